//! Inspecting an image on disk and following its backing chain.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::DiskError;
use crate::foreign::{self, FOREIGN_HEADER_LEN, VHDX_REGION_TABLE_AT};
use crate::qcow2::{self, Qcow2Header, INCOMPAT_DATA_FILE};
use crate::{sniff, Format, SNIFF_LEN};

/// The deepest backing chain nubo follows. nubo itself makes chains of two (verified base and
/// the VM's overlay) or three (with a snapshot layer); 8 leaves room for images built
/// elsewhere, while an unbounded chain from a downloaded image would make every inspection
/// and every guest read walk as many files as the image's author liked.
pub const MAX_BACKING_DEPTH: u32 = 8;

/// qcow2 clusters are at most 2 MiB, so the first cluster read for the header is bounded.
const MAX_CLUSTER: usize = 2 << 20;
/// qemu-img makes 1 MiB VHDX metadata regions; anything larger is not one nubo reads.
const MAX_VHDX_METADATA: u32 = 1 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DiskInfo {
    pub format: Format,
    /// Bytes the guest sees.
    pub virtual_size: u64,
    /// Bytes allocated on the host's disk for this file alone (sparse files count what is
    /// allocated, as `qemu-img info`'s "disk size" does).
    pub actual_size: u64,
    pub cluster_size: Option<u32>,
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
    /// The format the image records for it; `None` means qemu would probe it.
    pub format: Option<Format>,
}

/// Inspects `path`, sniffing its format, and walks its whole backing chain, refusing chains
/// deeper than [`MAX_BACKING_DEPTH`], loops, protocol names and qcow2 features nubo cannot
/// account for (external data files, unknown incompatible bits).
pub fn inspect(path: &Path) -> Result<DiskInfo, DiskError> {
    inspect_chain(path, None)
}

/// Like [`inspect`], but opens `path` as `format` the way qemu would with `format=`: a raw
/// image is not probed, and any other format must be what the file is.
pub fn inspect_as(path: &Path, format: Format) -> Result<DiskInfo, DiskError> {
    inspect_chain(path, Some(format))
}

