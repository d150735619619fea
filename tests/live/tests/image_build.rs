//! `nubo image build` end to end through the `nubo` binary (issue 15), in four boots:
//!
//! 1. a VMfile FROM the bootstrapped debian:12 with SIZE 3G, a COPY, a RUN writing a marker
//!    (and printing the build VM's host key and machine-id), CLOUDINIT adding a runcmd, and a
//!    last RUN: built (boot 1) and stored with provenance and labels;
//! 2. the same VMfile again: a cache hit, no QEMU started, the same digest;
//! 3. `vm create --wait` from the result (boot 2): the file and marker are there, the root
//!    filesystem is about 3G, the CLOUDINIT runcmd ran, and the VM is a new instance (its
//!    instance-id is its own UUID, its machine-id and SSH host key differ from the build VM's);
//! 4. only the last RUN changed (boot 3): only it runs;
//! 5. a failing RUN after the cached steps (boot 4): the error names the step and line, and
//!    nothing is left (no VM, no QEMU, no image, no work files);
//!
//! plus `image init` refusing to overwrite, a build killed while its VM starts, and `image
//! prune` reclaiming the cache and what the killed build left (no further full boot).
//! Every command is bounded; VMs are removed and stray QEMUs killed by PID ([`Cleanup`]).
//! Networking is restricted (the build's default).

use std::fs;
use std::path::Path;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use nubo_live::cli::{field, guest, inspect, json, no_qemu, nubo, vm_dirs, Cleanup};
use nubo_live::{timed, Guard, LiveTest, TestResult, TestRoot};

/// One build: a TCG boot to cloud-init (258 s seen under load), the steps, seal, flatten.
const BUILD: Duration = Duration::from_secs(900);
const BOOT: Duration = Duration::from_secs(420);
const QUICK: Duration = Duration::from_secs(180);
const VM: &str = "built";

fn main() -> ExitCode {
    nubo_live::run(vec![
        LiveTest::new(
            "image_build_cache_new_instance_failure",
            &["qemu", "qemu-img", "bootstrap"],
            || timed("image_build", image_build),
        ),
        LiveTest::new(
            "image_build_concurrent_same_vmfile_boots_once",
            &["qemu", "qemu-img", "bootstrap"],
            || timed("concurrent_builds", concurrent_builds),
        ),
    ])
}

/// Two builds of one VMfile at once: one boots a VM, the other says it waits for it and then
/// takes the first's image from the cache without a boot.
fn concurrent_builds() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let _cleanup = Cleanup::new(&root, &[]);
    let ctx = tempfile::tempdir().map_err(|e| e.to_string())?;
    fs::write(
        ctx.path().join("VMfile"),
        "FROM debian:12\nRUN echo concurrent > /etc/nubo-concurrent\n",
    )
    .map_err(|e| format!("writing the VMfile: {e}"))?;

    let t = Instant::now();
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| build(&root, ctx.path(), "concurrent:a"));
        let b = s.spawn(|| build(&root, ctx.path(), "concurrent:b"));
        (a.join(), b.join())
    });
    println!("timing two concurrent builds: {:.1}s", t.elapsed().as_secs_f64());
    let (a, b) = (a.map_err(|_| "build a panicked")??, b.map_err(|_| "build b panicked")??);
    let (booted, waited) = if a.0["booted"] == true { (a, b) } else { (b, a) };
    if booted.0["booted"] != true || waited.0["booted"] != false {
        return Err(format!(
            "exactly one of two concurrent builds should boot:\n{}\n{}",
            booted.0, waited.0
        ));
    }
    if !waited.1.contains("waiting for another build of") || !waited.1.contains("no VM booted") {
        return Err(format!(
            "the build that did not boot should say it waited, then use the cache:\n{}",
            waited.1
        ));
    }
    if booted.0["image"]["digest"] != waited.0["image"]["digest"] {
        return Err(format!(
            "the two builds gave different images: {} and {}",
            booted.0["image"]["digest"], waited.0["image"]["digest"]
        ));
    }
    println!(
        "  {}",
        waited
            .1
            .lines()
            .find(|l| l.contains("waiting for another build"))
            .unwrap_or_default()
    );
    no_qemu(&root, "after two concurrent builds")?;
    if !vm_dirs(&root).is_empty() {
        return Err(format!("the builds left VMs: {:?}", vm_dirs(&root)));
    }
    Ok(())
}

