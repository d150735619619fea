//! Shared folders on the qemu backend end to end through the `nubo` binary (issue 25), on ONE
//! cloud-init boot with a read-write and a read-only `--mount`: cloud-init has mounted both over
//! virtio-fs when it reports done; a host file is seen in the guest; a file the guest writes in
//! the read-write folder is seen on the host; a write to the read-only folder fails inside the
//! guest even after the guest remounts it read-write (the device refuses, not the guest); one
//! virtiofsd runs per folder (`--readonly` on the read-only one) and none is left after `vm stop`
//! or `vm rm`. Before the boot, hostile mounts are refused with nothing made. On the running VM,
//! `vm mount` hot-plugs a third folder (mounted in the guest, a guest write seen on the host)
//! and `vm umount` takes away one given at creation; a restart brings back the hot-plugged one
//! and not the other.
//!
//! Every command is bounded; the VM is removed by `nubo vm rm --force` and any QEMU or
//! virtiofsd left under the test's root is killed by PID on every path. `--restrict-network`.

use std::fs;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nubo_live::cli::{guest, inspect, no_qemu, no_virtiofsd, nubo, virtiofsds, vms_empty, Cleanup, KillVirtiofsd};
use nubo_live::{LiveTest, TestResult, TestRoot};

/// One boot to cloud-init under TCG on a loaded 2-core machine: 480 s did not suffice at a load
/// of 24 (init-local began at 381 s of guest uptime).
const BOOT: Duration = Duration::from_secs(900);
const QUICK: Duration = Duration::from_secs(180);
const VM: &str = "mnt";

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "mounts_virtiofs_rw_ro_on_qemu",
        &["qemu", "bootstrap", "virtiofsd"],
        || {
            let t = Instant::now();
            let r = mounts();
            println!(
                "timing mounts: {:.1}s ({})",
                t.elapsed().as_secs_f64(),
                if r.is_ok() { "ok" } else { "failed" }
            );
            r
        },
    )])
}

