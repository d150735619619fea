//! The content-addressed image store.
//!
//! ```text
//! images/
//!   blobs/<sha256-hex>.<format>   verified bases, mode 0444, never modified once here
//!   boot/<sha256-hex>/            kernel and initrd extracted for direct-kernel boot (0444)
//!   refs/<name>/<tag>.json        ImageRecord: a name pointing at a digest
//!   tmp/                          partial downloads and builds; same filesystem as blobs/
//! ```

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nubo_core::ErrorKind;

use crate::record::ImageRecord;
use crate::reference::ImageRef;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("image `{0}` is not in the store: run `nubo image ls` to see what is, or `nubo image pull`/`nubo image bootstrap` it")]
    NotFound(String),
    #[error("image record {} is corrupt", path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("digest `{0}` is not `sha256:<64 hex digits>`")]
    BadDigest(String),
    #[error("image store {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::NotFound(_) => ErrorKind::NotFound,
            StoreError::Corrupt { .. } | StoreError::BadDigest(_) => ErrorKind::Integrity,
            StoreError::Io { .. } => ErrorKind::Io,
        }
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[derive(Debug, Clone)]
pub struct ImageStore {
    dir: PathBuf,
}

impl ImageStore {
    /// Opens (creating if needed) the store at `dir`, normally `Roots::images()`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        for sub in ["blobs", "boot", "refs", "tmp"] {
            let p = dir.join(sub);
            fs::create_dir_all(&p).map_err(io_at(&p))?;
        }
        Ok(ImageStore { dir: dir.to_path_buf() })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where partial files go; on the store's filesystem so the final rename is atomic.
    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    pub fn blob_path(&self, digest: &str, format: &str) -> Result<PathBuf, StoreError> {
        Ok(self.dir.join("blobs").join(format!("{}.{format}", digest_hex(digest)?)))
    }

    fn record_path(&self, r: &ImageRef) -> PathBuf {
        self.dir.join("refs").join(&r.name).join(format!("{}.json", r.tag))
    }

    /// Moves a finished, verified file into the store, makes it read-only and records it under
    /// `record.reference`. `record.digest` must be the file's sha256; `record.path` is set here.
    pub fn add(&self, src: &Path, mut record: ImageRecord) -> Result<ImageRecord, StoreError> {
        let r = ImageRef::parse(&record.reference).map_err(|_| StoreError::NotFound(record.reference.clone()))?;
        let blob = self.blob_path(&record.digest, &record.format)?;
        if blob.exists() {
            // Same digest, same bytes: keep the existing read-only copy.
            fs::remove_file(src).map_err(io_at(src))?;
        } else {
            fs::rename(src, &blob).map_err(io_at(&blob))?;
        }
        fs::set_permissions(&blob, fs::Permissions::from_mode(0o444)).map_err(io_at(&blob))?;
        record.path = blob;
        record.reference = r.to_string();
        self.write_record(&r, &record)?;
        Ok(record)
    }

    /// Moves extracted kernel/initrd next to the blob of `digest`, read-only.
    pub fn add_boot_files(
        &self,
        digest: &str,
        kernel: &Path,
        initrd: Option<&Path>,
    ) -> Result<(PathBuf, Option<PathBuf>), StoreError> {
        let dir = self.dir.join("boot").join(digest_hex(digest)?);
        fs::create_dir_all(&dir).map_err(io_at(&dir))?;
        let place = |src: &Path, name: &str| -> Result<PathBuf, StoreError> {
            let dst = dir.join(name);
            fs::rename(src, &dst).map_err(io_at(&dst))?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(0o444)).map_err(io_at(&dst))?;
            Ok(dst)
        };
        let k = place(kernel, "vmlinuz")?;
        let i = initrd.map(|p| place(p, "initrd.img")).transpose()?;
        Ok((k, i))
    }

    pub fn write_record(&self, r: &ImageRef, record: &ImageRecord) -> Result<(), StoreError> {
        let path = self.record_path(r);
        let parent = path.parent().expect("record paths have a parent");
        fs::create_dir_all(parent).map_err(io_at(parent))?;
        nubo_core::write_json_atomic(&path, record).map_err(io_at(&path))
    }

    pub fn get(&self, r: &ImageRef) -> Result<Option<ImageRecord>, StoreError> {
        let path = self.record_path(r);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| StoreError::Corrupt { path, source }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_at(&path)(e)),
        }
    }

    /// Like [`get`](Self::get), but a missing image is an error naming it.
    pub fn require(&self, r: &ImageRef) -> Result<ImageRecord, StoreError> {
        self.get(r)?.ok_or_else(|| StoreError::NotFound(r.to_string()))
    }

    /// Every record, sorted by reference.
    pub fn list(&self) -> Result<Vec<ImageRecord>, StoreError> {
        let refs = self.dir.join("refs");
        let mut out = Vec::new();
        for name in fs::read_dir(&refs).map_err(io_at(&refs))? {
            let name = name.map_err(io_at(&refs))?.path();
            if !name.is_dir() {
                continue;
            }
            for tag in fs::read_dir(&name).map_err(io_at(&name))? {
                let path = tag.map_err(io_at(&name))?.path();
                if path.extension().is_some_and(|e| e == "json") {
                    let bytes = fs::read(&path).map_err(io_at(&path))?;
                    let rec = serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt { path, source })?;
                    out.push(rec);
                }
            }
        }
        out.sort_by(|a: &ImageRecord, b| a.reference.cmp(&b.reference));
        Ok(out)
    }

    /// Removes the reference, and the blob and boot files when no other reference points at
    /// the same digest. Whether a VM still uses the image is the caller's check.
    pub fn remove(&self, r: &ImageRef) -> Result<ImageRecord, StoreError> {
        let rec = self.require(r)?;
        let path = self.record_path(r);
        fs::remove_file(&path).map_err(io_at(&path))?;
        if !self.list()?.iter().any(|o| o.digest == rec.digest) {
            remove_if_exists(&rec.path)?;
            let boot = self.dir.join("boot").join(digest_hex(&rec.digest)?);
            match fs::remove_dir_all(&boot) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&boot)(e)),
                _ => {}
            }
        }
        Ok(rec)
    }
}