const CLOUD_CFG: &str =
    "#cloud-config\nruncmd:\n  - [sh, -c, \"cat /var/lib/cloud/data/instance-id > /var/tmp/nubo-image-runcmd\"]\n";

fn vmfile(last: &str, extra: &str) -> String {
    format!(
        "# the live test's VMfile\n\
FROM debian:12\n\
SIZE 3G\n\
LABEL org.example.test=image-build\n\
DEFAULTS vcpus=1 memory=1G\n\
COPY hello.txt /opt/hello/\n\
RUN echo built > /etc/nubo-run-marker && \\\n\
    echo \"BUILD-HOSTKEY $(cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub)\" && \\\n\
    echo \"BUILD-MACHINEID $(cat /etc/machine-id)\"\n\
CLOUDINIT cloud.cfg\n\
RUN echo {last} > /etc/nubo-last\n\
{extra}"
    )
}

fn build(root: &TestRoot, ctx: &Path, tag: &str) -> Result<(serde_json::Value, String), String> {
    let out = nubo(
        root,
        &[
            "image",
            "build",
            "-t",
            tag,
            "-o",
            "json",
            "--boot-timeout",
            "420s",
            &ctx.display().to_string(),
        ],
        BUILD,
    )?
    .require()?;
    Ok((json(&out.stdout, "image build -o json")?, out.stderr))
}

fn cached(report: &serde_json::Value) -> Vec<bool> {
    report["steps"]
        .as_array()
        .map(|s| s.iter().map(|s| s["cached"].as_bool().unwrap_or(false)).collect())
        .unwrap_or_default()
}

fn after(text: &str, tag: &str) -> Result<String, String> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(tag).map(|v| v.trim().to_owned()))
        .filter(|v| !v.is_empty())
        .ok_or_else(|| format!("the build's output has no `{tag}` line:\n{text}"))
}

fn layers(root: &TestRoot) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(root.root().join("images/build-cache"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".qcow2"))
        .collect();
    v.sort();
    v
}

