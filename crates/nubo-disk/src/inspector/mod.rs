//! The image inspector: what a disk image is, and whether nubo may hand it to QEMU, decided from
//! its bytes alone. Modelled on OpenStack's format inspector and the CVEs behind it (qcow2
//! backing and data files, VMDK extents and parents): identify every format QEMU could probe,
//! positively; accept only an allowlist of self-contained forms; bound every size and offset by
//! the file's length. Pure over [`ReadAt`] (fuzzed over byte slices): it cannot open any file
//! but the one it reads.
//!
//! Accepted: qcow2 with no backing file, external data file, encryption or unknown incompatible
//! features; raw (non-empty, starting with no other format's magic); VMDK `monolithicSparse` and
//! `streamOptimized` whose embedded descriptor names no extent but its own and no parent. VDI,
//! VHDX and VHD are accepted only for conversion, once proven not to be differencing images.
//! Everything else QEMU knows (qcow v1, QED, VMDK descriptors and COWD, Parallels, DMG, cloop,
//! Bochs, LUKS) is refused by name.

mod foreign;
mod qcow2;
mod vmdk;

use std::fmt;
use std::io;

use serde::Serialize;

use crate::error::HeaderError;
use crate::qcow2::Qcow2Header;
use crate::source::{read_clamped, ReadAt};
use crate::Format;

/// The largest virtual size nubo accepts: 64 TiB. Cloud images are a few GiB and grow to a few
/// TiB at most; a header claiming more is corrupt or hostile, and sizes past it reach arithmetic
/// (overlay layouts, `--disk-size` checks) nobody has exercised.
pub const MAX_VIRTUAL_SIZE: u64 = 64 << 40;

/// Bytes read from the start to identify a format: through the ISO 9660 primary volume
/// descriptor (32 KiB in) and every header nubo parses from the start.
const HEAD_LEN: usize = 64 << 10;
/// Footers at the end: a fixed VHD's 512 bytes, DMG's `koly` trailer, a streamOptimized VMDK's
/// footer (3 sectors).
const TAIL_LEN: usize = 1536;
const SECTOR: u64 = 512;

/// What nubo may do with an image it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Usage {
    /// A base nubo puts an overlay over and QEMU opens with an explicit driver.
    Base,
    /// Self-contained, but only ever read by `qemu-img convert` into qcow2 (VDI, VHDX, VHD).
    ConvertOnly,
}

/// Every format the inspector tells apart: each one QEMU can probe, plus ISO 9660.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Detected {
    Qcow2,
    QcowV1,
    Qed,
    /// VMDK with a binary sparse header (`KDMV`): monolithicSparse or streamOptimized.
    VmdkSparse,
    /// VMDK version 3 (`COWD`), which names its parent in the header.
    VmdkCowd,
    /// A VMDK text descriptor: a list of extents that are other files.
    VmdkDescriptor,
    Vhdx,
    Vpc,
    Vdi,
    Parallels,
    Dmg,
    Cloop,
    Luks,
    Bochs,
    Iso,
    Raw,
}

impl Detected {
    /// The name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Detected::Qcow2 => "qcow2",
            Detected::QcowV1 => "qcow (version 1)",
            Detected::Qed => "QED",
            Detected::VmdkSparse => "VMDK (sparse)",
            Detected::VmdkCowd => "VMDK version 3 (COWD)",
            Detected::VmdkDescriptor => "VMDK descriptor",
            Detected::Vhdx => "VHDX",
            Detected::Vpc => "VHD",
            Detected::Vdi => "VDI",
            Detected::Parallels => "Parallels",
            Detected::Dmg => "DMG",
            Detected::Cloop => "cloop",
            Detected::Luks => "LUKS",
            Detected::Bochs => "Bochs",
            Detected::Iso => "ISO 9660",
            Detected::Raw => "raw",
        }
    }

    /// Why the format is refused, beyond "nubo does not accept it".
    fn why_refused(self) -> &'static str {
        match self {
            Detected::QcowV1 | Detected::Qed | Detected::VmdkCowd | Detected::Parallels => {
                ": it can name a backing file QEMU would open"
            }
            Detected::VmdkDescriptor => {
                ": its extents and parent are other files QEMU would open (`RW ... FLAT \"/etc/shadow\"` reads a host file)"
            }
            Detected::Luks => ": it is encrypted, and nubo does not open encrypted images",
            _ => "",
        }
    }
}

