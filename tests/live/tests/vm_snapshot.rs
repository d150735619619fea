//! Snapshots on the qemu backend end to end through the `nubo` binary (issue 12), on ONE
//! cloud-init boot: a memory snapshot of a running guest brings back a deleted file and an
//! in-guest counter at the snapshot's value (and reports how long the guest was frozen); it
//! survives stop and restores onto the stopped VM from its memory; a disk-only snapshot of the
//! stopped VM reverts its disk (one plain boot proves it); a killed `snapshot create` leaves a
//! truthful list and a usable VM; the verified base's sha256 never changes; `rm` leaves nothing.
//!
//! Every command is bounded; the VM is removed by `nubo vm rm --force` and any QEMU left under
//! the test's root is killed by PID on every path ([`Cleanup`]). Networking is `--restrict-network`.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nubo_live::{Guard, LiveTest, TestResult, TestRoot};

/// One boot to cloud-init under TCG on a shared 2-core machine (258 s seen under load 10).
const BOOT: Duration = Duration::from_secs(420);
/// A command that boots nothing, or saves/loads a 1 GiB guest's state.
const QUICK: Duration = Duration::from_secs(180);
const VM: &str = "snap";

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "vm_snapshot_memory_disk_stop_start_kill_rm",
        &["qemu", "qemu-img", "bootstrap"],
        || {
            let t = Instant::now();
            let r = snapshots();
            println!(
                "timing vm_snapshot: {:.1}s ({})",
                t.elapsed().as_secs_f64(),
                if r.is_ok() { "ok" } else { "failed" }
            );
            r
        },
    )])
}

fn sha256(p: &Path) -> Result<String, String> {
    let out = run(Command::new("sha256sum").arg(p), QUICK)?.require()?;
    Ok(out.stdout.split_whitespace().next().unwrap_or_default().to_owned())
}

/// The counter the guest's background loop writes every second, and the guest's uptime.
fn counter(root: &TestRoot) -> Result<(u64, f64), String> {
    let out = guest(root, VM, "cat /dev/shm/ticks; cut -d' ' -f1 /proc/uptime")?;
    let mut it = out.lines();
    let ticks = it.next().and_then(|l| l.trim().parse().ok());
    let up = it.next().and_then(|l| l.trim().parse().ok());
    ticks
        .zip(up)
        .ok_or_else(|| format!("cannot read the guest's counter: {out:?}"))
}

fn snapshot_ls(root: &TestRoot) -> Result<serde_json::Value, String> {
    let out = nubo(root, &["vm", "snapshot", "ls", VM, "-o", "json"], QUICK)?.require()?;
    serde_json::from_str(&out.stdout).map_err(|e| format!("`snapshot ls -o json` is not JSON ({e}): {}", out.stdout))
}

/// (status, has_memory) of snapshot `name` in `snapshot ls -o json`, if listed.
fn listed(ls: &serde_json::Value, name: &str) -> Option<(String, bool)> {
    ls["snapshots"].as_array()?.iter().find(|s| s["name"] == name).map(|s| {
        (
            s["status"].as_str().unwrap_or_default().to_owned(),
            s["has_memory"].as_bool().unwrap_or(false),
        )
    })
}

fn expect_listed(root: &TestRoot, name: &str, memory: bool, when: &str) -> Result<serde_json::Value, String> {
    let ls = snapshot_ls(root)?;
    match listed(&ls, name) {
        Some((status, m)) if status == "ok" && m == memory => Ok(ls),
        other => Err(format!(
            "{when}: snapshot `{name}` is {other:?}, expected ok with memory={memory}:\n{ls}"
        )),
    }
}

/// `snapshot create`, returning the freeze time it reported (memory snapshots).
fn take(root: &TestRoot, name: &str) -> Result<Option<f64>, String> {
    let out = nubo(root, &["vm", "snapshot", "create", VM, name], QUICK)?.require()?;
    let frozen = out
        .stderr
        .split("frozen for ")
        .nth(1)
        .and_then(|r| r.split('s').next())
        .and_then(|v| v.parse().ok());
    println!(
        "  snapshot `{name}`: {}",
        out.stderr.lines().last().unwrap_or("").trim()
    );
    Ok(frozen)
}

