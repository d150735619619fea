//! One lock per VM, so two commands cannot race on it; commands on different VMs never wait for
//! each other. Two layers, because one process may run many commands at once (a daemon):
//!
//! - in-process: a registry of per-path slots (a mutex and a condition variable), so two
//!   threads of this process exclude each other, wait without polling, and name the
//!   operation that holds the VM;
//! - across processes: `flock` on a file in the run directory (tmpfs): it vanishes at reboot,
//!   and a lock held by a killed command is released by the kernel with its file descriptor.
//!   The holder writes `<pid> <operation>` into it, for the other process's busy message.
//!
//! Every wait ends at a [`Deadline`] or when its [`Cancel`] token is cancelled.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use nubo_core::{Cancel, Deadline};

use crate::EngineError;

/// How often a wait looks at its cancellation token, and at another process's flock.
const POLL: Duration = Duration::from_millis(50);

/// One lock file's in-process state: the operation holding it, if any.
#[derive(Default)]
struct Slot {
    holder: Mutex<Option<&'static str>>,
    released: Condvar,
}

/// Every lock path some thread holds or waits for. Entries are weak, so a path nobody uses
/// any more costs nothing but a stale entry, dropped on the next registration.
fn slot_for(path: &Path) -> Arc<Slot> {
    static SLOTS: OnceLock<Mutex<HashMap<PathBuf, Weak<Slot>>>> = OnceLock::new();
    let mut slots = SLOTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(slot) = slots.get(path).and_then(Weak::upgrade) {
        return slot;
    }
    slots.retain(|_, w| w.strong_count() > 0);
    let slot = Arc::new(Slot::default());
    slots.insert(path.to_path_buf(), Arc::downgrade(&slot));
    slot
}

/// The in-process half, held: releasing it wakes one thread waiting for the same VM.
struct Held(Arc<Slot>);

impl Drop for Held {
    fn drop(&mut self) {
        *self.0.holder.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.0.released.notify_one();
    }
}

pub struct VmLock {
    // Field order is drop order: the flock goes before the in-process slot, so the thread
    // woken next finds the file free.
    _lock: Flock<File>,
    _held: Held,
    path: PathBuf,
}

impl VmLock {
    /// Releases the lock and removes its file, for a VM that does not exist (any more): a
    /// refused or undone command leaves no lock file behind. Removing it while held is safe
    /// here: a racing command either saw it busy or creates a fresh lock file of its own, and
    /// this holder makes nothing after releasing.
    pub fn remove(self) {
        let _ = fs::remove_file(&self.path);
    }

    /// Takes the lock for `op` (the verb, named in the busy message of whoever waits),
    /// waiting for another command on this VM until `deadline` or until `cancel` is
    /// cancelled: commands on one VM serialise (a forked child briefly holding a killed
    /// command's lock until its exec is waited out too). Still held then is
    /// [`EngineError::Busy`] naming the holder; cancelled is [`EngineError::Cancelled`].
    pub fn acquire(
        locks_dir: &Path,
        name: &str,
        op: &'static str,
        deadline: Deadline,
        cancel: &Cancel,
    ) -> Result<VmLock, EngineError> {
        // run/ and run/locks 0755, lock files 0600, whatever the umask (nubo_core::fsmode).
        nubo_core::fsmode::create_dir_all(locks_dir, nubo_core::fsmode::DIR)
            .map_err(EngineError::io(name, format!("creating {}", locks_dir.display())))?;
        let path = locks_dir.join(format!("{name}.lock"));
        match take(&path, op, deadline, cancel) {
            Ok((lock, held)) => Ok(VmLock {
                _lock: lock,
                _held: held,
                path,
            }),
            Err(Wait::Busy(holder)) => Err(EngineError::Busy {
                name: name.to_owned(),
                holder,
            }),
            Err(Wait::Cancelled) => Err(cancelled(name, op)),
            Err(Wait::Io(e)) => Err(EngineError::io(name, format!("opening {}", path.display()))(e)),
        }
    }

    /// Takes the lock without waiting; a held lock is an error naming the holder.
    pub fn try_acquire(locks_dir: &Path, name: &str, op: &'static str) -> Result<VmLock, EngineError> {
        VmLock::acquire(locks_dir, name, op, Deadline::after(Duration::ZERO), &Cancel::new())
    }
}

fn cancelled(name: &str, op: &str) -> EngineError {
    EngineError::Cancelled {
        what: format!("waiting to `{op}` vm `{name}`"),
    }
}

/// An exclusive lock on a file several commands read, change and write back (settings.json):
/// the same two layers as [`VmLock`]. Its lock file stays (it is tiny, and removing a lock
/// file another process may be waiting on would let two holders in).
pub struct FileLock {
    _lock: Flock<File>,
    _held: Held,
}

