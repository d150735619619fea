//! `import`: a local disk image into the store. qcow2 is copied (hashed in the same pass); every
//! other format is converted to qcow2 with qemu-img, since overlays need a qcow2 or raw base and
//! qcow2 keeps the store small.

use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use nubo_disk::Format;

use crate::convert::{convert, ConvertError, ConvertSpec};
use crate::digest::{hash_file, AlignedBuf, StreamHasher, CHUNK};
use crate::pull::{now, DEFAULT_MEMORY_MIB, DEFAULT_VCPUS};
use crate::record::{ImageRecord, ImageSource, SourceKind};
use crate::reference::ImageRef;
use crate::store::{Added, ImageStore, Overwrite, StoreError};
use crate::Algorithm;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImportRequest {
    pub file: PathBuf,
    pub reference: ImageRef,
    /// No cloud-init: VMs from it get no seed and refuse personalisation options.
    pub appliance: bool,
    pub default_vcpus: Option<u32>,
    pub default_memory_mib: Option<u64>,
    /// Re-point `reference` if it already names another image (otherwise refused).
    pub force: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{} is an ISO image, not a disk: attach it with the VM's options instead", .0.display())]
    Iso(PathBuf),
    #[error("{} has a backing file, which QEMU would read too: nubo imports and converts only self-contained images; flatten it with `qemu-img convert -O qcow2` where you trust every file it names, and import the result", .0.display())]
    Backing(PathBuf),
    #[error("inspecting {}", path.display())]
    Disk {
        path: PathBuf,
        #[source]
        source: nubo_disk::DiskError,
    },
    #[error("copying {} into the image store", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Convert(#[from] ConvertError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ImportError {
    pub fn kind(&self) -> nubo_core::ErrorKind {
        use nubo_core::ErrorKind;
        match self {
            ImportError::Iso(_) | ImportError::Backing(_) => ErrorKind::Unsupported,
            ImportError::Disk { source, .. } => source.kind(),
            ImportError::Io { .. } => ErrorKind::Io,
            ImportError::Convert(e) => e.kind(),
            ImportError::Store(e) => e.kind(),
        }
    }
}

/// Imports `req.file` under `req.reference`. An existing tag with another digest is refused
/// unless `req.force`; the same bytes again are [`crate::store::TagChange::Unchanged`].
pub fn import(store: &ImageStore, req: &ImportRequest) -> Result<Added, ImportError> {
    let disk = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ImportError::Disk { path, source }
    };
    let info = nubo_disk::inspect(&req.file).map_err(disk(&req.file))?;
    if info.format == Format::Iso {
        return Err(ImportError::Iso(req.file.clone()));
    }
    if info.backing.is_some() {
        return Err(ImportError::Backing(req.file.clone()));
    }
    let tmp = store
        .tmp_dir()
        .join(format!("import-{}.qcow2", nubo_core::atomic::unique_tag()));
    let result = (|| {
        let digest = if info.format == Format::Qcow2 {
            copy_hashing(&req.file, &tmp)?
        } else {
            convert(&ConvertSpec {
                src: req.file.clone(),
                src_format: info.format,
                to: Format::Qcow2,
                out: tmp.clone(),
                compress: false,
            })?;
            hash_file(&tmp, Algorithm::Sha256)
                .map_err(|source| ImportError::Io {
                    path: tmp.clone(),
                    source,
                })?
                .to_string()
        };
        // Inspect the copy, not the source: the source may change under us.
        let stored = nubo_disk::inspect(&tmp).map_err(disk(&tmp))?;
        let size = fs::metadata(&tmp)
            .map_err(|source| ImportError::Io {
                path: tmp.clone(),
                source,
            })?
            .len();
        let abs = fs::canonicalize(&req.file).unwrap_or_else(|_| req.file.clone());
        let record = ImageRecord {
            reference: req.reference.to_string(),
            digest,
            path: PathBuf::new(),
            format: stored.format.as_str().to_owned(),
            size,
            virtual_size: stored.virtual_size,
            cloud_init: !req.appliance,
            os: None,
            release: None,
            arch: "x86_64".into(),
            firmware: vec![],
            boot: None,
            default_vcpus: req.default_vcpus.unwrap_or(DEFAULT_VCPUS),
            default_memory_mib: req.default_memory_mib.unwrap_or(DEFAULT_MEMORY_MIB),
            default_user: None,
            hypervisor: None,
            source: ImageSource {
                url: Some(abs.display().to_string()),
                ..ImageSource::new(SourceKind::Import)
            },
            verified: false,
            created: now(),
            build_seconds: None,
            labels: Default::default(),
            build: None,
        };
        Ok(store.commit(&tmp, record, Overwrite::from_force(req.force))?)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Copies `src` to `dst`, fsynced, returning `sha256:<hex>` of the bytes written.
fn copy_hashing(src: &Path, dst: &Path) -> Result<String, ImportError> {
    let io_src = |source| ImportError::Io {
        path: src.to_path_buf(),
        source,
    };
    let io_dst = |source| ImportError::Io {
        path: dst.to_path_buf(),
        source,
    };
    let mut input = nubo_core::file::open_regular(src, "disk image").map_err(|e| ImportError::Io {
        path: src.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
    })?;
    let mut output = nubo_core::fsmode::open(
        fs::OpenOptions::new().write(true).create(true).truncate(true),
        dst,
        nubo_core::fsmode::PRIVATE,
    )
    .map_err(io_dst)?;
    let mut h = StreamHasher::new(None);
    let mut buf = AlignedBuf::new(CHUNK);
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_src(e)),
        };
        h.update(&buf[..n]);
        output.write_all(&buf[..n]).map_err(io_dst)?;
    }
    output.sync_all().map_err(io_dst)?;
    Ok(h.finish().sha256.to_string())
}
