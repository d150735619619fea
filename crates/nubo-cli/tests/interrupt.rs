//! Ctrl-C during a wait the engine makes: `nubo vm rm` waiting for a VM's lock another process
//! holds ends at SIGINT within moments (not at the 30 s lock wait), exits 130, says it was
//! cancelled and what it waited for, and did nothing.

mod support;

use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[test]
fn sigint_during_lock_wait_exits_130_cancelled_and_does_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A VM directory without a record: `vm rm` takes its lock, then would remove it.
    let vm = d.join("root/vms/ghost");
    std::fs::create_dir_all(&vm).unwrap();
    std::fs::create_dir_all(d.join("run/locks")).unwrap();
    let lock = std::fs::File::create(d.join("run/locks/ghost.lock")).unwrap();
    let _held = Flock::lock(lock, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| e)
        .unwrap();
    let mut child = support::command(d, d, &["vm", "rm", "ghost"]).spawn().unwrap();
    // Its handler is installed (SIGINT caught, per /proc) when it builds the engine, just
    // before the wait; give it a moment more to be in the wait itself.
    let until = Instant::now() + Duration::from_secs(20);
    while !catches_sigint(child.id()) {
        assert!(Instant::now() < until, "nubo never installed its SIGINT handler");
        assert!(
            child.try_wait().unwrap().is_none(),
            "nubo ended before waiting for the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "nubo did not wait for the held lock"
    );
    let t0 = Instant::now();

    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let out = support::run_bounded_child(child, Duration::from_secs(10));

    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(stderr.contains("error: cancelled while"), "{stderr}");
    assert!(stderr.contains("ghost"), "{stderr}");
    assert!(vm.is_dir(), "the VM directory was removed although cancelled");
}

/// Whether process `pid` catches SIGINT (its bit in `SigCgt` of /proc/PID/status).
fn catches_sigint(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_some_and(|m| m & (1 << (Signal::SIGINT as u64 - 1)) != 0)
}
