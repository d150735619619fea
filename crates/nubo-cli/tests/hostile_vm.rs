//! Hostile input to `nubo vm` (issue 9): option-shaped strings, extreme numbers, devices,
//! FIFOs and YAML bombs. Each is refused with a message naming the flag and the cause, a usage
//! error exits 2 and a refused request 1, nothing is left behind (no VM directory, no lock
//! file), and nothing hangs. No VM boots: every case is refused before the VMM would start.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

struct Env {
    dir: tempfile::TempDir,
    disk: PathBuf,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    // A raw disk: non-empty, no other format's magic, so the inspector accepts it as a base.
    let disk = dir.path().join("base.raw");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    Env { dir, disk }
}

impl Env {
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// Runs nubo, killing it if it takes longer than 20 s (a hang is a failure, not a stuck test).
    fn nubo(&self, args: &[&str]) -> Output {
        support::nubo(self.dir.path(), args, Duration::from_secs(20))
    }

    fn create(&self, extra: &[&str]) -> Output {
        let disk = self.disk.display().to_string();
        let mut args = vec!["vm", "create", "evil", "--disk", disk.as_str(), "--restrict-network"];
        args.extend_from_slice(extra);
        self.nubo(&args)
    }

    /// Nothing of a VM is left: no VM directory and no lock file.
    fn assert_nothing_left(&self) {
        let listing = |p: &Path| -> Vec<String> {
            std::fs::read_dir(p)
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(listing(&self.root().join("vms")), Vec::<String>::new(), "VM dirs left");
        assert_eq!(
            listing(&self.run_dir().join("locks")),
            Vec::<String>::new(),
            "lock files left"
        );
    }

    fn file(&self, name: &str, content: &[u8]) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.display().to_string()
    }

    fn fifo(&self) -> String {
        let p = self.dir.path().join("fifo");
        let st = Command::new("mkfifo").arg(&p).status().unwrap();
        assert!(st.success());
        p.display().to_string()
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn refused(o: &Output, code: i32, needles: &[&str]) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(code), "{e}");
    for n in needles {
        assert!(e.contains(n), "missing {n:?} in: {e}");
    }
}

/// Regression (issue 9.4): `--ssh-user=-oProxyCommand=touch /tmp/x` reached ssh's argv.
#[test]
fn create_option_shaped_ssh_user_refused() {
    let e = env();

    let o = e.create(&["--ssh-user=-oProxyCommand=touch /tmp/x"]);

    refused(&o, 1, &["--ssh-user", "spec.sshUser"]);
    e.assert_nothing_left();
}

#[test]
fn create_option_shaped_hostname_refused() {
    let e = env();

    let o = e.create(&["--hostname=-oProxyCommand=x"]);

    refused(&o, 1, &["--hostname"]);
    e.assert_nothing_left();
}

/// Regression (issue 9.5): these durations panicked or printed 584542046090 years.
#[test]
fn durations_beyond_bounds_are_usage_errors() {
    let e = env();
    let huge = "18446744073709551615s";

    let create = e.create(&["--wait", "--boot-timeout", huge]);
    let wait = e.nubo(&["vm", "wait", "evil", "--timeout", huge]);
    let stop = e.nubo(&["vm", "stop", "evil", "--timeout", "99999999h"]);

    for o in [&create, &wait, &stop] {
        refused(o, 2, &["allowed range"]);
        assert!(!stderr(o).contains("panicked"), "{}", stderr(o));
    }
    e.assert_nothing_left();
}

/// Regression (issue 9.7): refused only after the lock, record and overlay were written.
#[test]
fn create_extreme_sizes_refused_before_any_write() {
    let e = env();

    let memory = e.create(&["--memory", "99999T"]);
    let vcpus = e.create(&["--vcpus", "289"]);
    let unaligned = e.create(&["--disk-size", "1000001"]);
    let huge_disk = e.create(&["--disk-size", "100000T"]);

    refused(&memory, 1, &["--memory"]);
    refused(&vcpus, 1, &["--vcpus"]);
    refused(&unaligned, 1, &["--disk-size"]);
    refused(&huge_disk, 1, &["--disk-size"]);
    e.assert_nothing_left();
}

#[test]
fn create_memory_beyond_host_names_both_numbers() {
    let e = env();

    let o = e.create(&["--memory", "8T"]);

    refused(&o, 1, &["--memory", "more than the host's"]);
    e.assert_nothing_left();
}

