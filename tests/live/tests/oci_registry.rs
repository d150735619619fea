//! VM images through a real OCI registry (Debian's docker-registry 2.8, started here on
//! 127.0.0.1 with TLS from a test CA and htpasswd auth): push, ls-remote, pull by tag and by
//! digest into fresh roots, interop with skopeo, refusals (401, 404, unreachable, a container
//! image, a tampered blob, a truncated blob, a manifest with a wrong size, a moved tag), and one
//! boot of the pulled image to cloud-init finished.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use nubo_image::digest::sha256_bytes;
use nubo_live::cli::{json, nubo_in, run_in};
use nubo_live::faults::{Cut, CuttingProxy};
use nubo_live::registry::{Registry, PASSWORD, USER};
use nubo_live::{run_with_timeout, LiveTest, TestResult, TestRoot};

const QUICK: Duration = Duration::from_secs(60);
const TRANSFER: Duration = Duration::from_secs(600);
/// One TCG boot on a shared 2-core machine: 40-90 s alone, minutes when other VMs run.
const BOOT: Duration = Duration::from_secs(720);

fn main() -> std::process::ExitCode {
    nubo_live::run(vec![
        LiveTest::new(
            "oci_push_pull_interop_and_refusals",
            &["docker-registry", "skopeo", "bootstrap", "qemu-img"],
            push_pull_interop_and_refusals,
        ),
        LiveTest::new(
            "oci_bearer_token_and_push_retry",
            &["docker-registry", "bootstrap"],
            bearer_token_and_push_retry,
        ),
        LiveTest::new(
            "oci_pulled_image_boots_to_cloud_init",
            &["docker-registry", "bootstrap", "qemu"],
            pulled_image_boots,
        ),
    ])
}

fn login(root: &TestRoot, reg: &Registry) -> Result<(), String> {
    reg.login(root)
}

/// Logs in to `host` (the registry, or a proxy in front of it) with the registry's CA.
fn login_at(root: &TestRoot, reg: &Registry, host: &str) -> Result<(), String> {
    reg.login_with(root, host, PASSWORD)?.require().map(drop)
}

/// What `reg` refuses before login, whatever its auth (basic or bearer): `unauthenticated`
/// (a nubo command against it) gets HTTP 401 with the fix in the message, and a wrong password
/// is refused by the registry at login with nothing stored.
fn refused_before_login(root: &TestRoot, reg: &Registry, unauthenticated: &[&str]) -> TestResult {
    nubo_in(root, unauthenticated, None, QUICK)?.refused(&["HTTP 401", "nubo registry login"])?;
    reg.login_with(root, &reg.host, "wrong")?.refused(&["401"])?;
    if root.root().join("auth.json").exists() {
        return Err(format!("a refused login at {} wrote credentials", reg.host));
    }
    Ok(())
}

fn text_at(v: &serde_json::Value, ptr: &str) -> String {
    v.pointer(ptr).and_then(|x| x.as_str()).unwrap_or_default().to_owned()
}

/// A minimal container image (one empty tar layer) as an OCI layout, for skopeo to push.
fn container_layout(dir: &Path) -> Result<(), String> {
    let w = |p: &Path, b: &[u8]| fs::write(p, b).map_err(|e| format!("writing {}: {e}", p.display()));
    let blobs = dir.join("blobs/sha256");
    fs::create_dir_all(&blobs).map_err(|e| e.to_string())?;
    let layer = vec![0u8; 1024];
    let config = br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"]},"config":{}}"#;
    let ld = sha256_bytes(&layer);
    let cd = sha256_bytes(config);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{cd}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{ld}","size":1024}}]}}"#,
        config.len()
    );
    let md = sha256_bytes(manifest.as_bytes());
    let hex = |d: &str| d.trim_start_matches("sha256:").to_owned();
    w(&blobs.join(hex(&ld)), &layer)?;
    w(&blobs.join(hex(&cd)), config)?;
    w(&blobs.join(hex(&md)), manifest.as_bytes())?;
    w(&dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{md}","size":{},"annotations":{{"org.opencontainers.image.ref.name":"1"}}}}]}}"#,
        manifest.len()
    );
    w(&dir.join("index.json"), index.as_bytes())
}