fn inspect_chain(path: &Path, format: Option<Format>) -> Result<DiskInfo, DiskError> {
    let (mut top, id) = inspect_one(path, format)?;
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
        let (info, id) = inspect_one(&b.file, b.format).map_err(|e| match e {
            DiskError::NotFound(backing) => DiskError::MissingBacking {
                image: image.clone(),
                backing,
            },
            other => other,
        })?;
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

/// One image, without its chain, and its (device, inode) for loop detection.
fn inspect_one(path: &Path, declared: Option<Format>) -> Result<(DiskInfo, (u64, u64)), DiskError> {
    let file = File::open(path).map_err(|e| DiskError::io("open", path, e))?;
    let meta = file.metadata().map_err(|e| DiskError::io("stat", path, e))?;
    let head = read_at(&file, path, 0, SNIFF_LEN)?;
    let sniffed = sniff(&head);
    let format = match declared {
        // qemu opens a declared raw image as raw whatever its bytes say; so does nubo.
        Some(d) if d.qemu_driver() == "raw" => d,
        Some(d) if d != sniffed => {
            return Err(DiskError::FormatMismatch {
                path: path.to_path_buf(),
                expected: d,
                found: sniffed,
            })
        }
        _ => sniffed,
    };
    let mut info = DiskInfo {
        format,
        virtual_size: meta.len(),
        actual_size: meta.blocks() * 512,
        cluster_size: None,
        backing: None,
        chain_depth: 0,
        qcow2: None,
    };
    match format {
        Format::Raw | Format::Iso => {}
        Format::Qcow2 => {
            let h = read_qcow2(&file, path, head)?;
            info.virtual_size = h.virtual_size;
            info.cluster_size = Some(h.cluster_size());
            info.backing = backing_of(path, &h)?;
            info.qcow2 = Some(h);
        }
        Format::Vhdx => {
            let table = read_at(&file, path, VHDX_REGION_TABLE_AT as u64, 64 << 10)?;
            let (at, len) = foreign::vhdx_metadata_region(&table).map_err(DiskError::at(path))?;
            let meta = read_at(&file, path, at, len.min(MAX_VHDX_METADATA) as usize)?;
            let f = foreign::parse_vhdx(&meta).map_err(DiskError::at(path))?;
            (info.virtual_size, info.cluster_size) = (f.virtual_size, f.cluster_size);
        }
        Format::Vmdk | Format::Vdi | Format::Vpc => {
            let bytes = &head[..head.len().min(FOREIGN_HEADER_LEN)];
            let f = foreign::parse_foreign(format, bytes).map_err(DiskError::at(path))?;
            (info.virtual_size, info.cluster_size) = (f.virtual_size, f.cluster_size);
        }
    }
    Ok((info, (meta.dev(), meta.ino())))
}

fn read_qcow2(file: &File, path: &Path, head: Vec<u8>) -> Result<Qcow2Header, DiskError> {
    // The header, its extensions and the backing name all lie in the first cluster.
    let cluster_bits = head
        .get(20..24)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let cluster = 1usize.checked_shl(cluster_bits).unwrap_or(MAX_CLUSTER).min(MAX_CLUSTER);
    let bytes = if cluster > head.len() {
        read_at(file, path, 0, cluster)?
    } else {
        head
    };
    let h = qcow2::parse_qcow2_header(&bytes).map_err(DiskError::at(path))?;
    let unknown = h.unknown_incompatible();
    if unknown != 0 {
        let what = format!("incompatible feature bits {unknown:#x}");
        return Err(DiskError::Features {
            path: path.to_path_buf(),
            what,
        });
    }
    if h.incompatible_features & INCOMPAT_DATA_FILE != 0 || h.data_file.is_some() {
        let what = format!("external data file `{}`", h.data_file.as_deref().unwrap_or(""));
        return Err(DiskError::Features {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(h)
}

fn backing_of(path: &Path, h: &Qcow2Header) -> Result<Option<Backing>, DiskError> {
    let Some(name) = h.backing_file.as_deref() else {
        return Ok(None);
    };
    if has_protocol(name) {
        return Err(DiskError::BackingProtocol {
            path: path.to_path_buf(),
            name: name.to_owned(),
        });
    }
    let format = match h.backing_format.as_deref() {
        None => None,
        Some(f) => Some(f.parse::<Format>().map_err(|_| DiskError::UnknownBackingFormat {
            path: path.to_path_buf(),
            name: f.to_owned(),
        })?),
    };
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok(Some(Backing {
        file: dir.join(name),
        format,
    }))
}

/// qemu's `path_has_protocol`: a colon before the first slash makes `nbd:host:port`,
/// `json:{...}` or `http://...` a protocol, not a file nubo can check.
fn has_protocol(name: &str) -> bool {
    let first = name.find(['/', ':']);
    first.is_some_and(|i| name.as_bytes()[i] == b':')
}

/// Up to `len` bytes from `offset`; fewer only at end of file.
fn read_at(file: &File, path: &Path, offset: u64, len: usize) -> Result<Vec<u8>, DiskError> {
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(DiskError::io("read", path, e)),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::create::write_new;
    use crate::layout::{layout, BackingRef};
    use std::fs;

    /// A qcow2 at `path` whose backing name is stored verbatim (for chains nubo would not make).
    fn qcow2_backed_by(path: &Path, name: &str, driver: &str) {
        write_new(path, &layout(1 << 20, Some(BackingRef { name, driver })).unwrap()).unwrap();
    }

    fn raw(dir: &Path, len: usize) -> PathBuf {
        let p = dir.join("base.raw");
        fs::write(&p, vec![7u8; len]).unwrap();
        p
    }

    #[test]
    fn has_protocol_colon_before_slash_is_protocol() {
        assert!(has_protocol("nbd:127.0.0.1:10809"));
        assert!(has_protocol("json:{\"driver\":\"file\"}"));
        assert!(has_protocol("http://example.invalid/x"));
    }

    #[test]
    fn has_protocol_plain_paths_are_files() {
        assert!(!has_protocol("/var/lib/nubo/images/a:b.qcow2"));
        assert!(!has_protocol("./base:1.qcow2"));
        assert!(!has_protocol("base.qcow2"));
    }

    #[test]
    fn inspect_self_referencing_backing_is_a_loop() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("loop.qcow2");
        qcow2_backed_by(&img, "loop.qcow2", "qcow2");

        let err = inspect(&img).unwrap_err();

        assert!(matches!(err, DiskError::ChainLoop { .. }), "{err}");
    }

    #[test]
    fn inspect_two_image_cycle_is_a_loop() {
        let dir = tempfile::tempdir().unwrap();
        qcow2_backed_by(&dir.path().join("a"), "b", "qcow2");
        qcow2_backed_by(&dir.path().join("b"), "a", "qcow2");

        let err = inspect(&dir.path().join("a")).unwrap_err();

        assert!(matches!(err, DiskError::ChainLoop { .. }), "{err}");
    }

    #[test]
    fn inspect_relative_backing_resolves_against_image_dir() {
        let dir = tempfile::tempdir().unwrap();
        raw(dir.path(), 4096);
        let img = dir.path().join("o.qcow2");
        qcow2_backed_by(&img, "base.raw", "raw");

        let info: DiskInfo = inspect(&img).unwrap();

        assert_eq!(info.backing.unwrap().file, dir.path().join("base.raw"));
    }

    #[test]
    fn inspect_missing_backing_names_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("o.qcow2");
        qcow2_backed_by(&img, "gone.raw", "raw");

        let err = inspect(&img).unwrap_err();

        assert!(matches!(err, DiskError::MissingBacking { .. }));
        assert!(err.to_string().contains("gone.raw") && err.to_string().contains("o.qcow2"));
    }

    #[test]
    fn inspect_protocol_backing_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("o.qcow2");
        qcow2_backed_by(&img, "nbd:127.0.0.1:10809", "raw");

        let err = inspect(&img).unwrap_err();

        assert!(matches!(err, DiskError::BackingProtocol { .. }));
    }

    #[test]
    fn inspect_unknown_backing_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        raw(dir.path(), 4096);
        let img = dir.path().join("o.qcow2");
        qcow2_backed_by(&img, "base.raw", "qed");

        let err = inspect(&img).unwrap_err();

        assert!(matches!(err, DiskError::UnknownBackingFormat { .. }));
    }

    #[test]
    fn inspect_raw_file_size_is_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let base = raw(dir.path(), 3000);

        let info = inspect(&base).unwrap();

        assert_eq!(
            (info.format, info.virtual_size, info.cluster_size),
            (Format::Raw, 3000, None)
        );
    }
}