#[test]
fn create_user_data_too_large_refused_before_any_write() {
    let e = env();
    let mut big = b"#cloud-config\n".to_vec();
    big.resize(17 << 20, b'#');
    let ud = e.file("big.yaml", &big);

    let o = e.create(&["--user-data", &ud]);

    refused(&o, 1, &["--user-data"]);
    e.assert_nothing_left();
}

#[test]
fn create_user_data_from_devices_and_fifos_refused_at_once() {
    let e = env();
    let fifo = e.fifo();

    let zero = e.create(&["--user-data", "/dev/zero"]);
    let pipe = e.create(&["--user-data", &fifo]);
    let dir = e.create(&["--user-data", "/tmp"]);

    refused(&zero, 1, &["character device"]);
    // A FIFO is a pipe a user may name (issue 21.15): with no writer, refused at the timeout.
    refused(&pipe, 1, &["nothing was written"]);
    refused(&dir, 1, &["directory"]);
    e.assert_nothing_left();
}

/// Regression (issue 9.3): a 373-byte user-data took 17 GB of memory.
#[test]
fn create_billion_laughs_user_data_refused() {
    let e = env();
    let mut bomb = String::from(
        "#cloud-config\na: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for (i, c) in "bcdefghi".chars().enumerate() {
        let prev = (b'a' + i as u8) as char;
        bomb.push_str(&format!(
            "{c}: &{c} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
        ));
    }
    let ud = e.file("bomb.yaml", bomb.as_bytes());

    let o = e.create(&["--user-data", &ud]);

    refused(&o, 1, &["--user-data"]);
    e.assert_nothing_left();
}

#[test]
fn create_disk_from_devices_and_fifos_refused_at_once() {
    let e = env();
    let fifo = e.fifo();

    let zero = e.nubo(&["vm", "create", "evil", "--disk", "/dev/zero"]);
    let pipe = e.nubo(&["vm", "create", "evil", "--disk", &fifo]);

    refused(&zero, 1, &["character device"]);
    refused(&pipe, 1, &["FIFO"]);
    e.assert_nothing_left();
}

/// Regression (issue 9.1): `vm create --disk` accepted a qcow2 whose backing file was a host file.
#[test]
fn create_disk_with_backing_file_refused() {
    let e = env();
    let evil = e.dir.path().join("evil.qcow2");
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-b", "/etc/hostname", "-F", "raw"])
        .arg(&evil)
        .status();
    if !st.is_ok_and(|s| s.success()) {
        eprintln!("skipped: qemu-img is not installed");
        return;
    }

    let o = e.nubo(&["vm", "create", "evil", "--disk", &evil.display().to_string()]);

    refused(&o, 1, &["backing"]);
    e.assert_nothing_left();
}

#[test]
fn create_oci_reference_unreachable_registry_says_connect() {
    let e = env();

    // Port 1 on loopback: nothing listens, and no packet leaves the machine.
    let o = e.nubo(&["vm", "create", "evil", "--image", "127.0.0.1:1/team/repo:1"]);

    refused(
        &o,
        1,
        &["could not connect to registry 127.0.0.1:1", "127.0.0.1:1/team/repo:1"],
    );
    e.assert_nothing_left();
}

#[test]
fn verbs_on_missing_vm_leave_no_lock_file() {
    let e = env();

    let start = e.nubo(&["vm", "start", "ghost"]);
    let stop = e.nubo(&["vm", "stop", "ghost"]);
    let rm = e.nubo(&["vm", "rm", "ghost"]);

    refused(&start, 1, &["does not exist"]);
    refused(&stop, 1, &["does not exist"]);
    assert!(rm.status.success(), "{}", stderr(&rm));
    e.assert_nothing_left();
}

#[test]
fn corrupt_settings_names_the_file_and_fix() {
    let e = env();
    std::fs::create_dir_all(e.root()).unwrap();
    std::fs::write(e.root().join("settings.json"), b"{not json").unwrap();

    let o = e.create(&[]);

    refused(&o, 1, &["settings.json", "delete it"]);
    assert!(!stderr(&o).contains("vm rm"), "{}", stderr(&o));
    e.assert_nothing_left();
}

#[test]
fn create_dry_run_prints_spec_and_plan_and_makes_nothing() {
    let e = env();
    let ud = e.file("ud.yaml", b"#cloud-config\npassword: hunter2\n");

    let o = e.create(&["--dry-run", "--memory", "512M", "--user-data", &ud]);

    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["spec"]["resources"]["memory"], 512 << 20);
    assert_eq!(v["plan"]["memory_mib"], 512);
    assert_eq!(v["spec"]["cloudInit"]["userData"]["len"], 32);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("hunter2"));
    assert!(!e.root().join("vms").exists());
    e.assert_nothing_left();
}
