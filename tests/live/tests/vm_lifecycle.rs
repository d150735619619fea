//! The VM lifecycle end to end through the `nubo` binary (issue 5, item 7): create with a
//! hostname, a key and a user-data (runcmd, write_files, and an `apt-get install` of a local .deb:
//! the boot-speed trimmed image still does what a user asks of it; issue 25), readiness from
//! cloud-init's own closing line, `vm ssh`,
//! stop/start and a killed VMM keeping the instance, rm + create giving a new instance, killed
//! and concurrent creates converging with nothing orphaned, bad input refused before anything
//! is made, and direct-kernel boot on the microvm machine.
//!
//! Boots are shared: five guests boot to cloud-init (four in the main test, one microvm); the
//! killed and concurrent creates start QEMU but never wait for the guest. Every command is
//! bounded; every VM is removed by `nubo vm rm --force` and any QEMU left under the test's root
//! is killed by PID, on every path (see [`Cleanup`]). Networking is always `--restrict-network`.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use nubo_live::cli::{
    field, guest, inspect, ls_state, no_qemu, nubo, one_qemu, qemu_processes, run, vm_dirs, vms_empty, zygote_served,
    Cleanup, Out,
};
use nubo_live::{Guard, LiveTest, TestResult, TestRoot};

/// One boot to cloud-init under TCG on a shared 2-core machine.
const BOOT: Duration = Duration::from_secs(300);
/// A command that boots nothing (or only starts QEMU).
const QUICK: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    nubo_live::run(vec![
        LiveTest::new("vm_lifecycle_bad_input_refused_nothing_created", &["bootstrap"], || {
            timed("bad_input", bad_input)
        }),
        LiveTest::new(
            "vm_lifecycle_create_ssh_stop_start_kill_recreate",
            &["qemu", "bootstrap"],
            || timed("main", main_lifecycle),
        ),
        LiveTest::new("vm_lifecycle_killed_create_converges", &["qemu", "bootstrap"], || {
            timed("killed_create", killed_create)
        }),
        LiveTest::new(
            "vm_lifecycle_concurrent_create_one_wins",
            &["qemu", "bootstrap"],
            || timed("concurrent_create", concurrent_create),
        ),
        LiveTest::new("vm_lifecycle_microvm_direct_kernel", &["qemu", "bootstrap"], || {
            timed("microvm", microvm)
        }),
    ])
}

fn timed(what: &str, body: impl FnOnce() -> TestResult) -> TestResult {
    let t = Instant::now();
    let r = body();
    println!(
        "timing {what}: {:.1}s ({})",
        t.elapsed().as_secs_f64(),
        if r.is_ok() { "ok" } else { "failed" }
    );
    r
}

// ---------------------------------------------------------------------------------------------
// What the test leaves behind