fn restore(root: &TestRoot, name: &str) -> Result<String, String> {
    let t = Instant::now();
    let out = nubo(root, &["vm", "snapshot", "restore", VM, name], QUICK)?.require()?;
    println!(
        "  restore `{name}` in {:.2}s: {}",
        t.elapsed().as_secs_f64(),
        out.stderr.trim().replace('\n', " / ")
    );
    Ok(out.stderr)
}

fn snapshots() -> TestResult {
    let root = TestRoot::new()?;
    let image = root.with_debian_image()?;
    let _cleanup = Cleanup::new(&root, &[VM]);
    let base_sha = sha256(&image.qcow2)?;

    // The one cloud-init boot.
    let t = Instant::now();
    let out = nubo(
        &root,
        &[
            "vm",
            "create",
            VM,
            "--image",
            "debian:12",
            "--memory",
            "1G",
            "--restrict-network",
            "--wait",
            "--boot-timeout",
            "420s",
        ],
        BOOT + QUICK,
    )?
    .require()?;
    if !out.stderr.contains("cloud-init finished") {
        return Err(format!(
            "create --wait did not reach cloud-init finished:\n{}",
            out.stderr
        ));
    }
    println!("timing boot (create --wait): {:.1}s", t.elapsed().as_secs_f64());
    let iid = guest(&root, VM, "cat /var/lib/cloud/data/instance-id")?;

    // A file on disk and a counter in memory.
    guest(
        &root,
        VM,
        "echo kept > /var/tmp/nubo-snap-file && sync && (setsid nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/ticks; sleep 1; done' </dev/null >/dev/null 2>&1 &) && sleep 3",
    )?;
    let (t0, u0) = counter(&root)?;
    let frozen = take(&root, "mem")?.ok_or("`snapshot create` of the running VM reported no freeze time")?;
    let (t1, u1) = counter(&root)?;
    println!("  counter at the snapshot: {t0}..{t1} (uptime {u0:.1}..{u1:.1}s); guest frozen {frozen:.3}s");
    expect_listed(&root, "mem", true, "after create")?;

    guest(&root, VM, "rm /var/tmp/nubo-snap-file && sync")?;
    std::thread::sleep(Duration::from_secs(30));
    let (t2, u2) = counter(&root)?;
    restore(&root, "mem")?;
    let (t3, u3) = counter(&root)?;
    println!("  counter: {t2} before restore (uptime {u2:.1}s), {t3} after (uptime {u3:.1}s)");
    if !(t0 <= t3 && t3 + 10 < t2 && u3 < u2) {
        return Err(format!(
            "the counter did not go back to the snapshot's value: snapshot {t0}..{t1}, before restore {t2}, after {t3} (uptime {u2} -> {u3})"
        ));
    }
    let file = guest(&root, VM, "cat /var/tmp/nubo-snap-file")?;
    if file != "kept" {
        return Err(format!("the deleted file did not come back: {file:?}"));
    }

    // Stop/start: the snapshot survives, and its memory restores onto the stopped VM.
    guest(&root, VM, "echo cold > /var/tmp/nubo-cold-file && sync")?;
    nubo(&root, &["vm", "stop", VM, "--timeout", "60s"], QUICK)?.require()?;
    expect_listed(&root, "mem", true, "after stop")?;
    take(&root, "cold")?;
    expect_listed(&root, "cold", false, "after a stopped snapshot")?;
    let said = restore(&root, "mem")?;
    if !said.contains("started from snapshot") {
        return Err(format!(
            "restoring a memory snapshot onto the stopped VM did not start it:\n{said}"
        ));
    }
    let (t4, _) = counter(&root)?;
    let cold = guest(&root, VM, "cat /var/tmp/nubo-cold-file 2>/dev/null || echo absent")?;
    let file = guest(&root, VM, "cat /var/tmp/nubo-snap-file")?;
    println!("  restored onto the stopped VM: counter {t4}, file {file:?}, later file {cold:?}");
    if !(t0 <= t4 && t4 + 10 < t2) || file != "kept" || cold != "absent" {
        return Err(format!(
            "memory restore onto the stopped VM: counter {t4} (snapshot {t0}..{t1}), file {file:?}, later file {cold:?}"
        ));
    }

    // The disk-only snapshot reverts the disk of the stopped VM (a plain boot shows it).
    nubo(&root, &["vm", "stop", "--force", VM], QUICK)?.require()?;
    restore(&root, "cold")?;
    let rec = snapshot_ls(&root)?;
    if rec["state"] != "stopped" || rec["current"] != "cold" {
        return Err(format!(
            "after a disk-only restore the VM should be stopped at `cold`: {rec}"
        ));
    }
    let t = Instant::now();
    nubo(&root, &["vm", "start", VM], QUICK)?.require()?;
    nubo(&root, &["vm", "wait", VM, "--for", "ssh", "--timeout", "420s"], BOOT)?.require()?;
    let cold = guest(&root, VM, "cat /var/tmp/nubo-cold-file")?;
    println!(
        "timing plain boot after the disk restore: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    if cold != "cold" {
        return Err(format!(
            "the disk-only restore did not bring back the stopped VM's disk: {cold:?}"
        ));
    }
    let iid2 = guest(&root, VM, "cat /var/lib/cloud/data/instance-id")?;
    if iid2 != iid {
        return Err(format!("the instance-id changed across restores: {iid} -> {iid2}"));
    }

    killed_create(&root)?;

    if sha256(&image.qcow2)? != base_sha {
        return Err(format!("the base image {} changed", image.qcow2.display()));
    }
    nubo(&root, &["vm", "rm", "--force", VM], QUICK)?.require()?;
    no_qemu(&root, "after rm")?;
    vms_empty(&root, "after rm")?;
    let runs: Vec<_> = fs::read_dir(root.run_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "locks")
        .collect();
    if !runs.is_empty() {
        return Err(format!("after rm the run dir still holds {runs:?}"));
    }
    if sha256(&image.qcow2)? != base_sha {
        return Err(format!("the base image {} changed", image.qcow2.display()));
    }
    Ok(())
}

