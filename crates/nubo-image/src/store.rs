//! The content-addressed image store.
//!
//! ```text
//! images/
//!   blobs/<sha256-hex>.<format>   verified bases, mode 0444, never modified once here
//!   boot/<sha256-hex>/            kernel and initrd extracted for direct-kernel boot (0444)
//!   refs/<name>/<tag>.json        ImageRecord: a name pointing at a digest
//!   tmp/                          partial downloads and builds; same filesystem as blobs/
//! ```
//!
//! A tag is never re-pointed silently: [`ImageStore::commit`] refuses an existing tag with
//! another digest unless told to [`Overwrite::Replace`], and reports what it replaced. The
//! replaced blob stays until [`ImageStore::prune`], which also removes stale partial downloads
//! and empty `refs/<name>/` directories. Tag writes and prune hold one store-wide lock, so prune
//! never sees a blob that is about to be tagged as unreferenced.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nubo_core::{fsmode, ErrorKind, FileError};
use serde::Serialize;

use crate::lock::TargetLock;
use crate::record::ImageRecord;
use crate::reference::ImageRef;

/// A record is a few hundred bytes; anything this large in `refs/` is not one.
const MAX_RECORD: u64 = 1 << 20;

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
    #[error("image `{reference}` already exists ({digest}, {}): pass --force to replace it (the old image is kept until `nubo image prune`), or choose another tag", if *verified { "verified" } else { "unverified" })]
    TagExists {
        reference: String,
        digest: String,
        verified: bool,
    },
    #[error("image record {} cannot be read: prune cannot tell whether its blob is in use; remove or repair the file and prune again", path.display())]
    PruneBlocked {
        path: PathBuf,
        #[source]
        source: Box<StoreError>,
    },
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
            StoreError::TagExists { .. } => ErrorKind::AlreadyExists,
            StoreError::PruneBlocked { .. } => ErrorKind::InvalidState,
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

/// What to do when a tag already points at another digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    Refuse,
    Replace,
}

impl Overwrite {
    pub fn from_force(force: bool) -> Self {
        if force {
            Overwrite::Replace
        } else {
            Overwrite::Refuse
        }
    }
}

/// What tagging did to the reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "kebab-case")]
pub enum TagChange {
    /// The tag did not exist.
    Created,
    /// The tag already pointed at this digest; only its record was refreshed.
    Unchanged,
    /// The tag pointed at `digest`; that blob stays until `prune` if nothing else uses it.
    Replaced { digest: String, verified: bool },
}

/// A stored image and what happened to its tag.
#[derive(Debug, Clone, PartialEq)]
pub struct Added {
    pub record: ImageRecord,
    pub change: TagChange,
}

/// A `refs/` entry that could not be read as a record.
#[derive(Debug)]
pub struct BadRecord {
    pub path: PathBuf,
    pub error: StoreError,
}

/// Every readable record, and the files that are not.
#[derive(Debug, Default)]
pub struct Listing {
    pub records: Vec<ImageRecord>,
    pub bad: Vec<BadRecord>,
}

