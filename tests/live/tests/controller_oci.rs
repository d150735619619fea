//! VMImages with Oci sources (issue 23) against real parts: a genuine kube-apiserver + etcd, a
//! registry (Debian's docker-registry with TLS from a test CA and htpasswd auth) holding an image
//! `nubo image push` put there, and a libvirtd over `qemu+tls://` in a network namespace.
//!
//! - a digest-pinned ref with a `kubernetes.io/dockerconfigjson` pullSecretRef and the disk's
//!   sha256 as checksum: Ready, its digest the pushed disk's; the controller trusts the
//!   registry's CA through `NUBO_CA_CERT`;
//! - a ref without a pullSecretRef: not Ready, the registry's 401 in the message;
//! - a tag without `allowMutableTag`: Failed (MutableTag); a wrong checksum: Failed
//!   (ChecksumMismatch), and a VM naming that image is refused with no domain made;
//! - a VM (`running: false`) from the Ready image: Provisioned, its domain's disk based on the
//!   image's base volume in the pool; deleting it removes domain, seed and disk volumes;
//! - the registry password is in no VMImage status, Event or controller log line.
//!
//! No guest boots: the image is a blank 64 MiB qcow2; a defined domain proves the path.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nubo_live::cli::{json, nubo};
use nubo_live::controller::{
    crds_namespace_credentials, domains, libvirtd_with_pool, start_replica_with, tail, wait_ready,
};
use nubo_live::kube::ApiServer;
use nubo_live::libvirtd::Libvirtd;
use nubo_live::registry::{Registry, PASSWORD, USER};
use nubo_live::{LiveTest, TestResult, TestRoot};
use serde_json::Value;

const QUICK: Duration = Duration::from_secs(120);
const POOL: &str = "ocipool";
const NET: &str = "10.250.76";

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "controller_oci_vmimages",
        &["qemu-img", "libvirt-tls", "kube-apiserver", "docker-registry"],
        || nubo_live::timed("controller_oci", controller_oci),
    )])
}

