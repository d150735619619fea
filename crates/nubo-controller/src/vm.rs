//! The VirtualMachine reconciler: resolves the class, image, Provider and Secrets, schedules
//! the VM to a host once, hands the engine a `VmSpec` with the rendered user-data, converges the
//! power state, and copies `Engine::observe`'s conditions into status (server-side apply on the
//! status subresource). Everything that blocks (libvirt) runs on the blocking pool.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event as KEvent, EventType};
use kube::{Resource, ResourceExt};
use nubo_engine::{Engine, EngineError};
use nubo_spec::{DiskSource, Firmware, Network, Payload, VmSpec};
use serde_json::json;

use crate::hosts::{Credentials, HostKey, Hosts, KEYS};
use crate::render;
use crate::types::*;
use crate::{Ctx, Error};

/// A VM that cannot be made now, and why: a condition, never a guess.
#[derive(Debug, Clone)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
    /// Pending (may resolve itself: a Secret or class created later) or Failed (the spec must change).
    pub phase: &'static str,
}

impl Refusal {
    /// Pending may resolve itself soon (a Secret created); Failed needs the spec changed,
    /// which a watch event brings: its retry is slow.
    pub fn retry(&self) -> Duration {
        Duration::from_secs(if self.phase == "Failed" { 120 } else { 15 })
    }
}

fn refuse(reason: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        reason,
        message: message.into(),
        phase: "Pending",
    }
}

fn fail(reason: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        reason,
        message: message.into(),
        phase: "Failed",
    }
}

/// The libvirt domain's name for a VirtualMachine: its name and a hash of namespace/name, so
/// two namespaces' `web` never share a domain on one host (a DNS label, at most 63 bytes).
pub fn domain_name(namespace: &str, name: &str) -> String {
    let h = crate::hosts::fnv(&format!("{namespace}/{name}"));
    let head: String = name.chars().take(50).collect();
    format!("{}-{h:08x}", head.trim_end_matches('-'))
}

/// The VirtualMachines that name Secret `ns/name` for their user-data or network-data: what a
/// change of that Secret reconciles.
pub fn referrers(
    vms: &[Arc<VirtualMachine>],
    ns: &str,
    name: &str,
) -> Vec<kube::runtime::reflector::ObjectRef<VirtualMachine>> {
    vms.iter()
        .filter(|vm| vm.namespace().as_deref() == Some(ns))
        .filter(|vm| {
            [&vm.spec.user_data, &vm.spec.network_data]
                .into_iter()
                .flatten()
                .any(|s| s.secret_ref.name == name)
        })
        .map(|vm| kube::runtime::reflector::ObjectRef::from_obj(vm.as_ref()))
        .collect()
}

/// Everything the engine needs, resolved.
struct Prepared {
    spec: VmSpec,
    engine: Arc<Engine>,
    host: String,
    /// `namespace/name` of the Provider, the host's URI as it gives it, its credentials
    /// Secret: what an unreachable host's message names.
    provider: String,
    uri: String,
    secret: String,
}

pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let t = Instant::now();
    let mut tr = crate::trace::Phases::start();
    let r = reconcile_inner(&vm, &ctx, &mut tr).await;
    ctx.metrics.observe("virtualmachine", t.elapsed(), r.is_err());
    let key = format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any());
    tr.report("virtualmachine", &key, &format!("{r:?}"));
    r
}