fn work_dirs(root: &TestRoot) -> Vec<String> {
    fs::read_dir(root.root().join("images/build-cache/tmp"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn image_build() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let _cleanup = Cleanup::new(&root, &[VM]);
    let ctx = tempfile::tempdir().map_err(|e| e.to_string())?;
    let c = ctx.path();
    let write = |name: &str, text: &str| fs::write(c.join(name), text).map_err(|e| format!("writing {name}: {e}"));
    write("hello.txt", "hello from the context\n")?;
    write("cloud.cfg", CLOUD_CFG)?;

    // `image init` writes a starter and refuses to overwrite it.
    let starter = c.join("Starter");
    let s = starter.display().to_string();
    nubo(&root, &["image", "init", "-f", &s], QUICK)?.require()?;
    nubo(&root, &["image", "init", "-f", &s], QUICK)?.refused(&["already exists", "--force"])?;

    // 1. Cold build: one boot.
    write("VMfile", &vmfile("one", ""))?;
    let t = Instant::now();
    let (first, log) = build(&root, c, "built:1")?;
    println!("timing image_build cold build: {:.1}s", t.elapsed().as_secs_f64());
    if cached(&first) != [false, false, false, false] || first["booted"] != true {
        return Err(format!("the cold build should run all 4 steps in a VM: {first}"));
    }
    let build_hostkey = after(&log, "BUILD-HOSTKEY")?;
    let build_machine_id = after(&log, "BUILD-MACHINEID")?;
    no_qemu(&root, "after the cold build")?;
    if !vm_dirs(&root).is_empty() {
        return Err(format!("the build left VMs: {:?}", vm_dirs(&root)));
    }
    let rec = json(
        &nubo(&root, &["image", "inspect", "built:1"], QUICK)?.require()?.stdout,
        "image inspect",
    )?;
    let digest = field(&rec, "/digest")?;
    for (ptr, want) in [
        ("/source/kind", "build"),
        ("/labels/org.example.test", "image-build"),
        ("/default_vcpus", "1"),
        ("/build/from", "debian:12"),
    ] {
        let got = rec
            .pointer(ptr)
            .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned));
        if got.as_deref() != Some(want) {
            return Err(format!("image record {ptr} is {got:?}, expected `{want}`: {rec}"));
        }
    }
    let steps = rec["build"]["steps"].as_array().map_or(0, Vec::len);
    if steps != 4 || !field(&rec, "/build/vmfile_digest")?.starts_with("sha256:") {
        return Err(format!(
            "the record's provenance should list 4 steps and the VMfile digest: {rec}"
        ));
    }
    if layers(&root).len() != 4 {
        return Err(format!("expected 4 cache layers, found {:?}", layers(&root)));
    }

    // 2. The same VMfile again: every step cached, nothing boots, the same image.
    let t = Instant::now();
    let (again, log) = build(&root, c, "built:1")?;
    println!("timing image_build cached rebuild: {:.1}s", t.elapsed().as_secs_f64());
    if cached(&again) != [true, true, true, true] || again["booted"] != false || !log.contains("no VM booted") {
        return Err(format!(
            "an unchanged rebuild must be a cache hit without a boot: {again}\n{log}"
        ));
    }
    if again["image"]["digest"] != digest.as_str() || log.contains("booting build vm") {
        return Err(format!("the cached rebuild gave another image or booted: {again}"));
    }
    no_qemu(&root, "after the cached rebuild")?;

    // 3. A VM from the image: a new instance with everything the build put in.
    let t = Instant::now();
    nubo(
        &root,
        &[
            "vm",
            "create",
            VM,
            "--image",
            "built:1",
            "--restrict-network",
            "--wait",
            "--boot-timeout",
            "420s",
        ],
        BOOT + QUICK,
    )?
    .require()?;
    println!(
        "timing image_build vm from the image: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let uuid = field(&inspect(&root, VM)?, "/uuid")?;
    let facts = guest(
        &root,
        VM,
        "cat /opt/hello/hello.txt /etc/nubo-run-marker /etc/nubo-last /var/tmp/nubo-image-runcmd /var/lib/cloud/data/instance-id /etc/machine-id; \
         cut -d' ' -f2 /etc/ssh/ssh_host_ed25519_key.pub; df -B1 --output=size / | tail -n 1; \
         sudo cat /root/.ssh/authorized_keys /home/*/.ssh/authorized_keys 2>/dev/null | grep -c nubo-build- || true",
    )?;
    let l: Vec<&str> = facts.lines().map(str::trim).collect();
    let [hello, marker, last, runcmd, instance, machine_id, hostkey, size, build_keys] = l.as_slice() else {
        return Err(format!("unexpected answer from the guest:\n{facts}"));
    };
    let checks = [
        (*hello == "hello from the context", "the COPYed file"),
        (*marker == "built", "the RUN marker"),
        (*last == "one", "the last RUN's file"),
        (
            *runcmd == uuid,
            "the CLOUDINIT runcmd ran on this VM's first boot (it wrote this VM's instance-id)",
        ),
        (*instance == uuid, "instance-id is the VM's own UUID"),
        (
            !machine_id.is_empty() && *machine_id != build_machine_id,
            "a fresh machine-id",
        ),
        (*hostkey != build_hostkey, "fresh SSH host keys"),
        (
            *build_keys == "0",
            "the build's one-time key is gone from every authorized_keys",
        ),
    ];
    for (ok, what) in checks {
        if !ok {
            return Err(format!("{what}: not so (uuid {uuid}, build host key {build_hostkey}, build machine-id {build_machine_id}):\n{facts}"));
        }
    }
    let size: u64 = size.parse().map_err(|_| format!("df said `{size}`"))?;
    if !(2_600_000_000..=3_300_000_000).contains(&size) {
        return Err(format!("the root filesystem is {size} bytes, not about 3G"));
    }
    nubo(&root, &["vm", "rm", "--force", VM], QUICK)?.require()?;

    // 4. Only the last RUN changed: the three steps before it come from the cache.
    write("VMfile", &vmfile("two", ""))?;
    let t = Instant::now();
    let (changed, log) = build(&root, c, "built:2")?;
    println!(
        "timing image_build last-step-changed rebuild: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    if cached(&changed) != [true, true, true, false] || after(&log, "BUILD-HOSTKEY").is_ok() {
        return Err(format!("changing the last RUN must re-run only it: {changed}\n{log}"));
    }

    // 5. A failing RUN after the cached steps: named by step and line; nothing left behind.
    let images_before = nubo(&root, &["image", "ls", "-o", "json"], QUICK)?.require()?.stdout;
    write(
        "VMfile",
        &vmfile("two", "RUN echo failing on purpose-$((40 + 2)) && exit 3\n"),
    )?;
    let out = nubo(
        &root,
        &[
            "image",
            "build",
            "-t",
            "broken:1",
            "--boot-timeout",
            "420s",
            &c.display().to_string(),
        ],
        BUILD,
    )?;
    let out = out.refused(&["step 5/5", "line 12", "exit status 3"])?;
    if !out.stderr.contains("failing on purpose-42") {
        return Err(format!("the failing step's output was not streamed:\n{}", out.stderr));
    }
    no_qemu(&root, "after the failed build")?;
    if !vm_dirs(&root).is_empty() || !work_dirs(&root).is_empty() {
        return Err(format!(
            "the failed build left VMs {:?} or work files {:?}",
            vm_dirs(&root),
            work_dirs(&root)
        ));
    }
    let images_after = nubo(&root, &["image", "ls", "-o", "json"], QUICK)?.require()?.stdout;
    if images_after != images_before {
        return Err(format!(
            "the failed build changed the store:\n{images_before}\n->\n{images_after}"
        ));
    }
    let leftovers: Vec<_> = fs::read_dir(root.root().join("images/tmp"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("build-"))
        .collect();
    if !leftovers.is_empty() {
        return Err(format!("the failed build left partial images: {leftovers:?}"));
    }

    // A build killed while its VM boots (the VMM is a daemon and outlives nubo): `image prune`
    // (as the next build would) removes the VM, its QEMU and its work files.
    let mut cmd = root.cmd()?;
    cmd.args([
        "image",
        "build",
        "-t",
        "killed:1",
        "--no-cache",
        &c.display().to_string(),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let mut killed = Guard::spawn(&mut cmd, "nubo image build")?;
    let deadline = Instant::now() + QUICK;
    while nubo_live::cli::qemu_processes(&root).is_empty() {
        if Instant::now() >= deadline || killed.exited().is_some() {
            return Err("the build to kill never started its VM".into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    killed.kill();
    killed.wait_timeout(QUICK)?;
    if vm_dirs(&root).is_empty() || work_dirs(&root).is_empty() {
        return Err("the killed build should have left its VM and work files (for prune to find)".into());
    }

    // `image prune` reclaims the cache and what the killed build left.
    let out = nubo(&root, &["image", "prune"], QUICK)?.require()?;
    no_qemu(&root, "after prune")?;
    if !vm_dirs(&root).is_empty() || !work_dirs(&root).is_empty() {
        return Err(format!(
            "prune left the killed build's VM {:?} or work files {:?}",
            vm_dirs(&root),
            work_dirs(&root)
        ));
    }
    if !layers(&root).is_empty() || !out.stdout.contains("build-cache") {
        return Err(format!("prune left cache layers {:?}:\n{}", layers(&root), out.stdout));
    }
    Ok(())
}