impl FileLock {
    /// Takes the lock file `path` for `op`, waiting until `deadline` or `cancel`; `what`
    /// names the guarded object in errors ("nubo's settings").
    pub fn acquire(
        path: &Path,
        what: &str,
        op: &'static str,
        deadline: Deadline,
        cancel: &Cancel,
    ) -> Result<FileLock, EngineError> {
        match take(path, op, deadline, cancel) {
            Ok((lock, held)) => Ok(FileLock {
                _lock: lock,
                _held: held,
            }),
            Err(Wait::Busy(holder)) => Err(EngineError::Unavailable {
                what: format!("changing {what} ({holder})"),
                fix: format!(
                    "wait for that command to finish and retry; if none runs, delete {}",
                    path.display()
                ),
            }),
            Err(Wait::Cancelled) => Err(EngineError::Cancelled {
                what: format!("waiting to change {what}"),
            }),
            Err(Wait::Io(e)) => Err(EngineError::io("", format!("opening {}", path.display()))(e)),
        }
    }
}

/// Why a wait for a lock ended without it.
enum Wait {
    /// Still held at the deadline, by this holder.
    Busy(String),
    Cancelled,
    Io(std::io::Error),
}

/// Both layers of the lock on `path`, in order: this process's slot, then the flock.
fn take(path: &Path, op: &'static str, deadline: Deadline, cancel: &Cancel) -> Result<(Flock<File>, Held), Wait> {
    let held = hold_in_process(path, op, deadline, cancel)?;
    loop {
        match lock_file(path, op).map_err(Wait::Io)? {
            Ok(lock) => return Ok((lock, held)),
            Err(_) if cancel.is_cancelled() => return Err(Wait::Cancelled),
            Err(holder) if deadline.passed() => return Err(Wait::Busy(holder)),
            // Another process holds it: flock has no timed wait, so poll.
            Err(_) => std::thread::sleep(deadline.slice(POLL)),
        }
    }
}

/// Waits (on the condition variable: no polling) until no other thread of this process holds
/// `path`, then marks it held by `op`.
fn hold_in_process(path: &Path, op: &'static str, deadline: Deadline, cancel: &Cancel) -> Result<Held, Wait> {
    let slot = slot_for(path);
    let mut holder = slot.holder.lock().unwrap_or_else(|p| p.into_inner());
    while let Some(by) = *holder {
        if cancel.is_cancelled() {
            return Err(Wait::Cancelled);
        }
        if deadline.passed() {
            return Err(Wait::Busy(format!("`{by}` holds it in this process")));
        }
        // Woken by a release; the slice only bounds how late a cancellation is seen.
        holder = slot
            .released
            .wait_timeout(holder, deadline.slice(POLL))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
    *holder = Some(op);
    drop(holder);
    Ok(Held(slot))
}

/// One non-blocking try of the file lock: the lock, or the holder another process wrote.
fn lock_file(path: &Path, op: &str) -> std::io::Result<Result<Flock<File>, String>> {
    let file = nubo_core::fsmode::open_lock(path)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        // Its holder removed the file (`VmLock::remove`) between our open and our flock: the
        // lock is on a name nobody else will open again, so it excludes no one. Try afresh.
        Ok(lock) if !still_at(&lock, path) => Ok(Err("its previous holder is removing it".to_owned())),
        Ok(mut lock) => {
            let _ = lock.set_len(0);
            let _ = lock.seek(SeekFrom::Start(0));
            let _ = write!(lock, "{} {op}", std::process::id());
            Ok(Ok(lock))
        }
        Err((mut file, _)) => {
            let mut text = String::new();
            // The file is ours (0600), but bound the read all the same.
            let _ = (&mut file).take(256).read_to_string(&mut text);
            Ok(Err(describe_holder(&text)))
        }
    }
}

