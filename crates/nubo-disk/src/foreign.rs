//! Sizes from the headers of the formats nubo does not write but must recognise on import:
//! VMDK, VDI, VHDX and VPC (VHD). Pure and bounds-checked like the qcow2 codec; each reports
//! what `qemu-img info` reports for the same file.

use crate::bytes::{Be, Le};
use crate::error::HeaderError;
use crate::Format;

/// What a header says about the disk it describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForeignInfo {
    pub virtual_size: u64,
    pub cluster_size: Option<u32>,
}

/// Bytes [`parse_foreign`] may need (a VPC dynamic header follows the 512-byte footer copy); VHDX keeps its region table at 192 KiB and its metadata
/// wherever that table says, so VHDX callers fetch more (see [`vhdx_metadata_region`]).
pub const FOREIGN_HEADER_LEN: usize = 4096;

const SECTOR: u64 = 512;

pub fn parse_foreign(format: Format, bytes: &[u8]) -> Result<ForeignInfo, HeaderError> {
    match format {
        Format::Vmdk => vmdk(bytes),
        Format::Vdi => vdi(bytes),
        Format::Vpc => vpc(bytes),
        Format::Vhdx => Err(invalid(
            Format::Vhdx,
            "layout",
            "use parse_vhdx with the metadata region",
        )),
        other => Err(HeaderError::BadMagic { format: other }),
    }
}

fn vmdk(b: &[u8]) -> Result<ForeignInfo, HeaderError> {
    let r = Le::new(b, Format::Vmdk);
    if b.starts_with(b"KDMV") {
        let sectors = r.u64(12)?;
        let grain = r.u64(20)?;
        let virtual_size = sectors
            .checked_mul(SECTOR)
            .ok_or_else(|| invalid(Format::Vmdk, "capacity", "overflows"))?;
        let cluster = grain.checked_mul(SECTOR).and_then(|c| u32::try_from(c).ok());
        return Ok(ForeignInfo {
            virtual_size,
            cluster_size: cluster,
        });
    }
    // A text descriptor: the disk is the concatenation of its extents.
    let text = String::from_utf8_lossy(b);
    let mut sectors = 0u64;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if matches!(words.next(), Some("RW" | "RDONLY" | "NOACCESS")) {
            let n: u64 = words
                .next()
                .and_then(|w| w.parse().ok())
                .ok_or_else(|| invalid(Format::Vmdk, "extent", "has no sector count"))?;
            sectors = sectors
                .checked_add(n)
                .ok_or_else(|| invalid(Format::Vmdk, "extent", "overflows"))?;
        }
    }
    let virtual_size = sectors
        .checked_mul(SECTOR)
        .ok_or_else(|| invalid(Format::Vmdk, "extent", "overflows"))?;
    Ok(ForeignInfo {
        virtual_size,
        cluster_size: None,
    })
}

fn vdi(b: &[u8]) -> Result<ForeignInfo, HeaderError> {
    let r = Le::new(b, Format::Vdi);
    Ok(ForeignInfo {
        virtual_size: r.u64(0x170)?,
        cluster_size: Some(r.u32(0x178)?),
    })
}

/// VHD stores the size twice; qemu believes the CHS geometry unless the creator is known to
/// use `current_size` or the geometry is saturated (block/vpc.c).
fn vpc(b: &[u8]) -> Result<ForeignInfo, HeaderError> {
    let r = Be::new(b, Format::Vpc);
    let virtual_size = vpc_footer(b)?;
    // Dynamic and differencing disks keep their block size in the header the footer points at.
    const DYNAMIC: u32 = 3;
    const DIFFERENCING: u32 = 4;
    let disk_type = r.u32(60)?;
    let cluster_size = if disk_type == DYNAMIC || disk_type == DIFFERENCING {
        let at = usize::try_from(r.u64(16)?).map_err(|_| invalid(Format::Vpc, "data offset", "overflows"))?;
        let cookie = r.slice(at, 8)?;
        if cookie != b"cxsparse" {
            return Err(invalid(Format::Vpc, "dynamic header", "lacks its cxsparse cookie"));
        }
        Some(
            r.u32(
                at.checked_add(32)
                    .ok_or_else(|| invalid(Format::Vpc, "data offset", "overflows"))?,
            )?,
        )
    } else {
        None
    };
    Ok(ForeignInfo {
        virtual_size,
        cluster_size,
    })
}

