//! Driving the `nubo` CLI from live tests: bounded runs with both outputs captured, the JSON
//! answers they read, `vm ssh` into a guest, and what a test must leave behind (no VM, no QEMU
//! under its root) checked and enforced on every path out.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Guard, TestResult, TestRoot};

/// The bound for the quick commands these helpers run themselves (`vm inspect`, `vm rm`).
const QUICK: Duration = Duration::from_secs(120);

/// A finished command: exit, both outputs, and the command line for messages.
#[derive(Debug)]
pub struct Out {
    pub ok: bool,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub shown: String,
}

impl Out {
    /// The command must have succeeded.
    pub fn require(self) -> Result<Out, String> {
        if self.ok {
            Ok(self)
        } else {
            Err(format!(
                "`{}` failed ({:?}):\n{}{}",
                self.shown, self.code, self.stderr, self.stdout
            ))
        }
    }

    /// The command must have failed, its error saying all of `words`.
    pub fn refused(self, words: &[&str]) -> Result<Out, String> {
        if self.ok {
            return Err(format!(
                "`{}` succeeded but should have failed:\n{}",
                self.shown, self.stdout
            ));
        }
        for w in words {
            if !self.stderr.contains(w) {
                return Err(format!(
                    "`{}`: the error does not say `{w}`:\n{}",
                    self.shown, self.stderr
                ));
            }
        }
        Ok(self)
    }
}

/// `nubo ARGS` under `root`, bounded by `timeout`, with both outputs captured whatever the exit.
pub fn nubo(root: &TestRoot, args: &[&str], timeout: Duration) -> Result<Out, String> {
    nubo_in(root, args, None, timeout)
}

/// [`nubo`] with `stdin` written to the command's standard input.
pub fn nubo_in(root: &TestRoot, args: &[&str], stdin: Option<&str>, timeout: Duration) -> Result<Out, String> {
    let mut cmd = root.cmd()?;
    cmd.args(args);
    run_in(&mut cmd, stdin, timeout)
}

/// Any command, bounded by `timeout`, stdin empty.
pub fn run(cmd: &mut Command, timeout: Duration) -> Result<Out, String> {
    run_in(cmd, None, timeout)
}

