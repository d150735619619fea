//! Writing new images: an empty qcow2, or a thin overlay over a base. Never clobbers (O_EXCL),
//! fsyncs the file and its directory, and removes what it made on any failure.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nubo_core::ByteSize;

use crate::chain::check_base;
use crate::error::DiskError;
use crate::layout::{layout, BackingRef, Layout};
use crate::Format;

/// Creates `out`, an empty qcow2 v3 overlay over `base` (opened as `base_format`, which must be
/// what the file is). The base must pass the untrusted inspector and be bootable as a base
/// ([`crate::inspect_base`]): self-contained, so the overlay's chain is exactly two files. The overlay records the base's absolute path and its format,
/// so qemu never probes the base. `virtual_size` defaults to the base's (rounded up to whole
/// sectors) and may only grow it: growing a disk is giving its overlay a larger size.
pub fn create_overlay(
    base: &Path,
    base_format: Format,
    out: &Path,
    virtual_size: Option<u64>,
) -> Result<(), DiskError> {
    overlay(base, base_format, out, virtual_size, Sync::Durable)
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sync {
    Durable,
    /// The caller syncs later.
    Later,
}

fn overlay(
    base: &Path,
    base_format: Format,
    out: &Path,
    virtual_size: Option<u64>,
    sync: Sync,
) -> Result<(), DiskError> {
    overlay_base(base, base_format, virtual_size)?.write(out, sync)
}

/// A base that passed the checks [`create_overlay`] makes before writing (only
/// [`overlay_base`] makes one): resolved, inspected as its declared format, usable as a base,
/// not encrypted; with the overlay's virtual size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayBase {
    path: PathBuf,
    format: Format,
    size: u64,
    base_size: u64,
}

impl OverlayBase {
    /// The base's absolute path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The overlay's virtual size: the one asked for, or the base's rounded up to sectors.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The base's own virtual size, as inspected: what a VM records so that every later boot can
    /// tell a replaced base ([`crate::verify_vm_chain`]).
    pub fn base_size(&self) -> u64 {
        self.base_size
    }

    /// Creates `out`, the overlay, without the fsyncs of the file and its directory: for a
    /// caller on a latency-critical path that makes the whole directory durable afterwards with
    /// one `syncfs` (`vm create` does, after the VMM has started).
    pub fn create_unsynced(&self, out: &Path) -> Result<(), DiskError> {
        self.write(out, Sync::Later)
    }

    fn write(&self, out: &Path, sync: Sync) -> Result<(), DiskError> {
        let name = self
            .path
            .to_str()
            .ok_or_else(|| DiskError::NonUtf8Path(self.path.clone()))?;
        let layout = layout(
            self.size,
            Some(BackingRef {
                name,
                driver: self.format.qemu_driver(),
            }),
        )?;
        write_new(out, &layout, sync)
    }
}

/// The checks [`create_overlay`] makes of `base` before writing, once, for a caller that then
/// makes the overlay itself ([`OverlayBase::create_unsynced`]) or has another program make it
/// (libvirt's storage driver): the base, resolved, must pass the untrusted inspector as
/// `base_format`, be usable as a base and not be encrypted (the check every later boot makes
/// again, [`crate::verify_vm_chain`]). The overlay's virtual size is
/// `virtual_size`, which may only grow the base's, or the base's own rounded up to whole sectors.
pub fn overlay_base(base: &Path, base_format: Format, virtual_size: Option<u64>) -> Result<OverlayBase, DiskError> {
    let base_abs = fs::canonicalize(base).map_err(|e| DiskError::io("resolve", base, e))?;
    let info = check_base(&base_abs, base_format)?;
    let size = match virtual_size {
        None => info.virtual_size.next_multiple_of(512),
        Some(s) if s < info.virtual_size => {
            return Err(DiskError::TooSmall {
                base: base_abs,
                requested: ByteSize(s),
                base_size: ByteSize(info.virtual_size),
            })
        }
        Some(s) => s,
    };
    Ok(OverlayBase {
        path: base_abs,
        format: base_format,
        size,
        base_size: info.virtual_size,
    })
}

/// Creates `out`, an empty qcow2 v3 image of `virtual_size` bytes (a multiple of 512) with no
/// backing file.
pub fn create_qcow2(out: &Path, virtual_size: u64) -> Result<(), DiskError> {
    write_new(out, &layout(virtual_size, None)?, Sync::Durable)
}

pub(crate) fn write_new(out: &Path, layout: &Layout, sync: Sync) -> Result<(), DiskError> {
    // 0600: the overlay will hold the guest's writes; libvirt relabels disks it hands to qemu.
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| DiskError::io("create", out, e))?;
    let result = fill(&file, out, layout, sync);
    if result.is_err() {
        drop(file);
        let _ = fs::remove_file(out);
    }
    result
}

