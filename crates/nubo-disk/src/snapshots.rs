//! The qcow2 internal snapshot table (docs/interop/qcow2.txt, "Snapshots"), read in-process so
//! `nubo vm snapshot ls` can cross-check a VM's record against what its overlay really holds
//! without running qemu-img. Pure over [`ReadAt`] and bounds-checked: the table is read entry
//! by entry, every length and offset checked against the object and against qemu's own limits
//! before it is used, so no input makes it allocate wildly, loop or panic (fuzzed).

use std::io;

use crate::qcow2::parse_qcow2_header;
use crate::source::ReadAt;
use crate::HeaderError;

/// qemu refuses images with more snapshots than this (`QCOW_MAX_SNAPSHOTS`).
pub const MAX_SNAPSHOTS: u32 = 65536;
/// qemu refuses a snapshot entry with more extra data than this (`QCOW_MAX_SNAPSHOT_EXTRA_DATA`).
pub const MAX_EXTRA_DATA: u32 = 1024;
/// qemu refuses a snapshot table larger than this (`QCOW_MAX_SNAPSHOTS_SIZE`, 64 MiB).
pub const MAX_TABLE_BYTES: u64 = 64 << 20;
/// The header, its extensions and the backing name live in the first cluster; clusters are at
/// most 2 MiB.
const MAX_FIRST_CLUSTER: u64 = 2 << 20;
/// The fixed part of an entry, before its extra data, id and name.
const ENTRY_FIXED: usize = 40;

