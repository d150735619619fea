//! The Kubernetes controller (issue 23) against real parts: a genuine kube-apiserver + etcd
//! (the shared run-apiserver.sh, one start for every case), kubectl, and a libvirtd reached over
//! `qemu+tls://` in a network namespace with certificates the test makes (the remote-libvirt
//! harness). The image is served by an HTTP server on 127.0.0.1 and verified by checksum.
//!
//! - the CRDs from deploy/crds.yaml are Established; `kubectl explain` shows field
//!   descriptions; `kubectl get vm` lists with the PHASE HOST IP AGE columns;
//! - a `firmware: efi`, `machine: q35` class gives a UEFI q35 domain (defined, not booted);
//! - refusals, each a condition with its reason and no domain made: a missing VMClass, a missing
//!   user-data Secret, an unknown placeholder, an unreachable host, a class smaller than the image;
//! - `running: false`: Provisioned (domain defined, seed and OS disk volumes in the pool),
//!   Stopped, `status.uuid` = the domain's UUID, the host recorded; the seed carries the
//!   rendered user-data (`${vm.uuid}` = the UUID);
//! - the VMImage is Ready for the host; one with a wrong checksum (its URL ending in the same
//!   file name) is Failed, and it and a VM using it (ImageChecksumMismatch) leave nothing in the
//!   pool and no partial file;
//! - the Providers' status: the reachable host's free memory and CPUs, the unreachable one's
//!   reason;
//! - the Secret changed: SeedCurrent=False promptly (the controller watches the namespace's
//!   Secrets; every replica's resync is an hour, so only the watch can explain it), the seed
//!   volume unchanged;
//! - the controller killed at three points of a create (the test hook
//!   `NUBO_CONTROLLER_TEST_PAUSE`: the domain defined without disk or seed; the disk without
//!   the seed; the seed before the VM is recorded created), restarted: one domain each, with
//!   exactly its disk and seed volumes;
//! - `running: true` starts that domain; kube-apiserver killed and started again under it
//!   (same etcd, port and certificates): the controller stays up (the outage is shorter than
//!   its 15 s lease), its watches resume, `running: false` stops it, no domain is duplicated;
//! - two replicas: one leads (readyz), the other takes over when the first is killed;
//! - delete: the finalizer removes domain, seed and disk volumes, leaves the base volume;
//! - libvirtd restarted under the running VM: the controller deletes through the new one;
//! - a VMImage's deletion is held (InUse naming its VMs) until its last VM is deleted;
//! - no Secret byte in the controller's log, Events or status.
//!
//! - the efi VM, started after the last takeover, and a bios VM applied with `running: true`
//!   beside it each reach CloudInitDone=True through the controller's console recorder
//!   (cloud-init's closing line as evidence); each DHCP lease bears the spec's hostname and the
//!   instance-id each guest prints on its console is its `status.uuid`.
//!
//! Two guests boot to cloud-init done, at the same time (UEFI and BIOS), one is started and
//! stopped without waiting; every other check needs only a defined domain.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nubo_live::controller::{
    crds_namespace_credentials, domains, http_get, libvirtd_with_pool, serve, start_replica_with, tail, wait_ready,
};
use nubo_live::kube::ApiServer;
use nubo_live::libvirtd::Libvirtd;
use nubo_live::{LiveTest, TestResult, TestRoot};
use serde_json::Value;

/// A marker inside the user-data Secret: it must never leave the seed.
const MARKER: &str = "nubo-secret-marker-5f1e";
/// The first create fetches the image and uploads the base (~400 MiB through TLS).
const FIRST: Duration = Duration::from_secs(600);
const QUICK: Duration = Duration::from_secs(120);
const POOL: &str = "k8spool";
/// What the booted guest prints before its instance-id on the console (its user-data's runcmd).
const IID: &str = "nubo-k8s-instance-id";
/// One TCG boot over TLS through UEFI, to cloud-init done.
const BOOT: Duration = Duration::from_secs(600);
/// Every replica's resync: an hour, so a prompt update can only come from a watch.
const RESYNC: (&str, &str) = ("NUBO_CONTROLLER_RESYNC", "3600");