async fn reconcile_inner(vm: &VirtualMachine, ctx: &Ctx, tr: &mut crate::trace::Phases) -> Result<Action, Error> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
    if vm.meta().deletion_timestamp.is_some() {
        return delete(vm, ctx, &api).await;
    }
    if !vm.finalizers().iter().any(|f| f == FINALIZER) {
        let mut fins = vm.finalizers().to_vec();
        fins.push(FINALIZER.to_owned());
        let patch = json!({"metadata": {"finalizers": fins, "resourceVersion": vm.resource_version()}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        tr.mark("finalizer");
        // The update triggers the next reconcile.
        return Ok(Action::await_change());
    }
    let old = vm.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.observed_generation = vm.meta().generation;
    let prepared = prepare(vm, ctx, &old).await;
    tr.mark("prepare");
    let prepared = match prepared? {
        Ok(p) => p,
        Err(r) => {
            set(&mut status, vm, "Provisioned", "False", r.reason, &r.message);
            status.phase = Some(r.phase.to_owned());
            ctx.metrics.set_phase(&ns, &name, r.phase);
            publish(ctx, vm, &old, &status).await;
            apply_status(&api, &name, &status, &ctx.manager).await?;
            return Ok(Action::requeue(ctx.backoff.jittered(r.retry())));
        }
    };
    // The host is recorded before anything is made on it: the VM never moves afterwards.
    if old.host.as_deref() != Some(prepared.host.as_str()) {
        status.host = Some(prepared.host.clone());
        set(
            &mut status,
            vm,
            "Provisioned",
            "False",
            "Scheduled",
            &format!("scheduled to host `{}`", prepared.host),
        );
        status.phase = Some("Provisioning".into());
        apply_status(&api, &name, &status, &ctx.manager).await?;
        tr.mark("status");
    }
    let running = vm.spec.running;
    let engine = prepared.engine.clone();
    let spec = prepared.spec.clone();
    let follow = Follow {
        consoles: ctx.consoles.clone(),
        host: prepared.host.clone(),
        key: format!("{ns}/{name}"),
    };
    let outcome = tokio::task::spawn_blocking(move || converge(&engine, &spec, running, &follow))
        .await
        .map_err(|e| Error::Engine(format!("the engine's task failed: {e}")))?;
    tr.mark("engine");
    match outcome {
        Ok(st) => {
            status.uuid = Some(st.uuid.clone());
            status.addresses = st.addresses.guest.clone();
            for c in &st.conditions {
                let kind = format!("{:?}", c.kind);
                let s = format!("{:?}", c.status);
                set(&mut status, vm, &kind, &s, &c.reason, &c.message);
            }
            let is = |t: &str| status.conditions.iter().any(|c| c.type_ == t && c.status == "True");
            let phase = if !is("Provisioned") {
                "Provisioning"
            } else if is("Running") {
                "Running"
            } else {
                "Stopped"
            };
            status.phase = Some(phase.into());
            ctx.metrics.set_phase(&ns, &name, phase);
        }
        Err(mut r) => {
            if r.reason == "HostUnreachable" {
                let at = crate::hosts::Unreachable {
                    provider: &prepared.provider,
                    host: &prepared.host,
                    uri: &prepared.uri,
                    secret: &prepared.secret,
                };
                r.message = format!("{}; retried", crate::hosts::unreachable(&at, &r.message));
            }
            set(&mut status, vm, "Provisioned", "False", r.reason, &r.message);
            status.phase = Some(r.phase.to_owned());
            ctx.metrics.set_phase(&ns, &name, r.phase);
            publish(ctx, vm, &old, &status).await;
            apply_status(&api, &name, &status, &ctx.manager).await?;
            return Ok(Action::requeue(ctx.backoff.jittered(r.retry())));
        }
    }
    publish(ctx, vm, &old, &status).await;
    tr.mark("events");
    if status != old {
        apply_status(&api, &name, &status, &ctx.manager).await?;
        tr.mark("status");
    }
    // Readiness is polled: a VM not yet CloudInitDone soon; others at the resync interval
    // (Secret changes outside the watched namespaces, a domain changed behind the controller).
    let done = status
        .conditions
        .iter()
        .any(|c| c.type_ == "CloudInitDone" && c.status == "True");
    let again = if running && !done {
        Duration::from_secs(5)
    } else {
        ctx.resync
    };
    Ok(Action::requeue(ctx.backoff.jittered(again)))
}

/// Whose console recorders a converge keeps: the controller's, for the VM's host.
struct Follow {
    consoles: Arc<crate::consoles::Consoles>,
    host: String,
    /// The VirtualMachine's `namespace/name` (for the test hook).
    key: String,
}

/// Makes the VM if it is not there (or finishes an interrupted create), then the power state;
/// a VM meant to run has its console recorded before it is observed (CloudInitDone reads it).
fn converge(engine: &Engine, spec: &VmSpec, running: bool, follow: &Follow) -> Result<nubo_engine::VmStatus, Refusal> {
    let name = spec.name.as_str();
    let mut quiet = |_e: nubo_engine::Event| {};
    let mut tr = crate::trace::Phases::start();
    let r = converge_traced(engine, spec, running, follow, &mut tr, &mut quiet);
    tr.report("engine", name, if r.is_ok() { "ok" } else { "refused" });
    r
}

fn converge_traced(
    engine: &Engine,
    spec: &VmSpec,
    running: bool,
    follow: &Follow,
    tr: &mut crate::trace::Phases,
    quiet: &mut dyn FnMut(nubo_engine::Event),
) -> Result<nubo_engine::VmStatus, Refusal> {
    let name = spec.name.as_str();
    let existing = match engine.observe_against(spec) {
        Ok(st) => Some(st),
        Err(EngineError::NotFound(_)) => None,
        Err(e) => return Err(classify(&e)),
    };
    tr.mark("observe");
    let creating = existing
        .as_ref()
        .is_none_or(|st| st.phase == nubo_engine::record::Phase::Creating);
    if creating {
        // The create's steps are traced, and are where the test hook may stop it.
        let mut steps = |e: nubo_engine::Event| {
            if let Some(phase) = crate::trace::create_phase(&e) {
                tr.mark(phase);
                crate::trace::test_pause(phase, &follow.key);
            }
            quiet(e);
        };
        let made = if running {
            engine.create(spec, &mut steps)
        } else {
            engine.create_stopped(spec, &mut steps)
        };
        tr.mark("create");
        made.map_err(|e| classify(&e))?;
    } else if let Some(st) = &existing {
        let on = st.domain.state.as_deref() == Some("running");
        if running && !on {
            engine.start(name, quiet).map_err(|e| classify(&e))?;
        } else if !running && on {
            engine
                .stop(name, false, Duration::from_secs(60), quiet)
                .map_err(|e| classify(&e))?;
        }
    }
    follow.consoles.follow(&follow.host, engine, name, running);
    tr.mark("console");
    let st = engine.observe_against(spec).map_err(|e| classify(&e));
    tr.mark("observe");
    st
}

/// An engine error as a condition. Seed errors may quote the user-data (a Secret's bytes):
/// their text is withheld.
fn classify(e: &EngineError) -> Refusal {
    use nubo_core::ErrorKind;
    match e {
        EngineError::Disk(nubo_disk::DiskError::TooSmall { base_size, requested, .. }) => fail(
            "ClassTooSmall",
            format!("the VMClass's disk ({requested}) is smaller than the image ({base_size}): use a class with sizeGiB of at least the image's virtual size; nothing was made"),
        ),
        EngineError::Spec(errs) if errs.has(nubo_spec::Field::ResourcesDiskSize) => {
            let why: Vec<String> = errs
                .errors()
                .iter()
                .filter(|e| e.field == nubo_spec::Field::ResourcesDiskSize)
                .map(|e| e.to_string())
                .collect();
            fail(
                "ClassTooSmall",
                format!(
                    "the VMClass's sizeGiB is smaller than the image ({}): use a class with sizeGiB of at least the image's virtual size; nothing was made",
                    why.join("; ")
                ),
            )
        }
        EngineError::Pull { .. } => {
            let integrity = std::error::Error::source(e)
                .and_then(|s| s.downcast_ref::<nubo_image::PullError>())
                .is_some_and(|p| p.kind() == nubo_core::ErrorKind::Integrity);
            let msg = nubo_core::error::chain(e);
            if integrity {
                fail("ImageChecksumMismatch", format!("{msg}; fix the VMImage's checksum or ref"))
            } else {
                refuse("ImageFetchFailed", msg)
            }
        }
        EngineError::Seed(_) => fail(
            "UserDataInvalid",
            "the seed could not be built from the user-data (details withheld: they would quote the Secret): check the user-data with `nubo seed`",
        ),
        other => {
            let reason = match other.kind() {
                ErrorKind::Remote | ErrorKind::Unavailable => "HostUnreachable",
                ErrorKind::InvalidInput => "Invalid",
                _ => "EngineError",
            };
            let d = other.diagnostic();
            refuse(reason, d.message)
        }
    }
}

/// Resolves what the VM references. `Ok(Err(_))` is a refusal to put in a condition; `Err` is
/// an API error (retried with backoff).
async fn prepare(
    vm: &VirtualMachine,
    ctx: &Ctx,
    old: &VirtualMachineStatus,
) -> Result<Result<Prepared, Refusal>, Error> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let classes: Api<VMClass> = Api::all(ctx.client.clone());
    let Some(class) = classes.get_opt(&vm.spec.class_ref.name).await? else {
        return Ok(Err(refuse(
            "ClassNotFound",
            format!(
                "vmclass `{}` does not exist: create it (deploy/examples/) or name another in spec.classRef",
                vm.spec.class_ref.name
            ),
        )));
    };
    let memory = match parse_quantity(&class.spec.memory) {
        Some(m) if m >= 64 << 20 => m,
        _ => {
            return Ok(Err(fail(
                "ClassInvalid",
                format!(
                    "vmclass `{}` has memory `{}`: give a quantity of at least 64Mi (512Mi, 2Gi)",
                    class.name_any(),
                    class.spec.memory
                ),
            )))
        }
    };
    let images: Api<VMImage> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(image) = images.get_opt(&vm.spec.image_ref.name).await? else {
        return Ok(Err(refuse(
            "ImageNotFound",
            format!(
                "vmimage `{}` does not exist in namespace `{ns}`: create it or name another in spec.imageRef",
                vm.spec.image_ref.name
            ),
        )));
    };
    let source = match image_source(&image) {
        Ok(s) => s,
        Err(r) => return Ok(Err(r)),
    };
    let provider = match crate::provider::resolve(ctx, &ns, vm.spec.provider_ref.as_ref()).await? {
        Ok(p) => p,
        Err(r) => return Ok(Err(r)),
    };
    let pns = provider.namespace().unwrap_or_default();
    let creds = match credentials(ctx, &provider).await? {
        Ok(c) => c,
        Err(r) => return Ok(Err(r)),
    };
    let hostname = vm.spec.hostname.clone().unwrap_or_else(|| name.clone());
    let user_data = match &vm.spec.user_data {
        None => None,
        Some(src) => match secret_key(ctx, &ns, &src.secret_ref, "spec.userData").await? {
            Err(r) => return Ok(Err(r)),
            Ok(bytes) => {
                let vars = render::Vars {
                    name: &name,
                    namespace: &ns,
                    hostname: &hostname,
                    uuid: None,
                };
                match render::render(&bytes, &vars) {
                    Ok(b) => Some(Payload::new(b)),
                    Err(e) => {
                        return Ok(Err(fail(
                            "UserDataInvalid",
                            format!("secret `{}`: {e}", src.secret_ref.name),
                        )))
                    }
                }
            }
        },
    };
    let network_config = match &vm.spec.network_data {
        None => None,
        Some(src) => match secret_key(ctx, &ns, &src.secret_ref, "spec.networkData").await? {
            Err(r) => return Ok(Err(r)),
            Ok(bytes) => Some(Payload::new(bytes)),
        },
    };
    // The host: the recorded one, else the reachable host with the most room.
    let mut reasons = Vec::new();
    let candidates: Vec<&ProviderHost> = match &old.host {
        Some(h) => match provider.spec.hosts.iter().find(|x| &x.name == h) {
            Some(x) => vec![x],
            None => {
                return Ok(Err(fail(
                    "HostGone",
                    format!("the VM is on host `{h}`, which Provider `{pns}/{}` no longer lists: put the host back (VMs never move)", provider.name_any()),
                )))
            }
        },
        None => provider.spec.hosts.iter().collect(),
    };
    let mut reachable: Vec<(ProviderHost, Arc<Engine>, crate::hosts::Candidate)> = Vec::new();
    let provider_key = format!("{pns}/{}", provider.name_any());
    let secret = provider.spec.credentials_secret_ref.name.clone();
    for h in candidates {
        let key = HostKey {
            namespace: pns.clone(),
            provider: provider.name_any(),
            host: h.name.clone(),
        };
        let engine = match ctx.hosts.engine(&key, &h.uri, &creds) {
            Ok(e) => e,
            Err(e) => {
                reasons.push(format!("{}: {e}", h.name));
                continue;
            }
        };
        // A scheduled VM stays where it is: its host is not asked again (the engine's own
        // calls say when it is unreachable), which spares a TLS connection per reconcile.
        let asked = if old.host.is_some() {
            Ok(None)
        } else {
            resources(engine.clone()).await
        };
        match asked {
            Ok(free) => {
                let c = crate::hosts::Candidate {
                    free_memory: free.map(|r| r.free_memory),
                    vms: vms_on(&engine),
                };
                reachable.push((h.clone(), engine, c));
            }
            Err(e) => {
                let at = crate::hosts::Unreachable {
                    provider: &provider_key,
                    host: &h.name,
                    uri: &h.uri,
                    secret: &secret,
                };
                reasons.push(crate::hosts::unreachable(&at, &e));
            }
        }
    }
    // The reachable host with the most free memory (see hosts::choose).
    let views: Vec<crate::hosts::Candidate> = reachable.iter().map(|(_, _, c)| c.clone()).collect();
    let chosen = crate::hosts::choose(&views)
        .map(|i| reachable.swap_remove(i))
        .map(|(h, e, _)| (h, e));
    let Some((host, engine)) = chosen else {
        return Ok(Err(refuse(
            "HostUnreachable",
            format!("no host is reachable: {}; retried", reasons.join("; ")),
        )));
    };
    let vm_name = match nubo_core::VmName::parse(&domain_name(&ns, &name)) {
        Ok(n) => n,
        Err(e) => return Ok(Err(fail("Invalid", e.to_string()))),
    };
    let mut spec = VmSpec::new(vm_name, source);
    spec.backend = Some("libvirt".into());
    spec.resources.vcpus = Some(class.spec.vcpus);
    spec.resources.memory = Some(nubo_core::ByteSize(memory));
    spec.resources.disk_size = Some(nubo_core::ByteSize(u64::from(class.spec.size_gib) << 30));
    spec.firmware = match class.spec.firmware {
        FirmwareKind::Bios => Firmware::Bios,
        FirmwareKind::Efi => Firmware::Efi,
    };
    let mut opts = std::collections::BTreeMap::new();
    opts.insert("pool".to_owned(), host.pool.clone());
    if let Some(m) = &class.spec.machine {
        opts.insert("machine".to_owned(), m.clone());
    }
    spec.overrides.insert("libvirt".into(), opts);
    spec.network = match &host.network {
        Some(n) => Network::Named(n.clone()),
        None => Network::Restricted,
    };
    spec.cloud_init.hostname = Some(hostname);
    spec.cloud_init.ssh_keys = vm.spec.ssh_keys.clone();
    spec.cloud_init.user_data = user_data;
    spec.cloud_init.network_config = network_config;
    Ok(Ok(Prepared {
        spec,
        engine,
        uri: host.uri,
        host: host.name,
        provider: provider_key,
        secret,
    }))
}