fn mounts() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let run_dir = root.run_dir().display().to_string();
    let _kill = KillVirtiofsd(run_dir.clone());
    let _cleanup = Cleanup::new(&root, &[VM]);
    let rw = root.root().join("share-rw");
    let ro = root.root().join("share-ro");
    fs::create_dir_all(&rw).map_err(|e| format!("creating {}: {e}", rw.display()))?;
    fs::create_dir_all(&ro).map_err(|e| format!("creating {}: {e}", ro.display()))?;
    fs::write(ro.join("hello.txt"), "from-host\n").map_err(|e| format!("writing hello.txt: {e}"))?;
    let file = root.root().join("a-file");
    fs::write(&file, "x").map_err(|e| format!("writing {}: {e}", file.display()))?;

    // Hostile mounts: refused by name before anything is made.
    let create = |mount: &str| {
        nubo(
            &root,
            &[
                "vm",
                "create",
                "bad",
                "--image",
                "debian:12",
                "--restrict-network",
                "--mount",
                mount,
            ],
            QUICK,
        )
    };
    create(&format!("{}/missing", root.root().display()))?.refused(&["--mount", "does not exist"])?;
    create(&file.display().to_string())?.refused(&["--mount", "not a directory"])?;
    create(&format!("{}:/etc", rw.display()))?.refused(&["--mount", "system directory"])?;
    create(&format!("{}:/mnt/a b", rw.display()))?.refused(&["--mount", "contains"])?;
    vms_empty(&root, "after the refused creates")?;

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
            "--mount",
            &format!("{}:/mnt/rw", rw.display()),
            "--mount",
            &format!("{}:/mnt/ro:ro", ro.display()),
            "--wait",
            "--boot-timeout",
            "900s",
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

    // One virtiofsd per folder, the read-only one with --readonly.
    let servers = virtiofsds(&run_dir);
    let ro_arg = ro.display().to_string();
    let readonly = servers
        .iter()
        .filter(|(_, c)| c.contains(&ro_arg) && c.contains("--readonly"))
        .count();
    let writable = servers.iter().filter(|(_, c)| !c.contains("--readonly")).count();
    if readonly == 0 || writable == 0 {
        return Err(format!(
            "expected a read-only and a read-write virtiofsd, found {servers:?}"
        ));
    }

    // Mounted by cloud-init, over virtio-fs.
    let fstype = guest(&root, VM, "findmnt -n -o FSTYPE /mnt/rw; findmnt -n -o FSTYPE /mnt/ro")?;
    if fstype.split_whitespace().collect::<Vec<_>>() != ["virtiofs", "virtiofs"] {
        return Err(format!(
            "/mnt/rw and /mnt/ro are not both virtiofs in the guest: {fstype:?}"
        ));
    }

    // Host -> guest, and live: a file made on the host now is seen at once.
    let hello = guest(&root, VM, "cat /mnt/ro/hello.txt")?;
    if hello != "from-host" {
        return Err(format!(
            "the guest read {hello:?} from /mnt/ro/hello.txt, not the host's file"
        ));
    }
    fs::write(rw.join("late.txt"), "late\n").map_err(|e| format!("writing late.txt: {e}"))?;
    let late = guest(&root, VM, "cat /mnt/rw/late.txt")?;
    if late != "late" {
        return Err(format!("a host file written after boot reads {late:?} in the guest"));
    }

    // Guest -> host through the read-write folder.
    guest(
        &root,
        VM,
        "echo from-guest | sudo tee /mnt/rw/guest.txt >/dev/null && sync",
    )?;
    let seen =
        fs::read_to_string(rw.join("guest.txt")).map_err(|e| format!("the guest's file is not on the host: {e}"))?;
    if seen.trim() != "from-guest" {
        return Err(format!("the host reads {seen:?} from the guest's file"));
    }

    // The read-only folder refuses writes, even once the guest remounts it read-write.
    let write_ro = "sudo sh -c 'echo x > /mnt/ro/nope.txt' 2>&1 && echo WROTE || echo REFUSED";
    let first = guest(&root, VM, write_ro)?;
    let remounted = guest(
        &root,
        VM,
        &format!("sudo mount -o remount,rw /mnt/ro 2>&1; findmnt -n -o OPTIONS /mnt/ro; {write_ro}"),
    )?;
    println!("  write to /mnt/ro: {first:?}; after remount,rw: {remounted:?}");
    if !first.ends_with("REFUSED") || !remounted.ends_with("REFUSED") || ro.join("nope.txt").exists() {
        return Err(format!(
            "a write to the read-only folder was not refused: {first:?}, after remount: {remounted:?}"
        ));
    }

    // Hot-plug (`vm mount`): a third folder joins the running VM, mounted in the guest by
    // nubo over SSH, with its fstab line; a guest directory in use is refused.
    let more = root.root().join("share-more");
    fs::create_dir_all(&more).map_err(|e| format!("creating {}: {e}", more.display()))?;
    fs::write(more.join("more.txt"), "hot\n").map_err(|e| format!("writing more.txt: {e}"))?;
    nubo(
        &root,
        &["vm", "mount", VM, &format!("{}:/mnt/ro", more.display())],
        QUICK,
    )?
    .refused(&["already has a shared folder at /mnt/ro"])?;
    // A guest directory the guest itself mounted something at: refused in the guest, after the
    // device was plugged, so this proves the undo: no virtiofsd, no device, nothing recorded.
    guest(
        &root,
        VM,
        "sudo mkdir -p /mnt/busy && sudo mount -t tmpfs busy /mnt/busy",
    )?;
    nubo(
        &root,
        &["vm", "mount", VM, &format!("{}:/mnt/busy", more.display())],
        QUICK,
    )?
    .refused(&[
        "already a mount point in the guest (busy)",
        "give another guest directory",
    ])?;
    let more_arg = more.display().to_string();
    if virtiofsds(&run_dir).iter().any(|(_, c)| c.contains(&more_arg)) {
        return Err(format!(
            "a refused vm mount left a virtiofsd: {:?}",
            virtiofsds(&run_dir)
        ));
    }
    let pci = guest(&root, VM, "grep -l 0x105a /sys/bus/pci/devices/*/device | wc -l")?;
    if pci != "2" || inspect(&root, VM)?.to_string().contains("/mnt/busy") {
        return Err(format!(
            "a refused vm mount left a device ({pci} virtio-fs PCI devices in the guest) or a record"
        ));
    }
    let t = Instant::now();
    nubo(
        &root,
        &["vm", "mount", VM, &format!("{}:/mnt/more", more.display())],
        QUICK,
    )?
    .require()?;
    println!("timing vm mount (hot-plug): {:.1}s", t.elapsed().as_secs_f64());
    let seen = guest(
        &root,
        VM,
        "findmnt -n -o FSTYPE /mnt/more; cat /mnt/more/more.txt; echo back | sudo tee /mnt/more/back.txt >/dev/null && sync",
    )?;
    if seen.split_whitespace().collect::<Vec<_>>() != ["virtiofs", "hot"] {
        return Err(format!(
            "the hot-plugged /mnt/more is not the host folder over virtiofs: {seen:?}"
        ));
    }
    let back = fs::read_to_string(more.join("back.txt"))
        .map_err(|e| format!("the guest's write to /mnt/more is not on the host: {e}"))?;
    if back.trim() != "back" {
        return Err(format!("the host reads {back:?} from the guest's write to /mnt/more"));
    }
    if !virtiofsds(&run_dir).iter().any(|(_, c)| c.contains(&more_arg)) {
        return Err(format!(
            "no virtiofsd serves {}: {:?}",
            more.display(),
            virtiofsds(&run_dir)
        ));
    }
    // A read-only one, plugged the same way: the device refuses the guest's write.
    nubo(
        &root,
        &["vm", "mount", VM, &format!("{}:/mnt/more-ro:ro", ro.display())],
        QUICK,
    )?
    .require()?;
    let ro_hot = guest(
        &root,
        VM,
        &format!(
            "cat /mnt/more-ro/hello.txt; {}",
            write_ro.replace("/mnt/ro/", "/mnt/more-ro/")
        ),
    )?;
    if !ro_hot.starts_with("from-host") || !ro_hot.ends_with("REFUSED") || ro.join("nope.txt").exists() {
        return Err(format!("the hot-plugged read-only /mnt/more-ro: {ro_hot:?}"));
    }

    // `vm umount` of a folder given at creation: unmounted in the guest, out of its fstab, its
    // virtiofsd gone; the others stay.
    nubo(&root, &["vm", "umount", VM, "/mnt/rw"], QUICK)?.require()?;
    let after = guest(
        &root,
        VM,
        "findmnt -n /mnt/rw >/dev/null && echo MOUNTED || echo GONE; grep -c ' /mnt/rw ' /etc/fstab || true",
    )?;
    if after.split_whitespace().collect::<Vec<_>>() != ["GONE", "0"] {
        return Err(format!(
            "/mnt/rw is still mounted or in the guest's fstab after vm umount: {after:?}"
        ));
    }
    let servers = virtiofsds(&run_dir);
    let rw_arg = format!("{} ", rw.display());
    if servers.iter().any(|(_, c)| format!("{c} ").contains(&rw_arg)) || servers.len() < 2 {
        return Err(format!("after vm umount /mnt/rw, the virtiofsds are {servers:?}"));
    }
    nubo(&root, &["vm", "umount", VM, "/mnt/rw"], QUICK)?.refused(&["has no shared folder at /mnt/rw"])?;

    // Across a restart the record brings the hot-plugged folder back and the guest's fstab
    // mounts it; the unmounted one stays away.
    let t = Instant::now();
    nubo(&root, &["vm", "stop", VM], QUICK)?.require()?;
    nubo(
        &root,
        &["vm", "mount", VM, &format!("{}:/mnt/x", more.display())],
        QUICK,
    )?
    .refused(&["start it first"])?;
    nubo(&root, &["vm", "start", VM], QUICK)?.require()?;
    nubo(&root, &["vm", "wait", VM, "--timeout", "900s"], BOOT + QUICK)?.require()?;
    println!("timing restart after hot-plug: {:.1}s", t.elapsed().as_secs_f64());
    let mounted = guest(
        &root,
        VM,
        "findmnt -n -o FSTYPE /mnt/more; findmnt -n -o FSTYPE /mnt/ro; findmnt -n /mnt/rw >/dev/null && echo RW || echo NORW; cat /mnt/more/more.txt; findmnt -n -o FSTYPE /mnt/more-ro",
    )?;
    if mounted.split_whitespace().collect::<Vec<_>>() != ["virtiofs", "virtiofs", "NORW", "hot", "virtiofs"] {
        return Err(format!("after the restart the guest's folders are {mounted:?}"));
    }

    // Stop ends the file servers with QEMU; rm leaves nothing.
    nubo(&root, &["vm", "stop", VM], QUICK)?.require()?;
    no_qemu(&root, "after vm stop")?;
    no_virtiofsd(&run_dir, "after vm stop")?;
    nubo(&root, &["vm", "rm", "--force", VM], QUICK)?.require()?;
    no_virtiofsd(&run_dir, "after vm rm")?;
    vms_empty(&root, "after vm rm")?;
    Ok(())
}
