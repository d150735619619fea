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
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nubo_live::cli::{guest, no_qemu, nubo, run, vms_empty, Cleanup};
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