/// How many VMs this controller has on the host (its engine's records): the scheduling
/// tie-breaker.
fn vms_on(engine: &Engine) -> usize {
    std::fs::read_dir(engine.roots.vms()).map(|d| d.count()).unwrap_or(0)
}

/// The host's resources (`None` when its backend cannot report them), or why it is unreachable;
/// bounded at 20 s.
pub async fn resources(engine: Arc<Engine>) -> Result<Option<nubo_backend::HostResources>, String> {
    let task = tokio::task::spawn_blocking(move || Hosts::resources(&engine));
    match tokio::time::timeout(Duration::from_secs(20), task).await {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => Err(format!("probe failed: {e}")),
        Err(_) => Err("libvirtd did not answer within 20 s".into()),
    }
}

fn image_source(image: &VMImage) -> Result<DiskSource, Refusal> {
    let name = image.name_any();
    let Some(src) = crate::image::libvirt_source(image) else {
        return Err(fail(
            "ImageUnsupported",
            format!("vmimage `{name}` has no source for providerClass libvirt: add one"),
        ));
    };
    match src.kind {
        SourceKind::Url => {
            if src.checksum.is_none() {
                return Err(fail(
                    "ImageUnverified",
                    format!("vmimage `{name}`: its Url source has no checksum: add `checksum: sha256:<hex>`"),
                ));
            }
            Ok(DiskSource::Url {
                url: src.reference.clone(),
                checksum: src.checksum.clone(),
                insecure_no_checksum: false,
                allow_http: src.reference.starts_with("http://"),
            })
        }
        // The VMImage's import pulled it into the host's store with its pullSecretRef's
        // credentials and checked it: the engine finds it there by its reference.
        SourceKind::Oci => match image.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Ready") => Ok(DiskSource::Image {
                reference: src.reference.clone(),
            }),
            Some("Failed") => Err(fail(
                "ImageFailed",
                format!("vmimage `{name}` failed to import (see its Ready condition): fix it"),
            )),
            _ => Err(refuse(
                "ImageNotReady",
                format!("vmimage `{name}` is not imported yet: waiting for its phase Ready"),
            )),
        },
    }
}