/// One thing prune removed (or, in a dry run, would remove).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pruned {
    /// `blob`, `boot`, `partial` or `empty-ref-dir`.
    pub kind: &'static str,
    pub path: PathBuf,
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneReport {
    pub dry_run: bool,
    pub removed: Vec<Pruned>,
    pub bytes: u64,
    /// Unreferenced blobs kept because a VM uses them (digests).
    pub kept_in_use: Vec<String>,
    /// Partial downloads kept because a pull is writing them right now.
    pub kept_active: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
pub struct ImageStore {
    dir: PathBuf,
}

impl ImageStore {
    /// Opens (creating if needed) the store at `dir`, normally `Roots::images()`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        // Modes set whatever the umask (nubo_core::fsmode): others (libvirt's QEMU user) may
        // read blobs but nobody else may write a record or a blob; partial files are private.
        fsmode::create_dir_all(dir, fsmode::DIR).map_err(io_at(dir))?;
        for (sub, mode) in [
            ("blobs", fsmode::DIR),
            ("boot", fsmode::DIR),
            ("refs", fsmode::DIR),
            ("tmp", fsmode::PRIVATE_DIR),
        ] {
            let p = dir.join(sub);
            fsmode::create_dir_all(&p, mode).map_err(io_at(&p))?;
        }
        Ok(ImageStore { dir: dir.to_path_buf() })
    }

    /// The store at `dir` for reading only: nothing is created, and a store that does not
    /// exist yet reads as empty. Dry runs plan through it, so they write nothing.
    pub fn open_read_only(dir: &Path) -> Self {
        ImageStore { dir: dir.to_path_buf() }
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

    /// `refs/<name>/<tag>.json`: where the record for `r` lives.
    pub fn record_file(&self, r: &ImageRef) -> PathBuf {
        self.record_path(r)
    }

    /// Moves a finished, verified file into the store, makes it read-only and records it under
    /// `record.reference`, replacing whatever the tag pointed at. `record.digest` must be the
    /// file's sha256; `record.path` is set here. Imports and pulls use [`commit`](Self::commit).
    pub fn add(&self, src: &Path, record: ImageRecord) -> Result<ImageRecord, StoreError> {
        self.commit(src, record, Overwrite::Replace).map(|a| a.record)
    }

    /// Like [`add`](Self::add), but an existing tag with another digest is refused
    /// ([`StoreError::TagExists`], with `src` left for the caller to delete) unless `overwrite`
    /// says to replace it. The same digest is [`TagChange::Unchanged`].
    pub fn commit(&self, src: &Path, mut record: ImageRecord, overwrite: Overwrite) -> Result<Added, StoreError> {
        let r = ImageRef::parse(&record.reference).map_err(|_| StoreError::NotFound(record.reference.clone()))?;
        let blob = self.blob_path(&record.digest, &record.format)?;
        let _lock = self.lock()?;
        let change = self.check_tag(&r, &record.digest, overwrite)?;
        if blob.exists() {
            // Same digest, same bytes: keep the existing read-only copy.
            fs::remove_file(src).map_err(io_at(src))?;
        } else {
            fs::rename(src, &blob).map_err(io_at(&blob))?;
        }
        fs::set_permissions(&blob, fs::Permissions::from_mode(fsmode::READ_ONLY)).map_err(io_at(&blob))?;
        record.path = blob;
        record.reference = r.to_string();
        self.write_record(&r, &record)?;
        Ok(Added { record, change })
    }

    /// Records `record` (whose blob is already in the store) under `record.reference`, with the
    /// same overwrite rule as [`commit`](Self::commit).
    pub fn tag(&self, mut record: ImageRecord, overwrite: Overwrite) -> Result<Added, StoreError> {
        let r = ImageRef::parse(&record.reference).map_err(|_| StoreError::NotFound(record.reference.clone()))?;
        let blob = self.blob_path(&record.digest, &record.format)?;
        let _lock = self.lock()?;
        let change = self.check_tag(&r, &record.digest, overwrite)?;
        if !blob.is_file() {
            return Err(StoreError::NotFound(format!("{} ({})", r, record.digest)));
        }
        record.path = blob;
        record.reference = r.to_string();
        self.write_record(&r, &record)?;
        Ok(Added { record, change })
    }

    /// What writing `digest` under `r` would do, or the refusal: callers check before a long
    /// download so they need not throw it away.
    pub fn check_tag(&self, r: &ImageRef, digest: &str, overwrite: Overwrite) -> Result<TagChange, StoreError> {
        match self.get(r) {
            Ok(None) => Ok(TagChange::Created),
            Ok(Some(old)) if old.digest == digest => Ok(TagChange::Unchanged),
            Ok(Some(old)) if overwrite == Overwrite::Replace => Ok(TagChange::Replaced {
                digest: old.digest,
                verified: old.verified,
            }),
            Ok(Some(old)) => Err(StoreError::TagExists {
                reference: r.to_string(),
                digest: old.digest,
                verified: old.verified,
            }),
            // A corrupt record is replaced only on request, like any other.
            Err(StoreError::Corrupt { .. }) if overwrite == Overwrite::Replace => Ok(TagChange::Replaced {
                digest: "unreadable record".into(),
                verified: false,
            }),
            Err(e) => Err(e),
        }
    }

    /// The store-wide lock that tag writes and prune hold.
    fn lock(&self) -> Result<TargetLock, StoreError> {
        let path = self.tmp_dir().join("store.lock");
        TargetLock::acquire(&path, &mut || {}).map_err(io_at(&path))
    }

    /// Moves extracted kernel/initrd next to the blob of `digest`, read-only.
    pub fn add_boot_files(
        &self,
        digest: &str,
        kernel: &Path,
        initrd: Option<&Path>,
    ) -> Result<(PathBuf, Option<PathBuf>), StoreError> {
        let dir = self.dir.join("boot").join(digest_hex(digest)?);
        fsmode::create_dir_all(&dir, fsmode::DIR).map_err(io_at(&dir))?;
        let place = |src: &Path, name: &str| -> Result<PathBuf, StoreError> {
            let dst = dir.join(name);
            fs::rename(src, &dst).map_err(io_at(&dst))?;
            fs::set_permissions(&dst, fs::Permissions::from_mode(fsmode::READ_ONLY)).map_err(io_at(&dst))?;
            Ok(dst)
        };
        let k = place(kernel, "vmlinuz")?;
        let i = initrd.map(|p| place(p, "initrd.img")).transpose()?;
        Ok((k, i))
    }

    /// Writes `record` under `r`, replacing any record there. A failed write leaves no empty
    /// `refs/<name>/` behind.
    pub fn write_record(&self, r: &ImageRef, record: &ImageRecord) -> Result<(), StoreError> {
        let path = self.record_path(r);
        let parent = path.parent().expect("record paths have a parent");
        fsmode::create_dir_all(parent, fsmode::DIR).map_err(io_at(parent))?;
        nubo_core::write_json_atomic(&path, record).map_err(|e| {
            let _ = fs::remove_dir(parent);
            io_at(&path)(e)
        })
    }

    pub fn get(&self, r: &ImageRef) -> Result<Option<ImageRecord>, StoreError> {
        let path = self.record_path(r);
        match read_record(&path) {
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            other => other.map(Some),
        }
    }

    /// Like [`get`](Self::get), but a missing image is an error naming it.
    pub fn require(&self, r: &ImageRef) -> Result<ImageRecord, StoreError> {
        self.get(r)?.ok_or_else(|| StoreError::NotFound(r.to_string()))
    }

    /// Every record, sorted by reference; the first unreadable one is an error. Listings that
    /// must go on past a bad file use [`scan`](Self::scan).
    pub fn list(&self) -> Result<Vec<ImageRecord>, StoreError> {
        let listing = self.scan()?;
        match listing.bad.into_iter().next() {
            Some(bad) => Err(bad.error),
            None => Ok(listing.records),
        }
    }

    /// Every readable record, sorted by reference, and every `refs/*/*.json` that is not one
    /// (corrupt JSON, not a regular file, unreadable), sorted by path.
    pub fn scan(&self) -> Result<Listing, StoreError> {
        let refs = self.dir.join("refs");
        let mut out = Listing::default();
        for name in fs::read_dir(&refs).map_err(io_at(&refs))? {
            let name = name.map_err(io_at(&refs))?.path();
            if !name.is_dir() {
                continue;
            }
            for tag in fs::read_dir(&name).map_err(io_at(&name))? {
                let path = tag.map_err(io_at(&name))?.path();
                if path.extension().is_some_and(|e| e == "json") {
                    match read_record(&path) {
                        Ok(rec) => out.records.push(rec),
                        Err(error) => out.bad.push(BadRecord { path, error }),
                    }
                }
            }
        }
        out.records.sort_by(|a, b| a.reference.cmp(&b.reference));
        out.bad.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Removes the reference, and the blob and boot files when no other reference points at
    /// the same digest. Whether a VM still uses the image is the caller's check.
    pub fn remove(&self, r: &ImageRef) -> Result<ImageRecord, StoreError> {
        let _lock = self.lock()?;
        let rec = self.require(r)?;
        let path = self.record_path(r);
        fs::remove_file(&path).map_err(io_at(&path))?;
        if let Some(parent) = path.parent() {
            // Only succeeds when this was the name's last tag.
            let _ = fs::remove_dir(parent);
        }
        let listing = self.scan()?;
        // An unreadable record may point at this blob too: leave it for prune to decide.
        if listing.bad.is_empty() && !listing.records.iter().any(|o| o.digest == rec.digest) {
            remove_if_exists(&rec.path)?;
            let boot = self.dir.join("boot").join(digest_hex(&rec.digest)?);
            match fs::remove_dir_all(&boot) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&boot)(e)),
                _ => {}
            }
        }
        Ok(rec)
    }

    /// Digests of blobs no reference points at (candidates for [`prune`](Self::prune); the
    /// caller finds which of them VMs still use).
    pub fn unreferenced_blobs(&self) -> Result<Vec<String>, StoreError> {
        let listing = self.scan()?;
        if let Some(bad) = listing.bad.into_iter().next() {
            return Err(StoreError::PruneBlocked {
                path: bad.path,
                source: Box::new(bad.error),
            });
        }
        let referenced: BTreeSet<&str> = listing.records.iter().map(|r| r.digest.as_str()).collect();
        Ok(self
            .blobs()?
            .into_iter()
            .map(|(digest, _)| digest)
            .filter(|d| !referenced.contains(d.as_str()))
            .collect())
    }

    /// `(digest, path)` of every file in `blobs/` named like a blob.
    fn blobs(&self) -> Result<Vec<(String, PathBuf)>, StoreError> {
        let dir = self.dir.join("blobs");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir).map_err(io_at(&dir))? {
            let path = e.map_err(io_at(&dir))?.path();
            let Some(hex) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split_once('.'))
                .map(|(h, _)| h)
            else {
                continue;
            };
            let digest = format!("sha256:{hex}");
            if digest_hex(&digest).is_ok() {
                out.push((digest, path));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes blobs (and their boot files) that no reference points at and whose digest is not
    /// in `in_use` (the digests VMs' overlays are based on: this crate does not read VM
    /// records), partial downloads no pull is writing, leftovers of imports whose process is
    /// gone, and empty `refs/<name>/` directories. With `dry_run`, reports the same without
    /// removing anything. Refused while any record is unreadable.
    pub fn prune(&self, in_use: &BTreeSet<String>, dry_run: bool) -> Result<PruneReport, StoreError> {
        let _lock = self.lock()?;
        let mut report = PruneReport {
            dry_run,
            ..Default::default()
        };
        let remove = |kind: &'static str, path: PathBuf, report: &mut PruneReport| -> Result<(), StoreError> {
            let bytes = disk_usage(&path);
            if !dry_run {
                let r = if path.is_dir() && kind != "empty-ref-dir" {
                    fs::remove_dir_all(&path)
                } else if path.is_dir() {
                    fs::remove_dir(&path)
                } else {
                    fs::remove_file(&path)
                };
                match r {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&path)(e)),
                    _ => {}
                }
            }
            report.bytes += bytes;
            report.removed.push(Pruned { kind, path, bytes });
            Ok(())
        };

        let orphans: BTreeSet<String> = self.unreferenced_blobs()?.into_iter().collect();
        for (digest, path) in self.blobs()? {
            if !orphans.contains(&digest) {
                continue;
            }
            if in_use.contains(&digest) {
                report.kept_in_use.push(digest);
                continue;
            }
            remove("blob", path, &mut report)?;
            let boot = self.dir.join("boot").join(digest_hex(&digest)?);
            if boot.exists() {
                remove("boot", boot, &mut report)?;
            }
        }
        // Boot files whose blob is gone (a prune or rm interrupted between the two).
        let boot_dir = self.dir.join("boot");
        let blob_hexes: BTreeSet<String> = self
            .blobs()?
            .into_iter()
            .filter_map(|(d, _)| d.strip_prefix("sha256:").map(str::to_owned))
            .collect();
        for e in fs::read_dir(&boot_dir).map_err(io_at(&boot_dir))? {
            let path = e.map_err(io_at(&boot_dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            let gone = !blob_hexes.contains(&name) && !orphans.contains(&format!("sha256:{name}"));
            if gone && digest_hex(&format!("sha256:{name}")).is_ok() {
                remove("boot", path, &mut report)?;
            }
        }

        let tmp = self.tmp_dir();
        let mut entries: Vec<PathBuf> = fs::read_dir(&tmp)
            .map_err(io_at(&tmp))?
            .map(|e| e.map(|e| e.path()).map_err(io_at(&tmp)))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for path in entries {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
            if let Some(key) = name.strip_suffix(".part") {
                // A pull holds `<key>.lock` for as long as it writes `<key>.part`.
                let lock_path = tmp.join(format!("{key}.lock"));
                match TargetLock::try_acquire(&lock_path).map_err(io_at(&lock_path))? {
                    Some(_held) => remove("partial", path, &mut report)?,
                    None => report.kept_active.push(path),
                }
            } else if name.ends_with(".lock") && name != "store.lock" {
                // Left by a pull that was killed; taking it (and dropping it) deletes it.
                drop(TargetLock::try_acquire(&path).map_err(io_at(&path))?);
            } else if let Some(pid) = import_pid(&name) {
                if !process_alive(pid) {
                    remove("partial", path, &mut report)?;
                }
            }
        }

        let refs = self.dir.join("refs");
        for e in fs::read_dir(&refs).map_err(io_at(&refs))? {
            let path = e.map_err(io_at(&refs))?.path();
            let empty = path.is_dir() && fs::read_dir(&path).map_err(io_at(&path))?.next().is_none();
            if empty {
                remove("empty-ref-dir", path, &mut report)?;
            }
        }
        Ok(report)
    }
}