/// `kill -9` of `snapshot create` of the running VM at several points: afterwards the list is
/// truthful (the snapshot absent, `ok`, or `incomplete`), an incomplete one is removable, and
/// the VM still answers and takes the next snapshot.
fn killed_create(root: &TestRoot) -> TestResult {
    let logs = tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
    for (i, delay) in [0u64, 150, 400, 1500].into_iter().enumerate() {
        let name = format!("killed-{i}");
        let err_log = logs.path().join(format!("{name}.err"));
        let mut cmd = root.cmd()?;
        cmd.args(["vm", "snapshot", "create", VM, &name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                fs::File::create(&err_log).map_err(|e| format!("creating {}: {e}", err_log.display()))?,
            ));
        let mut g = Guard::spawn(&mut cmd, "nubo vm snapshot create")?;
        std::thread::sleep(Duration::from_millis(delay));
        let exited = g.exited();
        g.kill();
        // A second command waits its turn on the VM's lock (busy until the kill releases it).
        let ls = snapshot_ls(root)?;
        let status = listed(&ls, &name);
        println!(
            "  snapshot create killed after {delay} ms{}: listed as {status:?}",
            if exited.is_some() { " (had exited)" } else { "" }
        );
        match status.as_ref().map(|s| s.0.as_str()) {
            None | Some("ok") | Some("incomplete") => {}
            Some(other) => return Err(format!("killed create left `{name}` as {other}:\n{ls}")),
        }
        if status.is_some() {
            nubo(root, &["vm", "snapshot", "rm", VM, &name], QUICK)?.require()?;
        }
        if listed(&snapshot_ls(root)?, &name).is_some() {
            return Err(format!("`{name}` is still listed after `snapshot rm`"));
        }
        guest(root, VM, "true")?;
    }
    take(root, "after-kills")?;
    expect_listed(root, "after-kills", true, "after the killed creates")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Running nubo (as in vm_lifecycle.rs)

struct Out {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
    shown: String,
}

impl Out {
    fn require(self) -> Result<Out, String> {
        if self.ok {
            Ok(self)
        } else {
            Err(format!(
                "`{}` failed ({:?}):\n{}{}",
                self.shown, self.code, self.stderr, self.stdout
            ))
        }
    }
}

/// `nubo ARGS` under `root`, bounded by `timeout`, with both outputs captured whatever the exit.
fn nubo(root: &TestRoot, args: &[&str], timeout: Duration) -> Result<Out, String> {
    let mut cmd = root.cmd()?;
    cmd.args(args);
    run(&mut cmd, timeout)
}

fn run(cmd: &mut Command, timeout: Duration) -> Result<Out, String> {
    let out_file = tempfile::tempfile().map_err(|e| format!("cannot create a temp file: {e}"))?;
    let err_file = tempfile::tempfile().map_err(|e| format!("cannot create a temp file: {e}"))?;
    let clone = |f: &fs::File| f.try_clone().map_err(|e| format!("cannot clone a temp file: {e}"));
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(clone(&out_file)?))
        .stderr(Stdio::from(clone(&err_file)?));
    let shown = shown(cmd);
    let mut g = Guard::spawn(cmd, &shown)?;
    let status = g.wait_timeout(timeout)?;
    let read = |mut f: fs::File| {
        let mut s = String::new();
        let _ = f.seek(SeekFrom::Start(0));
        let _ = f.read_to_string(&mut s);
        s
    };
    Ok(Out {
        ok: status.success(),
        code: status.code(),
        stdout: read(out_file),
        stderr: read(err_file),
        shown,
    })
}