fn files_in(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn push_pull_interop_and_refusals() -> TestResult {
    let reg = Registry::start()?;
    let host = reg.host.clone();
    let ca = reg.ca.display().to_string();
    let src = TestRoot::new()?;
    let img = src.with_debian_image()?;
    let target = format!("{host}/nubo/debian:12");

    // A push before login, and a login with a wrong password.
    refused_before_login(&src, &reg, &["image", "push", "debian:12", &target, "--ca-cert", &ca])?;
    // Without the CA the registry's certificate is not trusted.
    nubo_in(
        &src,
        &["image", "ls-remote", &format!("{host}/nubo/debian")],
        None,
        QUICK,
    )?
    .refused(&["not trusted", "--ca-cert"])?;
    login(&src, &reg)?;
    let mode = fs::metadata(src.root().join("auth.json"))
        .map_err(|e| e.to_string())?
        .permissions()
        .mode();
    if mode & 0o777 != 0o600 {
        return Err(format!("auth.json has mode {:o}, not 600", mode & 0o777));
    }

    // Push, timed; the pinned digest is printed.
    let t = Instant::now();
    let out = nubo_in(
        &src,
        &["image", "push", "debian:12", &target, "--ca-cert", &ca],
        None,
        TRANSFER,
    )?
    .require()?;
    let push_s = t.elapsed().as_secs_f64();
    let pinned = out.stdout.trim().to_owned();
    let digest = pinned
        .strip_prefix(&format!("{host}/nubo/debian@"))
        .ok_or_else(|| format!("push printed `{pinned}`, not {host}/nubo/debian@sha256:..."))?
        .to_owned();
    println!("timing push of {} bytes: {push_s:.1}s", img.record["size"]);
    // Again: HEAD finds every blob, nothing is uploaded.
    let again = nubo_in(
        &src,
        &["image", "push", "debian:12", &target, "--ca-cert", &ca],
        None,
        TRANSFER,
    )?
    .require()?;
    if !again.stderr.contains("0 blob(s) uploaded") || again.stdout.trim() != pinned {
        return Err(format!(
            "a second push uploaded again or moved the digest:\n{}{}",
            again.stderr, again.stdout
        ));
    }

    // ls-remote names the tag, its digest and what it is.
    let out = nubo_in(
        &src,
        &[
            "image",
            "ls-remote",
            &format!("{host}/nubo/debian"),
            "-o",
            "json",
            "--ca-cert",
            &ca,
        ],
        None,
        QUICK,
    )?
    .require()?;
    let tags = json(&out.stdout, "ls-remote -o json")?;
    if text_at(&tags, "/0/tag") != "12"
        || text_at(&tags, "/0/digest") != digest
        || text_at(&tags, "/0/kind") != "nubo-vm"
    {
        return Err(format!(
            "ls-remote does not list tag 12 as a nubo-vm at {digest}: {tags}"
        ));
    }

    // skopeo reads nubo's manifest byte for byte, and copies it to an OCI layout whose disk
    // layer is the disk's sha256.
    let cert_dir = reg.cert_dir.display().to_string();
    let creds = format!("{USER}:{PASSWORD}");
    let raw = run_with_timeout(
        Command::new("skopeo").args([
            "inspect",
            "--raw",
            "--creds",
            &creds,
            "--cert-dir",
            &cert_dir,
            &format!("docker://{target}"),
        ]),
        QUICK,
    )?;
    if sha256_bytes(raw.as_bytes()) != digest {
        return Err(format!(
            "skopeo inspect --raw returned other bytes than the pushed manifest {digest}: {raw}"
        ));
    }
    let layout = tempfile::tempdir().map_err(|e| e.to_string())?;
    let oci_dir = layout.path().join("copy");
    let t = Instant::now();
    run_with_timeout(
        Command::new("skopeo").args([
            "--insecure-policy",
            "copy",
            "--src-creds",
            &creds,
            "--src-cert-dir",
            &cert_dir,
            &format!("docker://{target}"),
            &format!("oci:{}:v1", oci_dir.display()),
        ]),
        TRANSFER,
    )?;
    println!("timing skopeo copy registry -> oci: {:.1}s", t.elapsed().as_secs_f64());
    let index = json(
        &fs::read_to_string(oci_dir.join("index.json")).map_err(|e| e.to_string())?,
        "index.json",
    )?;
    let mdigest = text_at(&index, "/manifests/0/digest");
    let mpath = oci_dir.join("blobs/sha256").join(mdigest.trim_start_matches("sha256:"));
    let m = json(
        &fs::read_to_string(&mpath).map_err(|e| e.to_string())?,
        "copied manifest",
    )?;
    if text_at(&m, "/layers/0/digest") != img.digest || text_at(&m, "/artifactType") != "application/vnd.nubo.vm.v1" {
        return Err(format!(
            "skopeo's copy has layer {} (want the disk's {}): {m}",
            text_at(&m, "/layers/0/digest"),
            img.digest
        ));
    }
    let layer = oci_dir
        .join("blobs/sha256")
        .join(img.digest.trim_start_matches("sha256:"));
    let layer_sum = nubo_image::digest::hash_file(&layer, nubo_image::Algorithm::Sha256).map_err(|e| e.to_string())?;
    if layer_sum.to_string() != img.digest {
        return Err(format!("the copied layer hashes to {layer_sum}, not {}", img.digest));
    }

    // Pull by tag into a fresh root: same disk, metadata restored, the manifest digest recorded.
    let dst = TestRoot::new()?;
    nubo_in(&dst, &["image", "pull", &target, "--ca-cert", &ca], None, QUICK)?
        .refused(&["HTTP 401", "nubo registry login"])?;
    login(&dst, &reg)?;
    let t = Instant::now();
    let out = nubo_in(&dst, &["image", "pull", &target, "--ca-cert", &ca], None, TRANSFER)?.require()?;
    println!("timing pull by tag: {:.1}s", t.elapsed().as_secs_f64());
    let local = format!("{}_nubo_debian:12", host.replace(':', "-"));
    if !out.stdout.starts_with(&format!("{local} {}", img.digest)) {
        return Err(format!("pull printed `{}`, not `{local} {}`", out.stdout, img.digest));
    }
    // The registry reference names the pulled image too (stored under the local name).
    let rec = json(
        &nubo_in(&dst, &["image", "inspect", &target], None, QUICK)?
            .require()?
            .stdout,
        "image inspect REGISTRY/REPO:TAG",
    )?;
    if text_at(&rec, "/reference") != local {
        return Err(format!(
            "image inspect {target} is not the image stored as {local}: {rec}"
        ));
    }
    let want = [
        ("/digest", img.digest.clone()),
        ("/source/kind", "oci".into()),
        ("/source/manifest", digest.clone()),
        ("/source/url", target.clone()),
        ("/source/origin/kind", "bootstrap".into()),
        ("/default_user", text_at(&img.record, "/default_user")),
        ("/boot/cmdline", img.cmdline.clone()),
        ("/os", "debian".into()),
    ];
    for (ptr, value) in want {
        if text_at(&rec, ptr) != value {
            return Err(format!(
                "pulled record {ptr} is `{}`, not `{value}`: {rec}",
                text_at(&rec, ptr)
            ));
        }
    }
    for ptr in [
        "/default_vcpus",
        "/default_memory_mib",
        "/virtual_size",
        "/firmware",
        "/cloud_init",
    ] {
        if rec.pointer(ptr) != img.record.pointer(ptr) {
            return Err(format!("pulled record {ptr} differs from the pushed image's: {rec}"));
        }
    }
    let kernel = Path::new(&text_at(&rec, "/boot/kernel")).to_path_buf();
    if nubo_image::digest::hash_file(&kernel, nubo_image::Algorithm::Sha256).ok()
        != nubo_image::digest::hash_file(&img.kernel, nubo_image::Algorithm::Sha256).ok()
    {
        return Err("the pulled kernel differs from the pushed one".into());
    }
    // A second pull downloads nothing.
    let out = nubo_in(&dst, &["image", "pull", &target, "--ca-cert", &ca], None, QUICK)?.require()?;
    if !out.stderr.contains("already in the store") || out.stderr.contains("disk sha256") {
        return Err(format!("a second pull downloaded again:\n{}", out.stderr));
    }

    // Pull by digest into another fresh root.
    let by_digest = TestRoot::new()?;
    login(&by_digest, &reg)?;
    let pinned_ref = format!("{host}/nubo/debian@{digest}");
    let out = nubo_in(
        &by_digest,
        &["image", "pull", &pinned_ref, "--ca-cert", &ca, "--name", "pinned:1"],
        None,
        TRANSFER,
    )?
    .require()?;
    if !out.stdout.starts_with(&format!("pinned:1 {}", img.digest)) {
        return Err(format!("pull by digest printed `{}`", out.stdout));
    }
    // A digest the registry does not have: 404 naming the repository.
    let missing = format!("{host}/nubo/debian@sha256:{}", "0".repeat(64));
    nubo_in(&by_digest, &["image", "pull", &missing, "--ca-cert", &ca], None, QUICK)?
        .refused(&["not found", "nubo/debian"])?;
    nubo_in(
        &by_digest,
        &["image", "pull", &format!("{host}/nubo/debian:nope"), "--ca-cert", &ca],
        None,
        QUICK,
    )?
    .refused(&["not found", "tag `nope`", "ls-remote"])?;
    // Nobody listening.
    nubo_in(
        &by_digest,
        &["image", "pull", "127.0.0.1:1/nubo/debian:12"],
        None,
        QUICK,
    )?
    .refused(&["could not connect to registry 127.0.0.1:1"])?;

    // A container image pushed by skopeo is refused for what it is.
    let ctr = layout.path().join("ctr");
    container_layout(&ctr)?;
    run_with_timeout(
        Command::new("skopeo").args([
            "--insecure-policy",
            "copy",
            "--dest-creds",
            &creds,
            "--dest-cert-dir",
            &cert_dir,
            &format!("oci:{}:1", ctr.display()),
            &format!("docker://{host}/ctr/busy:1"),
        ]),
        QUICK,
    )?;
    nubo_in(
        &by_digest,
        &["image", "pull", &format!("{host}/ctr/busy:1"), "--ca-cert", &ca],
        None,
        QUICK,
    )?
    .refused(&["is a container image", "not a nubo VM image"])?;

    // A moved tag: push another image to the same tag; the old pull's tag is kept until --force,
    // and image inspect then shows the new manifest digest.
    let small = layout.path().join("small.qcow2");
    run_with_timeout(
        Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2"])
            .arg(&small)
            .arg("64M"),
        QUICK,
    )?;
    nubo_in(
        &src,
        &["image", "import", &small.display().to_string(), "-t", "small:1"],
        None,
        QUICK,
    )?
    .require()?;
    let moved = nubo_in(
        &src,
        &["image", "push", "small:1", &target, "--ca-cert", &ca],
        None,
        QUICK,
    )?
    .require()?;
    let moved_digest = moved.stdout.trim().rsplit('@').next().unwrap_or_default().to_owned();
    nubo_in(&dst, &["image", "pull", &target, "--ca-cert", &ca], None, QUICK)?
        .refused(&["already exists", "--force"])?;
    nubo_in(
        &dst,
        &["image", "pull", &target, "--ca-cert", &ca, "--force"],
        None,
        QUICK,
    )?
    .require()?;
    let rec = json(
        &nubo_in(&dst, &["image", "inspect", &local], None, QUICK)?
            .require()?
            .stdout,
        "image inspect",
    )?;
    if text_at(&rec, "/source/manifest") != moved_digest || moved_digest == digest {
        return Err(format!(
            "after the tag moved, inspect shows manifest {} (want {moved_digest})",
            text_at(&rec, "/source/manifest")
        ));
    }

    // A manifest whose disk size is wrong (the registry does not check sizes): refused while
    // streaming, nothing stored.
    let fresh = TestRoot::new()?;
    login(&fresh, &reg)?;
    let mut m: serde_json::Value = json(&raw, "pushed manifest")?;
    let size = m["layers"][0]["size"].as_u64().unwrap_or(0);
    m["layers"][0]["size"] = serde_json::json!(size - 4096);
    put_manifest(
        &reg,
        "nubo/debian",
        "short",
        &serde_json::to_vec(&m).map_err(|e| e.to_string())?,
    )?;
    nubo_in(
        &fresh,
        &["image", "pull", &format!("{host}/nubo/debian:short"), "--ca-cert", &ca],
        None,
        TRANSFER,
    )?
    .refused(&["where the manifest says", "nothing was stored"])?;
    expect_empty_store(&fresh)?;

    // A tampered blob in the registry's storage: refused, nothing stored.
    let blob = reg.blob_file(&img.digest);
    let original = flip_byte(&blob, 100 << 20)?;
    let out = nubo_in(
        &fresh,
        &["image", "pull", &pinned_ref, "--ca-cert", &ca],
        None,
        TRANSFER,
    )?;
    restore_byte(&blob, 100 << 20, original)?;
    out.refused(&["does not match its digest", "tampered", "nothing was stored"])?;
    expect_empty_store(&fresh)?;

    // A truncated blob (the kernel's): the registry sends fewer bytes than the manifest says.
    let kernel_digest = text_at(&json(&raw, "manifest")?, "/layers/1/digest");
    let kblob = reg.blob_file(&kernel_digest);
    let kbytes = fs::read(&kblob).map_err(|e| e.to_string())?;
    fs::write(&kblob, &kbytes[..kbytes.len() / 2]).map_err(|e| e.to_string())?;
    let out = nubo_in(
        &fresh,
        &["image", "pull", &pinned_ref, "--ca-cert", &ca],
        None,
        TRANSFER,
    )?;
    fs::write(&kblob, &kbytes).map_err(|e| e.to_string())?;
    out.refused(&["nothing was stored"])?;
    expect_empty_store(&fresh)?;

    // A zstd disk layer whose annotations lie: decompressed to another sha256, or to more
    // bytes than annotated (the bound a decompression bomb hits). Refused, nothing stored.
    let zpushed = nubo_in(
        &src,
        &[
            "image",
            "push",
            "small:1",
            &format!("{host}/nubo/small:z"),
            "--compress",
            "--ca-cert",
            &ca,
        ],
        None,
        QUICK,
    )?
    .require()?;
    let zdigest = zpushed.stdout.trim().rsplit('@').next().unwrap_or_default().to_owned();
    let zbytes = client(&reg)?
        .manifest("nubo/small", &zdigest, "nubo/small")
        .map_err(|e| e.to_string())?
        .ok_or("the compressed manifest is gone")?;
    let zm: serde_json::Value = json(&String::from_utf8_lossy(&zbytes), "compressed manifest")?;
    if !text_at(&zm, "/layers/0/mediaType").ends_with("+zstd") {
        return Err(format!("push --compress did not push a +zstd disk layer: {zm}"));
    }
    let disk_size: u64 = text_at(&zm, "/annotations/io.nubo.image.disk.size")
        .parse()
        .unwrap_or(0);
    let lies = [
        (
            "zdigest",
            "io.nubo.image.disk.digest",
            format!("sha256:{}", "5".repeat(64)),
            "does not match its digest",
        ),
        (
            "zsize",
            "io.nubo.image.disk.size",
            (disk_size / 2).to_string(),
            "decompresses to more than",
        ),
    ];
    for (tag, key, value, why) in lies {
        let mut m = zm.clone();
        m["annotations"][key] = serde_json::json!(value);
        put_manifest(
            &reg,
            "nubo/small",
            tag,
            &serde_json::to_vec(&m).map_err(|e| e.to_string())?,
        )?;
        nubo_in(
            &fresh,
            &["image", "pull", &format!("{host}/nubo/small:{tag}"), "--ca-cert", &ca],
            None,
            QUICK,
        )?
        .refused(&[why, "nothing was stored"])?;
        expect_empty_store(&fresh)?;
    }

    // Logout forgets the credentials.
    nubo_in(&fresh, &["registry", "logout", &host], None, QUICK)?.require()?;
    nubo_in(&fresh, &["image", "pull", &pinned_ref, "--ca-cert", &ca], None, QUICK)?.refused(&["HTTP 401"])?;
    println!("registry pid {} stopped at the end of the test", reg.pid());
    Ok(())
}

/// PUTs a hand-made manifest with nubo's client (as a hostile publisher would).
fn put_manifest(reg: &Registry, repo: &str, tag: &str, bytes: &[u8]) -> TestResult {
    client(reg)?
        .put_manifest(repo, tag, bytes)
        .map(drop)
        .map_err(|e| format!("{e:#?}"))
}

/// nubo's own client with the registry's CA and the test credentials.
fn client(reg: &Registry) -> Result<nubo_image::oci::Client, String> {
    let settings = nubo_image::oci::ClientSettings {
        tls: nubo_image::TlsSettings {
            ca_bundle: None,
            extra_ca: vec![reg.ca.clone()],
        },
        insecure: false,
        credentials: Some(nubo_image::oci::Credentials {
            username: USER.into(),
            password: PASSWORD.into(),
        }),
        retries: 0,
        limits: Default::default(),
        cancel: None,
    };
    nubo_image::oci::Client::new(&reg.host, &settings).map_err(|e| e.to_string())
}

fn flip_byte(path: &Path, at: u64) -> Result<u8, String> {
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut b = [0u8];
    f.seek(SeekFrom::Start(at))
        .and_then(|_| f.read_exact(&mut b))
        .map_err(|e| e.to_string())?;
    f.seek(SeekFrom::Start(at))
        .and_then(|_| f.write_all(&[b[0] ^ 0xff]))
        .map_err(|e| e.to_string())?;
    Ok(b[0])
}

fn restore_byte(path: &Path, at: u64, b: u8) -> TestResult {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    f.seek(SeekFrom::Start(at))
        .and_then(|_| f.write_all(&[b]))
        .map_err(|e| e.to_string())
}

fn expect_empty_store(root: &TestRoot) -> TestResult {
    let images = root.root().join("images");
    let blobs = files_in(&images.join("blobs"));
    let boot = files_in(&images.join("boot"));
    let refs = files_in(&images.join("refs"));
    let parts: Vec<_> = files_in(&images.join("tmp"))
        .into_iter()
        .filter(|f| f.ends_with(".part"))
        .collect();
    if blobs.is_empty() && boot.is_empty() && refs.is_empty() && parts.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "a refused pull left files: blobs {blobs:?} boot {boot:?} refs {refs:?} partials {parts:?}"
        ))
    }
}