/// The VM directory holds one attempt's files and nothing else (no stray overlay, seed or temp
/// file from a dead attempt), and the record is complete.
fn one_clean_vm(root: &TestRoot, name: &str, when: &str) -> Result<serde_json::Value, String> {
    let dirs = vm_dirs(root);
    if dirs != [name] {
        return Err(format!("{when}: vms/ holds {dirs:?}, expected only `{name}`"));
    }
    let dir = root.root().join("vms").join(name);
    let allowed = [
        "vm.json",
        "disk.qcow2",
        "seed.img",
        "console.log",
        "console.log.1",
        "known_hosts",
    ];
    let mut files: Vec<String> = fs::read_dir(&dir)
        .map_err(|e| format!("{when}: cannot list {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let stray: Vec<&String> = files.iter().filter(|f| !allowed.contains(&f.as_str())).collect();
    if !stray.is_empty() {
        return Err(format!(
            "{when}: stray files in {}: {stray:?} (all: {files:?})",
            dir.display()
        ));
    }
    for f in ["vm.json", "disk.qcow2", "seed.img"] {
        if !files.iter().any(|x| x == f) {
            return Err(format!("{when}: {} has no {f} (files: {files:?})", dir.display()));
        }
    }
    let text = fs::read_to_string(dir.join("vm.json")).map_err(|e| format!("{when}: reading vm.json: {e}"))?;
    let rec: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{when}: vm.json: {e}"))?;
    if rec["phase"] != "created" {
        return Err(format!("{when}: record phase is {}, expected created", rec["phase"]));
    }
    // The run directory holds this VM's runtime files and the locks, nothing from another attempt.
    let run: Vec<String> = fs::read_dir(root.run_dir())
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "locks" && n != name)
        .collect();
    if !run.is_empty() {
        return Err(format!("{when}: stray entries in the run dir: {run:?}"));
    }
    Ok(rec)
}

// ---------------------------------------------------------------------------------------------
// Fixture for a personalised VM

struct Personal {
    _dir: tempfile::TempDir,
    key: PathBuf,
    pubkey: PathBuf,
    user_data: PathBuf,
    marker: String,
    /// The text `write_files` puts at [`WRITTEN`].
    written: String,
}

/// Where the user-data's `write_files` puts a file of the test's own.
const WRITTEN: &str = "/var/tmp/nubo-written";
/// The package the user-data installs with `apt-get install` from a local .deb (no network).
const PROBE_PACKAGE: &str = "nubo-live-probe";

/// A key pair of the test's own (ssh-keygen) and a user-data whose runcmd appends a marker to a
/// file (per-instance: must hold one line however often the VM boots) and to the console; whose
/// `write_files` writes a file and a .deb built here; and whose runcmd installs that .deb with
/// `apt-get install` (offline: a local file), as a user would a package: the trimmed image keeps
/// cloud-init's modules and apt working.
fn personal(tag: &str) -> Result<Personal, String> {
    let dir = tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let key = dir.path().join("id_test");
    let mut kg = Command::new("ssh-keygen");
    kg.args(["-q", "-t", "ed25519", "-N", "", "-C", "nubo-live", "-f"])
        .arg(&key);
    run(&mut kg, QUICK)?.require()?;
    let marker = format!("NUBO-RUNCMD-{tag}");
    let written = format!("NUBO-WRITTEN-{tag}");
    let deb = base64::engine::general_purpose::STANDARD.encode(probe_deb(dir.path(), &marker)?);
    let user_data = dir.path().join("user-data");
    fs::write(
        &user_data,
        format!(
            "#cloud-config\nwrite_files:\n  - path: {WRITTEN}\n    content: {written}\n  - path: /var/tmp/{PROBE_PACKAGE}.deb\n    encoding: b64\n    content: {deb}\nruncmd:\n  - echo {marker} >> /var/tmp/nubo-runcmd\n  - echo {marker} > /dev/ttyS0\n  - DEBIAN_FRONTEND=noninteractive apt-get install -y /var/tmp/{PROBE_PACKAGE}.deb > /var/tmp/nubo-apt.log 2>&1\n"
        ),
    )
    .map_err(|e| format!("writing {}: {e}", user_data.display()))?;
    Ok(Personal {
        written,
        pubkey: PathBuf::from(format!("{}.pub", key.display())),
        key,
        user_data,
        marker,
        _dir: dir,
    })
}

/// A package of the test's own, built with `dpkg-deb`: architecture `all`, no dependencies, one
/// file holding `marker`. Returns the .deb's bytes.
fn probe_deb(dir: &Path, marker: &str) -> Result<Vec<u8>, String> {
    let tree = dir.join("deb");
    let share = tree.join("usr/share").join(PROBE_PACKAGE);
    fs::create_dir_all(tree.join("DEBIAN"))
        .and_then(|()| fs::create_dir_all(&share))
        .map_err(|e| format!("cannot make the probe package's tree in {}: {e}", tree.display()))?;
    fs::write(
        tree.join("DEBIAN/control"),
        format!(
            "Package: {PROBE_PACKAGE}\nVersion: 1.0\nArchitecture: all\nMaintainer: nubo live tests <nubo@localhost>\nDescription: probe installed by nubo's vm_lifecycle live test\n"
        ),
    )
    .and_then(|()| fs::write(share.join("marker"), format!("{marker}\n")))
    .map_err(|e| format!("cannot write the probe package's files in {}: {e}", tree.display()))?;
    let deb = dir.join(format!("{PROBE_PACKAGE}.deb"));
    let mut build = Command::new("dpkg-deb");
    build
        .args(["--root-owner-group", "-Zgzip", "--build"])
        .arg(&tree)
        .arg(&deb);
    run(&mut build, QUICK)?.require()?;
    fs::read(&deb).map_err(|e| format!("reading {}: {e}", deb.display()))
}

fn tag() -> String {
    let mut b = [0u8; 4];
    let _ = fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    format!("{:08x}", u32::from_le_bytes(b) ^ std::process::id())
}

fn expect_ready(out: &Out, what: &str) -> Result<(), String> {
    let ready = out.stderr.lines().find(|l| l.contains("is ready")).unwrap_or_default();
    if !out.stderr.contains("cloud-init finished") || !ready.contains("DataSourceNoCloud") {
        return Err(format!(
            "{what}: no `cloud-init finished` phase naming DataSourceNoCloud:\n{}",
            out.stderr
        ));
    }
    Ok(())
}

fn path_str(p: &Path) -> String {
    p.display().to_string()
}

// ---------------------------------------------------------------------------------------------
// The tests

/// Steps 1-4 on one name, four boots: create + checks (and `create` again, same and different
/// spec); stop/start; kill -9 of QEMU + start; rm + create.
fn main_lifecycle() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let name = "life";
    let _cleanup = Cleanup::new(&root, &[name]);
    let tag = tag();
    let hostname = format!("nubo-life-{tag}");
    let p = personal(&tag)?;
    let key_arg = format!("@{}", path_str(&p.pubkey));
    let ud = path_str(&p.user_data);
    let create_args = [
        "vm",
        "create",
        name,
        "--image",
        "debian:12",
        "--hostname",
        &hostname,
        "--ssh-key",
        &key_arg,
        "--user-data",
        &ud,
        "--restrict-network",
    ];
    let with_wait = |extra: &[&'static str]| {
        let mut v: Vec<&str> = create_args.to_vec();
        v.extend_from_slice(extra);
        v
    };

    // 1. create --wait: cloud-init finished from the seed.
    let t = Instant::now();
    let out = nubo(&root, &with_wait(&["--wait", "--boot-timeout", "300s"]), BOOT + QUICK)?.require()?;
    expect_ready(&out, "create --wait")?;
    println!("timing boot 1 (create --wait): {:.1}s", t.elapsed().as_secs_f64());
    let rec = inspect(&root, name)?;
    let uuid = field(&rec, "/uuid")?;
    one_qemu(&root, &uuid, "after create")?;
    check_guest(&root, name, &hostname, &uuid, &p, "first boot")?;
    let log = nubo(&root, &["vm", "logs", name], QUICK)?.require()?;
    if !log.stdout.contains(&p.marker) {
        return Err(format!("runcmd marker {} not in `vm logs {name}`", p.marker));
    }
    // The user's own key, with plain ssh on the port `vm ip` names.
    let ip = nubo(&root, &["vm", "ip", name], QUICK)?.require()?;
    let port = ip
        .stdout
        .trim()
        .strip_prefix("127.0.0.1:")
        .ok_or_else(|| format!("`vm ip` printed {:?}, expected 127.0.0.1:PORT", ip.stdout))?
        .to_owned();
    let mut ssh = Command::new("ssh");
    ssh.arg("-i").arg(&p.key).args(["-p", &port]).args([
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=20",
        "debian@127.0.0.1",
        "hostname",
    ]);
    let own = run(&mut ssh, QUICK)?.require()?;
    if own.stdout.trim() != hostname {
        return Err(format!(
            "ssh with the test's key: hostname {:?}, expected {hostname}",
            own.stdout.trim()
        ));
    }

    // create again, same spec: returned as is; different spec: refused naming the difference.
    let again = nubo(&root, &create_args, QUICK)?.require()?;
    if !again.stderr.contains("exists") {
        return Err(format!(
            "create of the existing VM with the same spec did not say `exists`:\n{}",
            again.stderr
        ));
    }
    let differ = nubo(&root, &with_wait(&["--vcpus", "2"]), QUICK)?;
    if differ.ok || !differ.stderr.contains("vcpus") {
        return Err(format!(
            "create with a different --vcpus: expected a failure naming vcpus, got {:?}:\n{}",
            differ.code, differ.stderr
        ));
    }
    if field(&inspect(&root, name)?, "/uuid")? != uuid {
        return Err("create of an existing VM changed its uuid".into());
    }
    one_qemu(&root, &uuid, "after the repeated creates")?;
    // rm of a running VM without --force is refused and removes nothing.
    let rm = nubo(&root, &["vm", "rm", name], QUICK)?;
    if rm.ok || !rm.stderr.contains("--force") {
        return Err(format!(
            "`vm rm` of a running VM: expected a refusal naming --force, got:\n{}",
            rm.stderr
        ));
    }
    one_qemu(&root, &uuid, "after the refused rm")?;

    // 2. stop / start: same instance, per-instance modules not re-run.
    nubo(&root, &["vm", "stop", name, "--timeout", "120s"], BOOT)?.require()?;
    no_qemu(&root, "after stop")?;
    let state = ls_state(&root, name)?;
    if state != "stopped" {
        return Err(format!("after stop, `vm ls` says {state}"));
    }
    let t = Instant::now();
    nubo(&root, &["vm", "start", name], QUICK)?.require()?;
    let w = nubo(&root, &["vm", "wait", name, "--timeout", "300s"], BOOT + QUICK)?.require()?;
    if !w.stdout.contains("DataSourceNoCloud") {
        return Err(format!("`vm wait` after start: {}{}", w.stdout, w.stderr));
    }
    println!("timing boot 2 (stop, start, wait): {:.1}s", t.elapsed().as_secs_f64());
    one_qemu(&root, &uuid, "after start")?;
    check_guest(&root, name, &hostname, &uuid, &p, "after stop/start")?;

    // 3. kill -9 of QEMU: seen as stopped; start recovers.
    let pid_file = field(&inspect(&root, name)?, "/backend_state/pid_file")?;
    let pid: i32 = fs::read_to_string(&pid_file)
        .map_err(|e| format!("reading {pid_file}: {e}"))?
        .trim()
        .parse()
        .map_err(|e| format!("pid file {pid_file}: {e}"))?;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("kill -9 {pid}: {e}"))?;
    no_qemu(&root, "after kill -9")?;
    let state = ls_state(&root, name)?;
    if state != "stopped" {
        return Err(format!("after kill -9 of QEMU, `vm ls` says {state}"));
    }
    let t = Instant::now();
    nubo(&root, &["vm", "start", name], QUICK)?.require()?;
    nubo(&root, &["vm", "wait", name, "--timeout", "300s"], BOOT + QUICK)?.require()?;
    println!(
        "timing boot 3 (kill -9, start, wait): {:.1}s",
        t.elapsed().as_secs_f64()
    );
    one_qemu(&root, &uuid, "after start following kill -9")?;
    if ls_state(&root, name)? != "running" {
        return Err("after start following kill -9, `vm ls` does not say running".into());
    }
    check_guest(&root, name, &hostname, &uuid, &p, "after kill -9 and start")?;

    // 4. rm, then create with the same name: a new instance, cloud-init runs again.
    nubo(&root, &["vm", "rm", "--force", name], QUICK)?.require()?;
    no_qemu(&root, "after rm --force")?;
    vms_empty(&root, "after rm --force")?;
    let t = Instant::now();
    let out = nubo(&root, &with_wait(&["--wait", "--boot-timeout", "300s"]), BOOT + QUICK)?.require()?;
    expect_ready(&out, "re-create --wait")?;
    println!("timing boot 4 (rm, create --wait): {:.1}s", t.elapsed().as_secs_f64());
    let uuid2 = field(&inspect(&root, name)?, "/uuid")?;
    if uuid2 == uuid {
        return Err(format!("re-created VM kept the old uuid {uuid}"));
    }
    one_qemu(&root, &uuid2, "after re-create")?;
    check_guest(&root, name, &hostname, &uuid2, &p, "re-created")?;
    nubo(&root, &["vm", "rm", "--force", name], QUICK)?.require()?;
    no_qemu(&root, "at the end")?;
    vms_empty(&root, "at the end")
}