/// Waits until the controller's log `log` holds `line`.
fn wait_log(log: &Path, line: &str, timeout: Duration) -> TestResult {
    let deadline = Instant::now() + timeout;
    loop {
        if std::fs::read_to_string(log).unwrap_or_default().contains(line) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("`{line}` not in {} within {timeout:?}", log.display()));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// VM `name` is Provisioned with exactly one domain of its name and exactly its OS disk and
/// seed volumes; its domain's name.
fn one_domain(api: &ApiServer, lv: &Libvirtd, ns: &str, name: &str) -> Result<String, String> {
    let v = wait_cond(api, ns, name, "Provisioned", "True", None, QUICK)?;
    let dom = domain_of(lv, v["status"]["uuid"].as_str().unwrap_or_default())?;
    let all = domains(lv)?;
    let mine: Vec<&String> = all.iter().filter(|d| d.starts_with(&format!("{name}-"))).collect();
    if mine != [&dom] {
        return Err(format!("want exactly {name}'s domain {dom}: {all:?}"));
    }
    let vols: Vec<String> = volumes(lv)?.into_iter().filter(|v| v.starts_with(&dom)).collect();
    let want = [format!("{dom}-cidata.iso"), format!("{dom}.qcow2")];
    if vols != want {
        return Err(format!("{name}'s volumes: want {want:?}, have {vols:?}"));
    }
    Ok(dom)
}

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "controller_virtualmachines_on_remote_libvirt",
        &["qemu", "bootstrap", "libvirt-tls", "kube-apiserver"],
        || nubo_live::timed("controller", controller),
    )])
}

fn get_vm(api: &ApiServer, ns: &str, name: &str) -> Result<Value, String> {
    let out = api
        .kubectl(&["-n", ns, "get", "virtualmachine", name, "-o", "json"])?
        .require()?;
    nubo_live::cli::json(&out.stdout, "kubectl get vm")
}

fn condition(vm: &Value, t: &str) -> Option<Value> {
    vm.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
        .cloned()
}