impl fmt::Display for Detected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What nubo accepts, for every refusal's fix.
const ACCEPTS: &str = "nubo accepts qcow2 without backing or data files, raw, and monolithicSparse or streamOptimized VMDK images, and converts self-contained VDI, VHDX and VHD; convert the image to qcow2 where you trust it and every file it names, and give nubo the result";

/// Why the inspector refuses an image. Pure: it names no file; [`crate::DiskError::Refused`]
/// adds the path in front (`disk image `x` <reason>`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("is empty: a disk image holds at least one sector")]
    Empty,
    #[error("is a {0} image, which nubo does not accept{why}: {ACCEPTS}", why = .0.why_refused())]
    Unsupported(Detected),
    #[error("starts with qcow2's magic but is not a valid qcow2 image ({0}): nubo refuses it rather than guess whether it is a broken qcow2 image or a raw disk")]
    InvalidQcow2(HeaderError),
    #[error("is a {format} image whose header is malformed ({cause})")]
    Malformed { format: Detected, cause: HeaderError },
    #[error("is a qcow2 image with backing file `{0}`: QEMU would read that file too; {ACCEPTS}")]
    Backing(String),
    #[error("is a qcow2 image whose backing file `{0}` is a protocol or JSON name nubo never follows: rebase it onto a local file")]
    BackingProtocol(String),
    #[error("is a qcow2 image whose backing file `{0}` has no recorded format: QEMU would probe it; record one with `qemu-img rebase -u -F <format>`")]
    BackingUnformatted(String),
    #[error(
        "is a qcow2 image with external data file `{0}`: QEMU would read that file as the disk's contents; {ACCEPTS}"
    )]
    DataFile(String),
    #[error("is an encrypted qcow2 image: nubo does not open encrypted images; decrypt it with `qemu-img convert -O qcow2` where you hold the key")]
    Encrypted,
    #[error("is a qcow2 image with incompatible feature bits {0:#x} nubo does not know: convert it with a qemu-img that does")]
    UnknownFeatures(u64),
    #[error("is a qcow2 image marked corrupt: repair it with `qemu-img check -r all` where it was made")]
    Corrupt,
    #[error("is a VMDK image of type `{0}`; only monolithicSparse and streamOptimized are self-contained: {ACCEPTS}")]
    VmdkCreateType(String),
    #[error("is a VMDK image whose descriptor names extent `{0}`: its data would come from another file; {ACCEPTS}")]
    VmdkExtent(String),
    #[error("is a VMDK image with a parent ({0}): QEMU would open the parent file; {ACCEPTS}")]
    VmdkParent(String),
    #[error(
        "is a differencing {0} image: its data lies partly in a parent file; convert the whole chain where it was made"
    )]
    Differencing(Detected),
    #[error("is a {format} image of {size} bytes: a disk must be larger than 0 and at most {MAX_VIRTUAL_SIZE} bytes (64 TiB)")]
    VirtualSize { format: Detected, size: u64 },
    #[error("is a {format} image whose {what} (bytes {start}..{end}) lies past the end of the {len}-byte file: the image is truncated or corrupt")]
    OutOfBounds {
        format: Detected,
        what: &'static str,
        start: u64,
        end: u64,
        len: u64,
    },
    #[error("is a {format} image whose {what} is invalid ({why}): the image is corrupt")]
    Inconsistent {
        format: Detected,
        what: &'static str,
        why: String,
    },
}