/// Whether the open file `lock` is still the one at `path` (same device and inode).
fn still_at(lock: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (lock.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// The busy message's holder from a lock file's `<pid> <operation>` (a bare pid from an older
/// nubo too).
fn describe_holder(text: &str) -> String {
    let mut parts = text.trim().splitn(2, ' ');
    let pid = parts
        .next()
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let op = parts.next().map(str::trim).filter(|o| {
        !o.is_empty() && o.len() <= 32 && o.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b' ')
    });
    match (pid, op) {
        (Some(pid), Some(op)) => format!("held by pid {pid} (`{op}`)"),
        (Some(pid), None) => format!("held by pid {pid}"),
        _ => "held by another process".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(d: Duration) -> Deadline {
        Deadline::after(d)
    }

    #[test]
    fn try_acquire_second_holder_in_process_is_busy_naming_operation() {
        let dir = tempfile::tempdir().unwrap();
        let _first = VmLock::try_acquire(dir.path(), "web", "start").unwrap();

        let err = VmLock::try_acquire(dir.path(), "web", "stop").err().unwrap();

        assert!(
            err.to_string()
                .contains("vm `web` is busy: `start` holds it in this process"),
            "{err}"
        );
    }

    #[test]
    fn describe_holder_pid_and_operation_names_both() {
        assert_eq!(describe_holder("42 start"), "held by pid 42 (`start`)");
        assert_eq!(
            describe_holder("42 snapshot create"),
            "held by pid 42 (`snapshot create`)"
        );
        assert_eq!(describe_holder("42"), "held by pid 42");
        assert_eq!(describe_holder("\x1b[2J rm"), "held by another process");
        assert_eq!(describe_holder("42 \x1b[2J"), "held by pid 42");
    }

    #[test]
    fn acquire_other_process_flock_is_busy_naming_pid_and_operation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.lock");
        // Another open file description stands for another process: flock excludes it.
        let file = nubo_core::fsmode::open_lock(&path).unwrap();
        let mut other = Flock::lock(file, FlockArg::LockExclusiveNonblock).unwrap();
        write!(other, "4242 snapshot").unwrap();

        let err = VmLock::acquire(
            dir.path(),
            "web",
            "rm",
            within(Duration::from_millis(100)),
            &Cancel::new(),
        )
        .err()
        .unwrap();

        assert!(err.to_string().contains("held by pid 4242 (`snapshot`)"), "{err}");
    }

    #[test]
    fn acquire_waits_for_release() {
        let dir = tempfile::tempdir().unwrap();
        let first = VmLock::try_acquire(dir.path(), "web", "create").unwrap();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(first);
        });

        let second = VmLock::acquire(
            dir.path(),
            "web",
            "start",
            within(Duration::from_secs(5)),
            &Cancel::new(),
        );

        releaser.join().unwrap();
        assert!(second.is_ok());
    }

    #[test]
    fn acquire_still_held_after_deadline_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let _first = VmLock::try_acquire(dir.path(), "web", "create").unwrap();

        let err = VmLock::acquire(
            dir.path(),
            "web",
            "start",
            within(Duration::from_millis(100)),
            &Cancel::new(),
        )
        .err()
        .unwrap();

        assert!(matches!(err, EngineError::Busy { .. }), "{err}");
    }

    #[test]
    fn acquire_cancelled_while_waiting_is_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let _first = VmLock::try_acquire(dir.path(), "web", "create").unwrap();
        let cancel = Cancel::new();
        let canceller = {
            let cancel = cancel.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                cancel.cancel();
            })
        };

        let t = std::time::Instant::now();
        let err = VmLock::acquire(dir.path(), "web", "start", Deadline::NEVER, &cancel)
            .err()
            .unwrap();

        canceller.join().unwrap();
        assert!(matches!(err, EngineError::Cancelled { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn acquire_sixteen_threads_one_vm_exclude_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let inside = std::sync::atomic::AtomicUsize::new(0);
        let most = std::sync::atomic::AtomicUsize::new(0);

        std::thread::scope(|s| {
            for _ in 0..16 {
                s.spawn(|| {
                    for _ in 0..10 {
                        let _l = VmLock::acquire(dir.path(), "web", "start", Deadline::NEVER, &Cancel::new()).unwrap();
                        let now = inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                        std::thread::sleep(Duration::from_micros(200));
                        inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    }
                });
            }
        });

        assert_eq!(most.into_inner(), 1);
    }

    #[test]
    fn lock_file_removed_before_flock_is_not_taken() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("web.lock");
        let stale = nubo_core::fsmode::open_lock(&path).unwrap();
        fs::remove_file(&path).unwrap();
        // A lock on the removed file would exclude no one who opens the name afresh.
        let lock = Flock::lock(stale, FlockArg::LockExclusiveNonblock).unwrap();

        assert!(!still_at(&lock, &path));
        assert!(VmLock::try_acquire(dir.path(), "web", "start").is_ok());
    }

    #[test]
    fn try_acquire_other_vm_not_blocked() {
        let dir = tempfile::tempdir().unwrap();
        let _a = VmLock::try_acquire(dir.path(), "a", "start").unwrap();

        assert!(VmLock::try_acquire(dir.path(), "b", "start").is_ok());
    }

    #[test]
    fn try_acquire_after_release_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        drop(VmLock::try_acquire(dir.path(), "web", "start").unwrap());

        assert!(VmLock::try_acquire(dir.path(), "web", "start").is_ok());
    }
}
