//! A VM's VMM process, found and ended the same way for every backend that runs one as a child
//! (qemu, cloud-hypervisor). Backends differ only in how a process is recognised as the VM's
//! (QEMU: `-uuid <uuid>` on its command line; Cloud Hypervisor: `NUBO_VM_UUID=<uuid>` in its
//! environment) and in the name errors give it, so both are parameters ([`Vmm`]).
//!
//! The pid file alone is not trusted: a pid reused after a crash belongs to someone else, and a
//! VMM whose `create` was killed before the pid file was written has none. So the pid file's
//! process counts only if the predicate says it is the VM's, and a scan of `/proc` finds the
//! ones the pid file does not name.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::BackendError;

/// How long SIGKILLed processes may take to disappear before that is an error.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// How often `/proc` is looked at while waiting.
const POLL: Duration = Duration::from_millis(20);
/// How long a scan waits for processes caught mid-exec to become recognisable (an exec takes
/// well under a millisecond unloaded; a busy host stretches it).
const SETTLE: Duration = Duration::from_millis(200);

/// Removes a VMM's runtime files (sockets, pid files); one already gone is fine.
pub fn remove_files<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Result<(), BackendError> {
    for p in paths {
        let p = p.as_ref();
        match fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(BackendError::Io {
                    what: format!("removing {}", p.display()),
                    source: e,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// One VM's VMM, as its backend recognises it.
pub struct Vmm<'a> {
    /// The VMM's name in errors (`QEMU`, `Cloud Hypervisor`).
    pub label: &'static str,
    /// The VM's name in errors.
    pub vm: &'a str,
    /// Where the VMM's pid is recorded.
    pub pid_file: &'a Path,
    /// Whether process `pid` is this VM's VMM (false for a process that is gone or a zombie).
    pub ours: Box<dyn Fn(i32) -> bool + 'a>,
}

impl Vmm<'_> {
    /// The pid file's process, if it is alive and really this VM's.
    pub fn live_pid(&self) -> Option<Pid> {
        let pid: i32 = fs::read_to_string(self.pid_file).ok()?.trim().parse().ok()?;
        (pid > 0 && (self.ours)(pid)).then(|| Pid::from_raw(pid))
    }

    /// Every live process that is this VM's VMM: the pid file's, and any other the predicate
    /// recognises. A process caught in the middle of an exec cannot be recognised yet (see
    /// [`in_exec`]): the scan is repeated until none is, for at most [`SETTLE`], so a VMM
    /// whose killed `create` released the VM's lock at that very moment is not missed.
    pub fn pids(&self) -> Vec<Pid> {
        let t0 = Instant::now();
        loop {
            let (pids, unsettled) = self.scan();
            if !unsettled || t0.elapsed() >= SETTLE {
                return pids;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// One pass over `/proc`: the VM's VMM processes, and whether any process was mid-exec.
    fn scan(&self) -> (Vec<Pid>, bool) {
        let mut pids: Vec<Pid> = self.live_pid().into_iter().collect();
        let mut unsettled = false;
        let Ok(entries) = fs::read_dir("/proc") else {
            return (pids, false);
        };
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            if pids.contains(&Pid::from_raw(pid)) {
                continue;
            }
            if (self.ours)(pid) {
                pids.push(Pid::from_raw(pid));
            } else if in_exec(pid) {
                unsettled = true;
            }
        }
        (pids, unsettled)
    }

    /// Waits up to `timeout` for the pid file's process to go; true when it has.
    pub fn wait_gone(&self, timeout: Duration) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < timeout {
            if self.live_pid().is_none() {
                return true;
            }
            std::thread::sleep(POLL);
        }
        self.live_pid().is_none()
    }

    /// SIGKILLs every process of this VM's VMM and waits until none is left. Succeeds when none
    /// was running.
    pub fn kill_now(&self) -> Result<(), BackendError> {
        let pids = self.pids();
        for pid in &pids {
            match kill(*pid, Signal::SIGKILL) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(e) => {
                    return Err(BackendError::Io {
                        what: format!("killing {} (pid {pid}) of VM `{}`", self.label, self.vm),
                        source: e.into(),
                    })
                }
            }
        }
        let t0 = Instant::now();
        // Gone means every task of it has exited: its environment becomes unreadable as soon
        // as the main thread drops its memory, while other threads (and their open files: the
        // API socket) may live on a little longer.
        while !self.pids().is_empty() || pids.iter().any(|p| !exited(p.as_raw())) {
            if t0.elapsed() > KILL_GRACE {
                return Err(BackendError::Remote {
                    what: format!("VM `{}`", self.vm),
                    detail: format!(
                        "{} (pids {pids:?}) survived SIGKILL for {} s",
                        self.label,
                        KILL_GRACE.as_secs()
                    ),
                });
            }
            std::thread::sleep(POLL);
        }
        Ok(())
    }
}

/// Whether every task of process `pid` has exited: it is gone, or only its zombie is left to
/// reap (its `task/` lists nothing but the leader, itself a zombie).
fn exited(pid: i32) -> bool {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return true;
    };
    let zombie = status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|s| matches!(s.trim_start().chars().next(), Some('Z' | 'X')));
    let tasks = fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count());
    zombie && tasks <= 1
}