impl Rejection {
    pub fn kind(&self) -> nubo_core::ErrorKind {
        use nubo_core::ErrorKind;
        match self {
            Rejection::Empty
            | Rejection::InvalidQcow2(_)
            | Rejection::Malformed { .. }
            | Rejection::Corrupt
            | Rejection::VirtualSize { .. }
            | Rejection::OutOfBounds { .. }
            | Rejection::Inconsistent { .. } => ErrorKind::InvalidInput,
            _ => ErrorKind::Unsupported,
        }
    }

    /// Whether the image was refused for naming another file as its backing file or parent.
    pub fn is_backing(&self) -> bool {
        matches!(
            self,
            Rejection::Backing(_)
                | Rejection::BackingProtocol(_)
                | Rejection::BackingUnformatted(_)
                | Rejection::VmdkParent(_)
                | Rejection::Differencing(_)
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("reading the image")]
    Io(#[from] io::Error),
}

/// What the inspector found in an image it accepts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inspection {
    pub format: Format,
    pub usage: Usage,
    /// Bytes the guest sees: > 0 and at most [`MAX_VIRTUAL_SIZE`].
    pub virtual_size: u64,
    pub cluster_size: Option<u32>,
    pub qcow2: Option<Qcow2Header>,
    /// Only with [`Policy::OwnOverlay`]: the backing file name as stored, and its format.
    pub backing: Option<(String, Format)>,
}

/// How much the inspector trusts what it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Any image from outside: self-contained or refused.
    Untrusted,
    /// A qcow2 overlay nubo made itself: it may name a backing file, which must have a recorded
    /// format (so QEMU never probes it) and be a local path. Never for a user's file.
    OwnOverlay,
}

/// Inspects the image in `src` as an untrusted image: its format, identified from its bytes,
/// must be on the allowlist and the image self-contained, or it is refused saying why.
pub fn inspect_image<S: ReadAt + ?Sized>(src: &S) -> Result<Inspection, InspectError> {
    inspect_with(src, Policy::Untrusted)
}

pub(crate) fn inspect_with<S: ReadAt + ?Sized>(src: &S, policy: Policy) -> Result<Inspection, InspectError> {
    let len = src.size();
    if len == 0 {
        return Err(Rejection::Empty.into());
    }
    let head = read_clamped(src, 0, HEAD_LEN)?;
    let tail_at = len.saturating_sub(TAIL_LEN as u64);
    let tail = read_clamped(src, tail_at, TAIL_LEN)?;
    let detected = identify(&head, &tail, len);
    let accepted = |format, virtual_size| Inspection {
        format,
        usage: Usage::Base,
        virtual_size,
        cluster_size: None,
        qcow2: None,
        backing: None,
    };
    let found = match detected {
        Detected::Raw => accepted(Format::Raw, len),
        Detected::Iso => accepted(Format::Iso, len),
        Detected::Qcow2 => qcow2::inspect(src, &head, policy)?,
        Detected::VmdkSparse => vmdk::inspect(src, &head, &tail)?,
        Detected::Vdi => foreign::vdi(&head, len)?,
        Detected::Vhdx => foreign::vhdx(src)?,
        Detected::Vpc => foreign::vpc(src, &head, &tail)?,
        other => return Err(Rejection::Unsupported(other).into()),
    };
    check_size(detected, found.virtual_size)?;
    Ok(found)
}

fn check_size(format: Detected, size: u64) -> Result<(), Rejection> {
    if size == 0 || size > MAX_VIRTUAL_SIZE {
        return Err(Rejection::VirtualSize { format, size });
    }
    Ok(())
}

/// `start..start+len` must lie inside a file of `file_len` bytes.
pub(crate) fn in_bounds(
    format: Detected,
    what: &'static str,
    start: u64,
    len: u64,
    file_len: u64,
) -> Result<(), Rejection> {
    let end = start.checked_add(len);
    match end {
        Some(end) if end <= file_len => Ok(()),
        _ => Err(Rejection::OutOfBounds {
            format,
            what,
            start,
            end: end.unwrap_or(u64::MAX),
            len: file_len,
        }),
    }
}