/// One key of a Secret in `ns`. The bytes never reach a log, an event or status.
async fn secret_key(ctx: &Ctx, ns: &str, r: &SecretKeyRef, field: &str) -> Result<Result<Vec<u8>, Refusal>, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let Some(s) = api.get_opt(&r.name).await? else {
        return Ok(Err(refuse(
            "SecretNotFound",
            format!(
                "secret `{}` named by {field} does not exist in namespace `{ns}`: create it",
                r.name
            ),
        )));
    };
    match s.data.as_ref().and_then(|d| d.get(&r.key)) {
        Some(b) => Ok(Ok(b.0.clone())),
        None => Ok(Err(refuse(
            "SecretKeyNotFound",
            format!(
                "secret `{}` named by {field} has no key `{}`: add it or name another key",
                r.name, r.key
            ),
        ))),
    }
}

pub async fn credentials(ctx: &Ctx, provider: &Provider) -> Result<Result<Credentials, Refusal>, Error> {
    let ns = provider.namespace().unwrap_or_default();
    let sname = &provider.spec.credentials_secret_ref.name;
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(s) = api.get_opt(sname).await? else {
        return Ok(Err(refuse(
            "CredentialsNotFound",
            format!("the credentials secret `{ns}/{sname}` of Provider `{}` does not exist: create it with cacert.pem, clientcert.pem and clientkey.pem", provider.name_any()),
        )));
    };
    let data = s.data.unwrap_or_default();
    let mut got = Vec::new();
    for (a, b) in KEYS {
        match data.get(a).or_else(|| data.get(b)) {
            Some(v) => got.push(v.0.clone()),
            None => {
                return Ok(Err(refuse(
                    "CredentialsInvalid",
                    format!("the credentials secret `{ns}/{sname}` has neither `{a}` nor `{b}`: add it"),
                )))
            }
        }
    }
    let key = got.pop().unwrap_or_default();
    let cert = got.pop().unwrap_or_default();
    let ca = got.pop().unwrap_or_default();
    Ok(Ok(Credentials {
        ca,
        cert,
        key,
        version: s.metadata.resource_version.unwrap_or_default(),
    }))
}