fn remove_if_exists(p: &Path) -> Result<(), StoreError> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_at(p)(e)),
        _ => Ok(()),
    }
}

/// The hex part of `sha256:<hex>`, validated so it is safe as a file name.
pub fn digest_hex(digest: &str) -> Result<&str, StoreError> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) => Ok(h),
        _ => Err(StoreError::BadDigest(digest.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{ImageSource, SourceKind};

    fn record(reference: &str, digest: &str) -> ImageRecord {
        ImageRecord {
            reference: reference.into(),
            digest: digest.into(),
            path: PathBuf::new(),
            format: "qcow2".into(),
            size: 3,
            virtual_size: 1 << 30,
            cloud_init: true,
            os: Some("debian".into()),
            release: Some("12".into()),
            arch: "x86_64".into(),
            firmware: vec![],
            boot: None,
            default_vcpus: 1,
            default_memory_mib: 1024,
            default_user: None,
            hypervisor: None,
            source: ImageSource {
                kind: SourceKind::Import,
                url: None,
                checksum: None,
                serial: None,
                recipe: None,
            },
            verified: true,
            created: "2026-12-01T00:00:00Z".into(),
            build_seconds: None,
        }
    }

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

    #[test]
    fn add_makes_blob_read_only_and_records_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let src = store.tmp_dir().join("x");
        fs::write(&src, b"abc").unwrap();

        let rec = store.add(&src, record("debian:bookworm", D1)).unwrap();

        assert_eq!(rec.reference, "debian:12");
        assert_eq!(fs::metadata(&rec.path).unwrap().permissions().mode() & 0o777, 0o444);
        assert_eq!(store.require(&ImageRef::parse("debian:12").unwrap()).unwrap(), rec);
        assert!(!src.exists());
    }

    #[test]
    fn remove_keeps_blob_shared_by_another_ref() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        for r in ["a:1", "b:1"] {
            let src = store.tmp_dir().join(r);
            fs::write(&src, b"abc").unwrap();
            store.add(&src, record(r, D1)).unwrap();
        }

        let rec = store.remove(&ImageRef::parse("a:1").unwrap()).unwrap();

        assert!(rec.path.exists());
        assert_eq!(store.list().unwrap().len(), 1);
    }

    #[test]
    fn remove_last_ref_deletes_blob() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let src = store.tmp_dir().join("x");
        fs::write(&src, b"abc").unwrap();
        let rec = store.add(&src, record("a:1", D1)).unwrap();

        store.remove(&ImageRef::parse("a:1").unwrap()).unwrap();

        assert!(!rec.path.exists());
    }

    #[test]
    fn require_missing_names_image() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();

        let err = store.require(&ImageRef::parse("nope:1").unwrap()).unwrap_err();

        assert!(err.to_string().contains("`nope:1`"));
    }

    #[test]
    fn digest_hex_rejects_traversal() {
        assert!(digest_hex("sha256:../../etc").is_err());
    }
}
