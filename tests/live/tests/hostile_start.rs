//! Regression (issue 21): `vm start` trusted whatever the disk chain was by then. A VM made
//! from `--disk b.qcow2`, stopped, and `b.qcow2` replaced by `qemu-img create -f qcow2 -b
//! /etc/shadow -F raw b.qcow2 64M`: the next start had QEMU open /etc/shadow (the base's own
//! backing chain, resolved by QEMU itself). Now every start, restart and snapshot restore
//! inspects the chain again before the VMM gets it, on every backend.
//!
//! For each backend (qemu, libvirt with a libvirtd of the test's own, Cloud Hypervisor), one VM
//! that never needs to boot a guest (an empty disk; Cloud Hypervisor runs the tests' PVH
//! guest), made without `--wait`, stopped, given a disk-only snapshot. Then the base is
//! replaced by qcow2 images whose backing file is a host file: a file of the test's own named
//! absolutely, the same named relatively, `/etc/shadow` (written with `-u`, so nothing opens
//! it), and a qcow2 that is itself backed by the host file. After each: `vm start`, `vm
//! restart` and `vm snapshot restore` are refused naming the disk, the file it names and the
//! fix; no VMM process exists; inotify saw nobody open or read the host file. Finally the
//! original base is put back and `vm start` boots again (the check refuses nothing nubo made).
//! Every refusal happens before any VMM starts: seconds per backend (libvirt's first
//! connection probes QEMU once).

use std::fs;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nubo_live::cli::{self, Cleanup, Out};
use nubo_live::libvirtd::Libvirtd;
use nubo_live::watch::Watch;
use nubo_live::{prereq, pvh, timed, LiveTest, TestResult, TestRoot};

const QUICK: Duration = Duration::from_secs(120);
const VM: &str = "hs";
const SECRET: &[u8] = b"nubo-hostile-start: a host file no guest may read\n";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Qemu,
    Libvirt,
    CloudHypervisor,
}

fn main() -> ExitCode {
    nubo_live::run(vec![
        LiveTest::new(
            "hostile_start_qemu_refuses_replaced_base",
            &["qemu", "qemu-img"],
            || timed("hostile_start qemu", || hostile_start(Kind::Qemu)),
        ),
        LiveTest::new(
            "hostile_start_libvirt_refuses_replaced_base",
            &["qemu", "qemu-img", "libvirt"],
            || timed("hostile_start libvirt", || hostile_start(Kind::Libvirt)),
        ),
        LiveTest::new(
            "hostile_start_cloud_hypervisor_refuses_replaced_base",
            &["cloud-hypervisor", "qemu-img"],
            || {
                timed("hostile_start cloud-hypervisor", || {
                    hostile_start(Kind::CloudHypervisor)
                })
            },
        ),
    ])
}

/// `nubo ARGS` for `kind`: Cloud Hypervisor's binary first on PATH; libvirt's runs are wrapped
/// into its namespace by the root itself.
fn nubo(kind: Kind, root: &TestRoot, args: &[&str], timeout: Duration) -> Result<Out, String> {
    if kind != Kind::CloudHypervisor {
        return cli::nubo(root, args, timeout);
    }
    let bin = prereq::cloud_hypervisor_binary()?;
    let dir = bin.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut cmd = root.cmd()?;
    cmd.args(args).env(
        "PATH",
        format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default()),
    );
    cli::run(&mut cmd, timeout)
}

/// Every VMM process of the test's root (QEMU, also libvirt's, and Cloud Hypervisor).
fn vmms(root: &TestRoot) -> Vec<String> {
    cli::qemu_processes(root)
        .into_iter()
        .map(|(pid, c)| format!("QEMU pid {pid}: {c}"))
        .chain(
            cli::cloud_hypervisor_processes(root)
                .into_iter()
                .map(|(pid, uuid)| format!("Cloud Hypervisor pid {pid} (vm {uuid})")),
        )
        .collect()
}

/// No VMM runs for the root (a killed one may take a moment to go).
fn no_vmm(root: &TestRoot, when: &str) -> TestResult {
    cli::until_empty(Duration::from_secs(10), || vmms(root))
        .map_err(|left| format!("{when}: a VMM is still running: {left:?}"))
}

fn qemu_img(args: &[&str]) -> TestResult {
    cli::run(Command::new("qemu-img").args(args), QUICK)?.require()?;
    Ok(())
}

/// One way to replace the base: the backing file name written into it, its format, and
/// whether qemu-img may open it while writing the image.
struct Hostile {
    name: String,
    format: &'static str,
    unsafe_no_open: bool,
}