/// Deletion: the finalizer removes the domain, its seed and disk volumes (the base stays).
async fn delete(vm: &VirtualMachine, ctx: &Ctx, api: &Api<VirtualMachine>) -> Result<Action, Error> {
    if !vm.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let old = vm.status.clone().unwrap_or_default();
    if let Some(host) = &old.host {
        let blocked = |msg: String| refuse("CleanupBlocked", msg);
        let provider = match crate::provider::resolve(ctx, &ns, vm.spec.provider_ref.as_ref()).await? {
            Ok(p) => p,
            Err(r) => {
                return hold(
                    vm,
                    ctx,
                    api,
                    &old,
                    blocked(format!("cannot remove the domain: {}", r.message)),
                )
                .await
            }
        };
        let creds = match credentials(ctx, &provider).await? {
            Ok(c) => c,
            Err(r) => {
                return hold(
                    vm,
                    ctx,
                    api,
                    &old,
                    blocked(format!("cannot remove the domain: {}", r.message)),
                )
                .await
            }
        };
        let Some(h) = provider.spec.hosts.iter().find(|x| &x.name == host) else {
            return hold(
                vm,
                ctx,
                api,
                &old,
                blocked(format!(
                    "cannot remove the domain: host `{host}` is no longer in the Provider"
                )),
            )
            .await;
        };
        let key = HostKey {
            namespace: provider.namespace().unwrap_or_default(),
            provider: provider.name_any(),
            host: host.clone(),
        };
        let engine = match ctx.hosts.engine(&key, &h.uri, &creds) {
            Ok(e) => e,
            Err(e) => return hold(vm, ctx, api, &old, blocked(format!("cannot remove the domain: {e}"))).await,
        };
        let dom = domain_name(&ns, &name);
        let c = ctx.consoles.clone();
        let h2 = host.clone();
        let r = tokio::task::spawn_blocking(move || {
            c.forget(&h2, &dom);
            engine.remove(&dom, true, &mut |_| {})
        })
        .await
        .map_err(|e| Error::Engine(format!("the engine's task failed: {e}")))?;
        match r {
            Ok(_) | Err(EngineError::NotFound(_)) => {}
            Err(e) => {
                let d = e.diagnostic();
                return hold(
                    vm,
                    ctx,
                    api,
                    &old,
                    blocked(format!("removing the domain failed: {}", d.message)),
                )
                .await;
            }
        }
        emit(
            ctx,
            vm,
            EventType::Normal,
            "Deleted",
            format!("domain, seed and disk removed from host `{host}`"),
        )
        .await;
    }
    ctx.metrics.forget(&ns, &name);
    let fins: Vec<String> = vm.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    let patch = json!({"metadata": {"finalizers": fins, "resourceVersion": vm.resource_version()}});
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(Action::await_change())
}