/// The virtual size a VHD footer (`footer`: its 512 bytes) gives, as QEMU computes it.
pub fn vpc_footer(footer: &[u8]) -> Result<u64, HeaderError> {
    let r = Be::new(footer, Format::Vpc);
    const MAX_GEOMETRY: u64 = 65535 * 16 * 255;
    let creator = r.slice(28, 4)?;
    let current_size = r.u64(48)?;
    let cyls = u64::from(u16::from_be_bytes([r.u8(56)?, r.u8(57)?]));
    let chs_sectors = cyls * u64::from(r.u8(58)?) * u64::from(r.u8(59)?);
    let trusts_current = [b"win ", b"qem2", b"d2v ", b"CTXS", b"tap\0"]
        .iter()
        .any(|c| creator == *c);
    Ok(if trusts_current || chs_sectors == MAX_GEOMETRY {
        current_size / SECTOR * SECTOR
    } else {
        chs_sectors * SECTOR
    })
}

/// VHDX's region table lives at 192 KiB.
pub const VHDX_REGION_TABLE_AT: usize = 192 << 10;
const VHDX_REGION_TABLE_LEN: usize = 64 << 10;
const GUID_METADATA_REGION: [u8; 16] = guid(
    0x8b7c_a206,
    0x4790,
    0x4b9a,
    [0xb8, 0xfe, 0x57, 0x5f, 0x05, 0x0f, 0x88, 0x6e],
);
const GUID_FILE_PARAMETERS: [u8; 16] = guid(
    0xcaa1_6737,
    0xfa36,
    0x4d43,
    [0xb3, 0xb6, 0x33, 0xf0, 0xaa, 0x44, 0xe7, 0x6b],
);
const GUID_VIRTUAL_DISK_SIZE: [u8; 16] = guid(
    0x2fa5_4224,
    0xcd1b,
    0x4876,
    [0xb2, 0x11, 0x5d, 0xbe, 0xd8, 0x3b, 0xf4, 0xb8],
);

const GUID_PARENT_LOCATOR: [u8; 16] = guid(
    0xa8d3_5f2d,
    0xb30b,
    0x454d,
    [0xab, 0xf7, 0xd3, 0xd8, 0x48, 0x34, 0xab, 0x0c],
);

/// GUIDs as Microsoft lays them out: the first three fields little-endian.
const fn guid(a: u32, b: u16, c: u16, d: [u8; 8]) -> [u8; 16] {
    let a = a.to_le_bytes();
    let b = b.to_le_bytes();
    let c = c.to_le_bytes();
    [
        a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
    ]
}

/// Where the metadata region is (offset, length), from the region table: `table` is the 64 KiB
/// at [`VHDX_REGION_TABLE_AT`].
pub fn vhdx_metadata_region(table: &[u8]) -> Result<(u64, u32), HeaderError> {
    let r = Le::new(table, Format::Vhdx);
    if r.slice(0, 4)? != b"regi" {
        return Err(invalid(Format::Vhdx, "region table", "lacks its regi signature"));
    }
    let count = r.u32(8)? as usize;
    if count > (VHDX_REGION_TABLE_LEN - 16) / 32 {
        return Err(invalid(Format::Vhdx, "region table", "has too many entries"));
    }
    for i in 0..count {
        let at = 16 + i * 32;
        if r.slice(at, 16)? == GUID_METADATA_REGION {
            return Ok((r.u64(at + 16)?, r.u32(at + 24)?));
        }
    }
    Err(invalid(Format::Vhdx, "region table", "has no metadata region"))
}

