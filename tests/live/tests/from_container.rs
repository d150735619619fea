//! Issue 24, bootable VM images from OCI container images: `nubo image from-container`.
//!
//! The container image is made here from Debian's packages without a second mmdebstrap: the
//! root filesystem of the shared live-test image (bootstrapped once per machine from Debian's
//! packages, with its kernel, initramfs and cloud-init) is read out of its qcow2 with
//! `qemu-img convert` + `debugfs rdump` (no mount), tarred, gzipped and laid out as an OCI
//! image (one tar+gzip layer, a config with `created`), then pushed with skopeo to Debian's
//! docker-registry started on 127.0.0.1. Then:
//!
//! - a tag is refused without --allow-mutable-tag;
//! - hostile layers (a `..` path, a file through an absolute symlink, a whiteout of `..`, a
//!   device node outside /dev) are each refused, the store's `tmp/` left empty and nothing
//!   written outside (digest lies and enormous sparse files are unit-tested in oci::unpack);
//! - `image from-container REF@sha256:... -t ctr:1` in two fresh roots gives the same sha256
//!   (reproducible) and prints `sha256:` and `sha512:` lines; the record says where it came
//!   from (source kind, manifest and layer digests);
//! - one VM boots the disk through UEFI (OVMF) and the ESP's GRUB (`vm create --firmware efi`)
//!   to cloud-init finished with its hostname, `/sys/firmware/efi` present in the guest (the
//!   BIOS path of the same `disk_stages` assembly boots in the bootstrap tests), and the file
//!   capability the container image gave `/usr/local/bin/nubo-netraw` (`setcap cap_net_raw+ep`,
//!   a pax xattr record in the layer) read back in the guest;
//! - `--format iso --iso-cloud-config` in both roots gives the same sha256 (reproducible), a
//!   stored `iso` image printing `sha256:`/`sha512:`;
//! - under SeaBIOS the ISO as a USB disk (xHCI usb-storage, nothing else attached: the MBR's
//!   boot_hybrid.img) and from `-cdrom` (El Torito), both at once, each reach the kernel's first
//!   console line and are killed there (GRUB found and loaded the kernel and both initramfs);
//! - while the disk boots (two TCG VMs, two cores), QEMU under OVMF with the ISO as `-cdrom` and
//!   nothing else (UEFI El Torito, GRUB's EFI image, the image's kernel and initramfs plus
//!   nubo's live addition, root from the ISO under an overlay) reaches cloud-init finished, runs
//!   the baked seed's runcmd with the baked hostname and `/sys/firmware/efi` present, and shows
//!   a login prompt;
//! - `image push` of the ISO to the test registry and `image pull` of the printed digest into a
//!   fresh root give the same sha256, format `iso`.

use std::fs;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use nubo_bootstrap::digest::file_digest;
use nubo_bootstrap::layout::Layout;
use nubo_image::digest::sha256_bytes;
use nubo_live::cli::{field, guest, json, nubo, Cleanup};
use nubo_live::fixture::cache_base;
use nubo_live::prereq::{OVMF_CODE, OVMF_VARS};
use nubo_live::registry::{Registry, PASSWORD, USER};
use nubo_live::{run_with_timeout, Guard, LiveTest, TestResult, TestRoot};

const QUICK: Duration = Duration::from_secs(60);
/// Pull, unpack (two passes over ~450 MiB) and assemble, on a shared 2-core machine.
const MAKE: Duration = Duration::from_secs(900);
/// One TCG boot on a shared 2-core machine: 40-90 s alone, minutes when other VMs run.
const BOOT: Duration = Duration::from_secs(720);
const CREATED: &str = "2024-06-01T00:00:00Z";
/// The file the test's container image holds with `cap_net_raw+ep`.
const CAP_FILE: &str = "/usr/local/bin/nubo-netraw";
/// The kernel's first console line, which a boot check waits for.
const KERNEL_LINE: &str = "Linux version ";

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "from_container_reproducible_disk_boots_to_cloud_init",
        &[
            "docker-registry",
            "skopeo",
            "bootstrap",
            "qemu-img",
            "qemu",
            "ovmf",
            "iso-build",
            "setcap",
        ],
        reproducible_disk_boots,
    )])
}

