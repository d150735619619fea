//! Inspecting an image file: the file-level entry points around the pure inspector. Every one
//! opens the path it is given with `O_NONBLOCK` and refuses anything but a regular file before
//! reading a byte (a FIFO cannot hang nubo, `/dev/zero` is not read as a disk), then hands the
//! open file, and only it, to [`crate::inspector`].
//!
//! [`inspect`] is for every image from outside nubo. [`inspect_overlay_chain`] alone follows
//! backing files, and only for files nubo made itself.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::DiskError;
use crate::inspector::{self, InspectError, Policy, Usage};
use crate::qcow2::Qcow2Header;
use crate::source::FileSource;
use crate::Format;

/// The deepest backing chain [`inspect_overlay_chain`] follows. nubo itself makes chains of two
/// (verified base and the VM's overlay) or three (with a snapshot layer); 8 leaves room, while
/// an unbounded chain would make every inspection and every guest read walk as many files as
/// a bug liked.
pub const MAX_BACKING_DEPTH: u32 = 8;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskInfo {
    pub format: Format,
    /// What nubo may do with it: boot it as a base, or only convert it.
    pub usage: Usage,
    /// Bytes the guest sees.
    pub virtual_size: u64,
    /// Bytes allocated on the host's disk for this file alone (sparse files count what is
    /// allocated, as `qemu-img info`'s "disk size" does).
    pub actual_size: u64,
    pub cluster_size: Option<u32>,
    /// Always `None` from [`inspect`] (an image with a backing file is refused); set by
    /// [`inspect_overlay_chain`].
    pub backing: Option<Backing>,
    /// How many images lie below this one (0: no backing file).
    pub chain_depth: u32,
    /// The full header, for qcow2 images.
    pub qcow2: Option<Qcow2Header>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Backing {
    /// The backing file, resolved against the image's directory when stored relative.
    pub file: PathBuf,
    /// The format the image records for it (nubo's overlays always record one).
    pub format: Option<Format>,
}

/// Inspects an image from outside nubo (import, pull, `--url-img`, `--disk`, convert): the
/// format is identified from the bytes, and the image accepted only when it is on the allowlist
/// and self-contained (see [`crate::inspector`]). Opens `path` and nothing else.
pub fn inspect(path: &Path) -> Result<DiskInfo, DiskError> {
    Ok(inspect_one(path, Policy::Untrusted)?.0)
}

/// [`inspect`], returning the open file as well: a caller that hands the image to another
/// program (qemu-img) passes this descriptor, so the program reads exactly the bytes inspected,
/// whatever is renamed onto `path` meanwhile.
pub fn open_inspected(path: &Path) -> Result<(DiskInfo, File), DiskError> {
    let (info, _, src) = inspect_one(path, Policy::Untrusted)?;
    Ok((info, src.into_file()))
}

/// [`inspect`], and the image must be what `format` says (a declared raw image may be an ISO,
/// which QEMU reads with the raw driver too).
pub fn inspect_as(path: &Path, format: Format) -> Result<DiskInfo, DiskError> {
    let info = inspect(path)?;
    check_declared(path, format, info.format)?;
    Ok(info)
}

/// [`inspect`], and the image must be one nubo boots as a base under an overlay (qcow2, raw,
/// ISO, sparse VMDK); VDI, VHDX and VHD are refused with the fix (import them, which converts
/// them). What `vm create --disk` calls.
pub fn inspect_base(path: &Path) -> Result<DiskInfo, DiskError> {
    let info = inspect(path)?;
    if info.usage != Usage::Base {
        return Err(DiskError::NotBase {
            path: path.to_path_buf(),
            format: info.format,
        });
    }
    Ok(info)
}

/// Inspects a qcow2 overlay **nubo made itself** (a VM's disk, a snapshot layer) and walks its
/// backing chain. Never for a file a user named: the chain is followed, so a hostile image
/// would have nubo read the files it names. Each link must record its backing file's format
/// (nothing is probed) and be a local path; the chain is bounded by [`MAX_BACKING_DEPTH`] and
/// loops are refused; the bottom image must pass [`inspect`]'s rules.
pub fn inspect_overlay_chain(path: &Path) -> Result<DiskInfo, DiskError> {
    let (mut top, id, _) = inspect_one(path, Policy::OwnOverlay)?;
    let mut seen = vec![id];
    let mut next = top.backing.clone();
    let mut image = path.to_path_buf();
    while let Some(b) = next {
        top.chain_depth += 1;
        if top.chain_depth > MAX_BACKING_DEPTH {
            return Err(DiskError::ChainTooDeep {
                path: path.to_path_buf(),
                max: MAX_BACKING_DEPTH,
            });
        }
        let (info, id, _) = inspect_one(&b.file, Policy::OwnOverlay).map_err(|e| match e {
            DiskError::NotFound(backing) => DiskError::MissingBacking {
                image: image.clone(),
                backing,
            },
            other => other,
        })?;
        if let Some(declared) = b.format {
            check_declared(&b.file, declared, info.format)?;
        }
        if seen.contains(&id) {
            return Err(DiskError::ChainLoop {
                path: path.to_path_buf(),
                repeated: b.file,
            });
        }
        seen.push(id);
        image = b.file;
        next = info.backing;
    }
    Ok(top)
}

fn check_declared(path: &Path, declared: Format, found: Format) -> Result<(), DiskError> {
    let same = declared == found || (declared.qemu_driver() == "raw" && found.qemu_driver() == "raw");
    if !same {
        return Err(DiskError::FormatMismatch {
            path: path.to_path_buf(),
            expected: declared,
            found,
        });
    }
    Ok(())
}

/// Opens `path` as a regular file without blocking, for reading only.
pub(crate) fn open_image(path: &Path) -> Result<FileSource, DiskError> {
    let file = nubo_core::file::open_regular(path, "disk image").map_err(|e| match e {
        e if e.is_not_found() => DiskError::NotFound(path.to_path_buf()),
        other => DiskError::File(other),
    })?;
    FileSource::new(file).map_err(|e| DiskError::io("stat", path, e))
}

/// One image, without its chain, its (device, inode) for loop detection, and the open file.
pub(crate) fn inspect_one(path: &Path, policy: Policy) -> Result<(DiskInfo, (u64, u64), FileSource), DiskError> {
    let src = open_image(path)?;
    let meta = src.file().metadata().map_err(|e| DiskError::io("stat", path, e))?;
    let found = inspector::inspect_with(&src, policy).map_err(|e| match e {
        InspectError::Rejected(reason) => DiskError::Refused {
            path: path.to_path_buf(),
            reason,
        },
        InspectError::Io(e) => DiskError::io("read", path, e),
    })?;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let info = DiskInfo {
        format: found.format,
        usage: found.usage,
        virtual_size: found.virtual_size,
        actual_size: meta.blocks() * 512,
        cluster_size: found.cluster_size,
        backing: found.backing.map(|(name, format)| Backing {
            file: dir.join(name),
            format: Some(format),
        }),
        chain_depth: 0,
        qcow2: found.qcow2,
    };
    Ok((info, (meta.dev(), meta.ino()), src))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::create::{write_new, Sync};
    use crate::inspector::Rejection;
    use crate::layout::{layout, BackingRef};
    use std::fs;

    /// A qcow2 at `path` whose backing name is stored verbatim (for chains nubo would not make).
    fn qcow2_backed_by(path: &Path, name: &str, driver: &str) {
        write_new(
            path,
            &layout(1 << 20, Some(BackingRef { name, driver })).unwrap(),
            Sync::Durable,
        )
        .unwrap();
    }

    fn raw(dir: &Path, len: usize) -> PathBuf {
        let p = dir.join("base.raw");
        fs::write(&p, vec![7u8; len]).unwrap();
        p
    }

    #[test]
    fn inspect_backed_qcow2_is_refused_naming_backing_file() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("evil.qcow2");
        qcow2_backed_by(&img, "/etc/shadow", "raw");

        let err = inspect(&img).unwrap_err();

        assert!(
            matches!(&err, DiskError::Refused { reason: Rejection::Backing(n), .. } if n == "/etc/shadow"),
            "{err}"
        );
        assert!(err.to_string().contains("evil.qcow2"), "{err}");
    }

    #[test]
    fn inspect_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();

        let err = inspect(&p).unwrap_err();

        assert!(err.to_string().contains("FIFO"), "{err}");
    }

    #[test]
    fn inspect_dev_zero_is_refused() {
        let err = inspect(Path::new("/dev/zero")).unwrap_err();

        assert!(err.to_string().contains("character device"), "{err}");
    }

    #[test]
    fn inspect_empty_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty");
        fs::write(&p, b"").unwrap();

        let err = inspect(&p).unwrap_err();

        assert!(
            matches!(
                err,
                DiskError::Refused {
                    reason: Rejection::Empty,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn inspect_missing_file_is_not_found() {
        let err = inspect(Path::new("/nonexistent/nubo/x.qcow2")).unwrap_err();

        assert!(matches!(err, DiskError::NotFound(_)), "{err}");
    }

    #[test]
    fn inspect_base_vdi_is_not_a_base() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("d.vdi");
        fs::write(&p, crate::inspector::tests::vdi_image(1, 1 << 20)).unwrap();

        let err = inspect_base(&p).unwrap_err();

        assert!(
            matches!(
                err,
                DiskError::NotBase {
                    format: Format::Vdi,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn inspect_as_qcow2_of_raw_file_is_mismatch() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 4096);

        let err = inspect_as(&base, Format::Qcow2).unwrap_err();

        assert!(matches!(err, DiskError::FormatMismatch { .. }), "{err}");
    }

    #[test]
    fn overlay_chain_self_referencing_backing_is_a_loop() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("loop.qcow2");
        qcow2_backed_by(&img, "loop.qcow2", "qcow2");

        let err = inspect_overlay_chain(&img).unwrap_err();

        assert!(matches!(err, DiskError::ChainLoop { .. }), "{err}");
    }

    #[test]
    fn overlay_chain_two_image_cycle_is_a_loop() {
        let dir = tempfile::tempdir().unwrap();
        qcow2_backed_by(&dir.path().join("a"), "b", "qcow2");
        qcow2_backed_by(&dir.path().join("b"), "a", "qcow2");

        let err = inspect_overlay_chain(&dir.path().join("a")).unwrap_err();

        assert!(matches!(err, DiskError::ChainLoop { .. }), "{err}");
    }

    #[test]
    fn overlay_chain_relative_backing_resolves_against_image_dir() {
        let dir = tempfile::tempdir().unwrap();
        raw(dir.path(), 4096);
        let img = dir.path().join("o.qcow2");
        qcow2_backed_by(&img, "base.raw", "raw");

        let info = inspect_overlay_chain(&img).unwrap();

        assert_eq!(info.backing.unwrap().file, dir.path().join("base.raw"));
        assert_eq!(info.chain_depth, 1);
    }

    #[test]
    fn overlay_chain_missing_backing_names_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("o.qcow2");
        qcow2_backed_by(&img, "gone.raw", "raw");

        let err = inspect_overlay_chain(&img).unwrap_err();

        assert!(matches!(err, DiskError::MissingBacking { .. }));
        assert!(err.to_string().contains("gone.raw") && err.to_string().contains("o.qcow2"));
    }

    #[test]
    fn overlay_chain_protocol_backing_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("o.qcow2");
        qcow2_backed_by(&img, "nbd:127.0.0.1:10809", "raw");

        let err = inspect_overlay_chain(&img).unwrap_err();

        assert!(
            matches!(
                err,
                DiskError::Refused {
                    reason: Rejection::BackingProtocol(_),
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn overlay_chain_unknown_backing_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        raw(dir.path(), 4096);
        let img = dir.path().join("o.qcow2");
        qcow2_backed_by(&img, "base.raw", "qed");

        let err = inspect_overlay_chain(&img).unwrap_err();

        assert!(
            matches!(
                err,
                DiskError::Refused {
                    reason: Rejection::BackingUnformatted(_),
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn inspect_raw_file_size_is_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 3000);

        let info = inspect(&base).unwrap();

        assert_eq!(
            (info.format, info.virtual_size, info.cluster_size, info.usage),
            (Format::Raw, 3000, None, Usage::Base)
        );
    }
}
