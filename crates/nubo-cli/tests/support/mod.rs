//! Running the `nubo` binary from the CLI's integration tests: its own `NUBO_ROOT` and
//! `NUBO_RUN_DIR` under the test's directory, no backend preference from the caller's
//! environment, and a deadline, so a hang (a FIFO read, a lock never released) fails the test
//! instead of stalling the suite.

#![allow(dead_code)] // each test file uses its own part of this module

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Writes a 1 MiB raw disk at `path`: non-empty, with no other format's magic, so the inspector
/// accepts it as a base.
pub fn write_raw_base(path: &Path) {
    let mut disk = vec![0u8; 1 << 20];
    disk[0] = b'x';
    std::fs::write(path, disk).unwrap();
}

/// `nubo ARGS` with NUBO_ROOT=`dir`/root and NUBO_RUN_DIR=`dir`/run, run in `cwd`, output piped.
pub fn command(dir: &Path, cwd: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nubo"));
    c.args(args)
        .current_dir(cwd)
        .env("NUBO_ROOT", dir.join("root"))
        .env("NUBO_RUN_DIR", dir.join("run"))
        .env_remove("NUBO_VM_BACKEND")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs `c` to completion with `stdin` as its input, killing it (by its own pid) if it
/// outlives `deadline`, which fails the test naming the command.
pub fn run_bounded(mut c: Command, stdin: Option<&[u8]>, deadline: Duration) -> Output {
    if stdin.is_some() {
        c.stdin(Stdio::piped());
    }
    let mut child = c.spawn().expect("the nubo binary runs");
    if let Some(bytes) = stdin {
        child
            .stdin
            .take()
            .expect("stdin is piped")
            .write_all(bytes)
            .expect("writing nubo's stdin");
    }
    let start = Instant::now();
    while child.try_wait().expect("waiting for nubo").is_none() {
        if start.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collecting nubo's output");
            panic!(
                "{:?} hung for {deadline:?}; stderr: {}",
                c.get_args().collect::<Vec<_>>(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collecting nubo's output")
}

/// `nubo ARGS` under `dir` (also its working directory), bounded by `deadline`.
pub fn nubo(dir: &Path, args: &[&str], deadline: Duration) -> Output {
    run_bounded(command(dir, dir, args), None, deadline)
}

/// Waits for the running `child` (spawned from [`command`]), killing it by its own pid if it
/// outlives `deadline`, which fails the test.
pub fn run_bounded_child(mut child: std::process::Child, deadline: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("waiting for nubo").is_none() {
        if start.elapsed() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collecting nubo's output");
            panic!(
                "nubo hung for {deadline:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("collecting nubo's output")
}
