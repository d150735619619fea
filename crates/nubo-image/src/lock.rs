//! One lock file per download target in `tmp/`, so two pulls of the same image do one download:
//! the second waits, then finds the image already stored.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};

/// Held for the whole download; dropping it deletes the lock file, then unlocks.
pub struct TargetLock {
    path: PathBuf,
    _file: Flock<File>,
}

impl TargetLock {
    /// Blocks until the lock is ours; `on_wait` runs once if someone else holds it.
    pub fn acquire(path: &Path, on_wait: &mut dyn FnMut()) -> io::Result<TargetLock> {
        let mut waited = false;
        loop {
            let f = nubo_core::fsmode::open_lock(path)?;
            let locked = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                Ok(l) => l,
                Err((f, Errno::EWOULDBLOCK)) => {
                    if !waited {
                        waited = true;
                        on_wait();
                    }
                    Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?
                }
                Err((_, e)) => return Err(e.into()),
            };
            // The previous holder unlinks the file before unlocking: if the path now names another
            // inode (or none), we locked a stale one and must lock what the path names now.
            let ours = locked.metadata()?;
            match fs::metadata(path) {
                Ok(m) if m.ino() == ours.ino() && m.dev() == ours.dev() => {
                    return Ok(TargetLock {
                        path: path.to_path_buf(),
                        _file: locked,
                    })
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl TargetLock {
    /// Takes the lock only if nobody holds it: `None` while a pull is writing the target.
    pub fn try_acquire(path: &Path) -> io::Result<Option<TargetLock>> {
        let f = nubo_core::fsmode::open_lock(path)?;
        let locked = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((_, Errno::EWOULDBLOCK)) => return Ok(None),
            Err((_, e)) => return Err(e.into()),
        };
        let ours = locked.metadata()?;
        match fs::metadata(path) {
            Ok(m) if m.ino() == ours.ino() && m.dev() == ours.dev() => Ok(Some(TargetLock {
                path: path.to_path_buf(),
                _file: locked,
            })),
            // The holder just finished and unlinked it: whatever it guarded is being replaced.
            Ok(_) | Err(_) => Ok(None),
        }
    }
}

impl Drop for TargetLock {
    fn drop(&mut self) {
        // Best effort: a leftover empty lock file is harmless and reused by the next pull.
        let _ = fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_then_drop_removes_lock_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");

        let lock = TargetLock::acquire(&path, &mut || {}).unwrap();
        let existed = path.exists();
        drop(lock);

        assert!(existed);
        assert!(!path.exists());
    }

    #[test]
    fn try_acquire_while_held_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let _held = TargetLock::acquire(&path, &mut || {}).unwrap();

        let second = TargetLock::try_acquire(&path).unwrap();

        assert!(second.is_none());
    }

    #[test]
    fn try_acquire_free_lock_is_some() {
        let dir = tempfile::tempdir().unwrap();

        let lock = TargetLock::try_acquire(&dir.path().join("x.lock")).unwrap();

        assert!(lock.is_some());
    }
}
