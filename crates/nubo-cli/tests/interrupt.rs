//! Ctrl-C during a wait the engine makes (`nubo vm rm` waiting for a VM's lock another process
//! holds) and during a download: each ends at SIGINT within moments (not at the 30 s lock wait or
//! when the server gives up), exits 130, says it was cancelled and what it waited for, and did
//! nothing (a download keeps its partial file for the next pull).

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

/// Ctrl-C during a download: the pull ends at its next read (not when the server gives up),
/// exits 130, says it was cancelled and how many bytes it kept, and the partial file stays in
/// the store's `tmp/` for the next pull to resume.
#[test]
fn sigint_during_a_download_keeps_the_partial_and_exits_130() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // An HTTP server on 127.0.0.1 that announces 64 MiB and drips 4 KiB every 20 ms: a pull
    // that nothing stops would take minutes.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/disk.img", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let head = "HTTP/1.1 200 OK\r\nContent-Length: 67108864\r\nConnection: close\r\n\r\n";
                if s.write_all(head.as_bytes()).is_err() || req.starts_with(b"HEAD") {
                    return;
                }
                let chunk = [0x5au8; 4096];
                while s.write_all(&chunk).is_ok() {
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
    });
    let checksum = format!("sha256:{}", "0".repeat(64));
    let args = [
        "image",
        "pull",
        &url,
        "--allow-http",
        "--checksum",
        &checksum,
        "--name",
        "drip:1",
    ];
    let mut child = support::command(d, d, &args).spawn().unwrap();
    let tmp = d.join("root/images/tmp");
    let partial = || -> u64 {
        std::fs::read_dir(&tmp)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".part"))
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    };
    let until = Instant::now() + Duration::from_secs(30);
    while !(catches_sigint(child.id()) && partial() > 0) {
        assert!(Instant::now() < until, "nubo never started the download");
        assert!(
            child.try_wait().unwrap().is_none(),
            "nubo ended before the download was interrupted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let out = support::run_bounded_child(child, Duration::from_secs(20));

    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("the pull was cancelled"), "{stderr}");
    assert!(stderr.contains("bytes are kept"), "{stderr}");
    assert!(partial() > 0, "the partial download was removed: {stderr}");
    assert!(!d.join("root/images/refs").join("drip").exists(), "{stderr}");
}
