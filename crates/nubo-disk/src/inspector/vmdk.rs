//! Sparse VMDK (`KDMV`): accepted only as monolithicSparse or streamOptimized with an embedded
//! descriptor that names no extent but the file itself and no parent. Two QEMU paths out of the
//! file are closed here: a header with capacity 0 and a descriptor offset makes QEMU parse the
//! embedded descriptor as a descriptor *file* (extents and all), and `vmdk_parent_open` searches
//! the sectors after the header for `parentFileNameHint` whatever the descriptor says.

use super::{in_bounds, inconsistent, le_u32, le_u64, Detected, Inspection, Rejection, Usage, SECTOR};
use crate::source::{read_clamped, ReadAt};
use crate::Format;

const V: Detected = Detected::VmdkSparse;
/// QEMU's VMDK4_GD_AT_END: the grain directory (and the real header) is in the footer.
const GD_AT_END: u64 = u64::MAX;
/// What QEMU's `vmdk_parent_open` reads, from sector 1, looking for a parent: DESC_SIZE.
const PARENT_SCAN_AT: u64 = 512;
const PARENT_SCAN_LEN: usize = 20 * 512;
/// Embedded descriptors qemu-img and VMware write are 20 sectors; 1 MiB is far beyond any.
const MAX_DESCRIPTOR: u64 = 1 << 20;
/// QEMU refuses grains over 2^21 sectors (1 GiB).
const MAX_GRAIN_SECTORS: u64 = 0x20_0000;

struct Header {
    capacity: u64,
    granularity: u64,
    desc_offset: u64,
    desc_size: u64,
    gd_offset: u64,
}

fn header(b: &[u8], what: &'static str) -> Result<Header, Rejection> {
    let field = |v: Option<u64>| v.ok_or_else(|| inconsistent(V, what, "truncated"));
    let version = le_u32(b, 4).ok_or_else(|| inconsistent(V, what, "truncated"))?;
    if !(1..=3).contains(&version) {
        return Err(inconsistent(V, what, format!("version {version} is not 1, 2 or 3")));
    }
    Ok(Header {
        capacity: field(le_u64(b, 12))?,
        granularity: field(le_u64(b, 20))?,
        desc_offset: field(le_u64(b, 28))?,
        desc_size: field(le_u64(b, 36))?,
        gd_offset: field(le_u64(b, 56))?,
    })
}

pub(super) fn inspect<S: ReadAt + ?Sized>(
    src: &S,
    head: &[u8],
    tail: &[u8],
) -> Result<Inspection, super::InspectError> {
    let len = src.size();
    let h = header(head, "header")?;
    // Capacity 0 with a descriptor offset is QEMU's "descriptor file inside a sparse header".
    super::check_size(V, h.capacity.saturating_mul(SECTOR))?;
    if h.desc_offset == 0 || h.desc_size == 0 {
        return Err(inconsistent(V, "embedded descriptor", "is missing").into());
    }
    let desc_at = h.desc_offset.saturating_mul(SECTOR);
    let desc_len = h.desc_size.saturating_mul(SECTOR);
    if desc_len > MAX_DESCRIPTOR {
        return Err(inconsistent(V, "embedded descriptor", format!("{desc_len} bytes exceeds 1 MiB")).into());
    }
    in_bounds(V, "embedded descriptor", desc_at, desc_len, len)?;
    let grain = h.granularity;
    if grain == 0 || grain > MAX_GRAIN_SECTORS || !grain.is_power_of_two() {
        return Err(inconsistent(V, "grain size", format!("{grain} sectors")).into());
    }
    let capacity = if h.gd_offset == GD_AT_END {
        // streamOptimized: the real header is in the footer, 2 sectors from the end.
        let at = tail
            .len()
            .checked_sub(1024)
            .ok_or_else(|| inconsistent(V, "footer", "file too short"))?;
        let footer = &tail[at..];
        if !footer.starts_with(b"KDMV") {
            return Err(inconsistent(V, "footer", "lacks its KDMV magic").into());
        }
        let f = header(footer, "footer")?;
        if f.gd_offset == GD_AT_END {
            return Err(inconsistent(V, "footer", "points at itself for the grain directory").into());
        }
        in_bounds(V, "grain directory", f.gd_offset.saturating_mul(SECTOR), SECTOR, len)?;
        f.capacity
    } else {
        in_bounds(V, "grain directory", h.gd_offset.saturating_mul(SECTOR), SECTOR, len)?;
        h.capacity
    };
    let virtual_size = capacity.saturating_mul(SECTOR);
    super::check_size(V, virtual_size)?;

    let scan = read_clamped(src, PARENT_SCAN_AT, PARENT_SCAN_LEN)?;
    if contains(&scan, b"parentFileNameHint") {
        return Err(Rejection::VmdkParent("parentFileNameHint".into()).into());
    }
    let desc = read_clamped(src, desc_at, desc_len as usize)?;
    check_descriptor(&desc, capacity)?;
    Ok(Inspection {
        format: Format::Vmdk,
        usage: Usage::Base,
        virtual_size,
        cluster_size: u32::try_from(grain * SECTOR).ok(),
        qcow2: None,
        backing: None,
    })
}

/// The embedded descriptor: createType one of the two self-contained ones, no parent, and at most
/// one extent, the file itself (SPARSE, covering the whole capacity).
pub(super) fn check_descriptor(desc: &[u8], capacity: u64) -> Result<(), Rejection> {
    // QEMU reads descriptors as C strings.
    let desc = &desc[..desc.iter().position(|&b| b == 0).unwrap_or(desc.len())];
    let text = String::from_utf8_lossy(desc);
    let mut create_type = None;
    let mut extents = 0;
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some((key, value)) = line.split_once('=') {
            let (key, value) = (key.trim(), value.trim().trim_matches('"'));
            match key {
                "createType" => create_type = Some(value.to_owned()),
                "parentCID" if !value.eq_ignore_ascii_case("ffffffff") => {
                    return Err(Rejection::VmdkParent(format!("parentCID={}", crate::escape(value))));
                }
                k if k.starts_with("parent") && k != "parentCID" => {
                    return Err(Rejection::VmdkParent(crate::escape(k)));
                }
                _ => {}
            }
            continue;
        }
        let mut words = line.split_whitespace();
        if !matches!(words.next(), Some("RW" | "RDONLY" | "NOACCESS")) {
            continue;
        }
        extents += 1;
        let sectors = words.next().and_then(|w| w.parse::<u64>().ok());
        let kind = words.next();
        if extents > 1 || kind != Some("SPARSE") || sectors != Some(capacity) {
            return Err(Rejection::VmdkExtent(crate::escape(line)));
        }
    }
    match create_type.as_deref() {
        Some("monolithicSparse" | "streamOptimized") => Ok(()),
        Some(other) => Err(Rejection::VmdkCreateType(crate::escape(other))),
        None => Err(Rejection::VmdkCreateType("(none)".into())),
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}