/// Whether process `pid` is between execve's point of no return and its new image's argument
/// and environment pointers: its command line reads empty though it has an executable (a
/// kernel thread has none, a zombie neither). The parent's close-on-exec files, the VM's lock
/// among them, are already closed then, so a VMM being exec'd for a killed `create` would
/// otherwise be missed by the next command's scan (seen under load).
fn in_exec(pid: i32) -> bool {
    fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.is_empty())
        && fs::read_link(format!("/proc/{pid}/exe")).is_ok()
}

/// Whether a NUL-separated command line holds `flag` immediately followed by `value`. Pure.
pub fn args_have_pair(cmdline: &[u8], flag: &str, value: &str) -> bool {
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.windows(2)
        .any(|w| w[0] == flag.as_bytes() && w[1] == value.as_bytes())
}

/// Whether a NUL-separated environment holds `key=value` exactly. Pure.
pub fn environ_has(environ: &[u8], key: &str, value: &str) -> bool {
    let want = format!("{key}={value}");
    environ.split(|b| *b == 0).any(|kv| kv == want.as_bytes())
}

/// Process `pid`'s command line holds `flag value` (a zombie's is empty).
pub fn cmdline_has_pair(pid: i32, flag: &str, value: &str) -> bool {
    fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| args_have_pair(&c, flag, value))
}

/// Process `pid`'s environment holds `key=value` (a zombie's is empty).
pub fn process_env_has(pid: i32, key: &str, value: &str) -> bool {
    fs::read(format!("/proc/{pid}/environ")).is_ok_and(|e| environ_has(&e, key, value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_have_pair_flag_then_value_matches() {
        assert!(args_have_pair(
            b"qemu-system-x86_64\0-uuid\0abc\0-m\0x1024\0",
            "-uuid",
            "abc"
        ));
    }

    #[test]
    fn args_have_pair_value_elsewhere_does_not_match() {
        assert!(!args_have_pair(b"qemu\0-name\0abc\0-uuid\0abd\0", "-uuid", "abc"));
    }

    #[test]
    fn environ_has_exact_pair_only() {
        let env = b"PATH=/bin\0NUBO_VM_UUID=abc-1\0";

        assert!(environ_has(env, "NUBO_VM_UUID", "abc-1"));
        assert!(!environ_has(env, "NUBO_VM_UUID", "abc"));
        assert!(!environ_has(b"", "NUBO_VM_UUID", "abc"));
    }

    #[test]
    fn vmm_pid_file_of_another_process_is_not_live() {
        let d = tempfile::tempdir().unwrap();
        let pid_file = d.path().join("pid");
        fs::write(&pid_file, format!("{}\n", std::process::id())).unwrap();
        let v = Vmm {
            label: "VMM",
            vm: "t",
            pid_file: &pid_file,
            ours: Box::new(|_| false),
        };

        assert_eq!(v.live_pid(), None);
        assert!(v.wait_gone(Duration::ZERO));
        assert!(v.kill_now().is_ok());
    }

    #[test]
    fn in_exec_is_false_for_a_running_process() {
        assert!(!in_exec(std::process::id() as i32));
    }

    #[test]
    fn vmm_garbage_pid_file_is_not_live() {
        let d = tempfile::tempdir().unwrap();
        let pid_file = d.path().join("pid");
        fs::write(&pid_file, "-1\n").unwrap();
        let v = Vmm {
            label: "VMM",
            vm: "t",
            pid_file: &pid_file,
            ours: Box::new(|_| true),
        };

        assert_eq!(v.live_pid(), None);
    }

    #[test]
    fn vmm_kill_now_ends_a_recognised_child() {
        let d = tempfile::tempdir().unwrap();
        let pid_file = d.path().join("pid");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .env("NUBO_PROCESS_TEST", "kill-me")
            .spawn()
            .unwrap();
        fs::write(&pid_file, child.id().to_string()).unwrap();
        // Reap it as soon as it dies so it does not linger as a zombie in /proc.
        let reaper = std::thread::spawn(move || child.wait());
        let v = Vmm {
            label: "VMM",
            vm: "t",
            pid_file: &pid_file,
            ours: Box::new(|pid| process_env_has(pid, "NUBO_PROCESS_TEST", "kill-me")),
        };
        // Until the child has exec'd, /proc shows the test's own environment: wait for it
        // (under load that took long enough to fail a single look).
        let t0 = std::time::Instant::now();
        let mut before = v.live_pid();
        while before.is_none() && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(10));
            before = v.live_pid();
        }

        v.kill_now().unwrap();

        assert!(before.is_some());
        assert_eq!(v.live_pid(), None);
        assert!(reaper.join().is_ok());
    }
}