fn run(cmd: &mut Command, timeout: Duration) -> Result<String, String> {
    run_with_timeout(cmd, timeout)
}

/// The shared image's root filesystem as `dir/layer.tar.gz`; returns the layer's and the
/// uncompressed tar's digests and the layer's size.
fn rootfs_layer(root: &TestRoot, dir: &Path) -> Result<(String, String, u64), String> {
    let img = root.with_debian_image()?;
    let raw = dir.join("disk.raw");
    run(
        Command::new("qemu-img")
            .args(["convert", "-f", "qcow2", "-O", "raw"])
            .arg(&img.qcow2)
            .arg(&raw),
        MAKE,
    )?;
    let virtual_size = img.record["virtual_size"]
        .as_u64()
        .ok_or("the shared image's record has no virtual_size")?;
    let offset = Layout::for_size(virtual_size).root.offset();
    let tree = dir.join("tree");
    fs::create_dir(&tree).map_err(|e| e.to_string())?;
    // debugfs keeps modes, owners and times; reading the filesystem needs no mount.
    run(
        Command::new("debugfs")
            .arg("-R")
            .arg(format!("rdump / {}", tree.display()))
            .arg(format!("{}?offset={offset}", raw.display())),
        MAKE,
    )?;
    restore_set_id_bits(&raw, offset, &tree)?;
    fs::remove_file(&raw).map_err(|e| e.to_string())?;
    if !tree.join("usr/bin/cloud-init").exists() {
        return Err("the rootfs read out of the shared image has no /usr/bin/cloud-init".into());
    }
    // A file capability, as iputils-ping's postinst sets on ping (the image has no ping): kept
    // through the layer (a pax SCHILY.xattr record), the unpack and mkfs.ext4 -d into the disk.
    let netraw = tree.join(CAP_FILE.trim_start_matches('/'));
    fs::copy(tree.join("usr/bin/true"), &netraw).map_err(|e| format!("cannot copy /usr/bin/true: {e}"))?;
    run(Command::new("setcap").arg("cap_net_raw+ep").arg(&netraw), QUICK)?;
    let tar = dir.join("layer.tar");
    run(
        Command::new("tar")
            .args([
                "--numeric-owner",
                "--sort=name",
                "--xattrs",
                "--xattrs-include=security.capability",
                "--exclude=./lost+found",
                "-C",
            ])
            .arg(&tree)
            .arg("-cf")
            .arg(&tar)
            .arg("."),
        MAKE,
    )?;
    fs::remove_dir_all(&tree).map_err(|e| e.to_string())?;
    let diff_id = file_digest(&tar).map_err(|e| e.to_string())?;
    run(Command::new("gzip").args(["-n", "-1"]).arg(&tar), MAKE)?;
    let gz = dir.join("layer.tar.gz");
    let digest = file_digest(&gz).map_err(|e| e.to_string())?;
    let size = fs::metadata(&gz).map_err(|e| e.to_string())?.len();
    Ok((digest, diff_id, size))
}