/// Any command, bounded by `timeout`, with `stdin` as its input.
pub fn run_in(cmd: &mut Command, stdin: Option<&str>, timeout: Duration) -> Result<Out, String> {
    let out_file = tempfile::tempfile().map_err(|e| format!("cannot create a temp file: {e}"))?;
    let err_file = tempfile::tempfile().map_err(|e| format!("cannot create a temp file: {e}"))?;
    let clone = |f: &fs::File| f.try_clone().map_err(|e| format!("cannot clone a temp file: {e}"));
    cmd.stdout(Stdio::from(clone(&out_file)?))
        .stderr(Stdio::from(clone(&err_file)?))
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    let shown = shown(cmd);
    let mut g = Guard::spawn(cmd, &shown)?;
    if let Some(text) = stdin {
        let mut pipe = g.take_stdin().ok_or("no stdin pipe")?;
        pipe.write_all(text.as_bytes())
            .map_err(|e| format!("cannot write to `{shown}`'s stdin: {e}"))?;
    }
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

/// The command line, for messages.
pub fn shown(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` as JSON; `what` names where it came from.
pub fn json(text: &str, what: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| format!("{what} is not JSON ({e}): {text}"))
}

/// `nubo vm inspect NAME`.
pub fn inspect(root: &TestRoot, name: &str) -> Result<serde_json::Value, String> {
    let out = nubo(root, &["vm", "inspect", name], QUICK)?.require()?;
    json(&out.stdout, &format!("`vm inspect {name}`"))
}

/// The string at JSON pointer `ptr`.
pub fn field(v: &serde_json::Value, ptr: &str) -> Result<String, String> {
    v.pointer(ptr)
        .and_then(|x| x.as_str())
        .map(str::to_owned)
        .ok_or_else(|| format!("no string at {ptr} in {v}"))
}

/// The state `vm ls -o json` reports for `name`.
pub fn ls_state(root: &TestRoot, name: &str) -> Result<String, String> {
    let out = nubo(root, &["vm", "ls", "-o", "json"], QUICK)?.require()?;
    let v = json(&out.stdout, "`vm ls -o json`")?;
    v.as_array()
        .into_iter()
        .flatten()
        .find(|vm| vm["name"] == name)
        .and_then(|vm| vm["state"].as_str().map(str::to_owned))
        .ok_or_else(|| format!("`vm ls -o json` does not list `{name}`: {}", out.stdout))
}

/// `vm ssh NAME -- cmd`, stdout trimmed. Retried for a while: right after cloud-init finishes
/// sshd may still be settling, and with a shared CPU the first connection can time out.
pub fn guest(root: &TestRoot, name: &str, cmd: &str) -> Result<String, String> {
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

/// How a [`Cleanup`] runs `nubo ARGS` under a root, bounded (plain [`nubo`] unless told).
type Runner<'a> = Box<dyn Fn(&TestRoot, &[&str], Duration) -> Result<Out, String> + 'a>;

/// Removes the test's VMs (`nubo vm rm --force`) and kills, by PID, any QEMU whose command line
/// names the test's root and any Cloud Hypervisor of its run directory, on every path out of
/// the test.
pub struct Cleanup<'a> {
    root: &'a TestRoot,
    names: Vec<String>,
    nubo: Runner<'a>,
}

impl<'a> Cleanup<'a> {
    pub fn new(root: &'a TestRoot, names: &[&str]) -> Self {
        Cleanup {
            root,
            names: names.iter().map(|s| s.to_string()).collect(),
            nubo: Box::new(nubo),
        }
    }

    /// Runs `vm rm --force` through `run`: for tests whose `nubo` runs in a namespace of its own
    /// or with another VMM on PATH.
    pub fn through(mut self, run: impl Fn(&TestRoot, &[&str], Duration) -> Result<Out, String> + 'a) -> Self {
        self.nubo = Box::new(run);
        self
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        for n in &self.names {
            if let Ok(out) = (self.nubo)(self.root, &["vm", "rm", "--force", n], QUICK) {
                if !out.ok {
                    eprintln!("cleanup: `vm rm --force {n}` failed: {}", out.stderr.trim());
                }
            }
        }
        let strays = qemu_processes(self.root)
            .into_iter()
            .map(|(pid, _)| (pid, "QEMU"))
            .chain(
                cloud_hypervisor_processes(self.root)
                    .into_iter()
                    .map(|(pid, _)| (pid, "Cloud Hypervisor")),
            );
        for (pid, what) in strays {
            eprintln!("cleanup: killing stray {what} pid {pid}");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Every Cloud Hypervisor process of the test's root (its API socket is under the root's run
/// directory), children included: (pid, the `NUBO_VM_UUID` in its environment).
pub fn cloud_hypervisor_processes(root: &TestRoot) -> Vec<(i32, String)> {
    let needle = root.run_dir().display().to_string();
    let mut found = Vec::new();
    for (pid, dir) in processes() {
        let cmdline = fs::read(dir.join("cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(&needle) {
            continue;
        }
        let env = fs::read(dir.join("environ")).unwrap_or_default();
        if let Some(uuid) = env.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(b"NUBO_VM_UUID=")) {
            found.push((pid, String::from_utf8_lossy(uuid).into_owned()));
        }
    }
    found
}

/// QEMU processes whose command line mentions the test's NUBO_ROOT (their disk lives there):
/// (pid, space-joined command line), by pid.
pub fn qemu_processes(root: &TestRoot) -> Vec<(i32, String)> {
    let needle = root.root().display().to_string();
    processes_where(|args| {
        args.first().is_some_and(|a| a.contains("qemu-system")) && args.iter().any(|a| a.contains(&needle))
    })
}

/// virtiofsd processes whose command line mentions `needle` (a run directory, where their
/// sockets are, or a shared folder): (pid, space-joined command line), by pid.
pub fn virtiofsds(needle: &str) -> Vec<(i32, String)> {
    processes_where(|args| {
        args.first().is_some_and(|a| a.ends_with("virtiofsd")) && args.iter().any(|a| a.contains(needle))
    })
}

/// No virtiofsd of `needle` is left within 15 s (each exits when its VMM disconnects).
pub fn no_virtiofsd(needle: &str, when: &str) -> TestResult {
    until_empty(Duration::from_secs(15), || virtiofsds(needle))
        .map_err(|left| format!("{when}: virtiofsd still running: {left:?}"))
}

/// Polls `list` until it lists nothing (a process being killed takes a moment to go), or
/// `within` passes: then `Err` with what it last listed.
pub fn until_empty<T>(within: Duration, list: impl Fn() -> Vec<T>) -> Result<(), Vec<T>> {
    let deadline = Instant::now() + within;
    loop {
        let left = list();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(left);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kills, by PID, any virtiofsd of `needle` left on the way out of a test.
pub struct KillVirtiofsd(pub String);

impl Drop for KillVirtiofsd {
    fn drop(&mut self) {
        for (pid, _) in virtiofsds(&self.0) {
            eprintln!("cleanup: killing stray virtiofsd pid {pid}");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Processes whose argv passes `pred`: (pid, space-joined command line), by pid.
fn processes_where(pred: impl Fn(&[String]) -> bool) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for (pid, dir) in processes() {
        let Ok(raw) = fs::read(dir.join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if pred(&args) {
            found.push((pid, args.join(" ")));
        }
    }
    found.sort();
    found
}

/// Every process: its pid and its `/proc` directory.
fn processes() -> impl Iterator<Item = (i32, std::path::PathBuf)> {
    fs::read_dir("/proc").into_iter().flatten().flatten().filter_map(|e| {
        let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
        Some((pid, e.path()))
    })
}

/// Exactly one QEMU runs for the test's root, and it is the VM with `uuid`: its pid.
pub fn one_qemu(root: &TestRoot, uuid: &str, when: &str) -> Result<i32, String> {
    // A QEMU that was just killed may linger for a moment as the daemonizing parent exits.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = qemu_processes(root);
        let ours = procs.iter().filter(|(_, c)| c.contains(uuid)).count();
        if procs.len() == 1 && ours == 1 {
            return Ok(procs[0].0);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{when}: expected exactly one QEMU (uuid {uuid}) under {}, found {}:\n{}",
                root.root().display(),
                procs.len(),
                listed(&procs)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// No QEMU runs for the test's root (within a few seconds: a killed one may still be exiting).
pub fn no_qemu(root: &TestRoot, when: &str) -> TestResult {
    until_empty(Duration::from_secs(10), || qemu_processes(root))
        .map_err(|procs| format!("{when}: QEMU still running:\n{}", listed(&procs)))
}

fn listed(procs: &[(i32, String)]) -> String {
    procs
        .iter()
        .map(|(p, c)| format!("  pid {p}: {c}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names in `vms/` (missing directory = none), sorted.
pub fn vm_dirs(root: &TestRoot) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root.root().join("vms"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The bootstrapped image's cloud-init zygote ran all four stages of the guest's current boot:
/// each of its children records its stage in `/run/nubo-cloud-init/served` (a tmpfs, so per
/// boot); a stage that fell back to a plain `cloud-init` process records nothing.
pub fn zygote_served(root: &TestRoot, name: &str, when: &str) -> TestResult {
    let served = guest(root, name, "sudo cat /run/nubo-cloud-init/served")?;
    for stage in ["init --local", "init", "modules --mode=config", "modules --mode=final"] {
        if !served.lines().any(|l| l.starts_with(&format!("{stage} pid "))) {
            return Err(format!(
                "{when}: cloud-init's `{stage}` did not run in the zygote:\n{served}"
            ));
        }
    }
    Ok(())
}

/// `vms/` holds no VM.
pub fn vms_empty(root: &TestRoot, when: &str) -> TestResult {
    let left = vm_dirs(root);
    if left.is_empty() {
        Ok(())
    } else {
        Err(format!("{when}: vms/ still holds {left:?}"))
    }
}
