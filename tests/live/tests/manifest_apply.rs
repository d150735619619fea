//! `nubo apply` end to end (issue 13): one file with a VirtualMachine and a microvm Workload,
//! applied with `--wait` (both boot to cloud-init's closing line at once, in parallel), applied
//! again (nothing changes and it says so), applied with a changed field (refused with the
//! field's difference, nothing touched), and `delete -f` (both gone, no QEMU left).
//!
//! The two guests boot concurrently, so the test costs about one boot's wall time: the
//! Workload's microvm boot is the one extra the CI budget allows when it is cheap, and the
//! timing line printed below is the evidence. Every command is bounded; every VM is removed
//! and any QEMU left under the test's root is killed by PID on every path. Networking is
//! `restricted` (QEMU user-mode networking with restrict=on).

use std::fs;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nubo_live::cli::{inspect, json, no_qemu, nubo, qemu_processes, Cleanup};
use nubo_live::{LiveTest, TestResult, TestRoot};

/// Two boots to cloud-init at once under TCG on a shared 2-core machine.
const BOOT: Duration = Duration::from_secs(480);
/// A command that boots nothing.
const QUICK: Duration = Duration::from_secs(120);
const NAMES: [&str; 2] = ["mweb", "mwork"];

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "manifest_apply_wait_unchanged_changed_delete",
        &["qemu", "bootstrap"],
        || {
            let t = Instant::now();
            let r = apply_cycle();
            println!(
                "timing manifest_apply: {:.1}s ({})",
                t.elapsed().as_secs_f64(),
                if r.is_ok() { "ok" } else { "failed" }
            );
            r
        },
    )])
}

fn manifest(memory: &str) -> String {
    format!(
        "# the live test's fleet: one VM, one microvm workload
apiVersion: nubo.dev/v1alpha1
kind: VirtualMachine
metadata:
  name: mweb
spec:
  image: debian:12
  resources: {{ memory: {memory} }}
  network: restricted
  cloudInit:
    hostname: mweb-live
    userDataFile: files/user-data.yaml
  bootTimeout: 7m
---
apiVersion: nubo.dev/v1alpha1
kind: Workload
metadata:
  name: mwork
spec:
  type: microvm
  microvm:
    image: debian:12
    memory: 512M
    network: restricted
    cloudInit:
      hostname: mwork-live
    bootTimeout: 7m
"
    )
}