pub(crate) fn inconsistent(format: Detected, what: &'static str, why: impl Into<String>) -> Rejection {
    Rejection::Inconsistent {
        format,
        what,
        why: why.into(),
    }
}

const ISO_MAGIC_AT: usize = 0x8001;
const VDI_SIGNATURE_AT: usize = 0x40;
const VDI_SIGNATURE: [u8; 4] = 0xbeda_107fu32.to_le_bytes();
const CLOOP_MAGIC: &[u8] = b"#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0";

/// The format of an image from its first bytes (`head`, up to 64 KiB), its last (`tail`, up to
/// 1536) and its length. Every format QEMU probes is recognised; only what none claims is raw.
/// Pure and total.
pub fn identify(head: &[u8], tail: &[u8], len: u64) -> Detected {
    let starts = |magic: &[u8]| head.starts_with(magic);
    let last_sector = &tail[tail.len().saturating_sub(SECTOR as usize)..];
    if starts(crate::qcow2::MAGIC) {
        // qcow v1 shares the magic; only the version tells them apart.
        match head.get(4..8) {
            Some([0, 0, 0, 1]) => Detected::QcowV1,
            _ => Detected::Qcow2,
        }
    } else if starts(b"QED\0") {
        Detected::Qed
    } else if starts(b"KDMV") {
        Detected::VmdkSparse
    } else if starts(b"COWD") {
        Detected::VmdkCowd
    } else if starts(b"vhdxfile") {
        Detected::Vhdx
    } else if starts(b"conectix") {
        Detected::Vpc
    } else if head.get(VDI_SIGNATURE_AT..VDI_SIGNATURE_AT + 4) == Some(&VDI_SIGNATURE[..]) {
        Detected::Vdi
    } else if starts(b"WithoutFreeSpace") || starts(b"WithouFreSpacExt") {
        Detected::Parallels
    } else if starts(b"LUKS\xba\xbe") {
        Detected::Luks
    } else if starts(b"Bochs Virtual HD Image") {
        Detected::Bochs
    } else if starts(CLOOP_MAGIC) {
        Detected::Cloop
    } else if is_vmdk_descriptor(head) {
        Detected::VmdkDescriptor
    } else if len >= SECTOR && last_sector.starts_with(b"koly") {
        Detected::Dmg
    } else if len >= SECTOR && last_sector.starts_with(b"conectix") {
        // A fixed VHD keeps its footer only at the end.
        Detected::Vpc
    } else if head.get(ISO_MAGIC_AT..ISO_MAGIC_AT + 5) == Some(b"CD001") {
        Detected::Iso
    } else {
        Detected::Raw
    }
}

/// QEMU's `vmdk_probe` for text descriptors, widened: after any comment and blank lines, a line
/// starting `version=` makes a descriptor. Widening only refuses more.
fn is_vmdk_descriptor(head: &[u8]) -> bool {
    if head.starts_with(b"# Disk DescriptorFile") {
        return true;
    }
    for line in head.split(|&b| b == b'\n') {
        let line = trim_ascii(line);
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        return line.starts_with(b"version=");
    }
    false
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    let start = b.iter().position(|c| !c.is_ascii_whitespace()).unwrap_or(b.len());
    let end = b
        .iter()
        .rposition(|c| !c.is_ascii_whitespace())
        .map_or(start, |e| e + 1);
    &b[start..end.max(start)]
}

pub(crate) fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    crate::bytes::u32_at::<crate::bytes::Little>(b, at)
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> Option<u64> {
    crate::bytes::u64_at::<crate::bytes::Little>(b, at)
}

pub(crate) fn be_u32(b: &[u8], at: usize) -> Option<u32> {
    crate::bytes::u32_at::<crate::bytes::Big>(b, at)
}

pub(crate) fn be_u64(b: &[u8], at: usize) -> Option<u64> {
    crate::bytes::u64_at::<crate::bytes::Big>(b, at)
}

#[cfg(test)]
pub(crate) mod tests;