fn shown(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `vm ssh NAME -- cmd`, stdout trimmed. Retried for a while: right after cloud-init finishes
/// sshd may still be settling, and with a shared CPU the first connection can time out.
fn guest(root: &TestRoot, name: &str, cmd: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let out = nubo(root, &["vm", "ssh", name, "--", cmd], QUICK)?;
        if out.ok {
            return Ok(out.stdout.trim().to_owned());
        }
        // 255 is ssh's own failure (connection or auth): worth another try; anything else is
        // the command's answer.
        if out.code != Some(255) || Instant::now() >= deadline {
            return Err(format!(
                "`{}` failed ({:?}):\n{}{}",
                out.shown, out.code, out.stderr, out.stdout
            ));
        }
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// Removes the test's VMs (`nubo vm rm --force`) and kills, by PID, any QEMU whose command line
/// names the test's root, on every path out of the test.
struct Cleanup<'a> {
    root: &'a TestRoot,
    names: Vec<String>,
}

impl<'a> Cleanup<'a> {
    fn new(root: &'a TestRoot, names: &[&str]) -> Self {
        Cleanup {
            root,
            names: names.iter().map(|s| s.to_string()).collect(),
        }
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for n in &self.names {
            if let Ok(out) = nubo(self.root, &["vm", "rm", "--force", n], QUICK) {
                if !out.ok {
                    eprintln!("cleanup: `vm rm --force {n}` failed: {}", out.stderr.trim());
                }
            }
        }
        for (pid, _) in qemu_processes(self.root) {
            eprintln!("cleanup: killing stray QEMU pid {pid}");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// QEMU processes whose command line mentions the test's NUBO_ROOT (their disk lives there):
/// (pid, NUL-joined command line).
fn qemu_processes(root: &TestRoot) -> Vec<(i32, String)> {
    let needle = root.root().display().to_string();
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(raw) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_qemu = args.first().is_some_and(|a| a.contains("qemu-system"));
        if is_qemu && args.iter().any(|a| a.contains(&needle)) {
            found.push((pid, args.join(" ")));
        }
    }
    found.sort();
    found
}

fn no_qemu(root: &TestRoot, when: &str) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let procs = qemu_processes(root);
        if procs.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let list: Vec<String> = procs.iter().map(|(p, c)| format!("  pid {p}: {c}")).collect();
            return Err(format!("{when}: QEMU still running:\n{}", list.join("\n")));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The names in `vms/` (missing directory = none).
fn vm_dirs(root: &TestRoot) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root.root().join("vms"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn vms_empty(root: &TestRoot, when: &str) -> Result<(), String> {
    let left = vm_dirs(root);
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("{when}: vms/ still holds {left:?}"))
    }
}
