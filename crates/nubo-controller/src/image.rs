//! The VMImage reconciler: for every host of every Provider in the image's namespace, the
//! image is fetched into that host's engine store through the engine's fetcher, its checksum
//! verified while it streams (a mismatch deletes the partial file: nothing is kept, nothing
//! reaches a pool). The base volume is uploaded into the host's pool, and verified again, by
//! the first VirtualMachine that uses the image there. A VMImage's deletion is held (finalizer
//! `nubo.dev/in-use`, condition `InUse`) while VirtualMachines name it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use nubo_engine::{EngineError, Fetch};
use serde_json::json;

use crate::hosts::HostKey;
use crate::types::*;
use crate::vm::set_condition;
use crate::{Ctx, Error};

pub async fn reconcile(img: Arc<VMImage>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let t = Instant::now();
    let r = reconcile_inner(&img, &ctx).await;
    ctx.metrics.observe("vmimage", t.elapsed(), r.is_err());
    r
}

/// Why an image cannot be used, as (phase, reason, message).
fn bad(reason: &'static str, message: String) -> (&'static str, &'static str, String) {
    ("Failed", reason, message)
}

/// The fetch the image's libvirt source asks for.
pub fn fetch_of(img: &VMImage) -> Result<Fetch, (&'static str, &'static str, String)> {
    let name = img.name_any();
    let Some(src) = img.spec.sources.iter().find(|s| s.provider_class == "libvirt") else {
        return Err(bad(
            "NoSource",
            format!("vmimage `{name}` has no source for providerClass libvirt: add one"),
        ));
    };
    match src.kind {
        SourceKind::Url => {
            let Some(sum) = &src.checksum else {
                return Err(bad(
                    "NoChecksum",
                    format!(
                        "vmimage `{name}`: its Url source has no checksum: add `checksum: sha256:<hex>` (or sha512)"
                    ),
                ));
            };
            if let Err(e) = sum.parse::<nubo_image::Checksum>() {
                return Err(bad("BadChecksum", format!("vmimage `{name}`: checksum: {e}")));
            }
            if !(src.reference.starts_with("https://") || src.reference.starts_with("http://")) {
                return Err(bad(
                    "BadUrl",
                    format!(
                        "vmimage `{name}`: ref `{}` is not an http(s) URL: give one",
                        src.reference
                    ),
                ));
            }
            Ok(Fetch::Url {
                url: src.reference.clone(),
                checksum: Some(sum.clone()),
                insecure_no_checksum: false,
                allow_http: src.reference.starts_with("http://"),
            })
        }
        SourceKind::Oci => {
            if !src.reference.contains("@sha256:") && !img.spec.allow_mutable_tag {
                return Err(bad("MutableTag", format!("vmimage `{name}`: Oci ref `{}` is not pinned by digest: use `@sha256:<hex>` or set allowMutableTag: true", src.reference)));
            }
            Err(bad(
                "Unsupported",
                format!("vmimage `{name}`: Oci sources are not imported by the controller yet: use a Url source"),
            ))
        }
    }
}

/// Held on a VMImage while VirtualMachines use it.
pub const IN_USE_FINALIZER: &str = "nubo.dev/in-use";

/// The VirtualMachines of `ns` whose imageRef names `image`, sorted.
pub fn users(vms: &[VirtualMachine], ns: &str, image: &str) -> Vec<String> {
    let mut u: Vec<String> = vms
        .iter()
        .filter(|v| v.namespace().as_deref() == Some(ns) && v.spec.image_ref.name == image)
        .map(|v| v.name_any())
        .collect();
    u.sort();
    u
}