/// The bearer-token flow against a registry configured with `auth: token:` (the harness's
/// token service signs the JWTs), and a push whose upload is cut mid-chunk by a proxy in front
/// of the registry: retried, and the registry ends up with the right blob.
fn bearer_token_and_push_retry() -> TestResult {
    let reg = Registry::start_with_token()?;
    let tokens = reg.token.as_ref().ok_or("the registry has no token service")?;
    let host = reg.host.clone();
    let ca = reg.ca.display().to_string();
    let src = TestRoot::new()?;
    let img = src.with_debian_image()?;

    // Without credentials (the registry's Bearer challenge, the token service's 401), and with
    // a wrong password: both refusals come from the token service.
    refused_before_login(
        &src,
        &reg,
        &["image", "ls-remote", &format!("{host}/nubo/debian"), "--ca-cert", &ca],
    )?;
    if tokens.refused.load(std::sync::atomic::Ordering::SeqCst) < 2 {
        return Err("the refused requests never reached the token service".into());
    }

    // Push through a proxy that cuts the upload once, 100 MiB in (inside the second 64 MiB
    // chunk of the disk).
    let proxy = CuttingProxy::start(&host, 100 << 20, Cut::MidRequest)?;
    login_at(&src, &reg, &proxy.host)?;
    let target = format!("{}/nubo/debian:12", proxy.host);
    let t = Instant::now();
    let out = nubo_in(
        &src,
        &["image", "push", "debian:12", &target, "--ca-cert", &ca],
        None,
        TRANSFER,
    )?
    .require()?;
    println!(
        "timing push with one cut and a retry: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    if !proxy.did_cut() || !out.stderr.contains("retrying") {
        return Err(format!(
            "the proxy did not cut the push, or the push did not retry:\n{}",
            out.stderr
        ));
    }
    println!(
        "retry: {}",
        out.stderr.lines().find(|l| l.contains("retrying")).unwrap_or_default()
    );
    let digest = out.stdout.trim().rsplit('@').next().unwrap_or_default().to_owned();

    // Cut between two chunks instead (the registry saw none of the next PATCH): the upload's
    // status says how far it got and the push goes on from there, not from 0.
    let between = CuttingProxy::start(&host, 100 << 20, Cut::BetweenRequests)?;
    login_at(&src, &reg, &between.host)?;
    let out = nubo_in(
        &src,
        &[
            "image",
            "push",
            "debian:12",
            &format!("{}/nubo/resumed:12", between.host),
            "--ca-cert",
            &ca,
        ],
        None,
        TRANSFER,
    )?
    .require()?;
    let resumed = out.stderr.lines().find(|l| l.contains("retrying")).unwrap_or_default();
    println!("resume: {resumed}");
    if !between.did_cut() || !resumed.contains("the registry kept") || resumed.contains("from byte 0 ") {
        return Err(format!(
            "a cut between chunks did not resume from the registry's offset:\n{}",
            out.stderr
        ));
    }
    if !out.stdout.trim().ends_with(&digest) {
        return Err(format!("the resumed push gave {}, not {digest}", out.stdout.trim()));
    }

    // Straight to the registry with tokens: ls-remote, then a pull by digest into a fresh root
    // (every blob verified: the retried upload is whole).
    login(&src, &reg)?;
    let tags = json(
        &nubo_in(
            &src,
            &[
                "image",
                "ls-remote",
                &format!("{host}/nubo/debian"),
                "-o",
                "json",
                "--ca-cert",
                &ca,
            ],
            None,
            QUICK,
        )?
        .require()?
        .stdout,
        "ls-remote -o json",
    )?;
    if text_at(&tags, "/0/digest") != digest || text_at(&tags, "/0/kind") != "nubo-vm" {
        return Err(format!("ls-remote does not list the pushed {digest}: {tags}"));
    }
    let dst = TestRoot::new()?;
    login(&dst, &reg)?;
    let out = nubo_in(
        &dst,
        &[
            "image",
            "pull",
            &format!("{host}/nubo/debian@{digest}"),
            "--ca-cert",
            &ca,
            "--name",
            "tok:1",
        ],
        None,
        TRANSFER,
    )?
    .require()?;
    if !out.stdout.starts_with(&format!("tok:1 {}", img.digest)) {
        return Err(format!("pull with a token printed `{}`", out.stdout));
    }
    println!(
        "token service: {} tokens issued, {} requests refused",
        tokens.issued.load(std::sync::atomic::Ordering::SeqCst),
        tokens.refused.load(std::sync::atomic::Ordering::SeqCst)
    );
    Ok(())
}