/// Waits until condition `t` of VM `name` has `status` (and `reason`, when given).
fn wait_cond(
    api: &ApiServer,
    ns: &str,
    name: &str,
    t: &str,
    status: &str,
    reason: Option<&str>,
    timeout: Duration,
) -> Result<Value, String> {
    let deadline = Instant::now() + timeout;
    let mut last = Value::Null;
    loop {
        if let Ok(vm) = get_vm(api, ns, name) {
            if let Some(c) = condition(&vm, t) {
                if c["status"] == status && reason.is_none_or(|r| c["reason"] == r) {
                    return Ok(vm);
                }
            }
            last = vm;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "vm {ns}/{name}: condition {t}={status} ({reason:?}) not reached in {timeout:?}; status: {}",
                last.get("status").cloned().unwrap_or_default()
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Waits until `kubectl get KIND NAME -o json` has `want` at `ptr`.
fn wait_json(
    api: &ApiServer,
    ns: &str,
    kind: &str,
    name: &str,
    ptr: &str,
    want: &str,
    timeout: Duration,
) -> Result<Value, String> {
    let deadline = Instant::now() + timeout;
    loop {
        let out = api.kubectl(&["-n", ns, "get", kind, name, "-o", "json"])?;
        let v = nubo_live::cli::json(&out.stdout, "kubectl get").unwrap_or_default();
        if v.pointer(ptr).and_then(Value::as_str) == Some(want) {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "{kind} {ns}/{name}: {ptr} is not {want} after {timeout:?}: {}",
                v["status"]
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every file under `dir`, as paths.
fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        } else {
            out.push(p.display().to_string());
        }
    }
    out
}

fn volumes(lv: &Libvirtd) -> Result<Vec<String>, String> {
    nubo_live::controller::volumes(lv, POOL)
}

/// The domain whose UUID is `uuid`.
fn domain_of(lv: &Libvirtd, uuid: &str) -> Result<String, String> {
    Ok(lv.virsh(&["domname", uuid])?.require()?.stdout.trim().to_owned())
}

fn vol_bytes(lv: &Libvirtd, vol: &str) -> Result<Vec<u8>, String> {
    let out = lv.virsh(&["vol-path", "--pool", POOL, vol])?.require()?;
    std::fs::read(out.stdout.trim()).map_err(|e| format!("reading volume {vol}: {e}"))
}

fn contains(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn controller() -> TestResult {
    let t = Instant::now();
    let api = ApiServer::start()?;
    println!("timing apiserver start: {:.1}s", t.elapsed().as_secs_f64());
    let (mut lv, uri, tls_dir) = libvirtd_with_pool("10.250.78", POOL)?;
    let root = TestRoot::new()?;
    let image = root.with_debian_image()?;
    let url = serve(image.qcow2.clone())?;
    let ns = format!("nubo-test-{}", std::process::id());
    let state = tempfile::tempdir_in("/var/tmp").map_err(|e| format!("temp dir: {e}"))?;
    let r = cases(&api, &mut lv, &uri, &tls_dir, &url, &image.digest, &ns, state.path());
    if r.is_err() {
        for f in std::fs::read_dir(api.dir()).into_iter().flatten().flatten() {
            if f.file_name().to_string_lossy().starts_with("controller-") {
                eprintln!("--- {}:\n{}", f.path().display(), tail(&f.path()));
            }
        }
    }
    // Every domain the controller made is removed with the libvirtd (its drop).
    r
}

#[allow(clippy::too_many_arguments)]
fn cases(
    api: &ApiServer,
    lv: &mut Libvirtd,
    uri: &str,
    tls: &Path,
    url: &str,
    digest: &str,
    ns: &str,
    state: &Path,
) -> TestResult {
    // 1. The CRDs as deploy/ ships them.
    crds_namespace_credentials(api, ns, tls)?;
    let explain = api.kubectl(&["explain", "virtualmachine.spec.classRef"])?.require()?;
    if !explain.stdout.contains("VMClass") {
        return Err(format!("kubectl explain shows no description:\n{}", explain.stdout));
    }
    let listed = api.kubectl(&["-n", ns, "get", "vm"])?.require()?;
    if !(listed.stdout.is_empty() && listed.stderr.contains("No resources found")) {
        return Err(format!(
            "kubectl get vm on an empty namespace: {} {}",
            listed.stdout, listed.stderr
        ));
    }

    // 2. A Provider (its credentials are in `lab-tls`), classes, the image, a user-data Secret.
    let closed = uri.replace("10.250.78.1/", "10.250.78.1:16599/");
    api.apply(&format!(
        r#"
apiVersion: nubo.dev/v1alpha1
kind: Provider
metadata: {{name: lab, namespace: {ns}}}
spec:
  class: libvirt
  credentialsSecretRef: {{name: lab-tls}}
  hosts:
    - {{name: hv1, uri: "{uri}", pool: {POOL}, network: default}}
---
apiVersion: nubo.dev/v1alpha1
kind: Provider
metadata: {{name: down, namespace: {ns}}}
spec:
  class: libvirt
  credentialsSecretRef: {{name: lab-tls}}
  hosts:
    - {{name: hv9, uri: "{closed}", pool: {POOL}}}
---
apiVersion: nubo.dev/v1alpha1
kind: VMClass
metadata: {{name: {ns}-small}}
spec: {{vcpus: 1, memory: 512Mi, sizeGiB: 4}}
---
apiVersion: nubo.dev/v1alpha1
kind: VMClass
metadata: {{name: {ns}-efi}}
spec: {{vcpus: 1, memory: 512Mi, sizeGiB: 4, firmware: efi, machine: q35}}
---
apiVersion: nubo.dev/v1alpha1
kind: VMClass
metadata: {{name: {ns}-tiny}}
spec: {{vcpus: 1, memory: 512Mi, sizeGiB: 1}}
---
apiVersion: nubo.dev/v1alpha1
kind: VMImage
metadata: {{name: debian-12, namespace: {ns}}}
spec:
  sources:
    - {{providerClass: libvirt, kind: Url, ref: "{url}", checksum: "{digest}"}}
---
apiVersion: v1
kind: Secret
metadata: {{name: ud, namespace: {ns}}}
stringData:
  user-data: |
    #cloud-config
    write_files:
      - path: /etc/nubo-k8s
        content: "vm ${{vm.name}} in ${{vm.namespace}} as ${{vm.hostname}} id ${{vm.uuid}} {MARKER}\n"
  bad: |
    #cloud-config
    # ${{vm.password}}
---
apiVersion: v1
kind: Secret
metadata: {{name: boot, namespace: {ns}}}
stringData:
  user-data: |
    #cloud-config
    runcmd:
      - [sh, -c, 'echo "{IID} $(cat /var/lib/cloud/data/instance-id)" > /dev/console']
"#
    ))?;

    let pause_vk = format!("defined:{ns}/vk");
    let mut a = start_replica_with(
        api,
        state,
        ns,
        "a",
        &[RESYNC, ("NUBO_CONTROLLER_TEST_PAUSE", &pause_vk)],
    )?;
    wait_ready(&mut a, QUICK)?;
    let vm = |name: &str, class: &str, provider: &str, running: bool, key: &str| {
        format!(
            r#"
apiVersion: nubo.dev/v1alpha1
kind: VirtualMachine
metadata: {{name: {name}, namespace: {ns}}}
spec:
  classRef: {{name: {class}}}
  imageRef: {{name: debian-12}}
  providerRef: {{name: {provider}}}
  running: {running}
  hostname: {name}-host
  userData: {{secretRef: {{name: ud, key: {key}}}}}
"#
        )
    };
    let small = format!("{ns}-small");
    let tiny = format!("{ns}-tiny");

    // 3. The first VM, stopped: the image is fetched, the base uploaded, the domain defined.
    let t = Instant::now();
    api.apply(&vm("va", &small, "lab", false, "user-data"))?;
    let st = wait_cond(api, ns, "va", "Provisioned", "True", None, FIRST)?;
    println!(
        "timing first VM provisioned (fetch + base upload): {:.1}s",
        t.elapsed().as_secs_f64()
    );
    if st["status"]["phase"] != "Stopped" || st["status"]["host"] != "hv1" {
        return Err(format!("va: want phase Stopped on hv1: {}", st["status"]));
    }
    let uuid = st["status"]["uuid"].as_str().ok_or("va has no status.uuid")?.to_owned();
    let dom = domain_of(lv, &uuid)?;
    let state_out = lv.virsh(&["domstate", &dom])?.require()?;
    if !state_out.stdout.contains("shut off") {
        return Err(format!(
            "running: false, yet domain {dom} is {}",
            state_out.stdout.trim()
        ));
    }
    let vols = volumes(lv)?;
    let seed_vol = format!("{dom}-cidata.iso");
    for want in [seed_vol.clone(), format!("{dom}.qcow2")] {
        if !vols.contains(&want) {
            return Err(format!("pool {POOL} lacks {want}: {vols:?}"));
        }
    }
    if vols.iter().filter(|v| v.starts_with("nubo-base-")).count() != 1 {
        return Err(format!("want one base volume: {vols:?}"));
    }
    let seed = vol_bytes(lv, &seed_vol)?;
    let rendered = format!("vm va in {ns} as va-host id {uuid} {MARKER}");
    if !contains(&seed, &rendered) {
        return Err(format!("the seed lacks the rendered user-data `{rendered}`"));
    }
    let columns = api.kubectl(&["-n", ns, "get", "vm", "va"])?.require()?;
    let header = columns.stdout.lines().next().unwrap_or_default().to_owned();
    for c in ["NAME", "PHASE", "HOST", "IP", "AGE"] {
        if !header.contains(c) {
            return Err(format!("kubectl get vm has no {c} column: {header}"));
        }
    }
    if !columns.stdout.contains("Stopped") || !columns.stdout.contains("hv1") {
        return Err(format!("kubectl get vm: {}", columns.stdout));
    }

    // An efi class: the domain boots through UEFI firmware (defined here, booted in step 9).
    api.apply(&vm("ve", &format!("{ns}-efi"), "lab", false, "user-data").replace("name: ud,", "name: boot,"))?;
    let ve = wait_cond(api, ns, "ve", "Provisioned", "True", None, QUICK)?;
    let ve_dom = domain_of(lv, ve["status"]["uuid"].as_str().unwrap_or_default())?;
    let xml = lv.virsh(&["dumpxml", &ve_dom])?.require()?.stdout;
    if !xml.contains("<loader") || !xml.contains("q35") {
        return Err(format!("firmware: efi, machine: q35 not in {ve_dom}'s XML:\n{xml}"));
    }

    // 4. Refusals: a condition each, no domain made.
    let before = domains(lv)?;
    api.apply(&vm("nc", "no-such-class", "lab", false, "user-data"))?;
    api.apply(&vm("ns", &small, "lab", false, "user-data").replace("name: ud,", "name: no-such-secret,"))?;
    api.apply(&vm("np", &small, "lab", false, "bad"))?;
    api.apply(&vm("nu", &small, "down", false, "user-data"))?;
    api.apply(&vm("nt", &tiny, "lab", false, "user-data"))?;
    for (name, reason) in [
        ("nc", "ClassNotFound"),
        ("ns", "SecretNotFound"),
        ("np", "UserDataInvalid"),
        ("nu", "HostUnreachable"),
        ("nt", "ClassTooSmall"),
    ] {
        let v = wait_cond(api, ns, name, "Provisioned", "False", Some(reason), QUICK)?;
        println!(
            "{name}: {reason}: {}",
            condition(&v, "Provisioned").unwrap_or_default()["message"]
        );
    }
    // The image: Ready for the host; a wrong checksum is Failed, and neither it nor a VM using
    // it leaves anything in the pool or a partial file in the controller's state.
    let img = wait_json(api, ns, "vmimage", "debian-12", "/status/phase", "Ready", QUICK)?;
    let hv1 = img
        .pointer("/status/perProvider")
        .and_then(Value::as_array)
        .and_then(|p| {
            p.iter()
                .find(|x| x["providerName"] == "lab")
                .and_then(|x| x["hosts"].as_array())
                .cloned()
        });
    if !hv1.is_some_and(|h| h.iter().any(|x| x["name"] == "hv1" && x["ready"] == true)) {
        return Err(format!("vmimage debian-12 is not ready on lab/hv1: {}", img["status"]));
    }
    let vols_before = volumes(lv)?;
    let wrong = format!("sha256:{}", "0".repeat(64));
    // The same file name under another path: the controller names a URL image after its
    // checksum, so this one neither takes debian-12's store name (which would refuse it as a
    // re-pointed tag, not fail its checksum) nor aliases it.
    let other = url.replace("/debian-12.qcow2", "/y/debian-12.qcow2");
    api.apply(&format!(
        "apiVersion: nubo.dev/v1alpha1\nkind: VMImage\nmetadata: {{name: wrong, namespace: {ns}}}\nspec:\n  sources:\n    - {{providerClass: libvirt, kind: Url, ref: \"{other}\", checksum: \"{wrong}\"}}\n"
    ))?;
    api.apply(&vm("ni", &small, "lab", false, "user-data").replace("name: debian-12", "name: wrong"))?;
    let bad = wait_json(api, ns, "vmimage", "wrong", "/status/phase", "Failed", QUICK)?;
    println!("vmimage wrong: {}", bad["status"]["conditions"]);
    let ni = wait_cond(
        api,
        ns,
        "ni",
        "Provisioned",
        "False",
        Some("ImageChecksumMismatch"),
        QUICK,
    )?;
    println!("ni: {}", condition(&ni, "Provisioned").unwrap_or_default()["message"]);
    if volumes(lv)? != vols_before {
        return Err(format!(
            "a wrong checksum changed the pool: {vols_before:?} -> {:?}",
            volumes(lv)?
        ));
    }
    // ni's own retry may be fetching again (Failed VMs retry every 2 min): a partial file must
    // be gone within a fetch's time.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let partial: Vec<String> = walk(state).into_iter().filter(|p| p.ends_with(".part")).collect();
        if partial.is_empty() {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!("a failed fetch left files: {partial:?}"));
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    // The unreachable host's message names the Provider, host and URI and the controller's
    // fix, not the CLI's flags.
    let nu = condition(&get_vm(api, ns, "nu")?, "Provisioned").unwrap_or_default();
    let nu_msg = nu["message"].as_str().unwrap_or_default();
    let unreachable_ok = |m: &str| {
        [
            "host `hv9`",
            &format!("Provider `{ns}/down`"),
            &format!("`{closed}`"),
            "hosts[].uri",
            "credentialsSecretRef Secret `lab-tls`",
        ]
        .iter()
        .all(|w| m.contains(w))
            && !m.contains("--connect")
            && !m.contains("NUBO_LIBVIRT_URI")
    };
    if !unreachable_ok(nu_msg) {
        return Err(format!("nu's HostUnreachable message: {nu_msg}"));
    }

    let after = domains(lv)?;
    if after != before {
        return Err(format!(
            "a refused VM left a domain: before {before:?}, after {after:?}"
        ));
    }
    let unknown = condition(&get_vm(api, ns, "np")?, "Provisioned").unwrap_or_default();
    if !unknown["message"]
        .as_str()
        .unwrap_or_default()
        .contains("${vm.password}")
    {
        return Err(format!("the unknown placeholder is not named: {unknown}"));
    }

    // The Providers' status: hv1 reachable with the memory and CPUs libvirt reports (what
    // scheduling reads), hv9 unreachable with the reason.
    let lab = wait_json(api, ns, "provider", "lab", "/status/hosts/0/name", "hv1", QUICK)?;
    let h = &lab["status"]["hosts"][0];
    let free = h["capacity"]["freeMemoryBytes"].as_u64().unwrap_or(0);
    let total = h["capacity"]["memoryBytes"].as_u64().unwrap_or(0);
    if h["reachable"] != true || free == 0 || free > total || h["capacity"]["cpus"].as_u64().unwrap_or(0) == 0 {
        return Err(format!("provider lab's status: {}", lab["status"]));
    }
    let down = wait_json(api, ns, "provider", "down", "/status/hosts/0/name", "hv9", QUICK)?;
    let h = &down["status"]["hosts"][0];
    if h["reachable"] != false || !unreachable_ok(h["reason"].as_str().unwrap_or_default()) {
        return Err(format!("provider down's status: {}", down["status"]));
    }
    println!("provider status: lab {} / down {}", lab["status"]["hosts"], h);

    // 5. The Secret changes: SeedCurrent=False, the seed is not rewritten. The controller
    // watches the namespace's Secrets: va follows at once (its resync is an hour away).
    let t_secret = Instant::now();
    api.kubectl(&[
        "-n",
        ns,
        "patch",
        "secret",
        "ud",
        "--type=merge",
        "-p",
        r##"{"stringData":{"user-data":"#cloud-config\n# changed\n"}}"##,
    ])?
    .require()?;
    wait_cond(api, ns, "va", "SeedCurrent", "False", None, Duration::from_secs(20))
        .map_err(|e| format!("the Secret watch did not bring va's reconcile: {e}"))?;
    println!(
        "timing Secret change to SeedCurrent=False: {:.1}s",
        t_secret.elapsed().as_secs_f64()
    );
    if vol_bytes(lv, &seed_vol)? != seed {
        return Err("the seed volume was rewritten after the Secret changed".into());
    }

    // 6. Killed at three points of a create, restarted: one domain each, with its volumes.
    // The test hook stops a create at a phase; the replica is killed there.
    api.apply(&vm("vk", &small, "lab", false, "user-data"))?;
    wait_log(&a.log, &format!("test hook: paused at defined of {ns}/vk"), QUICK)?;
    if !domains(lv)?.iter().any(|d| d.starts_with("vk-")) {
        return Err(format!(
            "vk paused after its domain was defined, yet none: {:?}",
            domains(lv)?
        ));
    }
    a.guard.kill();
    let pauses = format!("disk:{ns}/vk2,seed:{ns}/vk3");
    let mut a = start_replica_with(api, state, ns, "a2", &[RESYNC, ("NUBO_CONTROLLER_TEST_PAUSE", &pauses)])?;
    api.apply(&vm("vk2", &small, "lab", false, "user-data"))?;
    api.apply(&vm("vk3", &small, "lab", false, "user-data"))?;
    wait_ready(&mut a, Duration::from_secs(60))?;
    wait_log(&a.log, &format!("test hook: paused at disk of {ns}/vk2"), QUICK)?;
    wait_log(&a.log, &format!("test hook: paused at seed of {ns}/vk3"), QUICK)?;
    let vols = volumes(lv)?;
    let made = |prefix: &str, suffix: &str| vols.iter().any(|v| v.starts_with(prefix) && v.ends_with(suffix));
    if !made("vk2-", ".qcow2") || made("vk2-", "-cidata.iso") || !made("vk3-", "-cidata.iso") {
        return Err(format!("paused at vk2's disk and vk3's seed, the pool has: {vols:?}"));
    }
    a.guard.kill();
    println!("killed the controller at vk's defined, vk2's disk, vk3's seed");
    let mut a = start_replica_with(api, state, ns, "a3", &[RESYNC])?;
    wait_ready(&mut a, Duration::from_secs(60))?;
    let vk_dom = one_domain(api, lv, ns, "vk")?;
    one_domain(api, lv, ns, "vk2")?;
    one_domain(api, lv, ns, "vk3")?;

    // 7. running: true starts the domain, false stops it (no wait for cloud-init: the guest
    // only has to run).
    let patch = |running: bool| {
        api.kubectl(&[
            "-n",
            ns,
            "patch",
            "vm",
            "vk",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"running":{running}}}}}"#),
        ])?
        .require()
        .map(|_| ())
    };
    patch(true)?;
    let on = wait_cond(api, ns, "vk", "Running", "True", None, QUICK)?;
    if on["status"]["phase"] != "Running" || !lv.virsh(&["domstate", &vk_dom])?.stdout.contains("running") {
        return Err(format!("running: true did not start {vk_dom}: {}", on["status"]));
    }
    // kube-apiserver restarted under the running vk: the controller's watches resume (vk's
    // resync is an hour away: only the watch brings `running: false`), nothing is duplicated.
    let sorted = |mut d: Vec<String>| {
        d.sort();
        d
    };
    let doms_before = sorted(domains(lv)?);
    let t_api = Instant::now();
    api.restart_apiserver()?;
    println!("timing kube-apiserver restart: {:.1}s", t_api.elapsed().as_secs_f64());
    patch(false)?;
    wait_cond(api, ns, "vk", "Running", "False", None, QUICK)?;
    if !lv.virsh(&["domstate", &vk_dom])?.stdout.contains("shut off") {
        return Err(format!("running: false did not stop {vk_dom}"));
    }
    if sorted(domains(lv)?) != doms_before {
        return Err(format!(
            "the apiserver's restart changed the domains: {doms_before:?} -> {:?}",
            domains(lv)?
        ));
    }
    if a.guard.exited().is_some() {
        return Err("the controller ended when the apiserver restarted".into());
    }

    // 8. Two replicas: b waits; when a is killed, b takes over and reconciles.
    let mut b = start_replica_with(api, state, ns, "b", &[RESYNC])?;
    std::thread::sleep(Duration::from_secs(3));
    if http_get(b.port, "/readyz")?.0 != 503 {
        return Err("a second replica is ready while the first leads".into());
    }
    let (code, metrics) = http_get(a.port, "/metrics")?;
    if code != 200 || !metrics.contains("nubo_reconciles_total{kind=\"virtualmachine\"}") {
        return Err(format!("/metrics: {code}\n{metrics}"));
    }
    a.guard.kill();
    let t = Instant::now();
    wait_ready(&mut b, Duration::from_secs(60))?;
    println!("timing takeover: {:.1}s", t.elapsed().as_secs_f64());

    // 9. The boots, after the last takeover (what a guest prints while no controller records
    // its console is not kept): ve through UEFI and vb through BIOS, to CloudInitDone=True.
    let t_boot = Instant::now();
    api.kubectl(&[
        "-n",
        ns,
        "patch",
        "vm",
        "ve",
        "--type=merge",
        "-p",
        r#"{"spec":{"running":true}}"#,
    ])?
    .require()?;
    // And a BIOS guest applied running, booting beside it.
    api.apply(&vm("vb", &small, "lab", true, "user-data").replace("name: ud,", "name: boot,"))?;
    let vb = wait_cond(api, ns, "vb", "Provisioned", "True", None, QUICK)?;
    let vb_dom = domain_of(lv, vb["status"]["uuid"].as_str().unwrap_or_default())?;

    // 10. Delete (while ve and vb boot): domain, seed and disk gone; the base stays.
    api.kubectl(&["-n", ns, "delete", "vm", "va", "--timeout=120s"])?
        .require()?;
    let vols = volumes(lv)?;
    if domains(lv)?.contains(&dom) || vols.iter().any(|v| v.starts_with(&dom)) {
        return Err(format!("va's domain or volumes remain: {vols:?}"));
    }
    if vols.iter().filter(|v| v.starts_with("nubo-base-")).count() != 1 {
        return Err(format!("the base volume went with the VM: {vols:?}"));
    }

    // The image's deletion is held while VMs name it (ve boots meanwhile).
    api.kubectl(&["-n", ns, "delete", "vmimage", "debian-12", "--wait=false"])?
        .require()?;
    let deadline = Instant::now() + QUICK;
    loop {
        let img = api
            .kubectl(&["-n", ns, "get", "vmimage", "debian-12", "-o", "json"])?
            .require()?;
        let img = nubo_live::cli::json(&img.stdout, "kubectl get vmimage")?;
        let held = img["status"]["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "InUse" && c["status"] == "True"))
            .and_then(|c| c["message"].as_str().map(str::to_owned));
        if let Some(m) = held {
            // The VMs named: every one whose imageRef is debian-12 (the refused ones too).
            let named: Vec<&str> = m
                .split_once(": ")
                .and_then(|(_, rest)| rest.split_once(';'))
                .map(|(list, _)| list.split(", ").collect())
                .unwrap_or_default();
            if named != ["nc", "np", "ns", "nt", "nu", "vb", "ve", "vk", "vk2", "vk3"] {
                return Err(format!("the hold does not name the VMs using the image: {m}"));
            }
            println!("vmimage debian-12 held: {m}");
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!("vmimage debian-12 is not held: {}", img["status"]));
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    booted(api, lv, ns, "ve", &ve_dom, state)?;
    println!(
        "timing efi boot to CloudInitDone: {:.1}s",
        t_boot.elapsed().as_secs_f64()
    );
    booted(api, lv, ns, "vb", &vb_dom, state)?;
    println!(
        "timing bios boot (beside it) to CloudInitDone: {:.1}s",
        t_boot.elapsed().as_secs_f64()
    );

    // libvirtd restarted under the running ve: the controller goes on with the new one (the
    // deletions below go through it).
    lv.restart()?;

    // The last VMs using the image go (ve running): the image is released.
    api.kubectl(&[
        "-n",
        ns,
        "delete",
        "vm",
        "ve",
        "vb",
        "vk",
        "vk2",
        "vk3",
        "nc",
        "np",
        "ns",
        "nt",
        "nu",
        "--timeout=120s",
    ])?
    .require()?;
    let deadline = Instant::now() + QUICK;
    loop {
        let out = api.kubectl(&["-n", ns, "get", "vmimage", "debian-12"])?;
        if !out.ok && out.stderr.contains("NotFound") {
            break;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "vmimage debian-12 outlived its last VM: {} {}",
                out.stdout, out.stderr
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    for d in [&ve_dom, &vb_dom] {
        if domains(lv)?.contains(d) {
            return Err(format!("deleting the running VMs left domain {d}"));
        }
    }

    // 11. The Secret's marker is nowhere but in the seed.
    let events = api.kubectl(&["-n", ns, "get", "events", "-o", "yaml"])?.require()?;
    let vms = api.kubectl(&["-n", ns, "get", "vm", "-o", "yaml"])?.require()?;
    let key = std::fs::read_to_string(tls.join("clientkey.pem")).map_err(|e| e.to_string())?;
    let key_line = key.lines().nth(1).unwrap_or("none").to_owned();
    for (what, text) in [
        ("events", events.stdout),
        ("status", vms.stdout),
        ("log a", std::fs::read_to_string(&a.log).unwrap_or_default()),
        ("log b", std::fs::read_to_string(&b.log).unwrap_or_default()),
    ] {
        if text.contains(MARKER) || text.contains(&key_line) {
            return Err(format!("Secret content in the controller's {what}"));
        }
    }
    drop(b);
    Ok(())
}

/// VM `name` (domain `dom`) reaches CloudInitDone=True through the controller, with cloud-init's
/// closing line as evidence; its DHCP lease bears the spec's hostname and the instance-id the
/// guest prints on its console (recorded by the controller under `state`) is `status.uuid`.
fn booted(api: &ApiServer, lv: &Libvirtd, ns: &str, name: &str, dom: &str, state: &Path) -> TestResult {
    let v = wait_cond(api, ns, name, "CloudInitDone", "True", None, BOOT)?;
    let c = condition(&v, "CloudInitDone").unwrap_or_default();
    let evidence = c["message"].as_str().unwrap_or_default();
    println!("{name}: CloudInitDone: {evidence}");
    if !evidence.contains("DataSourceNoCloud") {
        return Err(format!("{name}: cloud-init did not read the seed: {c}"));
    }
    let uuid = v["status"]["uuid"].as_str().unwrap_or_default().to_owned();
    let hostname = v["spec"]["hostname"].as_str().unwrap_or(name).to_owned();
    let iflist = lv.virsh(&["domiflist", dom])?.require()?.stdout;
    let mac = iflist
        .split_whitespace()
        .find(|w| w.len() == 17 && w.matches(':').count() == 5)
        .ok_or_else(|| format!("no MAC in domiflist {dom}:\n{iflist}"))?
        .to_owned();
    let leases = lv.virsh(&["net-dhcp-leases", "default"])?.require()?.stdout;
    let lease = leases
        .lines()
        .find(|l| l.contains(&mac))
        .ok_or_else(|| format!("no lease of {mac} on the host's network:\n{leases}"))?;
    if !lease.split_whitespace().any(|w| w == hostname) {
        return Err(format!("the lease of {mac} does not bear hostname {hostname}: {lease}"));
    }
    let logs: Vec<String> = walk(state)
        .into_iter()
        .filter(|p| p.ends_with(&format!("/{dom}/console.log")))
        .collect();
    let [log] = logs.as_slice() else {
        return Err(format!(
            "want one console log of {dom} under the controller's state: {logs:?}"
        ));
    };
    // Firmware writes bytes that are not UTF-8 to the serial console.
    let bytes = std::fs::read(log).map_err(|e| format!("{log}: {e}"))?;
    let text = String::from_utf8_lossy(&bytes);
    let iid = text
        .lines()
        // A UUID's 36 characters: the serial line may carry other output after it.
        .find_map(|l| {
            l.split_once(&format!("{IID} "))
                .map(|(_, id)| id.trim().chars().take(36).collect::<String>())
        })
        .ok_or_else(|| format!("the recorded console {log} has no `{IID}` line"))?;
    if iid != uuid {
        return Err(format!("the guest's instance-id {iid:?} is not status.uuid {uuid}"));
    }
    Ok(())
}