/// `import-<pid>.<n>.<ext>`: an import's working copy in `tmp/` (`<n>` tells one process's writers apart).
fn import_pid(name: &str) -> Option<i32> {
    name.strip_prefix("import-")?.split('.').next()?.parse().ok()
}

fn process_alive(pid: i32) -> bool {
    use nix::errno::Errno;
    // Signal 0 checks existence; EPERM means it exists but is not ours.
    matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Ok(()) | Err(Errno::EPERM)
    )
}

/// Bytes a file or directory tree occupies (allocated blocks, as `du`), best effort.
fn disk_usage(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    let children = fs::read_dir(path)
        .map(|rd| rd.filter_map(Result::ok).map(|e| disk_usage(&e.path())).sum())
        .unwrap_or(0);
    own + children
}

/// A record file, read bounded and without following it into a FIFO or device.
fn read_record(path: &Path) -> Result<ImageRecord, StoreError> {
    let bytes = nubo_core::file::read_bounded(path, "image record", MAX_RECORD).map_err(|e| match e {
        FileError::Io { error, .. } => io_at(path)(error),
        other => io_at(path)(io::Error::new(io::ErrorKind::InvalidData, other.to_string())),
    })?;
    serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
        path: path.to_path_buf(),
        source,
    })
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
            source: ImageSource::new(SourceKind::Import),
            verified: true,
            created: "2026-12-01T00:00:00Z".into(),
            build_seconds: None,
            labels: Default::default(),
            build: None,
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

    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn stored(store: &ImageStore, reference: &str, digest: &str, overwrite: Overwrite) -> Result<Added, StoreError> {
        let src = store.tmp_dir().join(format!("src-{reference}"));
        fs::write(&src, digest).unwrap();
        let r = store.commit(&src, record(reference, digest), overwrite);
        let _ = fs::remove_file(&src);
        r
    }

    #[test]
    fn commit_existing_tag_other_digest_refused_names_old() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        stored(&store, "a:1", D1, Overwrite::Refuse).unwrap();

        let err = stored(&store, "a:1", D2, Overwrite::Refuse).unwrap_err();

        assert!(
            matches!(err, StoreError::TagExists { ref digest, verified: true, .. } if digest == D1),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("--force") && err.to_string().contains(D1),
            "{err}"
        );
        assert_eq!(store.require(&ImageRef::parse("a:1").unwrap()).unwrap().digest, D1);
        assert!(!store.blob_path(D2, "qcow2").unwrap().exists());
    }

    #[test]
    fn commit_existing_tag_replace_reports_old_and_keeps_old_blob() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let old = stored(&store, "a:1", D1, Overwrite::Refuse).unwrap();

        let new = stored(&store, "a:1", D2, Overwrite::Replace).unwrap();

        assert_eq!(
            new.change,
            TagChange::Replaced {
                digest: D1.into(),
                verified: true
            }
        );
        assert!(old.record.path.exists());
        assert_eq!(store.unreferenced_blobs().unwrap(), vec![D1.to_owned()]);
    }

    #[test]
    fn commit_same_digest_is_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        stored(&store, "a:1", D1, Overwrite::Refuse).unwrap();

        let again = stored(&store, "a:1", D1, Overwrite::Refuse).unwrap();

        assert_eq!(again.change, TagChange::Unchanged);
    }

    #[test]
    fn remove_last_tag_leaves_no_empty_name_dir() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        stored(&store, "a:1", D1, Overwrite::Refuse).unwrap();

        store.remove(&ImageRef::parse("a:1").unwrap()).unwrap();

        assert!(!dir.path().join("refs/a").exists());
    }

    #[test]
    fn scan_corrupt_record_lists_the_rest_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        stored(&store, "a:1", D1, Overwrite::Refuse).unwrap();
        fs::create_dir_all(dir.path().join("refs/b")).unwrap();
        fs::write(dir.path().join("refs/b/1.json"), "{not json").unwrap();

        let listing = store.scan().unwrap();

        assert_eq!(listing.records.len(), 1);
        assert_eq!(listing.bad.len(), 1);
        assert_eq!(listing.bad[0].path, dir.path().join("refs/b/1.json"));
    }

    #[test]
    fn prune_removes_orphan_keeps_used_and_tagged() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        const D3: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";
        let orphan = stored(&store, "a:1", D1, Overwrite::Refuse).unwrap().record.path;
        let used = stored(&store, "a:1", D2, Overwrite::Replace).unwrap().record.path;
        stored(&store, "a:1", D3, Overwrite::Replace).unwrap();
        let in_use = BTreeSet::from([D2.to_owned()]);

        let report = store.prune(&in_use, false).unwrap();

        assert!(!orphan.exists());
        assert!(used.exists());
        assert_eq!(report.kept_in_use, vec![D2.to_owned()]);
        assert_eq!(report.removed.iter().filter(|p| p.kind == "blob").count(), 1);
        assert!(report.bytes > 0);
    }

    #[test]
    fn prune_dry_run_removes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let orphan = stored(&store, "a:1", D1, Overwrite::Refuse).unwrap().record.path;
        stored(&store, "a:1", D2, Overwrite::Replace).unwrap();

        let report = store.prune(&BTreeSet::new(), true).unwrap();

        assert!(orphan.exists());
        assert_eq!(report.removed.len(), 1);
        assert!(report.dry_run);
    }

    #[test]
    fn prune_removes_stale_part_keeps_locked_part() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let stale = store.tmp_dir().join("aaaa.part");
        let active = store.tmp_dir().join("bbbb.part");
        fs::write(&stale, b"x").unwrap();
        fs::write(&active, b"y").unwrap();
        let _pull = TargetLock::acquire(&store.tmp_dir().join("bbbb.lock"), &mut || {}).unwrap();

        let report = store.prune(&BTreeSet::new(), false).unwrap();

        assert!(!stale.exists());
        assert!(active.exists());
        assert_eq!(report.kept_active, vec![active]);
    }

    #[test]
    fn prune_removes_empty_ref_dir() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        fs::create_dir_all(dir.path().join("refs/empty")).unwrap();

        let report = store.prune(&BTreeSet::new(), false).unwrap();

        assert!(!dir.path().join("refs/empty").exists());
        assert_eq!(report.removed[0].kind, "empty-ref-dir");
    }

    #[test]
    fn prune_with_corrupt_record_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        stored(&store, "a:1", D1, Overwrite::Refuse).unwrap();
        fs::write(dir.path().join("refs/a/2.json"), "garbage").unwrap();

        let err = store.prune(&BTreeSet::new(), false).unwrap_err();

        assert!(err.to_string().contains("refs/a/2.json"), "{err}");
        assert!(store.blob_path(D1, "qcow2").unwrap().exists());
    }

    #[test]
    fn digest_hex_rejects_traversal() {
        assert!(digest_hex("sha256:../../etc").is_err());
    }
}