/// debugfs `rdump` sets a file's mode before its owner, and chown clears set-id bits: sudo
/// would lose its setuid (and a VMfile build's RUN, which runs through sudo, fail). One
/// debugfs run lists every directory of the tree with modes (`ls -p`), and each set-id
/// regular file gets its mode back.
fn restore_set_id_bits(raw: &Path, offset: u64, tree: &Path) -> TestResult {
    let mut dirs = vec![std::path::PathBuf::new()];
    let mut i = 0;
    while i < dirs.len() {
        let rel = dirs[i].clone();
        i += 1;
        for e in fs::read_dir(tree.join(&rel)).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            if e.file_type().map_err(|e| e.to_string())?.is_dir() {
                dirs.push(rel.join(e.file_name()));
            }
        }
    }
    let cmds: String = dirs.iter().map(|d| format!("ls -p \"/{}\"\n", d.display())).collect();
    let cmd_file = raw.with_extension("debugfs");
    fs::write(&cmd_file, cmds).map_err(|e| e.to_string())?;
    let out = run(
        Command::new("debugfs")
            .arg("-f")
            .arg(&cmd_file)
            .arg(format!("{}?offset={offset}", raw.display())),
        MAKE,
    )?;
    let mut dir = String::new();
    let mut fixed = 0;
    for line in out.lines() {
        if let Some(d) = line.strip_prefix("debugfs: ls -p \"/") {
            dir = d.trim_end_matches('"').to_owned();
            continue;
        }
        let f: Vec<&str> = line.split('/').collect();
        let [_, _, mode, _, _, name, ..] = f.as_slice() else {
            continue;
        };
        let Ok(mode) = u32::from_str_radix(mode, 8) else {
            continue;
        };
        if mode & 0o170000 == 0o100000 && mode & 0o6000 != 0 {
            let p = tree.join(&dir).join(name);
            fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode & 0o7777))
                .map_err(|e| format!("chmod {}: {e}", p.display()))?;
            fixed += 1;
        }
    }
    let sudo = fs::metadata(tree.join("usr/bin/sudo")).map_err(|e| format!("the tree has no /usr/bin/sudo: {e}"))?;
    if std::os::unix::fs::PermissionsExt::mode(&sudo.permissions()) & 0o4000 == 0 {
        return Err(format!(
            "/usr/bin/sudo is not setuid after restoring {fixed} set-id files"
        ));
    }
    Ok(())
}

/// An OCI layout in `dir/oci` holding the gzip layer, tagged `1`.
fn oci_layout(dir: &Path, layer: &(String, String, u64)) -> Result<(), String> {
    layout_with(
        dir,
        "oci",
        "layer.tar.gz",
        "application/vnd.oci.image.layer.v1.tar+gzip",
        layer,
    )
}

/// An OCI layout in `dir/NAME` holding `dir/FILE` as its one layer of `media_type`, tagged `1`.
fn layout_with(
    dir: &Path,
    name: &str,
    file: &str,
    media_type: &str,
    layer: &(String, String, u64),
) -> Result<(), String> {
    let (digest, diff_id, size) = layer;
    let oci = dir.join(name);
    let blobs = oci.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(|e| e.to_string())?;
    let hex = |d: &str| d.trim_start_matches("sha256:").to_owned();
    let w = |p: &Path, b: &[u8]| fs::write(p, b).map_err(|e| format!("writing {}: {e}", p.display()));
    fs::rename(dir.join(file), blobs.join(hex(digest))).map_err(|e| e.to_string())?;
    let config = format!(
        r#"{{"created":"{CREATED}","architecture":"amd64","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["{diff_id}"]}}}}"#
    );
    let cd = sha256_bytes(config.as_bytes());
    w(&blobs.join(hex(&cd)), config.as_bytes())?;
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cd}","size":{}}},"layers":[{{"mediaType":"{media_type}","digest":"{digest}","size":{size}}}]}}"#,
        config.len()
    );
    let md = sha256_bytes(manifest.as_bytes());
    w(&blobs.join(hex(&md)), manifest.as_bytes())?;
    w(&oci.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{md}","size":{},"annotations":{{"org.opencontainers.image.ref.name":"1"}}}}]}}"#,
        manifest.len()
    );
    w(&oci.join("index.json"), index.as_bytes())
}

