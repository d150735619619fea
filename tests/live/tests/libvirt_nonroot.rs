//! The libvirt backend run by an unprivileged caller on `qemu:///system` (issue 11): nubo
//! gives the domain a static DAC `<seclabel>` with the caller's uid/gid and `relabel='no'`, so
//! QEMU runs as the caller and reads its OS disk (a volume of nubo's pool in the caller's 0700
//! root) without anything being chowned away.
//!
//! The test's own libvirtd ([`Libvirtd`]) opens its socket to every user and relabels
//! (`dynamic_ownership = 1`) as a stock one does, with root as qemu.conf's user: a domain
//! without nubo's label would run QEMU as root and have the caller's overlay chowned to it.
//! `nubo` runs as a system user the test adds and removes (`useradd`/`userdel`: libvirt's
//! client needs a user record), via `setpriv` with no supplementary groups, its NUBO_ROOT (mode
//! 0700) and run directory its own. No cloud-init boot: the kernel's first lines on the serial
//! console show the guest runs. Proven: the domain runs with the label (`relabel='no'` read back
//! from libvirt), QEMU's uid and gid are the caller's, the overlay is still the caller's and the
//! base still root's, and the caller's `vm rm` leaves no domain, volume or VM directory.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nubo_live::cli::{ls_state, no_qemu, nubo, qemu_processes, vms_empty, Cleanup};
use nubo_live::libvirtd::{Libvirtd, Options};
use nubo_live::{LiveTest, TestResult, TestRoot};

const QUICK: Duration = Duration::from_secs(180);
/// The guest kernel's first serial lines under TCG on a loaded 2-core machine.
const KERNEL: Duration = Duration::from_secs(240);
const VM: &str = "lvu";

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "libvirt_non_root_caller_static_dac_label_nothing_chowned",
        &["qemu", "bootstrap", "libvirt"],
        || {
            let t = Instant::now();
            let r = non_root();
            println!(
                "timing libvirt_nonroot: {:.1}s ({})",
                t.elapsed().as_secs_f64(),
                if r.is_ok() { "ok" } else { "failed" }
            );
            r
        },
    )])
}

/// A system user (and its own group) the test adds with `useradd` and removes with `userdel`
/// on every path out: libvirt's client library needs the caller's user record.
struct Caller {
    name: String,
    uid: u32,
    gid: u32,
}

impl Caller {
    fn add() -> Result<Caller, String> {
        let name = format!("nubolv{}", std::process::id());
        let out = nubo_live::cli::run(
            std::process::Command::new("useradd").args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--home-dir",
                "/nonexistent",
                "--shell",
                "/usr/sbin/nologin",
                &name,
            ]),
            QUICK,
        )?;
        out.require()?;
        let mut caller = Caller {
            name: name.clone(),
            uid: 0,
            gid: 0,
        };
        let user = nix::unistd::User::from_name(&name)
            .ok()
            .flatten()
            .ok_or_else(|| format!("useradd made no user {name}"))?;
        caller.uid = user.uid.as_raw();
        caller.gid = user.gid.as_raw();
        Ok(caller)
    }
}

impl Drop for Caller {
    fn drop(&mut self) {
        match nubo_live::cli::run(std::process::Command::new("userdel").arg(&self.name), QUICK) {
            Ok(o) if o.ok => {}
            other => eprintln!("cleanup: `userdel {}` failed: {other:?}", self.name),
        }
    }
}

/// Gives `dir` to `(uid, gid)`: every directory, and every file that is not a hard link of the
/// shared image cache (chowning one of those would change the cache's own inode).
fn give(dir: &Path, id: (u32, u32)) -> TestResult {
    let own = |p: &Path| {
        nix::unistd::chown(
            p,
            Some(nix::unistd::Uid::from_raw(id.0)),
            Some(nix::unistd::Gid::from_raw(id.1)),
        )
        .map_err(|e| format!("chown {}: {e}", p.display()))
    };
    own(dir)?;
    for e in fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))? {
        let p = e.map_err(|e| format!("reading {}: {e}", dir.display()))?.path();
        let m = fs::symlink_metadata(&p).map_err(|e| format!("stat {}: {e}", p.display()))?;
        if m.is_dir() {
            give(&p, id)?;
        } else if m.is_file() && m.nlink() == 1 {
            own(&p)?;
        }
    }
    Ok(())
}

fn owner(p: &Path) -> Result<(u32, u32), String> {
    let m = fs::metadata(p).map_err(|e| format!("stat {}: {e}", p.display()))?;
    Ok((m.uid(), m.gid()))
}

