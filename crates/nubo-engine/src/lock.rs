//! One lock per VM, so two commands cannot race on it; commands on different VMs never wait for
//! each other. Lock files live in the run directory (tmpfs): they vanish at reboot, and a lock
//! held by a killed command is released by the kernel with its file descriptor.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;

use nix::fcntl::{Flock, FlockArg};

use crate::EngineError;

pub struct VmLock {
    _lock: Flock<File>,
    path: std::path::PathBuf,
}

impl VmLock {
    /// Releases the lock and removes its file, for a VM that does not exist (any more): a
    /// refused or undone command leaves no lock file behind. Removing it while held is safe
    /// here: a racing command either saw it busy or creates a fresh lock file of its own, and
    /// this holder makes nothing after releasing.
    pub fn remove(self) {
        let _ = fs::remove_file(&self.path);
    }

    /// Takes the lock, waiting up to `wait` for another command to release it (commands on one
    /// VM serialise; a forked child briefly holding a killed command's lock until its exec is
    /// waited out too); still held after that is an error naming the holder.
    pub fn acquire(locks_dir: &Path, name: &str, wait: std::time::Duration) -> Result<VmLock, EngineError> {
        let start = std::time::Instant::now();
        loop {
            match VmLock::try_acquire(locks_dir, name) {
                Err(EngineError::Busy { .. }) if start.elapsed() < wait => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                other => return other,
            }
        }
    }

    /// Takes the lock without waiting; a held lock is an error naming the holder.
    pub fn try_acquire(locks_dir: &Path, name: &str) -> Result<VmLock, EngineError> {
        // run/ and run/locks 0755, lock files 0600, whatever the umask (nubo_core::fsmode).
        nubo_core::fsmode::create_dir_all(locks_dir, nubo_core::fsmode::DIR)
            .map_err(EngineError::io(name, format!("creating {}", locks_dir.display())))?;
        let path = locks_dir.join(format!("{name}.lock"));
        let file = nubo_core::fsmode::open_lock(&path)
            .map_err(EngineError::io(name, format!("opening {}", path.display())))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut lock) => {
                let _ = lock.set_len(0);
                let _ = lock.seek(SeekFrom::Start(0));
                let _ = write!(lock, "{}", std::process::id());
                Ok(VmLock { _lock: lock, path })
            }
            Err((mut file, _)) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "pid unknown".to_owned(),
                    pid => format!("pid {pid}"),
                };
                Err(EngineError::Busy {
                    name: name.to_owned(),
                    holder,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn try_acquire_second_holder_is_busy_naming_pid() {
        let dir = tempfile::tempdir().unwrap();
        let _first = VmLock::try_acquire(dir.path(), "web").unwrap();

        let err = VmLock::try_acquire(dir.path(), "web").err().unwrap();

        assert!(
            err.to_string().contains(&format!("pid {}", std::process::id())),
            "{err}"
        );
    }

    #[test]
    fn acquire_waits_for_release() {
        let dir = tempfile::tempdir().unwrap();
        let first = VmLock::try_acquire(dir.path(), "web").unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            drop(first);
        });

        let second = VmLock::acquire(dir.path(), "web", std::time::Duration::from_secs(5));

        releaser.join().unwrap();
        assert!(second.is_ok());
    }

    #[test]
    fn acquire_still_held_after_wait_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let _first = VmLock::try_acquire(dir.path(), "web").unwrap();

        let err = VmLock::acquire(dir.path(), "web", std::time::Duration::from_millis(100))
            .err()
            .unwrap();

        assert!(matches!(err, EngineError::Busy { .. }), "{err}");
    }

    #[test]
    fn try_acquire_other_vm_not_blocked() {
        let dir = tempfile::tempdir().unwrap();
        let _a = VmLock::try_acquire(dir.path(), "a").unwrap();

        assert!(VmLock::try_acquire(dir.path(), "b").is_ok());
    }

    #[test]
    fn try_acquire_after_release_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        drop(VmLock::try_acquire(dir.path(), "web").unwrap());

        assert!(VmLock::try_acquire(dir.path(), "web").is_ok());
    }
}