/// One ustar header block (the tar crate is not a dependency of the live tests): `kind` is the
/// typeflag, the name and link written byte for byte, as a hostile layer has them.
fn ustar(name: &str, kind: u8, link: &str, data: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |h: &mut [u8; 512], at: usize, len: usize, v: u64| {
        let s = format!("{v:0w$o}\0", w = len - 1);
        h[at..at + len].copy_from_slice(s.as_bytes());
    };
    octal(&mut h, 100, 8, if kind == b'5' { 0o755 } else { 0o644 });
    octal(&mut h, 108, 8, 0);
    octal(&mut h, 116, 8, 0);
    octal(&mut h, 124, 12, data.len() as u64);
    octal(&mut h, 136, 12, 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = h.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

/// Pushes a one-layer image of `entries` (an uncompressed tar) as `ctr/NAME:1`; returns its
/// digest reference.
fn push_hostile(reg: &Registry, dir: &Path, name: &str, entries: &[Vec<u8>]) -> Result<String, String> {
    let mut tar: Vec<u8> = entries.concat();
    tar.extend_from_slice(&[0u8; 1024]);
    let file = format!("{name}.tar");
    fs::write(dir.join(&file), &tar).map_err(|e| e.to_string())?;
    let d = sha256_bytes(&tar);
    layout_with(
        dir,
        name,
        &file,
        "application/vnd.oci.image.layer.v1.tar",
        &(d.clone(), d, tar.len() as u64),
    )?;
    let digest_file = dir.join(format!("{name}.digest"));
    run(
        Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--dest-creds"])
            .arg(format!("{USER}:{PASSWORD}"))
            .arg("--dest-cert-dir")
            .arg(&reg.cert_dir)
            .arg("--digestfile")
            .arg(&digest_file)
            .arg(format!("oci:{}:1", dir.join(name).display()))
            .arg(format!("docker://{}/ctr/{name}:1", reg.host)),
        QUICK,
    )?;
    let pushed = fs::read_to_string(&digest_file).map_err(|e| e.to_string())?;
    Ok(format!("{}/ctr/{name}@{}", reg.host, pushed.trim()))
}

/// Hostile layers through the whole command: each refused, nothing left in the store's
/// `tmp/`, nothing written outside the work directory.
fn hostile_layers_refused(reg: &Registry, dir: &Path) -> TestResult {
    let outside = tempfile::Builder::new()
        .prefix("nubo-outside-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let out = outside.path().display().to_string();
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "traversal",
            vec![ustar(&format!("../../../../../../..{out}/evil"), b'0', "", b"x")],
            "`..` component",
        ),
        (
            "symlink-escape",
            vec![ustar("escape", b'2', &out, b""), ustar("escape/evil", b'0', "", b"x")],
            "never follows a link",
        ),
        (
            "whiteout-dotdot",
            vec![ustar("etc/", b'5', "", b""), ustar("etc/.wh...", b'0', "", b"")],
            "a whiteout of `..`",
        ),
        ("device", vec![ustar("usr/bin/disk", b'4', "", b"")], "device node"),
    ];
    let root = TestRoot::new()?;
    reg.login(&root)?;
    let ca = reg.ca.display().to_string();
    for (name, entries, says) in cases {
        let source = push_hostile(reg, dir, name, &entries)?;
        nubo(
            &root,
            &["image", "from-container", &source, "-t", "bad:1", "--ca-cert", &ca],
            MAKE,
        )?
        .refused(&[says])?;
        let left: Vec<_> = fs::read_dir(root.root().join("images/tmp"))
            .map(|rd| rd.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        if !left.is_empty() {
            return Err(format!("{name}: the refused unpack left {left:?} in the store's tmp/"));
        }
        if fs::read_dir(outside.path()).map_err(|e| e.to_string())?.count() != 0 {
            return Err(format!("{name}: something was written outside the work directory"));
        }
    }
    Ok(())
}

/// `image from-container` into a fresh root; returns the root and the printed sha256, sha512.
fn make(reg: &Registry, source: &str, label: &str) -> Result<(TestRoot, String, String), String> {
    let root = TestRoot::new()?;
    reg.login(&root)?;
    let (a, b) = make_in(&root, reg, source, label, &["-t", "ctr:1"])?;
    Ok((root, a, b))
}

/// `image from-container SOURCE ARGS...` in `root`; returns the printed sha256, sha512.
fn make_in(
    root: &TestRoot,
    reg: &Registry,
    source: &str,
    label: &str,
    args: &[&str],
) -> Result<(String, String), String> {
    let ca = reg.ca.display().to_string();
    let t = Instant::now();
    let mut argv = vec!["image", "from-container", source, "--ca-cert", &ca];
    argv.extend_from_slice(args);
    let out = nubo(root, &argv, MAKE)?.require()?;
    println!(
        "timing from-container ({label}): {:.1}s\n{}",
        t.elapsed().as_secs_f64(),
        out.stderr
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    match lines.as_slice() {
        [a, b] if a.starts_with("sha256:") && a.len() == 71 && b.starts_with("sha512:") && b.len() == 135 => {
            Ok((a.to_string(), b.to_string()))
        }
        _ => Err(format!(
            "from-container ({label}) printed {:?}, not a sha256: and a sha512: line",
            out.stdout
        )),
    }
}

fn reproducible_disk_boots() -> TestResult {
    let base = cache_base();
    fs::create_dir_all(&base).map_err(|e| e.to_string())?;
    let work = tempfile::Builder::new()
        .prefix("from-container-")
        .tempdir_in(&base)
        .map_err(|e| e.to_string())?;
    let fixture_root = TestRoot::new()?;
    let t = Instant::now();
    let layer = rootfs_layer(&fixture_root, work.path())?;
    drop(fixture_root);
    oci_layout(work.path(), &layer)?;
    println!("timing rootfs to OCI layout: {:.1}s", t.elapsed().as_secs_f64());

    let reg = Registry::start()?;
    let digest_file = work.path().join("pushed.digest");
    run(
        Command::new("skopeo")
            .args(["--insecure-policy", "copy", "--dest-creds"])
            .arg(format!("{USER}:{PASSWORD}"))
            .arg("--dest-cert-dir")
            .arg(&reg.cert_dir)
            .arg("--digestfile")
            .arg(&digest_file)
            .arg(format!("oci:{}:1", work.path().join("oci").display()))
            .arg(format!("docker://{}/ctr/debian:1", reg.host)),
        MAKE,
    )?;
    let pushed = fs::read_to_string(&digest_file).map_err(|e| e.to_string())?;
    let pushed = pushed.trim();
    let by_tag = format!("{}/ctr/debian:1", reg.host);
    let by_digest = format!("{}/ctr/debian@{pushed}", reg.host);

    // A tag moves: refused unless asked for, before anything is downloaded.
    let probe = TestRoot::new()?;
    nubo(&probe, &["image", "from-container", &by_tag, "-t", "ctr:1"], QUICK)?
        .refused(&["names a tag", "--allow-mutable-tag"])?;
    nubo(
        &probe,
        &[
            "image",
            "from-container",
            &by_digest,
            "-t",
            "ctr:1",
            "--iso-cloud-config",
            "/etc/hostname",
        ],
        QUICK,
    )?
    .refused(&["baked into an ISO only", "--format iso"])?;

    hostile_layers_refused(&reg, work.path())?;

    let (root, sha256, sha512) = make(&reg, &by_digest, "first")?;
    let (other, again, again512) = make(&reg, &by_digest, "second, another root")?;
    if (&sha256, &sha512) != (&again, &again512) {
        return Err(format!(
            "the same container digest gave two disks: {sha256} / {again} ({sha512} / {again512})"
        ));
    }
    let rec = json(
        &nubo(&root, &["image", "inspect", "ctr:1"], QUICK)?.require()?.stdout,
        "image inspect ctr:1",
    )?;
    let kind = field(&rec, "/source/kind")?;
    let manifest = field(&rec, "/source/manifest")?;
    let layers = field(&rec, "/labels/io.nubo.source.container.layers")?;
    let user = field(&rec, "/default_user")?;
    if kind != "container"
        || manifest != pushed
        || layers != layer.0
        || field(&rec, "/digest")? != sha256
        || user != "debian"
    {
        return Err(format!("the record does not say where the disk came from: {rec}"));
    }

    // The ISO, with a baked seed, made in both roots from the same digest: the same sha256.
    let seed = iso_seed(work.path())?;
    let (iso_sha, iso_path) = make_iso(&reg, &other, &by_digest, &seed, "iso")?;
    let (iso_again, _) = make_iso(&reg, &root, &by_digest, &seed, "iso, another root")?;
    if iso_sha != iso_again {
        return Err(format!(
            "the same container digest gave two ISOs: {iso_sha} / {iso_again}"
        ));
    }
    // BIOS, as a USB disk (the MBR's boot_hybrid.img) and from -cdrom (El Torito), each only
    // to the kernel's first console line: GRUB found and loaded the kernel and both initramfs.
    iso_reaches_kernel(&iso_path, work.path())?;
    // UEFI (OVMF) from -cdrom alone, the whole way, while the disk boots.
    let iso = iso_boot_start(&iso_path, work.path(), &seed.marker)?;

    // The disk boots through UEFI and the GRUB nubo put on the ESP, to cloud-init with its hostname.
    let name = "ctr";
    let hostname = "from-container-vm";
    let _cleanup = Cleanup::new(&root, &[name]);
    let t = Instant::now();
    let out = nubo(
        &root,
        &[
            "vm",
            "create",
            name,
            "--image",
            "ctr:1",
            "--firmware",
            "efi",
            "--hostname",
            hostname,
            "--restrict-network",
            "--wait",
            "--boot-timeout",
            "600s",
        ],
        BOOT,
    )?
    .require()?;
    println!(
        "timing vm create from the container disk to cloud-init finished: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    if !out.stderr.contains("cloud-init finished") {
        return Err(format!("vm create did not reach cloud-init finished:\n{}", out.stderr));
    }
    let h = guest(&root, name, "hostname")?;
    if h != hostname {
        return Err(format!("guest hostname {h:?}, expected {hostname:?}"));
    }
    let efi = guest(&root, name, "test -d /sys/firmware/efi && echo uefi || echo bios")?;
    if efi != "uefi" {
        return Err(format!("the guest booted with {efi}, not through UEFI"));
    }
    // The file capability of the container image, read in the booted guest (no getcap there:
    // python3 is cloud-init's) and decoded as struct vfs_cap_data.
    let cap = guest(
        &root,
        name,
        &format!("python3 -c 'import os; print(os.getxattr(\"{CAP_FILE}\", \"security.capability\").hex())'"),
    )?;
    cap_net_raw_effective(&cap)
        .map_err(|why| format!("{CAP_FILE} in the guest: {why} (security.capability {cap:?})"))?;
    iso_boot_finish(iso)?;
    iso_push_pull(&reg, &other, &iso_sha)?;
    vmfile_from_oci(&reg, &root, work.path(), &by_digest, pushed)
}

/// `image push` of the ISO to the test registry and `image pull` of the digest it printed into
/// a fresh root: the same sha256, still an `iso`.
fn iso_push_pull(reg: &Registry, root: &TestRoot, iso_sha: &str) -> TestResult {
    let ca = reg.ca.display().to_string();
    let target = format!("{}/ctr/iso:1", reg.host);
    let t = Instant::now();
    let out = nubo(root, &["image", "push", "ctr-iso:1", &target, "--ca-cert", &ca], MAKE)?.require()?;
    let pinned = out.stdout.trim().to_owned();
    if !pinned.starts_with(&format!("{}/ctr/iso@sha256:", reg.host)) {
        return Err(format!("push printed `{pinned}`, not {}/ctr/iso@sha256:...", reg.host));
    }
    let dst = TestRoot::new()?;
    reg.login(&dst)?;
    let out = nubo(
        &dst,
        &["image", "pull", &pinned, "--ca-cert", &ca, "--name", "iso:1"],
        MAKE,
    )?
    .require()?;
    if !out.stdout.starts_with(&format!("iso:1 {iso_sha}")) {
        return Err(format!(
            "pull of the pushed ISO printed `{}`, not `iso:1 {iso_sha}`",
            out.stdout
        ));
    }
    let rec = json(
        &nubo(&dst, &["image", "inspect", "iso:1"], QUICK)?.require()?.stdout,
        "image inspect iso:1",
    )?;
    if field(&rec, "/format")? != "iso" || field(&rec, "/digest")? != iso_sha {
        return Err(format!(
            "the pulled ISO's record is not an iso with the pushed digest: {rec}"
        ));
    }
    println!("timing push and pull of the ISO: {:.1}s", t.elapsed().as_secs_f64());
    Ok(())
}

/// `image build` of a VMfile `FROM oci://REGISTRY/REPO@sha256:...`: the container image made a
/// disk through from-container's path, one build VM (logging in as the image's default user),
/// the record naming the reference and the digest it resolved to.
fn vmfile_from_oci(reg: &Registry, root: &TestRoot, dir: &Path, by_digest: &str, pushed: &str) -> TestResult {
    let ctx = dir.join("vmfile-ctx");
    fs::create_dir_all(&ctx).map_err(|e| e.to_string())?;
    fs::write(
        ctx.join("VMfile"),
        format!("FROM oci://{by_digest}\nRUN echo built-from-oci > /etc/nubo-oci-built\n"),
    )
    .map_err(|e| e.to_string())?;
    let ca = reg.ca.display().to_string();
    let t = Instant::now();
    nubo(
        root,
        &[
            "image",
            "build",
            "-t",
            "built:1",
            "--ca-cert",
            &ca,
            "--boot-timeout",
            "600s",
            &ctx.display().to_string(),
        ],
        MAKE + BOOT,
    )?
    .require()?;
    println!("timing image build FROM oci://: {:.1}s", t.elapsed().as_secs_f64());
    let rec = json(
        &nubo(root, &["image", "inspect", "built:1"], QUICK)?.require()?.stdout,
        "image inspect built:1",
    )?;
    let from = field(&rec, "/build/from")?;
    if from != format!("oci://{by_digest}") || !from.ends_with(pushed) {
        return Err(format!(
            "the build record does not name FROM oci:// and its digest: {from}"
        ));
    }
    Ok(())
}

const ISO_HOST: &str = "nubo-iso-live";

struct IsoBoot {
    vm: Guard,
    log: std::path::PathBuf,
    marker: String,
    started: Instant,
}

/// The baked cloud-config: a hostname and a runcmd writing a marker to the serial console.
struct Seed {
    path: String,
    marker: String,
}

fn iso_seed(dir: &Path) -> Result<Seed, String> {
    let marker = format!("NUBO-ISO-SEED-{}", std::process::id());
    let cc = dir.join("iso-cloud-config");
    fs::write(
        &cc,
        format!("#cloud-config\nhostname: {ISO_HOST}\nruncmd:\n  - echo \"{marker} host=$(hostname) fw=$(test -d /sys/firmware/efi && echo uefi || echo bios)\" > /dev/ttyS0\n"),
    )
    .map_err(|e| e.to_string())?;
    Ok(Seed {
        path: cc.display().to_string(),
        marker,
    })
}

/// `--format iso --iso-cloud-config` in `root`; returns the printed sha256 and the stored path.
fn make_iso(
    reg: &Registry,
    root: &TestRoot,
    source: &str,
    seed: &Seed,
    label: &str,
) -> Result<(String, String), String> {
    let (sha256, _) = make_in(
        root,
        reg,
        source,
        label,
        &["-t", "ctr-iso:1", "--format", "iso", "--iso-cloud-config", &seed.path],
    )?;
    let rec = json(
        &nubo(root, &["image", "inspect", "ctr-iso:1"], QUICK)?.require()?.stdout,
        "image inspect ctr-iso:1",
    )?;
    if field(&rec, "/format")? != "iso" || field(&rec, "/digest")? != sha256 {
        return Err(format!("the ISO's record is not an iso with the printed digest: {rec}"));
    }
    let path = field(&rec, "/path")?;
    Ok((sha256, path))
}

/// QEMU (pc, TCG, no NIC, serial to `log`) with `media`, and OVMF's pflash when `efi`.
fn iso_qemu(media: &[String], log: &Path, vars: Option<&Path>) -> Command {
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args([
        "-machine",
        "pc",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-smp",
        "1",
        "-m",
        "1024",
        "-display",
        "none",
        "-no-reboot",
        "-nic",
        "none",
    ])
    .arg("-serial")
    .arg(format!("file:{}", log.display()));
    if let Some(vars) = vars {
        qemu.arg("-drive")
            .arg(format!("if=pflash,format=raw,unit=0,readonly=on,file={OVMF_CODE}"))
            .arg("-drive")
            .arg(format!("if=pflash,format=raw,unit=1,file={}", vars.display()));
    }
    qemu.args(media)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    qemu
}

/// The ISO under SeaBIOS as a USB stick (xHCI, usb-storage, nothing else attached: it boots as a
/// hard disk through the MBR) and from `-cdrom` (El Torito), both at once, each until the
/// kernel's first console line, then killed.
fn iso_reaches_kernel(iso: &str, dir: &Path) -> TestResult {
    let t = Instant::now();
    let usb = [
        "-device".to_owned(),
        "qemu-xhci,id=xhci".to_owned(),
        "-drive".to_owned(),
        format!("if=none,id=stick,format=raw,readonly=on,file={iso}"),
        "-device".to_owned(),
        "usb-storage,bus=xhci.0,drive=stick".to_owned(),
    ];
    let cd = ["-cdrom".to_owned(), iso.to_owned()];
    let mut boots = Vec::new();
    for (what, media) in [
        ("the ISO as a USB disk, BIOS", &usb[..]),
        ("the ISO from -cdrom, BIOS", &cd[..]),
    ] {
        let log = dir.join(format!("iso-{}.log", boots.len()));
        let vm = Guard::spawn(&mut iso_qemu(media, &log, None), what)?;
        boots.push((what, vm, log));
    }
    for (what, mut vm, log) in boots {
        let left = BOOT.saturating_sub(t.elapsed());
        vm.wait_for_line(&log, left, |l| l.contains(KERNEL_LINE))
            .map_err(|e| format!("{what}: {e}\n{}", console_tail(&log)))?;
        println!(
            "timing {what} to the kernel's first line: {:.1}s",
            t.elapsed().as_secs_f64()
        );
        vm.kill();
    }
    Ok(())
}

fn console_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(40).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!("last lines of the console:\n{}", tail.join("\n"))
}

/// A `security.capability` value (hex) grants CAP_NET_RAW (bit 13) permitted and effective.
fn cap_net_raw_effective(hex: &str) -> TestResult {
    let bytes: Vec<u8> = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2).unwrap_or("zz"), 16))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("not hex: {e}"))?;
    if bytes.len() < 8 {
        return Err("shorter than struct vfs_cap_data".into());
    }
    let magic = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    let permitted = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
    // VFS_CAP_REVISION_2 or _3, VFS_CAP_FLAGS_EFFECTIVE, CAP_NET_RAW = 13.
    if !matches!(magic & 0xFF00_0000, 0x0200_0000 | 0x0300_0000) || magic & 1 == 0 || permitted & (1 << 13) == 0 {
        return Err("does not grant cap_net_raw+ep".into());
    }
    Ok(())
}