/// hostname, instance-id = uuid, runcmd ran exactly once for this instance, one instance dir.
fn check_guest(root: &TestRoot, name: &str, hostname: &str, uuid: &str, p: &Personal, when: &str) -> TestResult {
    let (marker, written) = (p.marker.as_str(), p.written.as_str());
    let h = guest(root, name, "hostname")?;
    if h != hostname {
        return Err(format!("{when}: guest hostname {h:?}, expected {hostname:?}"));
    }
    let iid = guest(root, name, "cat /var/lib/cloud/data/instance-id")?;
    if iid != uuid {
        return Err(format!(
            "{when}: guest instance-id {iid:?}, expected the VM's uuid {uuid}"
        ));
    }
    let lines = guest(root, name, "cat /var/tmp/nubo-runcmd")?;
    if lines.lines().collect::<Vec<_>>() != [marker] {
        return Err(format!(
            "{when}: /var/tmp/nubo-runcmd holds {lines:?}, expected the marker once (runcmd is per-instance)"
        ));
    }
    let w = guest(root, name, &format!("cat {WRITTEN}"))?;
    if w != written {
        return Err(format!(
            "{when}: write_files left {w:?} in {WRITTEN}, expected {written:?}"
        ));
    }
    let installed = guest(
        root,
        name,
        &format!("dpkg-query -W -f '${{Status}}' {PROBE_PACKAGE}; echo; cat /usr/share/{PROBE_PACKAGE}/marker"),
    )
    .map_err(|e| {
        let log = guest(root, name, "cat /var/tmp/nubo-apt.log").unwrap_or_default();
        format!("{when}: {PROBE_PACKAGE} is not installed: {e}\napt-get said:\n{log}")
    })?;
    if installed.lines().collect::<Vec<_>>() != ["install ok installed", marker] {
        return Err(format!(
            "{when}: `apt-get install` of the local .deb: dpkg says {installed:?}, expected installed with the marker {marker}"
        ));
    }
    let instances = guest(root, name, "ls /var/lib/cloud/instances")?;
    if instances.split_whitespace().collect::<Vec<_>>() != [uuid] {
        return Err(format!(
            "{when}: /var/lib/cloud/instances holds {instances:?}, expected only {uuid}"
        ));
    }
    zygote_served(root, name, when)?;
    println!(
        "  {when}: hostname {h}, instance-id {iid}, runcmd once, write_files and apt-get install done, one instance, the four stages served by the zygote"
    );
    Ok(())
}