fn fill(file: &File, out: &Path, layout: &Layout, sync: Sync) -> Result<(), DiskError> {
    let io = |action| {
        move |e| DiskError::Io {
            action,
            path: out.to_path_buf(),
            source: e,
        }
    };
    // Extend first: the L1 table and the rest stay holes, read back as zeros.
    file.set_len(layout.len).map_err(io("extend"))?;
    for (offset, data) in &layout.writes {
        file.write_all_at(data, *offset).map_err(io("write"))?;
    }
    if sync == Sync::Later {
        return Ok(());
    }
    file.sync_all().map_err(io("fsync"))?;
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| DiskError::Io {
        action: "fsync the directory of",
        path: out.to_path_buf(),
        source: e,
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn create_unsynced_same_bytes_as_durable() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.qcow2");
        create_qcow2(&base, 1 << 20).unwrap();
        let (a, b) = (dir.path().join("a.qcow2"), dir.path().join("b.qcow2"));

        create_overlay(&base, Format::Qcow2, &a, None).unwrap();
        overlay_base(&base, Format::Qcow2, None)
            .unwrap()
            .create_unsynced(&b)
            .unwrap();

        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    }

    use super::*;
    use crate::inspect::{inspect, inspect_overlay_chain};
    use crate::inspector::Rejection;
    use std::path::PathBuf;

    fn raw(dir: &Path, len: usize) -> PathBuf {
        let p = dir.join("base.raw");
        fs::write(&p, vec![7u8; len]).unwrap();
        p
    }

    #[test]
    fn create_qcow2_inspects_as_empty_qcow2() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("a.qcow2");

        create_qcow2(&out, 1 << 30).unwrap();

        let info = inspect(&out).unwrap();
        assert_eq!(
            (info.format, info.virtual_size, info.cluster_size),
            (Format::Qcow2, 1 << 30, Some(65536))
        );
        assert_eq!((info.backing, info.chain_depth), (None, 0));
    }

    #[test]
    fn create_overlay_raw_base_records_absolute_path_and_format() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 1000);
        let out = dir.path().join("o.qcow2");

        create_overlay(&base, Format::Raw, &out, None).unwrap();

        let info = inspect_overlay_chain(&out).unwrap();
        assert_eq!(info.virtual_size, 1024);
        assert_eq!(info.chain_depth, 1);
        let backing = info.backing.unwrap();
        assert_eq!(backing.file, fs::canonicalize(&base).unwrap());
        assert_eq!(backing.format, Some(Format::Raw));
    }

    /// Regression (issue 9): a base with a backing file made nubo's overlay a door to whatever
    /// file the base named; bases must be self-contained now.
    #[test]
    fn create_overlay_over_overlay_is_refused_without_residue() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 4096);
        let mid = dir.path().join("mid.qcow2");
        let top = dir.path().join("top.qcow2");
        create_overlay(&base, Format::Raw, &mid, None).unwrap();

        let err = create_overlay(&mid, Format::Qcow2, &top, Some(1 << 20)).unwrap_err();

        assert!(
            matches!(
                err,
                DiskError::Refused {
                    reason: Rejection::Backing(_),
                    ..
                }
            ),
            "{err}"
        );
        assert!(!top.exists());
    }

    #[test]
    fn create_overlay_existing_output_is_not_clobbered() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 4096);
        let out = dir.path().join("o.qcow2");
        fs::write(&out, b"precious").unwrap();

        let err = create_overlay(&base, Format::Raw, &out, None).unwrap_err();

        assert_eq!(err.kind(), nubo_core::ErrorKind::AlreadyExists);
        assert_eq!(fs::read(&out).unwrap(), b"precious");
    }

    #[test]
    fn overlay_base_raw_rounds_size_up_to_sectors_and_resolves_path() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 1000);

        let b = overlay_base(&dir.path().join(".").join("base.raw"), Format::Raw, None).unwrap();

        assert_eq!((b.path(), b.size()), (fs::canonicalize(&base).unwrap().as_path(), 1024));
    }

    #[test]
    fn overlay_base_declared_format_mismatch_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 4096);

        let err = overlay_base(&base, Format::Qcow2, Some(1 << 20)).unwrap_err();

        assert!(matches!(err, DiskError::FormatMismatch { .. }), "{err}");
    }

    #[test]
    fn create_overlay_smaller_than_base_names_both_sizes() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("b.qcow2");
        create_qcow2(&base, 2 << 30).unwrap();
        let out = dir.path().join("o.qcow2");

        let err = create_overlay(&base, Format::Qcow2, &out, Some(1 << 30)).unwrap_err();

        let msg = err.to_string();
        assert!(msg.contains("1G") && msg.contains("2G"), "{msg}");
        assert!(!out.exists());
    }

    #[test]
    fn create_overlay_wrong_base_format_is_refused_without_residue() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 4096);
        let out = dir.path().join("o.qcow2");

        let err = create_overlay(&base, Format::Qcow2, &out, None).unwrap_err();

        assert!(matches!(
            err,
            DiskError::FormatMismatch {
                expected: Format::Qcow2,
                found: Format::Raw,
                ..
            }
        ));
        assert!(!out.exists());
    }

    #[test]
    fn create_overlay_unaligned_size_is_refused_without_residue() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 4096);
        let out = dir.path().join("o.qcow2");

        let err = create_overlay(&base, Format::Raw, &out, Some(5000)).unwrap_err();

        assert!(matches!(err, DiskError::Unaligned(5000)));
        assert!(!out.exists());
    }

    #[test]
    fn create_overlay_missing_base_is_not_found() {
        let dir = tempfile::tempdir().unwrap();

        let err = create_overlay(&dir.path().join("nope"), Format::Raw, &dir.path().join("o"), None).unwrap_err();

        assert_eq!(err.kind(), nubo_core::ErrorKind::NotFound);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]

        /// Through the file system this time: what create writes, inspect reads back.
        #[test]
        fn create_overlay_any_size_round_trips_through_inspect(extra_sectors in 0u64..(crate::MAX_VIRTUAL_SIZE / 512 - 3)) {
            let dir = tempfile::tempdir().unwrap();
            let base = raw(dir.path(), 1536);
            let out = dir.path().join("o.qcow2");
            let size = 1536 + extra_sectors * 512;

            create_overlay(&base, Format::Raw, &out, Some(size)).unwrap();

            let info = inspect_overlay_chain(&out).unwrap();
            proptest::prop_assert_eq!(info.virtual_size, size);
            proptest::prop_assert_eq!(info.qcow2.unwrap().virtual_size, size);
        }
    }
}