fn pulled_image_boots() -> TestResult {
    let reg = Registry::start()?;
    let ca = reg.ca.display().to_string();
    let src = TestRoot::new()?;
    src.with_debian_image()?;
    login(&src, &reg)?;
    let target = format!("{}/nubo/debian:12", reg.host);
    // Compressed: the VM below boots the disk decompressed from the zstd layer.
    let pushed = nubo_in(
        &src,
        &["image", "push", "debian:12", &target, "--compress", "--ca-cert", &ca],
        None,
        TRANSFER,
    )?
    .require()?;
    if !pushed.stderr.contains("compressed to") {
        return Err(format!("push --compress did not compress:\n{}", pushed.stderr));
    }

    // A fresh root with nothing but credentials: vm create pulls the image like a catalog ref.
    let dst = TestRoot::new()?;
    login(&dst, &reg)?;
    let name = "oci-boot";
    let mut cmd = dst.cmd()?;
    // --ca-cert, as on image pull (no SSL_CERT_FILE).
    cmd.env_remove("SSL_CERT_FILE").args([
        "vm",
        "create",
        name,
        "--image",
        &target,
        "--ca-cert",
        &ca,
        "--restrict-network",
        "--wait",
        "--boot-timeout",
        "600s",
    ]);
    let t = Instant::now();
    let out = run_in(&mut cmd, None, BOOT);
    let cleanup = nubo_in(&dst, &["vm", "rm", "--force", name], None, QUICK);
    let out = out?.require()?;
    println!(
        "timing vm create from the registry to cloud-init finished: {:.1}s",
        t.elapsed().as_secs_f64()
    );
    if !out.stderr.contains("cloud-init finished") || !out.stderr.contains("pulled") {
        return Err(format!(
            "vm create did not pull and reach cloud-init finished:\n{}",
            out.stderr
        ));
    }
    cleanup?.require()?;
    Ok(())
}
