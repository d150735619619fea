//! VDI, VHDX and VHD: accepted for conversion only, once the header proves the image is not a
//! differencing image (the one way each format names another file) and its tables lie inside it.

use super::{be_u32, be_u64, in_bounds, inconsistent, le_u32, le_u64, Detected, Inspection, Rejection, Usage, SECTOR};
use crate::foreign::{self as codec, VHDX_REGION_TABLE_AT};
use crate::source::{read_clamped, ReadAt};
use crate::Format;

fn convert_only(format: Format, virtual_size: u64, cluster_size: Option<u32>) -> Inspection {
    Inspection {
        format,
        usage: Usage::ConvertOnly,
        virtual_size,
        cluster_size,
        qcow2: None,
        backing: None,
    }
}

/// VirtualBox's header (VDI 1.1, the only version QEMU reads).
pub(super) fn vdi(head: &[u8], len: u64) -> Result<Inspection, super::InspectError> {
    const D: Detected = Detected::Vdi;
    const VERSION_1_1: u32 = 0x0001_0001;
    const DYNAMIC: u32 = 1;
    const STATIC: u32 = 2;
    const UNDO: u32 = 3;
    const DIFF: u32 = 4;
    let field = |v: Option<u64>| v.ok_or_else(|| inconsistent(D, "header", "truncated"));
    let u32_at = |at| field(le_u32(head, at).map(u64::from));
    in_bounds(D, "header", 0, 0x200, len)?;
    let version = u32_at(0x44)?;
    if version != u64::from(VERSION_1_1) {
        return Err(inconsistent(D, "version", format!("{version:#x} is not 1.1")).into());
    }
    match u32_at(0x4c)? as u32 {
        DYNAMIC | STATIC => {}
        UNDO | DIFF => return Err(Rejection::Differencing(D).into()),
        other => return Err(inconsistent(D, "image type", format!("{other}")).into()),
    }
    let bmap = u32_at(0x154)?;
    let data = u32_at(0x158)?;
    let disk_size = field(le_u64(head, 0x170))?;
    let block = u32_at(0x178)?;
    let blocks = u32_at(0x180)?;
    in_bounds(D, "block map", bmap, blocks * 4, len)?;
    if data > len {
        return Err(inconsistent(D, "data offset", format!("{data} is past the end of the file")).into());
    }
    let cluster = u32::try_from(block).ok();
    Ok(convert_only(Format::Vdi, disk_size, cluster))
}

/// Hyper-V's VHDX: the metadata region must lie inside the file and say "no parent" (the
/// HasParent flag clear and no parent locator item; QEMU refuses differencing VHDX too).
pub(super) fn vhdx<S: ReadAt + ?Sized>(src: &S) -> Result<Inspection, super::InspectError> {
    const D: Detected = Detected::Vhdx;
    const TABLE_LEN: usize = 64 << 10;
    /// qemu-img makes 1 MiB metadata regions; anything larger is not one nubo reads.
    const MAX_METADATA: u64 = 1 << 20;
    let len = src.size();
    in_bounds(D, "region table", VHDX_REGION_TABLE_AT as u64, TABLE_LEN as u64, len)?;
    let table = read_clamped(src, VHDX_REGION_TABLE_AT as u64, TABLE_LEN)?;
    let malformed = |cause| Rejection::Malformed { format: D, cause };
    let (at, region_len) = codec::vhdx_metadata_region(&table).map_err(malformed)?;
    if u64::from(region_len) > MAX_METADATA {
        return Err(inconsistent(D, "metadata region", format!("{region_len} bytes exceeds 1 MiB")).into());
    }
    in_bounds(D, "metadata region", at, u64::from(region_len), len)?;
    let meta = read_clamped(src, at, region_len as usize)?;
    let info = codec::parse_vhdx(&meta).map_err(malformed)?;
    if codec::vhdx_has_parent(&meta).map_err(malformed)? {
        return Err(Rejection::Differencing(D).into());
    }
    Ok(convert_only(Format::Vhdx, info.virtual_size, info.cluster_size))
}

/// Microsoft's VHD: the footer at the start (dynamic) or only at the end (fixed); fixed and
/// dynamic disks are self-contained, differencing ones are not.
pub(super) fn vpc<S: ReadAt + ?Sized>(src: &S, head: &[u8], tail: &[u8]) -> Result<Inspection, super::InspectError> {
    const D: Detected = Detected::Vpc;
    const FIXED: u32 = 2;
    const DYNAMIC: u32 = 3;
    const DIFFERENCING: u32 = 4;
    let len = src.size();
    let footer = if head.starts_with(b"conectix") {
        &head[..head.len().min(SECTOR as usize)]
    } else {
        &tail[tail.len().saturating_sub(SECTOR as usize)..]
    };
    let truncated = || inconsistent(D, "footer", "truncated");
    let disk_type = be_u32(footer, 60).ok_or_else(truncated)?;
    let cluster_size = match disk_type {
        FIXED => None,
        DYNAMIC => {
            let at = be_u64(footer, 16).ok_or_else(truncated)?;
            in_bounds(D, "dynamic header", at, 1024, len)?;
            let dynamic = read_clamped(src, at, 1024)?;
            if !dynamic.starts_with(b"cxsparse") {
                return Err(inconsistent(D, "dynamic header", "lacks its cxsparse cookie").into());
            }
            let table_at = be_u64(&dynamic, 16).ok_or_else(truncated)?;
            let entries = be_u32(&dynamic, 28).ok_or_else(truncated)?;
            in_bounds(D, "block allocation table", table_at, u64::from(entries) * 4, len)?;
            be_u32(&dynamic, 32)
        }
        DIFFERENCING => return Err(Rejection::Differencing(D).into()),
        other => return Err(inconsistent(D, "disk type", format!("{other}")).into()),
    };
    let info = codec::vpc_footer(footer).map_err(|cause| Rejection::Malformed { format: D, cause })?;
    Ok(convert_only(Format::Vpc, info, cluster_size))
}