async fn hold(
    vm: &VirtualMachine,
    ctx: &Ctx,
    api: &Api<VirtualMachine>,
    old: &VirtualMachineStatus,
    r: Refusal,
) -> Result<Action, Error> {
    let mut status = old.clone();
    set(&mut status, vm, "Provisioned", "True", r.reason, &r.message);
    publish(ctx, vm, old, &status).await;
    apply_status(api, &vm.name_any(), &status, &ctx.manager).await?;
    Ok(Action::requeue(ctx.backoff.jittered(Duration::from_secs(15))))
}

/// Sets condition `t`, keeping its lastTransitionTime when its status did not change.
pub fn set(status: &mut VirtualMachineStatus, vm: &VirtualMachine, t: &str, s: &str, reason: &str, message: &str) {
    set_condition(&mut status.conditions, vm.meta().generation, t, s, reason, message)
}

pub fn set_condition(
    conds: &mut Vec<Condition>,
    generation: Option<i64>,
    t: &str,
    s: &str,
    reason: &str,
    message: &str,
) {
    let now = crate::now();
    match conds.iter_mut().find(|c| c.type_ == t) {
        Some(c) => {
            if c.status != s {
                c.last_transition_time = Some(now);
            }
            c.status = s.to_owned();
            c.reason = reason.to_owned();
            c.message = message.to_owned();
            c.observed_generation = generation;
        }
        None => conds.push(Condition {
            type_: t.to_owned(),
            status: s.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            last_transition_time: Some(now),
            observed_generation: generation,
        }),
    }
}

