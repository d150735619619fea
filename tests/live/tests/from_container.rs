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
//! - one VM boots the disk through BIOS firmware and its GRUB (`--firmware bios`) to
//!   cloud-init finished with its hostname.

use std::fs;
use std::path::Path;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nubo_bootstrap::digest::file_digest;
use nubo_bootstrap::layout::Layout;
use nubo_image::digest::sha256_bytes;
use nubo_live::cli::{field, guest, json, nubo, nubo_in, Cleanup};
use nubo_live::fixture::cache_base;
use nubo_live::registry::{Registry, PASSWORD, USER};
use nubo_live::{run_with_timeout, LiveTest, TestResult, TestRoot};

const QUICK: Duration = Duration::from_secs(60);
/// Pull, unpack (two passes over ~450 MiB) and assemble, on a shared 2-core machine.
const MAKE: Duration = Duration::from_secs(900);
/// One TCG boot on a shared 2-core machine: 40-90 s alone, minutes when other VMs run.
const BOOT: Duration = Duration::from_secs(720);
const CREATED: &str = "2024-06-01T00:00:00Z";

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "from_container_reproducible_disk_boots_to_cloud_init",
        &["docker-registry", "skopeo", "bootstrap", "qemu-img", "qemu"],
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
    fs::remove_file(&raw).map_err(|e| e.to_string())?;
    if !tree.join("usr/bin/cloud-init").exists() {
        return Err("the rootfs read out of the shared image has no /usr/bin/cloud-init".into());
    }
    let tar = dir.join("layer.tar");
    run(
        Command::new("tar")
            .args(["--numeric-owner", "--sort=name", "--exclude=./lost+found", "-C"])
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
    login(&root, reg)?;
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

fn login(root: &TestRoot, reg: &Registry) -> TestResult {
    let ca = reg.ca.display().to_string();
    nubo_in(
        root,
        &[
            "registry",
            "login",
            &reg.host,
            "-u",
            USER,
            "--password-stdin",
            "--ca-cert",
            &ca,
        ],
        Some(&format!("{PASSWORD}\n")),
        QUICK,
    )?
    .require()
    .map(drop)
}

/// `image from-container` into a fresh root; returns the root and the printed sha256, sha512.
fn make(reg: &Registry, source: &str, label: &str) -> Result<(TestRoot, String, String), String> {
    let root = TestRoot::new()?;
    login(&root, reg)?;
    let ca = reg.ca.display().to_string();
    let t = Instant::now();
    let out = nubo(
        &root,
        &["image", "from-container", source, "-t", "ctr:1", "--ca-cert", &ca],
        MAKE,
    )?
    .require()?;
    println!(
        "timing from-container ({label}): {:.1}s\n{}",
        t.elapsed().as_secs_f64(),
        out.stderr
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    match lines.as_slice() {
        [a, b] if a.starts_with("sha256:") && a.len() == 71 && b.starts_with("sha512:") && b.len() == 135 => {
            let (a, b) = (a.to_string(), b.to_string());
            Ok((root, a, b))
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
        &["image", "from-container", &by_digest, "-t", "ctr:1", "--format", "iso"],
        QUICK,
    )?
    .refused(&["--format iso is not built yet"])?;

    hostile_layers_refused(&reg, work.path())?;

    let (root, sha256, sha512) = make(&reg, &by_digest, "first")?;
    let (_other, again, again512) = make(&reg, &by_digest, "second, another root")?;
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
    if kind != "container" || manifest != pushed || layers != layer.0 || field(&rec, "/digest")? != sha256 {
        return Err(format!("the record does not say where the disk came from: {rec}"));
    }

    // The disk boots through BIOS and the GRUB nubo installed, to cloud-init with its hostname.
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
            "bios",
            "--hostname",
            hostname,
            // The image's cloud-init default user; a container disk records none of its own.
            "--ssh-user",
            "debian",
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
    Ok(())
}
