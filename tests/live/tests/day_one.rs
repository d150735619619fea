//! What a Multipass or Lima user types on day one (issue 25), on ONE cloud-init boot of the
//! qemu backend:
//! - the default image: `image default` says `debian:12` on a fresh root, `vm create NAME
//!   --dry-run` with no image plans it, and the VM itself is created without `--image`;
//! - `--ssh-key PATH.pub` without `@` reaches the guest's authorized_keys;
//! - cloud-init's four stages ran in children of the image's zygote (recipe 5);
//! - `--publish`: a taken host port is refused before anything is made; the published port
//!   reaches an HTTP server in the guest (python3's, started by the user-data's runcmd) through
//!   `--restrict-network`; `vm ls` and `vm inspect` show the forward;
//! - `vm cp` both ways with a 50 MiB file (sha256 compared) and `-r` with a directory;
//! - `vm pause` stops the guest's clock (its monotonic uptime does not advance while the host
//!   sleeps), `vm ls` says paused, `vm resume` restarts it, and `vm stop` of a paused VM
//!   powers it off.
//!
//! Every command is bounded; the VM is removed by `nubo vm rm --force` and any QEMU left under
//! the test's root is killed by PID on every path ([`Cleanup`]).

use std::fs;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nubo_live::cli::{guest, inspect, json, ls_state, no_qemu, nubo, run, vm_dirs, vms_empty, zygote_served, Cleanup};
use nubo_live::net::{free_port, http_get_ok};
use nubo_live::{LiveTest, TestResult, TestRoot};

/// One boot to cloud-init under TCG on a 2-core machine other builds and VMs share: 480 s was
/// seen to run out at load 18 with three guests booting at once.
const BOOT: Duration = Duration::from_secs(900);
/// A command that boots nothing, or copies 50 MiB over user-mode networking.
const QUICK: Duration = Duration::from_secs(180);
const VM: &str = "day1";
/// The guest port python3's HTTP server listens on.
const GUEST_HTTP: u16 = 8000;
const BIG: usize = 50 << 20;

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "day_one_default_image_publish_cp_pause_resume",
        &["qemu", "bootstrap"],
        || nubo_live::timed("day_one", day_one),
    )])
}

fn sha256(p: &Path) -> Result<String, String> {
    let out = run(Command::new("sha256sum").arg(p), QUICK)?.require()?;
    Ok(out.stdout.split_whitespace().next().unwrap_or_default().to_owned())
}

/// The guest's monotonic uptime in seconds.
fn uptime(root: &TestRoot) -> Result<f64, String> {
    let out = guest(root, VM, "cut -d' ' -f1 /proc/uptime")?;
    out.trim()
        .parse()
        .map_err(|_| format!("cannot read the guest's uptime: {out:?}"))
}

