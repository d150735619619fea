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
use std::io::{Read, Seek, SeekFrom};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nubo_live::{Guard, LiveTest, TestResult, TestRoot};

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
    let _cleanup = Cleanup { root: &root };
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
    let report = json(&out.stdout)?;
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
    if doc(&report, "mwork")?["backendReason"]
        != "backend qemu (chosen by the Workload's default: a microvm runs on qemu's microvm machine)"
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
    no_qemu(&root)?;
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

struct Out {
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Out {
    fn require(self) -> Result<Out, String> {
        if self.ok {
            Ok(self)
        } else {
            Err(format!(
                "nubo failed ({:?}):\n{}{}",
                self.code, self.stderr, self.stdout
            ))
        }
    }
}

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
    let shown = format!("{cmd:?}");
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
    })
}

fn json(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON ({e}): {text}"))
}

fn doc<'a>(report: &'a serde_json::Value, name: &str) -> Result<&'a serde_json::Value, String> {
    report["documents"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == name)
        .ok_or_else(|| format!("the report has no `{name}`: {report}"))
}

fn inspect(root: &TestRoot, name: &str) -> Result<serde_json::Value, String> {
    let out = nubo(root, &["vm", "inspect", name], QUICK)?.require()?;
    json(&out.stdout)
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

/// Removes the test's VMs and kills, by PID, any QEMU whose command line names the test's
/// root, on every path out of the test.
struct Cleanup<'a> {
    root: &'a TestRoot,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for n in NAMES {
            let _ = nubo(self.root, &["vm", "rm", "--force", n], QUICK);
        }
        for (pid, _) in qemu_processes(self.root) {
            eprintln!("cleanup: killing stray QEMU pid {pid}");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// QEMU processes whose command line mentions the test's NUBO_ROOT: (pid, command line).
fn qemu_processes(root: &TestRoot) -> Vec<(i32, String)> {
    let needle = root.root().display().to_string();
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
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
        if args.first().is_some_and(|a| a.contains("qemu-system")) && args.iter().any(|a| a.contains(&needle)) {
            found.push((pid, args.join(" ")));
        }
    }
    found
}

fn no_qemu(root: &TestRoot) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !qemu_processes(root).is_empty() {
        if Instant::now() >= deadline {
            return Err(format!("QEMU still running after delete: {:?}", qemu_processes(root)));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}