/// A VMImage being deleted: held (condition `InUse` naming the VMs) while VirtualMachines use
/// it, released when the last one is gone. VMs being deleted still count: their domains and
/// disks are removed by their own finalizer first.
async fn deleting(img: &VMImage, ctx: &Ctx, api: &Api<VMImage>) -> Result<Action, Error> {
    if !img.finalizers().iter().any(|f| f == IN_USE_FINALIZER) {
        return Ok(Action::await_change());
    }
    let ns = img.namespace().unwrap_or_default();
    let name = img.name_any();
    let vms: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let users = users(&vms.list(&ListParams::default()).await?.items, &ns, &name);
    if users.is_empty() {
        let fins: Vec<String> = img
            .finalizers()
            .iter()
            .filter(|f| *f != IN_USE_FINALIZER)
            .cloned()
            .collect();
        let patch = json!({"metadata": {"finalizers": fins, "resourceVersion": img.resource_version()}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        return Ok(Action::await_change());
    }
    let old = img.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let shown: Vec<&str> = users.iter().take(20).map(String::as_str).collect();
    let more = users.len().saturating_sub(shown.len());
    set_condition(
        &mut status.conditions,
        img.meta().generation,
        "InUse",
        "True",
        "DeletionHeld",
        &format!(
            "deletion waits for {} VirtualMachine(s) using this image: {}{}; delete them or point their imageRef elsewhere",
            users.len(),
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() }
        ),
    );
    if status != old {
        apply(api, &name, &status, &ctx.manager).await?;
    }
    // A VM's deletion does not wake this reconcile: it looks again soon.
    Ok(Action::requeue(ctx.backoff.jittered(Duration::from_secs(10))))
}

async fn reconcile_inner(img: &VMImage, ctx: &Ctx) -> Result<Action, Error> {
    let ns = img.namespace().unwrap_or_default();
    let name = img.name_any();
    let api: Api<VMImage> = Api::namespaced(ctx.client.clone(), &ns);
    if img.meta().deletion_timestamp.is_some() {
        return deleting(img, ctx, &api).await;
    }
    if !img.finalizers().iter().any(|f| f == IN_USE_FINALIZER) {
        let mut fins = img.finalizers().to_vec();
        fins.push(IN_USE_FINALIZER.to_owned());
        let patch = json!({"metadata": {"finalizers": fins, "resourceVersion": img.resource_version()}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        // The update brings the next reconcile.
        return Ok(Action::await_change());
    }
    let old = img.status.clone().unwrap_or_default();
    let mut status = old.clone();
    status.observed_generation = img.meta().generation;
    let generation = img.meta().generation;
    let fetch = match fetch_of(img) {
        Ok(f) => f,
        Err((phase, reason, msg)) => {
            status.phase = Some(phase.into());
            set_condition(&mut status.conditions, generation, "Ready", "False", reason, &msg);
            apply(&api, &name, &status, &ctx.manager).await?;
            return Ok(Action::requeue(ctx.backoff.jittered(Duration::from_secs(300))));
        }
    };
    let providers: Api<Provider> = Api::namespaced(ctx.client.clone(), &ns);
    let providers = providers.list(&ListParams::default()).await?.items;
    // A settled image is not fetched again for its own status update (which triggers a
    // reconcile): only a new generation, or for Ready a changed set of hosts, does that.
    let hosts_now: Vec<(String, String)> = providers
        .iter()
        .flat_map(|p| p.spec.hosts.iter().map(move |h| (p.name_any(), h.name.clone())))
        .collect();
    let hosts_then: Vec<(String, String)> = old
        .per_provider
        .iter()
        .flat_map(|p| p.hosts.iter().map(move |h| (p.provider_name.clone(), h.name.clone())))
        .collect();
    let settled = old.observed_generation == generation
        && match old.phase.as_deref() {
            Some("Failed") => true,
            Some("Ready") => {
                let (mut a, mut b) = (hosts_now.clone(), hosts_then);
                a.sort();
                b.sort();
                a == b
            }
            _ => false,
        };
    if settled {
        return Ok(Action::requeue(ctx.backoff.jittered(Duration::from_secs(300))));
    }
    if old.phase.is_none() || old.observed_generation != generation {
        status.phase = Some("Importing".into());
        set_condition(
            &mut status.conditions,
            generation,
            "Ready",
            "False",
            "Importing",
            "fetching and verifying on each host",
        );
        apply(&api, &name, &status, &ctx.manager).await?;
    }
    let mut per = Vec::new();
    let mut failed: Option<String> = None;
    let mut pending: Option<String> = None;
    for p in &providers {
        let mut ps = ImageProviderStatus {
            provider_name: p.name_any(),
            ..ImageProviderStatus::default()
        };
        let creds = match crate::vm::credentials(ctx, p).await? {
            Ok(c) => c,
            Err(r) => {
                ps.reason = Some(r.message.clone());
                pending.get_or_insert(r.message);
                per.push(ps);
                continue;
            }
        };
        for h in &p.spec.hosts {
            let key = HostKey {
                namespace: ns.clone(),
                provider: p.name_any(),
                host: h.name.clone(),
            };
            let mut hs = ImageHostStatus {
                name: h.name.clone(),
                ..ImageHostStatus::default()
            };
            match ctx.hosts.engine(&key, &h.uri, &creds) {
                Err(e) => {
                    pending.get_or_insert(e);
                }
                Ok(engine) => {
                    let f = fetch.clone();
                    let r = tokio::task::spawn_blocking(move || match &engine.fetcher {
                        Some(fetcher) => fetcher.fetch(&f, &engine.cancel, &mut |_| {}),
                        None => Err(EngineError::Unavailable {
                            what: "fetching images".into(),
                            fix: "give the engine a fetcher".into(),
                        }),
                    })
                    .await
                    .map_err(|e| Error::Engine(format!("the fetch task failed: {e}")))?;
                    match r {
                        Ok(rec) => {
                            hs.ready = true;
                            status.digest = Some(rec.digest.clone());
                        }
                        Err(e) => {
                            let integrity = e.kind() == nubo_core::ErrorKind::Integrity
                                || std::error::Error::source(&e)
                                    .and_then(|s| s.downcast_ref::<nubo_image::PullError>())
                                    .is_some_and(|p| p.kind() == nubo_core::ErrorKind::Integrity);
                            let msg = format!("host `{}`: {}", h.name, chain(&e));
                            if integrity {
                                failed.get_or_insert(msg.clone());
                            } else {
                                pending.get_or_insert(msg.clone());
                            }
                            ps.reason.get_or_insert(msg);
                        }
                    }
                }
            }
            ps.hosts.push(hs);
        }
        ps.ready = !ps.hosts.is_empty() && ps.hosts.iter().all(|h| h.ready);
        per.push(ps);
    }
    status.per_provider = per;
    let (phase, cs, reason, msg, again) = if let Some(m) = failed {
        ("Failed", "False", "ChecksumMismatch", m, 300)
    } else if let Some(m) = pending {
        ("Importing", "False", "NotYet", m, 30)
    } else if providers.is_empty() {
        (
            "Pending",
            "False",
            "NoProvider",
            format!("namespace `{ns}` has no Provider to import into"),
            30,
        )
    } else {
        (
            "Ready",
            "True",
            "Verified",
            "fetched and verified for every host; uploaded into a host's pool with the first VM there".into(),
            300,
        )
    };
    status.phase = Some(phase.into());
    set_condition(&mut status.conditions, generation, "Ready", cs, reason, &msg);
    if status != old {
        apply(&api, &name, &status, &ctx.manager).await?;
    }
    Ok(Action::requeue(ctx.backoff.jittered(Duration::from_secs(again))))
}

/// An error and its sources, one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

async fn apply(api: &Api<VMImage>, name: &str, status: &VMImageStatus, manager: &str) -> Result<(), Error> {
    let patch = json!({"apiVersion": format!("{GROUP}/{VERSION}"), "kind": "VMImage", "status": status});
    api.patch_status(name, &PatchParams::apply(manager).force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod hold_tests {
    use super::*;

    fn vm(ns: &str, name: &str, image: &str) -> VirtualMachine {
        let mut v = VirtualMachine::new(
            name,
            VirtualMachineSpec {
                class_ref: NameRef { name: "c".into() },
                image_ref: NameRef { name: image.into() },
                provider_ref: None,
                running: false,
                hostname: None,
                user_data: None,
                network_data: None,
                ssh_keys: vec![],
            },
        );
        v.metadata.namespace = Some(ns.into());
        v
    }

    #[test]
    fn users_same_namespace_same_image_sorted() {
        let vms = [
            vm("a", "web-2", "debian"),
            vm("a", "web-1", "debian"),
            vm("a", "db", "other"),
            vm("b", "web-3", "debian"),
        ];
        assert_eq!(users(&vms, "a", "debian"), ["web-1", "web-2"]);
        assert!(users(&vms, "a", "gone").is_empty());
    }
}