fn apply_cycle() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let _cleanup = Cleanup::new(&root, &NAMES);
    let dir = tempfile::tempdir().map_err(|e| format!("tempdir: {e}"))?;
    fs::create_dir_all(dir.path().join("files")).map_err(|e| e.to_string())?;
    fs::write(
        dir.path().join("files/user-data.yaml"),
        "#cloud-config\nruncmd:\n  - [sh, -c, 'echo applied > /run/nubo-manifest']\n",
    )
    .map_err(|e| e.to_string())?;
    let file = dir.path().join("fleet.yaml");
    fs::write(&file, manifest("1G")).map_err(|e| e.to_string())?;
    let f = file.display().to_string();

    // 1. apply --wait: both created, both ready (cloud-init finished from the NoCloud seed).
    let t = Instant::now();
    let out = nubo(&root, &["apply", "-f", &f, "--wait", "-o", "json"], BOOT + QUICK)?;
    if !out.ok {
        return Err(format!(
            "apply --wait failed ({:?}):\n{}\n{}\nconsole tails:\n{}",
            out.code,
            out.stderr,
            out.stdout,
            consoles(&root)
        ));
    }
    println!(
        "timing apply --wait (two guests in parallel): {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let report = json(&out.stdout, "the apply report")?;
    for name in NAMES {
        let doc = doc(&report, name)?;
        if doc["result"] != "created" {
            return Err(format!(
                "first apply: `{name}` result {}, expected created: {doc}",
                doc["result"]
            ));
        }
        let ready = doc["ready"].as_str().unwrap_or_default();
        if !ready.contains("finished, datasource DataSourceNoCloud") {
            return Err(format!("first apply: `{name}` not ready from its seed: {doc}"));
        }
    }
    // No `backend:` and `network: restricted`: the heuristic passes cloud-hypervisor over (it
    // has no restricted network) for QEMU's microvm machine.
    if !doc(&report, "mwork")?["backendReason"]
        .as_str()
        .unwrap_or_default()
        .starts_with("backend qemu (chosen by the built-in heuristic: a microvm runs on cloud-hypervisor")
    {
        return Err(format!("the workload's backend reason: {}", doc(&report, "mwork")?));
    }
    let uuids = [uuid(&root, "mweb")?, uuid(&root, "mwork")?];
    let work = inspect(&root, "mwork")?;
    if !work["launch"]["value"].to_string().contains("microvm") {
        return Err(format!(
            "the workload's QEMU does not use the microvm machine: {}",
            work["launch"]
        ));
    }
    if work["spec"]["machine"] != "microvm" {
        return Err(format!("the workload's spec machine: {}", work["spec"]));
    }
    let qemus = qemu_processes(&root).len();
    if qemus != 2 {
        return Err(format!("{qemus} QEMU processes after apply, expected 2"));
    }

    // 2. apply again: nothing changes, and it says so.
    let out = nubo(&root, &["apply", "-f", &f], QUICK)?.require()?;
    for name in NAMES {
        let want = format!("`{name}`: unchanged");
        if !out.stdout.contains(&want) {
            return Err(format!("second apply does not say {want:?}:\n{}", out.stdout));
        }
    }
    if [uuid(&root, "mweb")?, uuid(&root, "mwork")?] != uuids {
        return Err("second apply replaced a VM (its uuid changed)".into());
    }

    // 3. a changed field: refused with its difference, nothing touched.
    fs::write(&file, manifest("2G")).map_err(|e| e.to_string())?;
    let out = nubo(&root, &["apply", "-f", &f], QUICK)?;
    if out.ok || !out.stderr.contains("spec.resources.memory: 1G -> 2G") || !out.stderr.contains("--recreate") {
        return Err(format!(
            "a changed memory was not refused with its difference ({:?}):\n{}{}",
            out.code, out.stderr, out.stdout
        ));
    }
    if !out.stderr.contains("user-data never re-applies") {
        return Err(format!(
            "the refusal does not say user-data never re-applies:\n{}",
            out.stderr
        ));
    }
    if [uuid(&root, "mweb")?, uuid(&root, "mwork")?] != uuids || qemu_processes(&root).len() != 2 {
        return Err("a refused apply touched a VM".into());
    }

    // 4. delete -f: both removed, no QEMU left, nothing in vms/.
    let out = nubo(&root, &["delete", "-f", &f], QUICK)?.require()?;
    for name in NAMES {
        if !out.stdout.contains(&format!("vm `{name}` removed")) {
            return Err(format!("delete does not report `{name}` removed:\n{}", out.stdout));
        }
    }
    no_qemu(&root, "after delete")?;
    let left: Vec<String> = fs::read_dir(root.root().join("vms"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    if !left.is_empty() {
        return Err(format!("vms/ still holds {left:?} after delete"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn doc<'a>(report: &'a serde_json::Value, name: &str) -> Result<&'a serde_json::Value, String> {
    report["documents"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == name)
        .ok_or_else(|| format!("the report has no `{name}`: {report}"))
}

fn uuid(root: &TestRoot, name: &str) -> Result<String, String> {
    inspect(root, name)?["uuid"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("`vm inspect {name}` has no uuid"))
}

fn consoles(root: &TestRoot) -> String {
    let mut out = String::new();
    for name in NAMES {
        let log = fs::read_to_string(root.root().join("vms").join(name).join("console.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(25).collect();
        out.push_str(&format!(
            "--- {name}\n{}\n",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    out
}