/// One entry of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotEntry {
    /// qemu's numeric id (`1`, `2`, ...), as text.
    pub id: String,
    /// The name (tag) it was given; untrusted text, lossily decoded.
    pub name: String,
    /// Seconds since the Unix epoch when it was taken (host clock).
    pub date_sec: u32,
    pub date_nsec: u32,
    /// The guest's virtual clock at the snapshot, in nanoseconds.
    pub vm_clock_nsec: u64,
    /// Bytes of saved VM state (memory and devices); 0 for a disk-only snapshot.
    pub vm_state_size: u64,
    /// The disk's virtual size when it was taken (qcow2 v3 entries only).
    pub disk_size: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotTableError {
    #[error("reading the qcow2 image")]
    Io(#[from] io::Error),
    #[error(transparent)]
    Header(#[from] HeaderError),
    #[error("qcow2 snapshot table is invalid: {0}")]
    Invalid(String),
}

/// Reads every entry of the snapshot table of the qcow2 image `src`.
pub fn read_snapshot_table<S: ReadAt + ?Sized>(src: &S) -> Result<Vec<SnapshotEntry>, SnapshotTableError> {
    let mut first = vec![0u8; src.size().min(MAX_FIRST_CLUSTER) as usize];
    read_exact(src, &mut first, 0)?;
    let h = parse_qcow2_header(&first)?;
    if h.nb_snapshots == 0 {
        return Ok(Vec::new());
    }
    let bad = |why: String| SnapshotTableError::Invalid(why);
    if h.nb_snapshots > MAX_SNAPSHOTS {
        return Err(bad(format!(
            "{} snapshots, more than qemu's {MAX_SNAPSHOTS}",
            h.nb_snapshots
        )));
    }
    let cluster = u64::from(h.cluster_size());
    let start = h.snapshots_offset;
    if start == 0 || !start.is_multiple_of(cluster) || start >= src.size() {
        return Err(bad(format!(
            "the table offset {start} is not a cluster-aligned offset inside the {}-byte image",
            src.size()
        )));
    }
    let limit = start.saturating_add(MAX_TABLE_BYTES).min(src.size());
    let mut out = Vec::with_capacity(h.nb_snapshots.min(1024) as usize);
    let mut pos = start;
    for i in 0..h.nb_snapshots {
        let need = |len: u64| {
            pos.checked_add(len).filter(|end| *end <= limit).ok_or_else(|| {
                bad(format!(
                    "entry {i} at offset {pos} ({len} bytes) runs past the image or qemu's 64 MiB table limit"
                ))
            })
        };
        need(ENTRY_FIXED as u64)?;
        let mut fixed = [0u8; ENTRY_FIXED];
        read_exact(src, &mut fixed, pos)?;
        let be16 = |o: usize| u16::from_be_bytes([fixed[o], fixed[o + 1]]);
        let be32 = |o: usize| u32::from_be_bytes([fixed[o], fixed[o + 1], fixed[o + 2], fixed[o + 3]]);
        let be64 = |o: usize| (u64::from(be32(o)) << 32) | u64::from(be32(o + 4));
        let id_len = usize::from(be16(12));
        let name_len = usize::from(be16(14));
        let extra_len = be32(36);
        if extra_len > MAX_EXTRA_DATA {
            return Err(bad(format!(
                "entry {i} has {extra_len} bytes of extra data, more than qemu's {MAX_EXTRA_DATA}"
            )));
        }
        let extra_len = extra_len as usize;
        let len = ENTRY_FIXED + extra_len + id_len + name_len;
        // Entries are padded to 8 bytes, but qemu writes the table's length unpadded, so the
        // last entry's padding may lie past the end of the file.
        need(len as u64)?;
        let padded = len.next_multiple_of(8) as u64;
        let mut var = vec![0u8; len - ENTRY_FIXED];
        read_exact(src, &mut var, pos + ENTRY_FIXED as u64)?;
        let (extra, rest) = var.split_at(extra_len);
        let (id, name) = rest.split_at(id_len);
        let extra64 = |o: usize| {
            extra
                .get(o..o + 8)
                .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
        };
        let legacy_state = u64::from(be32(32));
        out.push(SnapshotEntry {
            id: String::from_utf8_lossy(id).into_owned(),
            name: String::from_utf8_lossy(name).into_owned(),
            date_sec: be32(16),
            date_nsec: be32(20),
            vm_clock_nsec: be64(24),
            // The 64-bit size in the extra data supersedes the legacy 32-bit field.
            vm_state_size: extra64(0).unwrap_or(legacy_state),
            disk_size: extra64(8),
        });
        pos += padded;
    }
    Ok(out)
}

fn read_exact<S: ReadAt + ?Sized>(src: &S, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let n = src.read_at(&mut buf[done..], offset + done as u64)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("the image ends before byte {}", offset + buf.len() as u64),
            ));
        }
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An empty 1 GiB qcow2 v3 image claiming `nb` snapshots in a table at cluster 1 holding `table`.
    fn image(nb: u32, table: &[u8]) -> Vec<u8> {
        let l = crate::layout::layout(1 << 30, None).unwrap();
        let mut img = vec![0u8; l.len.max(3 << 16) as usize];
        for (at, bytes) in &l.writes {
            img[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
        }
        img[60..64].copy_from_slice(&nb.to_be_bytes());
        img[64..72].copy_from_slice(&(1u64 << 16).to_be_bytes());
        img[1 << 16..(1 << 16) + table.len()].copy_from_slice(table);
        img
    }

    fn entry(id: &str, name: &str, state: u64, extra: bool) -> Vec<u8> {
        let mut e = vec![0u8; ENTRY_FIXED];
        e[12..14].copy_from_slice(&(id.len() as u16).to_be_bytes());
        e[14..16].copy_from_slice(&(name.len() as u16).to_be_bytes());
        e[16..20].copy_from_slice(&1_700_000_000u32.to_be_bytes());
        e[24..32].copy_from_slice(&5_000_000_000u64.to_be_bytes());
        e[32..36].copy_from_slice(&(state as u32).to_be_bytes());
        if extra {
            e[36..40].copy_from_slice(&16u32.to_be_bytes());
            e.extend_from_slice(&state.to_be_bytes());
            e.extend_from_slice(&(1u64 << 30).to_be_bytes());
        }
        e.extend_from_slice(id.as_bytes());
        e.extend_from_slice(name.as_bytes());
        e.resize(e.len().next_multiple_of(8), 0);
        e
    }

    #[test]
    fn read_snapshot_table_no_snapshots_is_empty() {
        let img = image(0, &[]);

        assert_eq!(read_snapshot_table(img.as_slice()).unwrap(), Vec::new());
    }

    #[test]
    fn read_snapshot_table_two_entries_parsed() {
        let mut t = entry("1", "before-upgrade", 0, true);
        t.extend(entry("2", "with-memory", 300 << 20, true));
        let img = image(2, &t);

        let s = read_snapshot_table(img.as_slice()).unwrap();

        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "before-upgrade");
        assert_eq!(s[0].vm_state_size, 0);
        assert_eq!(s[1].id, "2");
        assert_eq!(s[1].vm_state_size, 300 << 20);
        assert_eq!(s[1].disk_size, Some(1 << 30));
        assert_eq!(s[1].vm_clock_nsec, 5_000_000_000);
    }

    /// Regression: qemu-img leaves the last entry's padding out of the file (found by the live
    /// test: `snapshot create` of a stopped VM after a memory snapshot failed to list).
    #[test]
    fn read_snapshot_table_last_entry_unpadded_at_end_of_file() {
        let mut t = entry("1", "s1", 0, true);
        t.extend(entry("2", "s3", 0, true));
        let mut img = image(2, &t);
        img.truncate((1 << 16) + 64 + 59);

        let s = read_snapshot_table(img.as_slice()).unwrap();

        assert_eq!(s[1].name, "s3");
    }

    #[test]
    fn read_snapshot_table_v2_entry_uses_legacy_state_size() {
        let img = image(1, &entry("1", "old", 4096, false));

        let s = read_snapshot_table(img.as_slice()).unwrap();

        assert_eq!((s[0].vm_state_size, s[0].disk_size), (4096, None));
    }

    #[test]
    fn read_snapshot_table_count_past_table_is_invalid() {
        let mut img = image(1000, &entry("1", "a", 0, true));
        img.truncate((1 << 16) + 64);

        let err = read_snapshot_table(img.as_slice()).unwrap_err();

        assert!(matches!(err, SnapshotTableError::Invalid(_)), "{err}");
    }

    #[test]
    fn read_snapshot_table_huge_extra_data_is_invalid() {
        let mut e = entry("1", "a", 0, true);
        e[36..40].copy_from_slice(&u32::MAX.to_be_bytes());
        let img = image(1, &e);

        let err = read_snapshot_table(img.as_slice()).unwrap_err();

        assert!(err.to_string().contains("extra data"), "{err}");
    }

    #[test]
    fn read_snapshot_table_unaligned_offset_is_invalid() {
        let mut img = image(1, &entry("1", "a", 0, true));
        img[64..72].copy_from_slice(&((1u64 << 16) + 8).to_be_bytes());

        let err = read_snapshot_table(img.as_slice()).unwrap_err();

        assert!(err.to_string().contains("cluster-aligned"), "{err}");
    }

    #[test]
    fn read_snapshot_table_too_many_snapshots_is_invalid() {
        let img = image(MAX_SNAPSHOTS + 1, &[]);

        assert!(read_snapshot_table(img.as_slice()).is_err());
    }

    #[test]
    fn read_snapshot_table_not_qcow2_is_header_error() {
        assert!(matches!(
            read_snapshot_table(&[0u8; 512][..]),
            Err(SnapshotTableError::Header(_))
        ));
    }
}
