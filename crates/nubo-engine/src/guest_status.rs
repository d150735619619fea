//! `cloud-init status --wait --long` over SSH, for guests whose console says nothing about
//! cloud-init, run as a child process the readiness step looks at without blocking: a step
//! must return at once (a daemon steps many VMs from one loop), and the command itself waits
//! until cloud-init is done. The child is killed and reaped if the wait ends first.

use std::io::Read;
use std::process::{Child, Command, Stdio};

/// `cloud-init status --long` prints a few lines; more is not cloud-init's, and is cut.
const MAX_OUTPUT: u64 = 64 << 10;

pub(crate) struct GuestStatus {
    child: Child,
}

/// What the command said once it exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Not yet: still running.
    Pending,
    /// ssh itself failed (exit 255: not accepting nubo's key yet), or the command could not
    /// be waited for: ask again later.
    Retry,
    /// cloud-init's answer: `Ok` on exit 0 (done), `Err` otherwise (it reported errors).
    Done(Result<String, String>),
}

impl GuestStatus {
    /// Starts `argv` (the ssh command line); `None` when it cannot be started.
    pub(crate) fn start(argv: &[String]) -> Option<GuestStatus> {
        let (program, args) = argv.split_first()?;
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        Some(GuestStatus { child })
    }

    /// Looks once, without blocking.
    pub(crate) fn poll(&mut self) -> Answer {
        let status = match self.child.try_wait() {
            Ok(None) => return Answer::Pending,
            Ok(Some(s)) => s,
            Err(_) => return Answer::Retry,
        };
        let mut out = Vec::new();
        if let Some(stdout) = self.child.stdout.take() {
            let _ = stdout.take(MAX_OUTPUT).read_to_end(&mut out);
        }
        let text = String::from_utf8_lossy(&out).trim().to_owned();
        match status.code() {
            Some(0) => Answer::Done(Ok(text)),
            // 255 is ssh's own failure; no code means a signal ended it.
            Some(255) | None => Answer::Retry,
            Some(_) => Answer::Done(Err(text)),
        }
    }
}

impl Drop for GuestStatus {
    fn drop(&mut self) {
        // Still running: this handle's own child, not yet reaped, so its pid is still ours.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn sh(script: &str) -> GuestStatus {
        GuestStatus::start(&["sh".into(), "-c".into(), script.into()]).unwrap()
    }

    /// Polls until the answer is no longer pending (at most 5 s).
    fn settle(g: &mut GuestStatus) -> Answer {
        let t = Instant::now();
        loop {
            match g.poll() {
                Answer::Pending if t.elapsed() < Duration::from_secs(5) => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                a => return a,
            }
        }
    }

    #[test]
    fn guest_status_exit_zero_is_done_with_output() {
        let mut g = sh("echo 'status: done'");

        assert_eq!(settle(&mut g), Answer::Done(Ok("status: done".into())));
    }

    #[test]
    fn guest_status_exit_one_is_cloud_init_error_with_output() {
        let mut g = sh("echo 'status: error'; exit 1");

        assert_eq!(settle(&mut g), Answer::Done(Err("status: error".into())));
    }

    #[test]
    fn guest_status_ssh_failure_is_retry() {
        let mut g = sh("exit 255");

        assert_eq!(settle(&mut g), Answer::Retry);
    }

    #[test]
    fn guest_status_running_command_is_pending_without_blocking() {
        let mut g = sh("sleep 30");
        let t = Instant::now();

        let a = g.poll();

        assert_eq!(a, Answer::Pending);
        assert!(t.elapsed() < Duration::from_secs(1), "poll blocked {:?}", t.elapsed());
    }

    #[test]
    fn guest_status_dropped_while_running_kills_and_reaps_its_child() {
        let g = sh("sleep 30");
        let pid = nix::unistd::Pid::from_raw(g.child.id() as i32);

        drop(g);

        // Reaped: the pid is no longer this process's child.
        assert!(nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)).is_err());
    }

    #[test]
    fn guest_status_missing_program_does_not_start() {
        assert!(GuestStatus::start(&["/nonexistent/ssh".into()]).is_none());
        assert!(GuestStatus::start(&[]).is_none());
    }
}