fn non_root() -> TestResult {
    let lv = Libvirtd::start_with(Options {
        open_socket: true,
        dynamic_ownership: true,
        ..Options::default()
    })?;
    let caller = Caller::add()?;
    let id = (caller.uid, caller.gid);
    let mut root = TestRoot::new()?;
    let image = root.with_debian_image()?;
    give(root.root(), id)?;
    give(root.run_dir(), id)?;
    fs::set_permissions(root.root(), fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("chmod {}: {e}", root.root().display()))?;
    let base_owner = owner(&image.qcow2)?;
    let (uid, gid) = (id.0.to_string(), id.1.to_string());
    root.wrap(
        ["setpriv", "--reuid", &uid, "--regid", &gid, "--clear-groups", "--"]
            .map(String::from)
            .to_vec(),
        vec![
            ("NUBO_LIBVIRT_URI".into(), lv.uri.clone()),
            ("HOME".into(), root.root().display().to_string()),
        ],
    );
    let _cleanup = Cleanup::new(&root, &[VM]);

    let args = [
        "vm",
        "create",
        VM,
        "--image",
        "debian:12",
        "--backend",
        "libvirt",
        "--network",
        "none",
        "--memory",
        "512M",
    ];
    let t = Instant::now();
    nubo(&root, &args, QUICK)?.require()?;
    println!("timing create as uid {uid}: {:.1}s", t.elapsed().as_secs_f64());

    // The domain runs, labelled with the caller's ids and no relabelling.
    if lv.virsh(&["domstate", VM])?.require()?.stdout.trim() != "running" {
        return Err("the caller's domain is not running".into());
    }
    if ls_state(&root, VM)? != "running" {
        return Err("`vm ls` (as the caller) does not say running".into());
    }
    let xml = lv.virsh(&["dumpxml", VM])?.require()?.stdout;
    let label = format!("+{uid}:+{gid}");
    let doc = roxmltree::Document::parse(&xml).map_err(|e| format!("dumpxml {VM}: {e}"))?;
    let labelled = doc.root_element().children().any(|n| {
        n.has_tag_name("seclabel")
            && n.attribute("model") == Some("dac")
            && n.attribute("type") == Some("static")
            && n.attribute("relabel") == Some("no")
            && n.children()
                .any(|l| l.has_tag_name("label") && l.text() == Some(&label))
    });
    if !labelled {
        return Err(format!(
            "the domain has no static DAC label {label} with relabel='no':\n{xml}"
        ));
    }

    // QEMU runs as the caller.
    let procs = qemu_processes(&root);
    let [(pid, _)] = procs.as_slice() else {
        return Err(format!("expected one QEMU for the caller's VM, found {procs:?}"));
    };
    let status = fs::read_to_string(format!("/proc/{pid}/status")).map_err(|e| format!("QEMU pid {pid}: {e}"))?;
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    if field("Uid:").iter().any(|u| *u != uid) || field("Gid:").iter().any(|g| *g != gid) {
        return Err(format!(
            "QEMU pid {pid} does not run as {uid}:{gid}: Uid {:?}, Gid {:?}",
            field("Uid:"),
            field("Gid:")
        ));
    }

    // The guest kernel runs: its first lines reach the serial console log.
    let console = root.root().join("vms").join(VM).join("console.log");
    let deadline = Instant::now() + KERNEL;
    while !String::from_utf8_lossy(&fs::read(&console).unwrap_or_default()).contains("Linux version") {
        if Instant::now() >= deadline {
            return Err(format!(
                "no kernel line on {} within {}s",
                console.display(),
                KERNEL.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    println!(
        "timing kernel on the console as uid {uid}: {:.1}s",
        t.elapsed().as_secs_f64()
    );

    // Nothing was chowned away: the OS disk (the volume `<name>.qcow2` of nubo's pool, in the
    // caller's root) is the caller's, the verified base root's still.
    let overlay = root.root().join("libvirt-pool").join(format!("{VM}.qcow2"));
    if owner(&overlay)? != id {
        return Err(format!(
            "the overlay {} is owned by {:?}, not the caller {uid}:{gid}",
            overlay.display(),
            owner(&overlay)?
        ));
    }
    if owner(&image.qcow2)? != base_owner {
        return Err(format!(
            "the verified base {} was chowned from {base_owner:?} to {:?}",
            image.qcow2.display(),
            owner(&image.qcow2)?
        ));
    }

    // The caller removes it: no domain, no volume, no VM directory.
    nubo(&root, &["vm", "rm", "--force", VM], QUICK)?.require()?;
    let domains = lv.virsh(&["list", "--all", "--name"])?.require()?.stdout;
    if domains.split_whitespace().any(|d| d == VM) {
        return Err(format!("after rm the domain is still defined: {domains}"));
    }
    for p in lv.virsh(&["pool-list", "--name"])?.require()?.stdout.split_whitespace() {
        let vols = lv.virsh(&["vol-list", "--pool", p])?.require()?.stdout;
        if !vols.trim().is_empty() {
            return Err(format!("after rm pool {p} still holds volumes:\n{vols}"));
        }
    }
    no_qemu(&root, "after rm")?;
    vms_empty(&root, "after rm")
}
