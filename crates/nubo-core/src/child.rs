//! Waiting for a child process with a bound.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// How often [`wait_bounded`] looks.
const POLL: Duration = Duration::from_millis(20);

/// Waits up to `timeout` for `child` to exit and returns its status; past that, or when it
/// cannot be waited for, kills and reaps it and returns `None`.
pub fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[test]
    fn exit_within_the_bound_gives_its_status() {
        let mut c = Command::new("sh").args(["-c", "exit 3"]).spawn().unwrap();

        let st = wait_bounded(&mut c, Duration::from_secs(10)).unwrap();

        assert_eq!(st.code(), Some(3));
    }

    #[test]
    fn past_the_bound_it_is_killed_and_reaped() {
        let mut c = Command::new("sleep").arg("30").spawn().unwrap();
        let t0 = Instant::now();

        assert_eq!(wait_bounded(&mut c, Duration::from_millis(200)), None);

        assert!(t0.elapsed() < Duration::from_secs(10));
        // Reaped: nothing is left to wait for.
        assert!(c.try_wait().unwrap().is_some());
    }
}
