//! Disk image formats and sniffing them from their first bytes, the way qemu probes, so nubo
//! and qemu agree on what a file is.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How many leading bytes [`sniff`] looks at: through the ISO 9660 primary volume descriptor's
/// identifier at 32769..32774.
pub const SNIFF_LEN: usize = ISO_MAGIC_AT + ISO_MAGIC.len();

const ISO_MAGIC_AT: usize = 0x8001;
const ISO_MAGIC: &[u8] = b"CD001";
/// VDI's signature sits after a 64-byte free-text banner.
const VDI_SIGNATURE_AT: usize = 0x40;
const VDI_SIGNATURE: u32 = 0xbeda_107f;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Qcow2,
    Raw,
    Vmdk,
    Vdi,
    Vhdx,
    /// Microsoft VHD; qemu calls the driver `vpc`.
    Vpc,
    /// An ISO 9660 image; qemu reads it with the `raw` driver.
    Iso,
}

impl Format {
    pub const ALL: [Format; 7] = [
        Format::Qcow2,
        Format::Raw,
        Format::Vmdk,
        Format::Vdi,
        Format::Vhdx,
        Format::Vpc,
        Format::Iso,
    ];

    /// qemu-img's name for the format, except `iso`, which qemu has no driver of its own for
    /// (see [`Format::qemu_driver`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Qcow2 => "qcow2",
            Format::Raw => "raw",
            Format::Vmdk => "vmdk",
            Format::Vdi => "vdi",
            Format::Vhdx => "vhdx",
            Format::Vpc => "vpc",
            Format::Iso => "iso",
        }
    }

    /// The qemu block driver that opens the format: what `-F`, `format=` and the backing-format
    /// header extension must say.
    pub fn qemu_driver(self) -> &'static str {
        match self {
            Format::Iso => "raw",
            other => other.as_str(),
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown disk format `{0}`: use qcow2, raw, vmdk, vdi, vhdx, vpc (or vhd) or iso")]
pub struct UnknownFormat(pub String);

impl FromStr for Format {
    type Err = UnknownFormat;

    /// Accepts qemu-img's names, plus `vhd` for `vpc` (the name users know).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_ascii_lowercase();
        match lower.as_str() {
            "vhd" => Ok(Format::Vpc),
            name => Format::ALL
                .into_iter()
                .find(|f| f.as_str() == name)
                .ok_or_else(|| UnknownFormat(s.to_owned())),
        }
    }
}

/// The format of an image from its first bytes (ideally [`SNIFF_LEN`] of them). Anything
/// unrecognised is raw, as qemu concludes. Pure and total.
pub fn sniff(bytes: &[u8]) -> Format {
    let starts = |magic: &[u8]| bytes.starts_with(magic);
    if starts(crate::qcow2::MAGIC) {
        Format::Qcow2
    } else if starts(b"KDMV") || starts(b"# Disk DescriptorFile") {
        Format::Vmdk
    } else if starts(b"vhdxfile") {
        Format::Vhdx
    } else if starts(b"conectix") {
        Format::Vpc
    } else if le_u32(bytes, VDI_SIGNATURE_AT) == Some(VDI_SIGNATURE) {
        Format::Vdi
    } else if bytes.get(ISO_MAGIC_AT..ISO_MAGIC_AT + ISO_MAGIC.len()) == Some(ISO_MAGIC) {
        Format::Iso
    } else {
        Format::Raw
    }
}

fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_at(at: usize, magic: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; SNIFF_LEN];
        v[at..at + magic.len()].copy_from_slice(magic);
        v
    }

    #[test]
    fn sniff_qcow2_magic_is_qcow2() {
        assert_eq!(sniff(b"QFI\xfb\0\0\0\x03"), Format::Qcow2);
    }

    #[test]
    fn sniff_vmdk_sparse_and_descriptor_are_vmdk() {
        assert_eq!(sniff(b"KDMV\x01\0\0\0"), Format::Vmdk);
        assert_eq!(sniff(b"# Disk DescriptorFile\nversion=1\n"), Format::Vmdk);
    }

    #[test]
    fn sniff_vhdx_and_vpc_cookies_are_recognised() {
        assert_eq!(sniff(b"vhdxfile\0\0"), Format::Vhdx);
        assert_eq!(sniff(b"conectix\0\0"), Format::Vpc);
    }

    #[test]
    fn sniff_vdi_signature_at_0x40_is_vdi() {
        assert_eq!(sniff(&with_at(0x40, &VDI_SIGNATURE.to_le_bytes())), Format::Vdi);
    }

    #[test]
    fn sniff_iso_volume_descriptor_is_iso() {
        assert_eq!(sniff(&with_at(ISO_MAGIC_AT, ISO_MAGIC)), Format::Iso);
    }

    #[test]
    fn sniff_short_or_unknown_input_is_raw() {
        assert_eq!(sniff(b""), Format::Raw);
        assert_eq!(sniff(b"QFI"), Format::Raw);
        assert_eq!(sniff(&[0u8; 4096]), Format::Raw);
    }

    #[test]
    fn format_names_match_serde_and_parse_back() {
        for f in Format::ALL {
            let json = serde_json::to_string(&f).unwrap();

            assert_eq!(json, format!("\"{}\"", f.as_str()));
            assert_eq!(f.as_str().parse::<Format>().unwrap(), f);
        }
    }

    #[test]
    fn format_vhd_alias_is_vpc() {
        assert_eq!("VHD".parse::<Format>().unwrap(), Format::Vpc);
    }

    #[test]
    fn format_iso_driver_is_raw() {
        assert_eq!(Format::Iso.qemu_driver(), "raw");
        assert_eq!(Format::Qcow2.qemu_driver(), "qcow2");
    }

    #[test]
    fn format_unknown_name_is_rejected() {
        assert!("qed".parse::<Format>().is_err());
    }
}