/// Sizes from the VHDX metadata region (`meta` is the whole region).
pub fn parse_vhdx(meta: &[u8]) -> Result<ForeignInfo, HeaderError> {
    let r = Le::new(meta, Format::Vhdx);
    if r.slice(0, 8)? != b"metadata" {
        return Err(invalid(Format::Vhdx, "metadata table", "lacks its metadata signature"));
    }
    let count = usize::from(u16::from_le_bytes([r.u8(10)?, r.u8(11)?]));
    let (mut size, mut block) = (None, None);
    for i in 0..count {
        let at = 32 + i * 32;
        let id = r.slice(at, 16)?;
        let item = r.u32(at + 16)? as usize;
        if id == GUID_VIRTUAL_DISK_SIZE {
            size = Some(r.u64(item)?);
        } else if id == GUID_FILE_PARAMETERS {
            block = Some(r.u32(item)?);
        }
    }
    let virtual_size = size.ok_or_else(|| invalid(Format::Vhdx, "virtual disk size", "is missing"))?;
    Ok(ForeignInfo {
        virtual_size,
        cluster_size: block,
    })
}

/// Whether the VHDX metadata region (`meta`) describes a differencing disk: the HasParent flag
/// of the file parameters, or a parent locator item. Either makes QEMU (or a newer one) look for
/// another file.
pub fn vhdx_has_parent(meta: &[u8]) -> Result<bool, HeaderError> {
    const HAS_PARENT: u32 = 1 << 1;
    let r = Le::new(meta, Format::Vhdx);
    let count = usize::from(u16::from_le_bytes([r.u8(10)?, r.u8(11)?]));
    for i in 0..count {
        let at = 32 + i * 32;
        let id = r.slice(at, 16)?;
        if id == GUID_PARENT_LOCATOR {
            return Ok(true);
        }
        if id == GUID_FILE_PARAMETERS {
            let item = r.u32(at + 16)? as usize;
            if r.u32(item.saturating_add(4))? & HAS_PARENT != 0 {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn invalid(format: Format, field: &'static str, why: &str) -> HeaderError {
    HeaderError::Field {
        format,
        field,
        why: why.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(b: &mut Vec<u8>, at: usize, bytes: &[u8]) {
        if b.len() < at + bytes.len() {
            b.resize(at + bytes.len(), 0);
        }
        b[at..at + bytes.len()].copy_from_slice(bytes);
    }

    #[test]
    fn vmdk_sparse_header_gives_capacity_and_grain() {
        let mut b = b"KDMV".to_vec();
        put(&mut b, 12, &204_800u64.to_le_bytes());
        put(&mut b, 20, &128u64.to_le_bytes());

        let info = parse_foreign(Format::Vmdk, &b).unwrap();

        assert_eq!(
            info,
            ForeignInfo {
                virtual_size: 100 << 20,
                cluster_size: Some(65536)
            }
        );
    }

    #[test]
    fn vmdk_descriptor_sums_its_extents() {
        let text = b"# Disk DescriptorFile\nversion=1\nRW 2048 FLAT \"a-flat.vmdk\" 0\nRDONLY 2048 SPARSE \"b.vmdk\"\n";

        let info = parse_foreign(Format::Vmdk, text).unwrap();

        assert_eq!(
            info,
            ForeignInfo {
                virtual_size: 2 << 20,
                cluster_size: None
            }
        );
    }

    #[test]
    fn vdi_header_gives_disk_and_block_size() {
        let mut b = vec![0u8; 0x180];
        put(&mut b, 0x170, &(64u64 << 20).to_le_bytes());
        put(&mut b, 0x178, &(1u32 << 20).to_le_bytes());

        let info = parse_foreign(Format::Vdi, &b).unwrap();

        assert_eq!(
            info,
            ForeignInfo {
                virtual_size: 64 << 20,
                cluster_size: Some(1 << 20)
            }
        );
    }

    fn vpc_footer(creator: &[u8; 4], current: u64, chs: (u16, u8, u8), disk_type: u32) -> Vec<u8> {
        let mut b = b"conectix".to_vec();
        put(&mut b, 16, &512u64.to_be_bytes());
        put(&mut b, 28, creator);
        put(&mut b, 48, &current.to_be_bytes());
        put(&mut b, 56, &chs.0.to_be_bytes());
        put(&mut b, 58, &[chs.1, chs.2]);
        put(&mut b, 60, &disk_type.to_be_bytes());
        put(&mut b, 512, b"cxsparse");
        put(&mut b, 512 + 32, &(2u32 << 20).to_be_bytes());
        b
    }

    #[test]
    fn vpc_qemu_creator_uses_chs_geometry() {
        let b = vpc_footer(b"qemu", 100 << 20, (3, 16, 63), 3);

        let info = parse_foreign(Format::Vpc, &b).unwrap();

        assert_eq!(
            info,
            ForeignInfo {
                virtual_size: 3 * 16 * 63 * 512,
                cluster_size: Some(2 << 20)
            }
        );
    }

    #[test]
    fn vpc_hyperv_creator_uses_current_size() {
        let b = vpc_footer(b"win ", 100 << 20, (3, 16, 63), 2);

        let info = parse_foreign(Format::Vpc, &b).unwrap();

        assert_eq!(
            info,
            ForeignInfo {
                virtual_size: 100 << 20,
                cluster_size: None
            }
        );
    }

    #[test]
    fn vpc_dynamic_without_cxsparse_is_rejected() {
        let mut b = vpc_footer(b"qemu", 1 << 20, (1, 1, 1), 3);
        b[512] = b'X';

        assert!(matches!(
            parse_foreign(Format::Vpc, &b),
            Err(HeaderError::Field {
                field: "dynamic header",
                ..
            })
        ));
    }

    #[test]
    fn vhdx_region_table_and_metadata_give_sizes() {
        let mut table = b"regi".to_vec();
        put(&mut table, 8, &1u32.to_le_bytes());
        put(&mut table, 16, &GUID_METADATA_REGION);
        put(&mut table, 32, &(2u64 << 20).to_le_bytes());
        put(&mut table, 40, &(1u32 << 20).to_le_bytes());
        let mut meta = b"metadata".to_vec();
        put(&mut meta, 10, &2u16.to_le_bytes());
        put(&mut meta, 32, &GUID_FILE_PARAMETERS);
        put(&mut meta, 48, &0x1_0000u32.to_le_bytes());
        put(&mut meta, 64, &GUID_VIRTUAL_DISK_SIZE);
        put(&mut meta, 80, &0x1_0008u32.to_le_bytes());
        put(&mut meta, 0x1_0000, &(8u32 << 20).to_le_bytes());
        put(&mut meta, 0x1_0008, &(100u64 << 20).to_le_bytes());

        let region = vhdx_metadata_region(&table).unwrap();
        let info = parse_vhdx(&meta).unwrap();

        assert_eq!(region, (2 << 20, 1 << 20));
        assert_eq!(
            info,
            ForeignInfo {
                virtual_size: 100 << 20,
                cluster_size: Some(8 << 20)
            }
        );
    }

    #[test]
    fn vhdx_metadata_without_size_is_rejected() {
        let mut meta = b"metadata".to_vec();
        put(&mut meta, 31, &[0]);

        assert!(matches!(
            parse_vhdx(&meta),
            Err(HeaderError::Field {
                field: "virtual disk size",
                ..
            })
        ));
    }

    #[test]
    fn vdi_truncated_header_is_rejected() {
        assert!(matches!(
            parse_foreign(Format::Vdi, &[0u8; 0x100]),
            Err(HeaderError::Truncated { .. })
        ));
    }
}