/// Starts QEMU under OVMF with the ISO as `-cdrom` and nothing else.
fn iso_boot_start(iso: &str, dir: &Path, marker: &str) -> Result<IsoBoot, String> {
    let log = dir.join("iso-serial.log");
    let vars = dir.join("iso-OVMF_VARS.fd");
    fs::copy(OVMF_VARS, &vars).map_err(|e| format!("cannot copy {OVMF_VARS}: {e}"))?;
    let vm = Guard::spawn(
        &mut iso_qemu(&["-cdrom".to_owned(), iso.to_owned()], &log, Some(&vars)),
        "qemu (the ISO from -cdrom under OVMF)",
    )?;
    Ok(IsoBoot {
        vm,
        log,
        marker: marker.to_owned(),
        started: Instant::now(),
    })
}

/// The ISO's console: cloud-init finished, the baked runcmd ran with the baked hostname, and a
/// login prompt.
fn iso_boot_finish(b: IsoBoot) -> TestResult {
    let log = b.log.clone();
    iso_boot_wait(b).map_err(|e| format!("{e}\n{}", console_tail(&log)))
}

fn iso_boot_wait(mut b: IsoBoot) -> TestResult {
    let left = BOOT.saturating_sub(b.started.elapsed());
    let seen = b.vm.wait_for_line(&b.log, left, |l| {
        l.contains("Cloud-init v.") && l.contains(" finished at ")
    })?;
    let left = BOOT.saturating_sub(b.started.elapsed()).max(Duration::from_secs(60));
    let seen = match seen.contains(" login: ") {
        true => seen,
        false => b.vm.wait_for_prompt(&b.log, left, " login: ")?,
    };
    println!(
        "timing ISO from -cdrom under OVMF to cloud-init finished and a login prompt: {:.1}s",
        b.started.elapsed().as_secs_f64()
    );
    b.vm.kill();
    let expected = format!("{} host={ISO_HOST} fw=uefi", b.marker);
    if !seen.contains(&expected) {
        return Err(format!(
            "the baked seed's runcmd marker `{expected}` is not on the ISO's console; log {}",
            b.log.display()
        ));
    }
    Ok(())
}
