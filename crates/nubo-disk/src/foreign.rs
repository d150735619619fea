//! Sizes from the headers of the formats nubo does not write but must recognise on import:
//! VMDK, VDI, VHDX and VPC (VHD). Pure and bounds-checked like the qcow2 codec; each reports
//! what `qemu-img info` reports for the same file.

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
    let r = Le(b, Format::Vmdk);
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
    let r = Le(b, Format::Vdi);
    Ok(ForeignInfo {
        virtual_size: r.u64(0x170)?,
        cluster_size: Some(r.u32(0x178)?),
    })
}

/// VHD stores the size twice; qemu believes the CHS geometry unless the creator is known to
/// use `current_size` or the geometry is saturated (block/vpc.c).
fn vpc(b: &[u8]) -> Result<ForeignInfo, HeaderError> {
    let r = Be(b, Format::Vpc);
    const MAX_GEOMETRY: u64 = 65535 * 16 * 255;
    let creator = r.slice(28, 4)?;
    let current_size = r.u64(48)?;
    let cyls = u64::from(u16::from_be_bytes([r.u8(56)?, r.u8(57)?]));
    let chs_sectors = cyls * u64::from(r.u8(58)?) * u64::from(r.u8(59)?);
    let trusts_current = [b"win ", b"qem2", b"d2v ", b"CTXS", b"tap\0"]
        .iter()
        .any(|c| creator == *c);
    let virtual_size = if trusts_current || chs_sectors == MAX_GEOMETRY {
        current_size / SECTOR * SECTOR
    } else {
        chs_sectors * SECTOR
    };
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
    let r = Le(table, Format::Vhdx);
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
    let r = Le(meta, Format::Vhdx);
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

fn invalid(format: Format, field: &'static str, why: &str) -> HeaderError {
    HeaderError::Field {
        format,
        field,
        why: why.to_owned(),
    }
}

/// Bounds-checked little- and big-endian readers that name the format in their errors.
struct Le<'a>(&'a [u8], Format);
struct Be<'a>(&'a [u8], Format);

fn slice(b: &[u8], format: Format, at: usize, len: usize) -> Result<&[u8], HeaderError> {
    let end = at.saturating_add(len);
    b.get(at..end).ok_or(HeaderError::Truncated {
        format,
        need: end,
        got: b.len(),
    })
}

impl Le<'_> {
    fn slice(&self, at: usize, len: usize) -> Result<&[u8], HeaderError> {
        slice(self.0, self.1, at, len)
    }
    fn u8(&self, at: usize) -> Result<u8, HeaderError> {
        Ok(self.slice(at, 1)?[0])
    }
    fn u32(&self, at: usize) -> Result<u32, HeaderError> {
        let b = self.slice(at, 4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&self, at: usize) -> Result<u64, HeaderError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.slice(at, 8)?);
        Ok(u64::from_le_bytes(a))
    }
}

impl Be<'_> {
    fn slice(&self, at: usize, len: usize) -> Result<&[u8], HeaderError> {
        slice(self.0, self.1, at, len)
    }
    fn u8(&self, at: usize) -> Result<u8, HeaderError> {
        Ok(self.slice(at, 1)?[0])
    }
    fn u32(&self, at: usize) -> Result<u32, HeaderError> {
        let b = self.slice(at, 4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&self, at: usize) -> Result<u64, HeaderError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.slice(at, 8)?);
        Ok(u64::from_be_bytes(a))
    }
}
