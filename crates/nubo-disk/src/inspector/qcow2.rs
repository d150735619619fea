//! qcow2: the header parsed by the codec, then everything QEMU would follow out of the file
//! refused, and every table the header points at checked against the file's length (QEMU's
//! `validate_table_offset` and its size limits).

use super::{in_bounds, inconsistent, Detected, Inspection, Policy, Rejection, Usage};
use crate::qcow2::{self as codec, CryptMethod, INCOMPAT_CORRUPT, INCOMPAT_DATA_FILE};
use crate::source::{read_clamped, ReadAt};
use crate::Format;

const Q: Detected = Detected::Qcow2;
/// QEMU's QCOW_MAX_L1_SIZE and QCOW_MAX_REFTABLE_SIZE: larger tables are refused by QEMU too.
const MAX_L1_BYTES: u64 = 32 << 20;
const MAX_REFTABLE_BYTES: u64 = 8 << 20;
/// QEMU's QCOW_MAX_SNAPSHOTS.
const MAX_SNAPSHOTS: u32 = 65536;
/// The fixed part of a snapshot table entry.
const SNAPSHOT_ENTRY_MIN: u64 = 40;

pub(super) fn inspect<S: ReadAt + ?Sized>(
    src: &S,
    head: &[u8],
    policy: Policy,
) -> Result<Inspection, super::InspectError> {
    let len = src.size();
    // The header, its extensions and the backing name all lie in the first cluster (2 MiB at
    // most); an out-of-range cluster_bits is the codec's to report.
    let bits = super::be_u32(head, 20).unwrap_or(0);
    let cluster = if (9..=21).contains(&bits) {
        1usize << bits
    } else {
        head.len()
    };
    let first = if cluster > head.len() {
        read_clamped(src, 0, cluster)?
    } else {
        head[..cluster.min(head.len())].to_vec()
    };
    let h = codec::parse_qcow2_header(&first).map_err(Rejection::InvalidQcow2)?;
    let backing = check_header(&h, policy)?;
    super::check_size(Q, h.virtual_size)?;
    check_tables(&h, len)?;
    Ok(Inspection {
        format: Format::Qcow2,
        usage: Usage::Base,
        virtual_size: h.virtual_size,
        cluster_size: Some(h.cluster_size()),
        qcow2: Some(h),
        backing,
    })
}

/// Everything in the header that would make QEMU read another file, or read this one in a way
/// nubo cannot account for.
fn check_header(h: &codec::Qcow2Header, policy: Policy) -> Result<Option<(String, Format)>, Rejection> {
    if h.crypt_method != CryptMethod::None {
        return Err(Rejection::Encrypted);
    }
    let unknown = h.unknown_incompatible();
    if unknown != 0 {
        return Err(Rejection::UnknownFeatures(unknown));
    }
    if h.incompatible_features & INCOMPAT_CORRUPT != 0 {
        return Err(Rejection::Corrupt);
    }
    if h.incompatible_features & INCOMPAT_DATA_FILE != 0 || h.data_file.is_some() {
        return Err(Rejection::DataFile(crate::escape(
            h.data_file.as_deref().unwrap_or_default(),
        )));
    }
    let Some(name) = h.backing_file.clone() else {
        return Ok(None);
    };
    if policy == Policy::Untrusted {
        return Err(Rejection::Backing(crate::escape(&name)));
    }
    if name.is_empty() || has_protocol(&name) {
        return Err(Rejection::BackingProtocol(crate::escape(&name)));
    }
    let format = h
        .backing_format
        .as_deref()
        .and_then(|f| f.parse::<Format>().ok())
        .ok_or_else(|| Rejection::BackingUnformatted(crate::escape(&name)))?;
    Ok(Some((name, format)))
}

fn check_tables(h: &codec::Qcow2Header, len: u64) -> Result<(), Rejection> {
    let cluster = u64::from(h.cluster_size());
    in_bounds(Q, "header cluster", 0, cluster, len)?;
    let aligned = |what, offset: u64| {
        if offset.is_multiple_of(cluster) {
            Ok(())
        } else {
            Err(inconsistent(Q, what, format!("offset {offset} is not cluster-aligned")))
        }
    };
    // The L1 table must map the whole virtual size (QEMU refuses a smaller one).
    let l1_bytes = u64::from(h.l1_size) * 8;
    if l1_bytes > MAX_L1_BYTES {
        return Err(inconsistent(
            Q,
            "L1 table",
            format!("{l1_bytes} bytes exceeds QEMU's 32 MiB"),
        ));
    }
    let per_l1_entry = cluster * (cluster / 8);
    let needed = h.virtual_size.div_ceil(per_l1_entry);
    if u64::from(h.l1_size) < needed {
        return Err(inconsistent(
            Q,
            "L1 table",
            format!("{} entries cannot map {} bytes", h.l1_size, h.virtual_size),
        ));
    }
    if h.l1_size > 0 {
        aligned("L1 table", h.l1_table_offset)?;
        in_bounds(Q, "L1 table", h.l1_table_offset, l1_bytes, len)?;
    }
    let reftable_bytes = u64::from(h.refcount_table_clusters) * cluster;
    if reftable_bytes == 0 || reftable_bytes > MAX_REFTABLE_BYTES {
        return Err(inconsistent(
            Q,
            "refcount table",
            format!("{reftable_bytes} bytes is outside 1 cluster..8 MiB"),
        ));
    }
    aligned("refcount table", h.refcount_table_offset)?;
    in_bounds(Q, "refcount table", h.refcount_table_offset, reftable_bytes, len)?;
    if h.nb_snapshots > MAX_SNAPSHOTS {
        return Err(inconsistent(
            Q,
            "snapshot table",
            format!("{} snapshots", h.nb_snapshots),
        ));
    }
    if h.nb_snapshots > 0 {
        aligned("snapshot table", h.snapshots_offset)?;
        let min = u64::from(h.nb_snapshots) * SNAPSHOT_ENTRY_MIN;
        in_bounds(Q, "snapshot table", h.snapshots_offset, min, len)?;
    }
    Ok(())
}

/// QEMU's `path_has_protocol`: a colon before the first slash makes `nbd:host:port`,
/// `json:{...}` or `http://...` a protocol, not a file.
pub(crate) fn has_protocol(name: &str) -> bool {
    let first = name.find(['/', ':']);
    first.is_some_and(|i| name.as_bytes()[i] == b':')
}
