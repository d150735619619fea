//! The metadata of a new, empty qcow2 v3 image, computed purely: which bytes go where and how
//! long the file is. [`crate::create`] writes it.
//!
//! ```text
//! cluster 0  header, backing-format extension, end marker, backing file name
//! cluster 1  refcount table (one entry: cluster 2)
//! cluster 2  refcount block 0 (refcount 1 for every metadata cluster)
//! cluster 3+ L1 table, all zero (nothing allocated: every read falls through to the backing file)
//! ```

use crate::error::DiskError;
use crate::qcow2::{EXT_BACKING_FORMAT, EXT_END, MAGIC, MAX_BACKING_NAME};
use nubo_core::ByteSize;

/// 64 KiB, qemu's default: one L2 table maps 512 MiB, so a 2 TiB disk needs a 32 KiB L1.
pub const CLUSTER_BITS: u32 = 16;
const CLUSTER: u64 = 1 << CLUSTER_BITS;
/// 16-bit refcounts, qemu's default; one refcount block then covers 32768 clusters (2 GiB).
const REFCOUNT_ORDER: u32 = 4;
/// qemu 10 writes 112-byte headers (with the compression type byte); older qemus read them too.
const HEADER_LEN: u32 = 112;
/// qemu refuses L1 tables over 32 MiB (QCOW_MAX_L1_SIZE), which caps 64 KiB-cluster images
/// at 2 PiB.
const MAX_L1_BYTES: u64 = 32 << 20;
const L2_ENTRIES: u64 = CLUSTER / 8;
const REFCOUNT_TABLE_AT: u64 = CLUSTER;
const REFCOUNT_BLOCK_AT: u64 = 2 * CLUSTER;
const L1_AT: u64 = 3 * CLUSTER;

/// Bytes to write at offsets into a file of `len` bytes; everything else is zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub writes: Vec<(u64, Vec<u8>)>,
    pub len: u64,
}

/// The backing file a new overlay points at: the name stored in the image and its qemu driver.
#[derive(Debug, Clone, Copy)]
pub struct BackingRef<'a> {
    pub name: &'a str,
    pub driver: &'a str,
}

pub fn layout(virtual_size: u64, backing: Option<BackingRef<'_>>) -> Result<Layout, DiskError> {
    if !virtual_size.is_multiple_of(512) {
        return Err(DiskError::Unaligned(virtual_size));
    }
    let l1_size = virtual_size.div_ceil(CLUSTER * L2_ENTRIES);
    if l1_size * 8 > MAX_L1_BYTES {
        return Err(DiskError::TooLarge(ByteSize(virtual_size)));
    }
    let l1_clusters = (l1_size * 8).div_ceil(CLUSTER);
    let metadata_clusters = 3 + l1_clusters;
    let mut writes = vec![(0, header(virtual_size, l1_size, backing)?)];
    writes.push((REFCOUNT_TABLE_AT, REFCOUNT_BLOCK_AT.to_be_bytes().to_vec()));
    let refcounts: Vec<u8> = (0..metadata_clusters).flat_map(|_| 1u16.to_be_bytes()).collect();
    writes.push((REFCOUNT_BLOCK_AT, refcounts));
    Ok(Layout {
        writes,
        len: metadata_clusters * CLUSTER,
    })
}

fn header(virtual_size: u64, l1_size: u64, backing: Option<BackingRef<'_>>) -> Result<Vec<u8>, DiskError> {
    let mut h = Vec::with_capacity(HEADER_LEN as usize + 64);
    h.extend_from_slice(MAGIC);
    h.extend_from_slice(&3u32.to_be_bytes());
    h.extend_from_slice(&0u64.to_be_bytes()); // backing_file_offset, patched below
    h.extend_from_slice(&0u32.to_be_bytes()); // backing_file_size, patched below
    h.extend_from_slice(&CLUSTER_BITS.to_be_bytes());
    h.extend_from_slice(&virtual_size.to_be_bytes());
    h.extend_from_slice(&0u32.to_be_bytes()); // crypt_method: none
    h.extend_from_slice(&(l1_size as u32).to_be_bytes());
    h.extend_from_slice(&L1_AT.to_be_bytes());
    h.extend_from_slice(&REFCOUNT_TABLE_AT.to_be_bytes());
    h.extend_from_slice(&1u32.to_be_bytes()); // refcount_table_clusters
    h.extend_from_slice(&0u32.to_be_bytes()); // nb_snapshots
    h.extend_from_slice(&0u64.to_be_bytes()); // snapshots_offset
    h.extend_from_slice(&0u64.to_be_bytes()); // incompatible features
    h.extend_from_slice(&0u64.to_be_bytes()); // compatible features
    h.extend_from_slice(&0u64.to_be_bytes()); // autoclear features
    h.extend_from_slice(&REFCOUNT_ORDER.to_be_bytes());
    h.extend_from_slice(&HEADER_LEN.to_be_bytes());
    h.extend_from_slice(&[0u8; 8]); // compression type zlib, padding
    debug_assert_eq!(h.len(), HEADER_LEN as usize);
    if let Some(b) = backing {
        if b.name.len() > MAX_BACKING_NAME {
            return Err(DiskError::BackingPathTooLong(b.name.into()));
        }
        extension(&mut h, EXT_BACKING_FORMAT, b.driver.as_bytes());
    }
    extension(&mut h, EXT_END, &[]);
    if let Some(b) = backing {
        let offset = h.len() as u64;
        h[8..16].copy_from_slice(&offset.to_be_bytes());
        h[16..20].copy_from_slice(&(b.name.len() as u32).to_be_bytes());
        h.extend_from_slice(b.name.as_bytes());
    }
    Ok(h)
}