fn hostile_start(kind: Kind) -> TestResult {
    let mut root = TestRoot::new()?;
    // Kept alive until the end (dropped after the cleanup below, it tears libvirtd down).
    let _lv = match kind {
        Kind::Libvirt => {
            let t = Instant::now();
            let lv = Libvirtd::start()?;
            println!("  libvirtd started in {:.1}s", t.elapsed().as_secs_f64());
            root.wrap(lv.wrapper(), vec![("NUBO_LIBVIRT_URI".into(), lv.uri.clone())]);
            Some(lv)
        }
        _ => None,
    };
    let files = tempfile::tempdir().map_err(|e| e.to_string())?;
    let secret = files.path().join("host-secret");
    fs::write(&secret, SECRET).map_err(|e| e.to_string())?;
    let disks = files.path().join("disks");
    fs::create_dir(&disks).map_err(|e| e.to_string())?;
    let base = disks.join("b.qcow2");
    let pristine = files.path().join("b.orig");
    let base_s = base.display().to_string();
    qemu_img(&["create", "-q", "-f", "qcow2", &base_s, "64M"])?;
    fs::copy(&base, &pristine).map_err(|e| e.to_string())?;
    let mid = files.path().join("mid.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        &secret.display().to_string(),
        "-F",
        "raw",
        &mid.display().to_string(),
        "64M",
    ])?;
    let run = |args: &[&str]| nubo(kind, &root, args, QUICK);
    let _cleanup = Cleanup::new(&root, &[VM]).through(move |r, a, t| nubo(kind, r, a, t));

    // Made and started (no guest is waited for), then stopped, with a disk-only snapshot.
    let elf = files.path().join("pvh.elf");
    fs::write(&elf, pvh::guest_elf()).map_err(|e| e.to_string())?;
    let elf_s = elf.display().to_string();
    let mut create = vec![
        "vm",
        "create",
        VM,
        "--disk",
        &base_s,
        "--network",
        "none",
        "--memory",
        "128M",
    ];
    create.extend(match kind {
        Kind::Qemu => vec!["--backend", "qemu"],
        Kind::Libvirt => vec!["--backend", "libvirt"],
        Kind::CloudHypervisor => vec![
            "--backend",
            "cloud-hypervisor",
            "--kernel",
            &elf_s,
            "--cmdline",
            "pvh",
            "--machine",
            "microvm",
        ],
    });
    run(&create)?.require()?;
    if vmms(&root).is_empty() {
        return Err("`vm create` left no VMM running".into());
    }
    run(&["vm", "stop", "--force", VM])?.require()?;
    no_vmm(&root, "after `vm stop --force`")?;
    run(&["vm", "snapshot", "create", VM, "s1"])?.require()?;

    let hostile = [
        Hostile {
            name: secret.display().to_string(),
            format: "raw",
            unsafe_no_open: false,
        },
        Hostile {
            name: "../host-secret".into(),
            format: "raw",
            unsafe_no_open: false,
        },
        Hostile {
            name: "/etc/shadow".into(),
            format: "raw",
            unsafe_no_open: true,
        },
        Hostile {
            name: mid.display().to_string(),
            format: "qcow2",
            unsafe_no_open: false,
        },
    ];
    for h in &hostile {
        let mut args = vec!["create", "-q", "-f", "qcow2"];
        if h.unsafe_no_open {
            args.push("-u");
        }
        args.extend(["-b", &h.name, "-F", h.format, &base_s, "64M"]);
        fs::remove_file(&base).map_err(|e| e.to_string())?;
        qemu_img(&args)?;
        let watch = Watch::new(&secret)?;
        let watch_mid = Watch::new(&mid)?;
        let t = Instant::now();

        let start = run(&["vm", "start", VM])?;
        let restart = run(&["vm", "restart", "--force", VM])?;
        let restore = run(&["vm", "snapshot", "restore", VM, "s1"])?;

        let took = t.elapsed();
        let words = [base_s.as_str(), h.name.as_str(), "nubo vm rm", "nothing was started"];
        let shown = start.refused(&words)?.stderr;
        restart.refused(&words)?;
        restore.refused(&words)?;
        no_vmm(&root, &format!("after the refusals over a base backed by {}", h.name))?;
        watch.untouched(&format!("with the base backed by {}", h.name))?;
        watch_mid.untouched(&format!("with the base backed by {}", h.name))?;
        println!(
            "  backing {} ({}): 3 refusals in {:.2}s: {}",
            h.name,
            h.format,
            took.as_secs_f64(),
            shown.lines().last().unwrap_or_default()
        );
    }

    // The chain nubo made passes: the original base back, the VM boots again.
    fs::remove_file(&base).map_err(|e| e.to_string())?;
    fs::copy(&pristine, &base).map_err(|e| e.to_string())?;
    run(&["vm", "start", VM])?.require()?;
    if vmms(&root).is_empty() {
        return Err("`vm start` over the original base left no VMM running".into());
    }
    run(&["vm", "rm", "--force", VM])?.require()?;
    no_vmm(&root, "after `vm rm --force`")
}
