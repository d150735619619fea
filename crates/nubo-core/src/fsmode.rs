//! The modes of everything nubo creates, set explicitly whatever the caller's umask: under
//! `umask 000` a plain `create_dir_all` or `File::create` makes world-writable directories and
//! records, and any local user could then re-point a tag or swap a blob; under `umask 077` the
//! blobs libvirt's QEMU user must read would be closed to it. So every directory and file the
//! store, the VM directories and the run directory hold is created here, with its mode set on
//! the open descriptor (`fchmod`) after creation: the umask can neither widen nor narrow it.
//!
//! The policy, in one place:
//!
//! | what | mode |
//! |---|---|
//! | store and run directories others may read (`images/`, `blobs/`, `refs/`, `boot/`, `vms/`, `run/`, `run/locks`) | [`DIR`] 0755 |
//! | private directories (`images/tmp/`, a VM's directory, build work, SSH keys) | [`PRIVATE_DIR`] 0700 |
//! | records (`refs/*/*.json`, `vm.json`, `settings.json`) | [`RECORD`] 0644 |
//! | seeds, lock files, keys, partial files | [`PRIVATE`] 0600 |
//! | verified blobs and boot files | [`READ_ONLY`] 0444 |

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Directories other users (libvirt's QEMU user, `nubo image ls` of a root store) may read.
pub const DIR: u32 = 0o755;
/// Directories only their owner may enter: partial downloads, a VM's seed, keys.
pub const PRIVATE_DIR: u32 = 0o700;
/// Records: readable by all, writable by their owner only.
pub const RECORD: u32 = 0o644;
/// Seeds (they may carry passwords), lock files and keys.
pub const PRIVATE: u32 = 0o600;
/// Verified blobs and their boot files: never modified once stored.
pub const READ_ONLY: u32 = 0o444;

/// Sets `file`'s mode to exactly `mode` through its descriptor (`fchmod`).
pub fn set(file: &File, mode: u32) -> io::Result<()> {
    file.set_permissions(fs::Permissions::from_mode(mode))
}

/// Creates `path` and every missing parent with exactly `mode` (each created directory is
/// opened without following a symlink and `fchmod`ed); directories that already exist are left
/// as they are. A race with another creator is not an error.
pub fn create_dir_all(path: &Path, mode: u32) -> io::Result<()> {
    if path.as_os_str().is_empty() || path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        create_dir_all(parent, mode)?;
    }
    match create_dir(path, mode) {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        other => other,
    }
}

/// Creates the one directory `path` (its parent must exist) with exactly `mode`; an existing
/// `path` is an `AlreadyExists` error, as `mkdir(2)` gives.
pub fn create_dir(path: &Path, mode: u32) -> io::Result<()> {
    fs::DirBuilder::new().mode(mode).create(path)?;
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(path)?;
    set(&dir, mode)
}

/// Opens `path` with `options` (which must create it, or may), then sets its mode to exactly
/// `mode` on the descriptor. A file another user owns keeps its mode (only its owner may
/// change it; the open already succeeded, so its mode lets this user in).
pub fn open(options: &mut OpenOptions, path: &Path, mode: u32) -> io::Result<File> {
    let file = options.mode(mode).open(path)?;
    match set(&file, mode) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => Ok(file),
        Err(e) => Err(e),
        Ok(()) => Ok(file),
    }
}

/// Creates the new file `path` (refusing an existing one, never following a symlink there)
/// with exactly `mode`, open for writing.
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    open(
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW),
        path,
        mode,
    )
}

/// Opens (creating if needed) the lock file `path`, mode [`PRIVATE`], for `flock`.
pub fn open_lock(path: &Path) -> io::Result<File> {
    open(
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NOFOLLOW),
        path,
        PRIVATE,
    )
}

/// The mode bits (`0o7777`) of whatever is at `path`, not following a symlink there.
pub fn mode_of(path: &Path) -> io::Result<u32> {
    Ok(fs::symlink_metadata(path)?.permissions().mode() & 0o7777)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process's umask, set to `mask` for the duration of `f` (tests in this module run
    /// their umask-dependent part inside this, one at a time).
    fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _held = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: umask(2) only swaps the process's file mode mask; it cannot fail.
        #[allow(unsafe_code)]
        let old = unsafe { libc::umask(mask as libc::mode_t) };
        let out = f();
        // SAFETY: as above, restoring the previous mask.
        #[allow(unsafe_code)]
        unsafe {
            libc::umask(old)
        };
        out
    }

    #[test]
    fn create_dir_all_umask_000_sets_exact_mode_on_every_created_dir() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("a/b/c");

        with_umask(0o000, || create_dir_all(&leaf, DIR)).unwrap();

        for p in ["a", "a/b", "a/b/c"] {
            assert_eq!(mode_of(&root.path().join(p)).unwrap(), DIR, "{p}");
        }
    }

    #[test]
    fn create_dir_all_umask_077_still_sets_0755() {
        let root = tempfile::tempdir().unwrap();
        let leaf = root.path().join("images");

        with_umask(0o077, || create_dir_all(&leaf, DIR)).unwrap();

        assert_eq!(mode_of(&leaf).unwrap(), DIR);
    }

    #[test]
    fn create_dir_all_existing_dir_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path().join("mine");
        fs::create_dir(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o750)).unwrap();

        create_dir_all(&p, DIR).unwrap();

        assert_eq!(mode_of(&p).unwrap(), 0o750);
    }

    #[test]
    fn create_new_umask_000_is_exactly_private() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path().join("seed.img");

        with_umask(0o000, || create_new(&p, PRIVATE)).unwrap();

        assert_eq!(mode_of(&p).unwrap(), PRIVATE);
    }

    #[test]
    fn create_new_symlink_refused_and_target_untouched() {
        let root = tempfile::tempdir().unwrap();
        let target = root.path().join("victim");
        let link = root.path().join("out");
        std::os::unix::fs::symlink(&target, &link).unwrap();

        let err = create_new(&link, PRIVATE).unwrap_err();

        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert!(!target.exists());
    }

    #[test]
    fn open_lock_umask_000_is_private() {
        let root = tempfile::tempdir().unwrap();
        let p = root.path().join("x.lock");

        with_umask(0o000, || open_lock(&p)).unwrap();

        assert_eq!(mode_of(&p).unwrap(), PRIVATE);
    }
}