fn extension(h: &mut Vec<u8>, kind: u32, data: &[u8]) {
    h.extend_from_slice(&kind.to_be_bytes());
    h.extend_from_slice(&(data.len() as u32).to_be_bytes());
    h.extend_from_slice(data);
    h.resize(h.len().next_multiple_of(8), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qcow2::parse_qcow2_header;

    fn image(l: &Layout) -> Vec<u8> {
        let mut b = vec![0u8; l.len as usize];
        for (at, data) in &l.writes {
            b[*at as usize..*at as usize + data.len()].copy_from_slice(data);
        }
        b
    }

    #[test]
    fn layout_overlay_header_parses_back() {
        let l = layout(
            20 << 30,
            Some(BackingRef {
                name: "/s/base.qcow2",
                driver: "qcow2",
            }),
        )
        .unwrap();

        let h = parse_qcow2_header(&image(&l)).unwrap();

        assert_eq!(h.version, 3);
        assert_eq!(h.virtual_size, 20 << 30);
        assert_eq!(h.cluster_size(), 65536);
        assert_eq!(h.refcount_order, 4);
        assert_eq!(h.backing_file.as_deref(), Some("/s/base.qcow2"));
        assert_eq!(h.backing_format.as_deref(), Some("qcow2"));
        assert_eq!(h.l1_size, 40);
        assert_eq!(h.l1_table_offset, L1_AT);
    }

    #[test]
    fn layout_refcounts_cover_every_metadata_cluster() {
        let l = layout(4 << 40, None).unwrap();

        let b = image(&l);

        let clusters = l.len / CLUSTER;
        assert_eq!(clusters, 3 + 1);
        let block = &b[REFCOUNT_BLOCK_AT as usize..];
        assert!((0..clusters as usize).all(|i| block[2 * i..2 * i + 2] == [0, 1]));
        assert_eq!(block[2 * clusters as usize..2 * clusters as usize + 2], [0, 0]);
    }

    #[test]
    fn layout_large_disk_gets_multi_cluster_l1() {
        let l = layout(8 << 40, None).unwrap();

        assert_eq!(l.len / CLUSTER, 3 + 2);
    }

    #[test]
    fn layout_unaligned_size_is_rejected() {
        assert!(matches!(layout(1000, None), Err(DiskError::Unaligned(1000))));
    }

    #[test]
    fn layout_size_beyond_l1_limit_is_rejected() {
        assert!(matches!(layout(4 << 50, None), Err(DiskError::TooLarge(_))));
    }

    #[test]
    fn layout_zero_size_has_no_l1_cluster() {
        let l = layout(0, None).unwrap();

        assert_eq!(l.len, 3 * CLUSTER);
    }

    #[test]
    fn layout_backing_name_over_1023_bytes_is_rejected() {
        let name = "/".repeat(1024);

        let r = layout(
            1 << 20,
            Some(BackingRef {
                name: &name,
                driver: "raw",
            }),
        );

        assert!(matches!(r, Err(DiskError::BackingPathTooLong(_))));
    }

    proptest::proptest! {
        #[test]
        fn layout_any_virtual_size_round_trips(sectors in 0u64..(1u64 << 42), name in "/[a-z0-9/._-]{0,200}") {
            let size = sectors * 512;
            let l = layout(size, Some(BackingRef { name: &name, driver: "raw" })).unwrap();

            let h = parse_qcow2_header(&l.writes[0].1).unwrap();

            proptest::prop_assert_eq!(h.virtual_size, size);
            proptest::prop_assert_eq!(h.backing_file.as_deref(), Some(name.as_str()));
            proptest::prop_assert_eq!(u64::from(h.l1_size), size.div_ceil(CLUSTER * L2_ENTRIES));
        }
    }
}