/// Waits until `kubectl get KIND NAME -o json` satisfies `ok`; the last object on timeout.
fn wait_for(
    api: &ApiServer,
    ns: &str,
    kind: &str,
    name: &str,
    what: &str,
    ok: impl Fn(&Value) -> bool,
) -> Result<Value, String> {
    let deadline = Instant::now() + QUICK;
    loop {
        let out = api.kubectl(&["-n", ns, "get", kind, name, "-o", "json"])?;
        let v = json(&out.stdout, "kubectl get").unwrap_or_default();
        if ok(&v) {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{kind} {ns}/{name}: not {what} after {QUICK:?}: {}",
                v["status"]
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Condition `t` of `v`'s status.
fn cond(v: &Value, t: &str) -> Value {
    v.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| cs.iter().find(|c| c["type"] == t))
        .cloned()
        .unwrap_or_default()
}

fn volumes(lv: &Libvirtd) -> Result<Vec<String>, String> {
    nubo_live::controller::volumes(lv, POOL)
}

fn controller_oci() -> TestResult {
    let api = ApiServer::start()?;
    let reg = Registry::start()?;
    let (lv, uri, tls_dir) = libvirtd_with_pool(NET, POOL)?;

    // A blank disk, imported and pushed: the pinned reference and the disk's sha256.
    let root = TestRoot::new()?;
    let disk = root.root().join("tiny.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&disk)
        .arg("64M")
        .status()
        .map_err(|e| format!("qemu-img: {e}"))?;
    if !made.success() {
        return Err(format!("qemu-img create: {made}"));
    }
    let disk_s = disk.display().to_string();
    nubo(&root, &["image", "import", "--tag", "tiny:1", &disk_s], QUICK)?.require()?;
    let record = json(
        &nubo(&root, &["image", "inspect", "tiny:1"], QUICK)?.require()?.stdout,
        "image inspect",
    )?;
    let digest = record["digest"].as_str().ok_or("inspect printed no digest")?.to_owned();
    let ca = reg.ca.display().to_string();
    reg.login(&root)?;
    let tagged = format!("{}/vm/tiny:1", reg.host);
    let pinned = nubo(&root, &["image", "push", "tiny:1", &tagged, "--ca-cert", &ca], QUICK)?
        .require()?
        .stdout
        .trim()
        .to_owned();
    if !pinned.contains("@sha256:") {
        return Err(format!("push printed `{pinned}`, not a pinned reference"));
    }
    // The same disk in a repository nothing else pulls, for the VMImage without credentials (a
    // host's store keeps what one VMImage pulled for every VMImage of the namespace naming it).
    let other = format!("{}/vm/other:1", reg.host);
    let pinned_other = nubo(&root, &["image", "push", "tiny:1", &other, "--ca-cert", &ca], QUICK)?
        .require()?
        .stdout
        .trim()
        .to_owned();

    let ns = format!("nubo-oci-{}", std::process::id());
    let state = tempfile::tempdir_in("/var/tmp").map_err(|e| format!("temp dir: {e}"))?;
    let refs = Refs {
        pinned,
        pinned_other,
        tagged,
        digest,
    };
    let r = cases(&api, &lv, &reg, &uri, &tls_dir, &refs, &ns, state.path());
    if r.is_err() {
        eprintln!("--- controller log:\n{}", tail(&api.dir().join("controller-oci.log")));
        let out = std::process::Command::new("find").arg(state.path()).output();
        if let Ok(o) = out {
            eprintln!("--- the controller's state:\n{}", String::from_utf8_lossy(&o.stdout));
        }
    }
    r
}

/// What was pushed: the disk by digest (twice, in two repositories), by tag, and its sha256.
struct Refs {
    pinned: String,
    pinned_other: String,
    tagged: String,
    digest: String,
}

#[allow(clippy::too_many_arguments)]
fn cases(
    api: &ApiServer,
    lv: &Libvirtd,
    reg: &Registry,
    uri: &str,
    tls: &Path,
    refs: &Refs,
    ns: &str,
    state: &Path,
) -> TestResult {
    let (pinned, tagged, digest) = (refs.pinned.as_str(), refs.tagged.as_str(), refs.digest.as_str());
    crds_namespace_credentials(api, ns, tls)?;
    api.kubectl(&[
        "-n",
        ns,
        "create",
        "secret",
        "docker-registry",
        "regcred",
        &format!("--docker-server={}", reg.host),
        &format!("--docker-username={USER}"),
        &format!("--docker-password={PASSWORD}"),
    ])?
    .require()?;
    let wrong = format!("sha256:{}", "0".repeat(64));
    let image = |name: &str, r: &str, extra: &str| {
        format!(
            r#"
---
apiVersion: nubo.dev/v1alpha1
kind: VMImage
metadata: {{name: {name}, namespace: {ns}}}
spec:
  sources:
    - {{providerClass: libvirt, kind: Oci, ref: "{r}"{extra}}}
"#
        )
    };
    let mut yaml = format!(
        r#"
apiVersion: nubo.dev/v1alpha1
kind: Provider
metadata: {{name: lab, namespace: {ns}}}
spec:
  class: libvirt
  credentialsSecretRef: {{name: lab-tls}}
  hosts:
    - {{name: hv1, uri: "{uri}", pool: {POOL}}}
---
apiVersion: nubo.dev/v1alpha1
kind: VMClass
metadata: {{name: {ns}-small}}
spec: {{vcpus: 1, memory: 256Mi, sizeGiB: 1}}
"#
    );
    yaml += &image("tiny", pinned, &format!(r#", checksum: "{digest}""#));
    yaml.push_str("  pullSecretRef: {name: regcred}\n");
    yaml += &image("nologin", &refs.pinned_other, "");
    yaml += &image("bytag", tagged, "");
    yaml += &image("badsum", pinned, &format!(r#", checksum: "{wrong}""#));
    yaml.push_str("  pullSecretRef: {name: regcred}\n");
    api.apply(&yaml)?;

    let ca = reg.ca.display().to_string();
    let mut c = start_replica_with(api, state, ns, "oci", &[("NUBO_CA_CERT", &ca)])?;
    wait_ready(&mut c, QUICK)?;

    let t = Instant::now();
    let tiny = wait_for(api, ns, "vmimage", "tiny", "Ready", |v| v["status"]["phase"] == "Ready")?;
    println!("timing oci import: {:.1}s", t.elapsed().as_secs_f64());
    if tiny["status"]["digest"] != digest {
        return Err(format!(
            "tiny: digest {} is not the pushed disk's {digest}",
            tiny["status"]["digest"]
        ));
    }
    let nologin = wait_for(api, ns, "vmimage", "nologin", "refused by the registry", |v| {
        cond(v, "Ready")["message"].as_str().is_some_and(|m| m.contains("401"))
    })?;
    if nologin["status"]["phase"] == "Ready" {
        return Err(format!("nologin: Ready without credentials: {}", nologin["status"]));
    }
    let bytag = wait_for(api, ns, "vmimage", "bytag", "Failed", |v| {
        v["status"]["phase"] == "Failed"
    })?;
    if cond(&bytag, "Ready")["reason"] != "MutableTag" {
        return Err(format!("bytag: want reason MutableTag: {}", bytag["status"]));
    }
    let badsum = wait_for(api, ns, "vmimage", "badsum", "Failed", |v| {
        v["status"]["phase"] == "Failed"
    })?;
    let m = cond(&badsum, "Ready");
    if m["reason"] != "ChecksumMismatch" || !m["message"].as_str().is_some_and(|s| s.contains(digest)) {
        return Err(format!("badsum: want ChecksumMismatch naming {digest}: {m}"));
    }

    let vm = |name: &str, image: &str| {
        format!(
            r#"
apiVersion: nubo.dev/v1alpha1
kind: VirtualMachine
metadata: {{name: {name}, namespace: {ns}}}
spec:
  classRef: {{name: {ns}-small}}
  imageRef: {{name: {image}}}
  running: false
"#
        )
    };
    // A VM of the failed image: refused, nothing made.
    api.apply(&vm("vbad", "badsum"))?;
    let vbad = wait_for(api, ns, "virtualmachine", "vbad", "refused", |v| {
        cond(v, "Provisioned")["reason"] == "ImageFailed"
    })?;
    if !domains(lv)?.is_empty() {
        return Err(format!("vbad ({}) left a domain: {:?}", vbad["status"], domains(lv)?));
    }

    // A VM of the Ready image: defined, its disk on the image's base volume.
    api.apply(&vm("vtiny", "tiny"))?;
    let v = wait_for(api, ns, "virtualmachine", "vtiny", "Provisioned", |v| {
        cond(v, "Provisioned")["status"] == "True"
    })?;
    let uuid = v["status"]["uuid"].as_str().ok_or("vtiny has no status.uuid")?;
    let dom = lv.virsh(&["domname", uuid])?.require()?.stdout.trim().to_owned();
    let vols = volumes(lv)?;
    let base: Vec<&String> = vols.iter().filter(|v| v.starts_with("nubo-base-")).collect();
    let [base] = base[..] else {
        return Err(format!("want one base volume in {POOL}: {vols:?}"));
    };
    let disk_xml = lv
        .virsh(&["vol-dumpxml", "--pool", POOL, &format!("{dom}.qcow2")])?
        .require()?
        .stdout;
    if !disk_xml.contains(base.as_str()) {
        return Err(format!("{dom}.qcow2 is not based on {base}:\n{disk_xml}"));
    }

    api.kubectl(&["-n", ns, "delete", "virtualmachine", "vtiny", "vbad", "--timeout=120s"])?
        .require()?;
    let left: Vec<String> = volumes(lv)?.into_iter().filter(|v| v.starts_with(&dom)).collect();
    if !left.is_empty() || domains(lv)?.contains(&dom) {
        return Err(format!("deleting vtiny left {dom} or its volumes: {left:?}"));
    }
    // The registry password (in the pullSecretRef) is nowhere the controller writes.
    let images = api.kubectl(&["-n", ns, "get", "vmimage", "-o", "yaml"])?.require()?;
    let events = api.kubectl(&["-n", ns, "get", "events", "-o", "yaml"])?.require()?;
    for (what, text) in [
        ("VMImage status", images.stdout),
        ("events", events.stdout),
        ("log", std::fs::read_to_string(&c.log).unwrap_or_default()),
    ] {
        if text.contains(PASSWORD) {
            return Err(format!("the registry password is in the controller's {what}"));
        }
    }
    drop(c);
    Ok(())
}
