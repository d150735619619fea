//! Processes a live test starts: bounded by a timeout, killed by PID on every path.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process killed (SIGKILL, by its PID) and reaped when dropped, so a failing or
/// panicking test never leaves a VM running.
pub struct Guard {
    child: Child,
    what: String,
}

impl Guard {
    pub fn spawn(cmd: &mut Command, what: &str) -> Result<Guard, String> {
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {what} ({:?}): {e}", cmd.get_program()))?;
        Ok(Guard {
            child,
            what: what.to_owned(),
        })
    }

    /// The child's stdin pipe (when spawned with `Stdio::piped()`); dropping it closes it.
    pub fn take_stdin(&mut self) -> Option<std::process::ChildStdin> {
        self.child.stdin.take()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits for exit, killing the process at `timeout`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<ExitStatus, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(format!(
                    "{} (pid {}) still running after {}s: killed",
                    self.what,
                    self.pid(),
                    timeout.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until the console's last text ends with `prompt` (a getty `host login: ` is written
    /// without a newline, so a line-only wait sees it only if something else follows), or a
    /// complete line contains it. Fails as soon as the process exits.
    pub fn wait_for_prompt(&mut self, path: &Path, timeout: Duration, prompt: &str) -> Result<String, String> {
        let what = self.what.clone();
        wait_until_text(
            path,
            timeout,
            Tail::Prompt(prompt),
            |l| l.contains(prompt),
            || self.exited().map(|s| format!("{what} exited with {s}")),
        )
    }

    /// Like [`wait_for_line`], but fails as soon as the process exits.
    pub fn wait_for_line(
        &mut self,
        path: &Path,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String, String> {
        let what = self.what.clone();
        wait_until(path, timeout, pred, || {
            self.exited().map(|s| format!("{what} exited with {s}"))
        })
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.exited().is_none() {
            self.kill();
        }
    }
}

/// Runs `cmd` to completion with its output captured, killed at `timeout`. `Err` names the
/// command and carries its stderr when it fails.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<String, String> {
    let out_file = tempfile::tempfile().map_err(|e| format!("cannot create a temp file: {e}"))?;
    let err_file = tempfile::tempfile().map_err(|e| format!("cannot create a temp file: {e}"))?;
    let clone = |f: &File| f.try_clone().map_err(|e| format!("cannot clone a temp file: {e}"));
    cmd.stdout(Stdio::from(clone(&out_file)?))
        .stderr(Stdio::from(clone(&err_file)?));
    let shown = format!("{:?}", cmd);
    let mut g = Guard::spawn(cmd, &shown)?;
    let status = g.wait_timeout(timeout)?;
    let read = |mut f: File| {
        let mut s = String::new();
        let _ = f.seek(SeekFrom::Start(0));
        let _ = f.read_to_string(&mut s);
        s
    };
    let (out, err) = (read(out_file), read(err_file));
    if status.success() {
        Ok(out)
    } else {
        Err(format!("{shown} failed with {status}:\n{err}{out}"))
    }
}

/// Waits until a line of the growing file at `path` (a serial console log) satisfies `pred`;
/// returns all text seen up to and including that line. On timeout the error carries the last
/// lines seen.
pub fn wait_for_line(path: &Path, timeout: Duration, pred: impl Fn(&str) -> bool) -> Result<String, String> {
    wait_until(path, timeout, pred, || None)
}

fn wait_until(
    path: &Path,
    timeout: Duration,
    pred: impl Fn(&str) -> bool,
    gone: impl FnMut() -> Option<String>,
) -> Result<String, String> {
    wait_until_text(path, timeout, Tail::Ignore, pred, gone)
}

/// What a wait does with the text after the last newline.
enum Tail<'a> {
    /// Nothing: a line still being written could match only in part.
    Ignore,
    /// Matches when it ends with this prompt, which is never followed by a newline.
    Prompt(&'a str),
}

fn wait_until_text(
    path: &Path,
    timeout: Duration,
    tail: Tail<'_>,
    pred: impl Fn(&str) -> bool,
    mut gone: impl FnMut() -> Option<String>,
) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let mut seen = Vec::<u8>::new();
    let mut checked = 0usize;
    loop {
        if let Ok(mut f) = File::open(path) {
            let _ = f.seek(SeekFrom::Start(seen.len() as u64));
            let _ = f.read_to_end(&mut seen);
        }
        // Only complete lines: a line still being written could match only in part.
        while let Some(nl) = seen[checked..].iter().position(|&b| b == b'\n') {
            let line = String::from_utf8_lossy(&seen[checked..checked + nl]).into_owned();
            checked += nl + 1;
            if pred(&line) {
                return Ok(String::from_utf8_lossy(&seen[..checked]).into_owned());
            }
        }
        if let Tail::Prompt(prompt) = tail {
            if seen[checked..].ends_with(prompt.as_bytes()) {
                return Ok(String::from_utf8_lossy(&seen).into_owned());
            }
        }
        let why = if Instant::now() >= deadline {
            Some(format!("timed out after {}s", timeout.as_secs()))
        } else {
            gone()
        };
        if let Some(why) = why {
            let text = String::from_utf8_lossy(&seen);
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            return Err(format!(
                "waiting for a line in {}: {why}; last lines:\n{tail}",
                path.display()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_for_line_returns_text_through_match() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "a\nboot ok\nlater\n").unwrap();

        let seen = wait_for_line(&p, Duration::from_secs(1), |l| l.contains("ok")).unwrap();

        assert_eq!(seen, "a\nboot ok\n");
    }

    #[test]
    fn wait_for_line_timeout_carries_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "only this\n").unwrap();

        let err = wait_for_line(&p, Duration::from_millis(300), |l| l == "never").unwrap_err();

        assert!(err.contains("timed out") && err.contains("only this"), "{err}");
    }

    #[test]
    fn wait_for_prompt_sees_a_prompt_without_newline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "booted\nhost login: ").unwrap();
        let mut g = Guard::spawn(Command::new("sleep").arg("30"), "sleep").unwrap();

        let seen = g.wait_for_prompt(&p, Duration::from_secs(1), " login: ").unwrap();

        assert_eq!(seen, "booted\nhost login: ");
    }

    #[test]
    fn wait_for_prompt_ignores_a_partial_line_that_only_contains_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        std::fs::write(&p, "Last login: yesterday").unwrap();
        let mut g = Guard::spawn(Command::new("sleep").arg("30"), "sleep").unwrap();

        let err = g
            .wait_for_prompt(&p, Duration::from_millis(300), " login: ")
            .unwrap_err();

        assert!(err.contains("timed out"), "{err}");
    }

    #[test]
    fn guard_drop_kills_process() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let g = Guard::spawn(&mut cmd, "sleep").unwrap();
        let pid = g.pid();

        drop(g);

        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