/// An Event for every condition whose status or reason changed.
async fn publish(ctx: &Ctx, vm: &VirtualMachine, old: &VirtualMachineStatus, new: &VirtualMachineStatus) {
    for c in &new.conditions {
        let before = old.conditions.iter().find(|o| o.type_ == c.type_);
        if before.is_some_and(|b| b.status == c.status && b.reason == c.reason) {
            continue;
        }
        let warn = c.status == "False"
            && !matches!(c.reason.as_str(), "Scheduled" | "Stopped" | "NotStarted" | "Booting")
            && c.type_ == "Provisioned";
        let kind = if warn { EventType::Warning } else { EventType::Normal };
        emit(
            ctx,
            vm,
            kind,
            &c.reason,
            format!("{} {}: {}", c.type_, c.status, c.message),
        )
        .await;
    }
}

async fn emit(ctx: &Ctx, vm: &VirtualMachine, kind: EventType, reason: &str, note: String) {
    let ev = KEvent {
        type_: kind,
        reason: reason.chars().take(128).collect(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    // An Event that cannot be written is not worth failing a reconcile for.
    let _ = ctx.recorder.publish(&ev, &vm.object_ref(&())).await;
}

async fn apply_status(
    api: &Api<VirtualMachine>,
    name: &str,
    status: &VirtualMachineStatus,
    manager: &str,
) -> Result<(), Error> {
    let patch = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "VirtualMachine",
        "status": status,
    });
    api.patch_status(name, &PatchParams::apply(manager).force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// A Kubernetes quantity in bytes: plain, or with Ki Mi Gi Ti (binary) or k M G T (decimal).
pub fn parse_quantity(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let n: u64 = num.parse().ok()?;
    let mul: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_quantity_units_parsed() {
        assert_eq!(parse_quantity("512Mi"), Some(512 << 20));
        assert_eq!(parse_quantity("2Gi"), Some(2 << 30));
        assert_eq!(parse_quantity("1G"), Some(1_000_000_000));
        assert_eq!(parse_quantity("100"), Some(100));
    }

    #[test]
    fn parse_quantity_hostile_refused() {
        for q in [
            "",
            "Mi",
            "1.5Gi",
            "-1Gi",
            "1Xi",
            "99999999999999999999Ti",
            "18446744073709551615Ti",
        ] {
            assert_eq!(parse_quantity(q), None, "{q}");
        }
    }

    fn vm_naming(ns: &str, name: &str, user: Option<&str>, net: Option<&str>) -> Arc<VirtualMachine> {
        let src = |s: &str| SecretSource {
            secret_ref: SecretKeyRef {
                name: s.into(),
                key: "k".into(),
            },
        };
        let mut vm = VirtualMachine::new(
            name,
            VirtualMachineSpec {
                class_ref: NameRef { name: "c".into() },
                image_ref: NameRef { name: "i".into() },
                provider_ref: None,
                running: true,
                hostname: None,
                user_data: user.map(src),
                network_data: net.map(src),
                ssh_keys: vec![],
            },
        );
        vm.metadata.namespace = Some(ns.into());
        Arc::new(vm)
    }

    #[test]
    fn referrers_user_or_network_secret_same_namespace_only() {
        let vms = [
            vm_naming("a", "u", Some("s"), None),
            vm_naming("a", "n", None, Some("s")),
            vm_naming("a", "other", Some("t"), None),
            vm_naming("b", "elsewhere", Some("s"), None),
            vm_naming("a", "none", None, None),
        ];
        let names: Vec<String> = referrers(&vms, "a", "s").into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["u", "n"]);
        assert!(referrers(&vms, "c", "s").is_empty());
    }

    #[test]
    fn domain_name_distinct_per_namespace_and_a_label() {
        let a = domain_name("team-a", "web");
        let b = domain_name("team-b", "web");
        assert_ne!(a, b);
        assert!(a.starts_with("web-"));
        let long = domain_name("ns", &"x".repeat(253));
        assert!(nubo_core::VmName::parse(&long).is_ok(), "{long}");
    }
}