fn day_one() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let _cleanup = Cleanup::new(&root, &[VM, "taken"]);
    let work = root.root().join("day1-work");
    fs::create_dir_all(&work).map_err(|e| e.to_string())?;

    // The default image on a fresh root, and `vm create NAME` alone planning it.
    let shown = nubo(&root, &["image", "default"], QUICK)?.require()?;
    if shown.stdout.trim() != "debian:12" {
        return Err(format!("`image default` on a fresh root says {:?}", shown.stdout));
    }
    nubo(&root, &["image", "default", "--set", "not a ref"], QUICK)?.refused(&["--set"])?;
    let dry = nubo(&root, &["vm", "create", "solo", "--dry-run"], QUICK)?.require()?;
    let dry = json(&dry.stdout, "`vm create solo --dry-run`")?;
    if dry["spec"]["source"]["image"]["reference"] != "debian:12" || dry["plan"]["image"]["reference"] != "debian:12" {
        return Err(format!("`vm create solo` alone did not plan debian:12: {dry}"));
    }

    // A taken host port is refused before the VM exists.
    let held = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
    let taken = held.local_addr().map_err(|e| e.to_string())?.port();
    let spec = format!("{taken}:80");
    nubo(
        &root,
        &["vm", "create", "taken", "--restrict-network", "--publish", &spec],
        QUICK,
    )?
    .refused(&["--publish", &format!("127.0.0.1:{taken}/tcp"), "cannot be bound"])?;
    if vm_dirs(&root).contains(&"taken".to_owned()) {
        return Err("a refused --publish left vms/taken behind".into());
    }
    drop(held);

    // A key given as a .pub path (no @), and user-data starting the guest's HTTP server.
    let key = work.join("id_ed25519");
    run(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "day1-user", "-f"])
            .arg(&key),
        QUICK,
    )?
    .require()?;
    let user_data = work.join("user-data");
    fs::write(
        &user_data,
        format!(
            "#cloud-config\nwrite_files:\n  - path: /srv/www/hello.txt\n    content: \"hello from day1\\n\"\nruncmd:\n  - [systemd-run, --unit=nubo-web, python3, -m, http.server, \"{GUEST_HTTP}\", --directory, /srv/www]\n"
        ),
    )
    .map_err(|e| e.to_string())?;
    let port = free_port()?;
    let publish = format!("{port}:{GUEST_HTTP}");
    let pub_key = format!("{}.pub", key.display());

    let t = Instant::now();
    let out = nubo(
        &root,
        &[
            "vm",
            "create",
            VM,
            "--restrict-network",
            "--publish",
            &publish,
            "--ssh-key",
            &pub_key,
            "--user-data",
            &user_data.display().to_string(),
            "--wait",
            "--boot-timeout",
            "900s",
        ],
        BOOT + QUICK,
    )?
    .require()?;
    if !out.stderr.contains("cloud-init finished") || !out.stderr.contains("default image `debian:12`") {
        return Err(format!(
            "create without --image did not boot the default image to cloud-init:\n{}",
            out.stderr
        ));
    }
    println!("timing boot (create --wait): {:.1}s", t.elapsed().as_secs_f64());

    let rec = inspect(&root, VM)?;
    let forward = format!("127.0.0.1:{port}->{GUEST_HTTP}/tcp");
    if rec["image"]["reference"] != "debian:12" || rec["ports"][0] != forward.as_str() {
        return Err(format!(
            "`vm inspect` shows image {} and ports {}",
            rec["image"], rec["ports"]
        ));
    }
    let argv = rec["launch"]["value"].as_array().cloned().unwrap_or_default();
    let netdev = format!("hostfwd=tcp:127.0.0.1:{port}-:{GUEST_HTTP}");
    if !argv.iter().any(|a| {
        a.as_str()
            .is_some_and(|a| a.contains("restrict=on") && a.contains(&netdev))
    }) {
        return Err(format!("QEMU's netdev lacks `restrict=on` with {netdev}: {argv:?}"));
    }
    let ls = nubo(&root, &["vm", "ls"], QUICK)?.require()?;
    if !ls.stdout.contains("PORTS") || !ls.stdout.contains(&forward) {
        return Err(format!("`vm ls` does not show {forward}:\n{}", ls.stdout));
    }
    let keys = guest(&root, VM, "cat ~/.ssh/authorized_keys")?;
    if !keys.contains("day1-user") {
        return Err(format!("--ssh-key PATH.pub did not reach authorized_keys:\n{keys}"));
    }
    zygote_served(&root, VM, "first boot")?;

    // The published port reaches the guest's HTTP server.
    let reply = http_get_ok(port, "/hello.txt")?;
    if !reply.contains("hello from day1") {
        return Err(format!("the published port answered something else:\n{reply}"));
    }
    println!(
        "  published 127.0.0.1:{port} -> guest :{GUEST_HTTP}: {}",
        reply.lines().next().unwrap_or("")
    );

    // vm cp both ways, 50 MiB, and -r.
    let big = work.join("big.bin");
    let mut bytes = vec![0u8; BIG];
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for chunk in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    fs::write(&big, &bytes).map_err(|e| e.to_string())?;
    drop(bytes);
    let want = sha256(&big)?;
    let t = Instant::now();
    nubo(
        &root,
        &["vm", "cp", &big.display().to_string(), &format!("{VM}:/tmp/big.bin")],
        QUICK,
    )?
    .require()?;
    let to_guest = t.elapsed();
    let in_guest = guest(&root, VM, "sha256sum /tmp/big.bin")?;
    if !in_guest.starts_with(&want) {
        return Err(format!("the guest's copy hashes {in_guest}, the host's {want}"));
    }
    let back = work.join("back.bin");
    let t = Instant::now();
    nubo(
        &root,
        &["vm", "cp", &format!("{VM}:/tmp/big.bin"), &back.display().to_string()],
        QUICK,
    )?
    .require()?;
    let from_guest = t.elapsed();
    if sha256(&back)? != want {
        return Err("the file copied back from the guest differs".into());
    }
    println!(
        "  vm cp 50 MiB: to the guest {:.1}s, back {:.1}s, sha256 {want}",
        to_guest.as_secs_f64(),
        from_guest.as_secs_f64()
    );
    let tree = work.join("tree");
    fs::create_dir_all(tree.join("sub")).map_err(|e| e.to_string())?;
    fs::write(tree.join("sub/leaf.txt"), "leaf\n").map_err(|e| e.to_string())?;
    nubo(
        &root,
        &["vm", "cp", &tree.display().to_string(), &format!("{VM}:/tmp/")],
        QUICK,
    )?
    .refused(&["scp exited"])?;
    nubo(
        &root,
        &["vm", "cp", "-r", &tree.display().to_string(), &format!("{VM}:/tmp/")],
        QUICK,
    )?
    .require()?;
    if guest(&root, VM, "cat /tmp/tree/sub/leaf.txt")? != "leaf" {
        return Err("`vm cp -r` did not copy the directory tree".into());
    }

    // Pause stops the guest's clock; resume restarts it.
    let u0 = uptime(&root)?;
    let h0 = Instant::now();
    nubo(&root, &["vm", "pause", VM], QUICK)?.require()?;
    if ls_state(&root, VM)? != "paused" {
        return Err(format!("`vm ls` says {} for a paused VM", ls_state(&root, VM)?));
    }
    nubo(
        &root,
        &["vm", "cp", &big.display().to_string(), &format!("{VM}:/tmp/x")],
        QUICK,
    )?
    .refused(&["paused", "nubo vm resume"])?;
    std::thread::sleep(Duration::from_secs(20));
    nubo(&root, &["vm", "resume", VM], QUICK)?.require()?;
    let u1 = uptime(&root)?;
    let host = h0.elapsed().as_secs_f64();
    let guest_s = u1 - u0;
    println!("  paused 20s: the host saw {host:.1}s pass, the guest {guest_s:.1}s");
    if guest_s > host - 15.0 {
        return Err(format!(
            "the guest's clock ran while paused: {guest_s:.1}s of uptime over {host:.1}s on the host"
        ));
    }
    std::thread::sleep(Duration::from_secs(5));
    let u2 = uptime(&root)?;
    if u2 - u1 < 4.0 {
        return Err(format!("the guest's clock did not run after resume: {u1} -> {u2}"));
    }
    if ls_state(&root, VM)? != "running" {
        return Err("`vm ls` does not say running after resume".into());
    }

    // Stop of a paused VM powers it off.
    nubo(&root, &["vm", "pause", VM], QUICK)?.require()?;
    let stop = nubo(&root, &["vm", "stop", VM, "--timeout", "120s"], QUICK)?.require()?;
    if !stop.stderr.contains("resuming it so it can power off") || ls_state(&root, VM)? != "stopped" {
        return Err(format!("`vm stop` of a paused VM:\n{}", stop.stderr));
    }
    no_qemu(&root, "after stop of the paused VM")?;
    nubo(&root, &["vm", "rm", VM], QUICK)?.require()?;
    vms_empty(&root, "after rm")
}