#[derive(Debug, Clone, Copy)]
enum KillAt {
    After(u64),
    /// As soon as a QEMU process for the VM exists (nubo is waiting for `-daemonize`).
    QemuSpawned,
    /// Once `create` printed this line.
    Line(&'static str),
}

/// Step 5: `nubo vm create --wait` killed at several points, then the same `create` again.
fn killed_create() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let name = "crash";
    let _cleanup = Cleanup::new(&root, &[name]);
    let logs = tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let args = ["vm", "create", name, "--image", "debian:12", "--restrict-network"];
    let points = [
        KillAt::After(0),
        KillAt::After(20),
        KillAt::After(50),
        KillAt::After(100),
        KillAt::After(150),
        KillAt::Line("overlay "),
        KillAt::Line("seed "),
        // The narrowest window, between QEMU's exec and its pid file: hit it a few times.
        KillAt::QemuSpawned,
        KillAt::QemuSpawned,
        KillAt::QemuSpawned,
        KillAt::QemuSpawned,
        KillAt::Line("created and started"),
    ];
    for (i, point) in points.iter().enumerate() {
        let err_log = logs.path().join(format!("create-{i}.err"));
        let mut cmd = root.cmd()?;
        cmd.args(args)
            .arg("--wait")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                fs::File::create(&err_log).map_err(|e| format!("creating {}: {e}", err_log.display()))?,
            ));
        let t = Instant::now();
        let mut g = Guard::spawn(&mut cmd, "nubo vm create --wait")?;
        match point {
            KillAt::After(ms) => std::thread::sleep(Duration::from_millis(*ms)),
            KillAt::QemuSpawned => {
                let deadline = Instant::now() + QUICK;
                while qemu_processes(&root).is_empty() {
                    if Instant::now() >= deadline || g.exited().is_some() {
                        return Err(format!("{point:?}: no QEMU appeared; create log:\n{}", read(&err_log)));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            // Polled tightly (not wait_for_line's 250 ms): the whole create takes ~0.2 s.
            KillAt::Line(l) => {
                let deadline = Instant::now() + QUICK;
                while !read(&err_log).contains(l) {
                    if Instant::now() >= deadline || g.exited().is_some() {
                        return Err(format!(
                            "{point:?}: create never printed it; its log:\n{}",
                            read(&err_log)
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        let ran = t.elapsed();
        let exited = g.exited();
        g.kill();
        let what = format!(
            "create killed at {point:?} ({} ms in{})",
            ran.as_millis(),
            if exited.is_some() { ", had exited" } else { "" }
        );
        let left = leftovers(&root, name);

        let again = nubo(&root, &args, QUICK)?;
        if !again.ok {
            return Err(format!(
                "{what}: the next create failed:\n{}\nkilled create's log:\n{}",
                again.stderr,
                read(&err_log)
            ));
        }
        let rec = one_clean_vm(&root, name, &what)?;
        let uuid = field(&rec, "/uuid")?;
        one_qemu(&root, &uuid, &what)?;
        if field(&inspect(&root, name)?, "/uuid")? != uuid {
            return Err(format!("{what}: inspect and vm.json disagree on the uuid"));
        }
        let said = again
            .stderr
            .lines()
            .rev()
            .find(|l| l.contains("vm `"))
            .unwrap_or("")
            .to_owned();
        println!("  {what}: left {left}; next create converged ({said})");
        nubo(&root, &["vm", "rm", "--force", name], QUICK)?.require()?;
        no_qemu(&root, &format!("{what}: after rm --force"))?;
        vms_empty(&root, &format!("{what}: after rm --force"))?;
    }
    Ok(())
}

/// What a killed create left behind, for the report: record phase, files, QEMU processes.
fn leftovers(root: &TestRoot, name: &str) -> String {
    let dir = root.root().join("vms").join(name);
    let phase = fs::read_to_string(dir.join("vm.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map_or_else(|| "no record".to_owned(), |v| format!("phase {}", v["phase"]));
    let mut files: Vec<String> = fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    format!("{phase}, files {files:?}, {} qemu", qemu_processes(root).len())
}

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_default()
}

/// Step 6: two `create` of one name at once, twice. With different hostnames the loser cannot
/// be the idempotent "exists": exactly one succeeds, the other fails saying busy or naming the
/// difference. With the same spec exactly one creates; the other is busy, or (if it came
/// second) returns the same VM as existing. Either way one VM, one QEMU, nothing orphaned.
fn concurrent_create() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let name = "race";
    let _cleanup = Cleanup::new(&root, &[name]);
    for same_spec in [false, true] {
        race_round(&root, name, same_spec)?;
    }
    Ok(())
}

fn race_round(root: &TestRoot, name: &str, same_spec: bool) -> TestResult {
    let round = if same_spec { "same spec" } else { "different hostnames" };
    let logs = tempfile::tempdir().map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let mut guards = Vec::new();
    for i in 0..2 {
        let err_log = logs.path().join(format!("race-{i}.err"));
        let host = if same_spec {
            "race".to_owned()
        } else {
            format!("race-{i}")
        };
        let mut cmd = root.cmd()?;
        cmd.args([
            "vm",
            "create",
            name,
            "--image",
            "debian:12",
            "--restrict-network",
            "--hostname",
            &host,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(
            fs::File::create(&err_log).map_err(|e| format!("creating {}: {e}", err_log.display()))?,
        ));
        guards.push((Guard::spawn(&mut cmd, "nubo vm create")?, err_log, host));
    }
    // (exit code, stderr, hostname asked for)
    let mut results = Vec::new();
    for (g, log, host) in &mut guards {
        let status = g.wait_timeout(QUICK)?;
        results.push((status.code(), read(log), host.clone()));
    }
    let created: Vec<_> = results
        .iter()
        .filter(|r| r.0 == Some(0) && r.1.contains("created and started"))
        .collect();
    let others: Vec<_> = results
        .iter()
        .filter(|r| !(r.0 == Some(0) && r.1.contains("created and started")))
        .collect();
    if created.len() != 1 || others.len() != 1 {
        return Err(format!(
            "{round}: expected exactly one create to make the VM, got {results:?}"
        ));
    }
    let other = others[0];
    let busy = other.0 == Some(1) && other.1.contains("is busy");
    let clear = busy
        || if same_spec {
            other.0 == Some(0) && other.1.contains("exists")
        } else {
            other.0 == Some(1) && other.1.contains("already exists with a different spec")
        };
    if !clear {
        return Err(format!(
            "{round}: the other create did not end clearly (exit {:?}):\n{}",
            other.0, other.1
        ));
    }
    let rec = one_clean_vm(root, name, round)?;
    let uuid = field(&rec, "/uuid")?;
    one_qemu(root, &uuid, round)?;
    if rec["spec"]["cloudInit"]["hostname"] != created[0].2.as_str() {
        return Err(format!(
            "{round}: the record's hostname {} is not the winner's {}",
            rec["spec"]["cloudInit"]["hostname"], created[0].2
        ));
    }
    let said = other
        .1
        .lines()
        .find(|l| l.starts_with("error") || l.contains("exists"))
        .unwrap_or(other.1.trim());
    println!(
        "  {round}: one created the VM; the other (exit {:?}) said: {said}",
        other.0
    );
    nubo(root, &["vm", "rm", "--force", name], QUICK)?.require()?;
    no_qemu(root, &format!("{round}: after rm --force"))?;
    vms_empty(root, &format!("{round}: after rm --force"))
}

/// Step 7: bad names and a too-small disk are refused with exit 1, naming the problem, before
/// anything is made.
fn bad_input() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let long = "a".repeat(64);
    let cases: [(&str, &[&str], &[&str]); 5] = [
        ("a/b", &[], &["a/b", "/"]),
        ("..", &[], &[".."]),
        (&long, &[], &["63"]),
        ("Web", &[], &["Web"]),
        ("okname", &["--disk-size", "1M"], &["--disk-size", "virtual size"]),
    ];
    let _cleanup = Cleanup::new(&root, &["okname"]);
    for (name, extra, expect) in cases {
        let mut args = vec!["vm", "create", name, "--image", "debian:12", "--restrict-network"];
        args.extend_from_slice(extra);
        let out = nubo(&root, &args, QUICK)?;
        let msg = out.stderr.trim();
        if out.code != Some(1) {
            return Err(format!("`{}`: expected exit 1, got {:?}:\n{msg}", out.shown, out.code));
        }
        if let Some(missing) = expect.iter().find(|e| !msg.contains(*e)) {
            return Err(format!(
                "`{}`: the message does not name `{missing}`:\n{msg}",
                out.shown
            ));
        }
        vms_empty(&root, &out.shown)?;
        no_qemu(&root, &out.shown)?;
        println!("  {name:?} {extra:?}: {}", msg.lines().last().unwrap_or(""));
    }
    Ok(())
}

/// Step 8: direct-kernel boot on the microvm machine reaches cloud-init finished.
fn microvm() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let name = "micro";
    let _cleanup = Cleanup::new(&root, &[name]);
    let hostname = format!("nubo-micro-{}", tag());
    let t = Instant::now();
    let out = nubo(
        &root,
        &[
            "vm",
            "create",
            name,
            "--image",
            "debian:12",
            "--machine",
            "microvm",
            // QEMU's microvm machine: the heuristic would pick cloud-hypervisor where installed.
            "--backend",
            "qemu",
            "--hostname",
            &hostname,
            "--restrict-network",
            "--wait",
            "--boot-timeout",
            "300s",
        ],
        BOOT + QUICK,
    )?;
    let console = root.root().join("vms").join(name).join("console.log");
    if !out.ok {
        let log = read(&console);
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        return Err(format!(
            "microvm create --wait failed ({:?}):\n{}\nconsole tail:\n{}",
            out.code,
            out.stderr,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    expect_ready(&out, "microvm create --wait")?;
    println!(
        "timing boot 5 (microvm create --wait): {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let rec = inspect(&root, name)?;
    let uuid = field(&rec, "/uuid")?;
    one_qemu(&root, &uuid, "microvm")?;
    let argv = rec["launch"]["value"].as_array().map(|a| a.len()).unwrap_or(0);
    if rec["launch"]["kind"] != "argv" || !rec["launch"]["value"].to_string().contains("microvm") || argv == 0 {
        return Err(format!(
            "the recorded launch argv does not use the microvm machine: {}",
            rec["launch"]
        ));
    }
    let h = guest(&root, name, "hostname")?;
    if h != hostname {
        return Err(format!("microvm: guest hostname {h:?}, expected {hostname:?}"));
    }
    let iid = guest(&root, name, "cat /var/lib/cloud/data/instance-id")?;
    if iid != uuid {
        return Err(format!("microvm: instance-id {iid:?}, expected {uuid}"));
    }
    nubo(&root, &["vm", "rm", "--force", name], QUICK)?.require()?;
    no_qemu(&root, "microvm after rm")?;
    vms_empty(&root, "microvm after rm")
}
