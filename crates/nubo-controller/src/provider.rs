//! Which Provider a VirtualMachine uses, and the Provider reconciler (its hosts' status).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::hosts::HostKey;
use crate::types::{HostCapacity, Provider, ProviderHostStatus, ProviderRef, ProviderStatus, GROUP, VERSION};
use crate::vm::Refusal;
use crate::{Ctx, Error};

/// `r`, or the namespace's only Provider when the VM names none.
pub async fn resolve(ctx: &Ctx, ns: &str, r: Option<&ProviderRef>) -> Result<Result<Provider, Refusal>, Error> {
    let refuse = |reason: &'static str, message: String| Refusal {
        reason,
        message,
        phase: "Pending",
    };
    match r {
        Some(r) => {
            let pns = r.namespace.clone().unwrap_or_else(|| ns.to_owned());
            let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &pns);
            Ok(api.get_opt(&r.name).await?.ok_or_else(|| {
                refuse(
                    "ProviderNotFound",
                    format!(
                        "provider `{pns}/{}` does not exist: create it or fix spec.providerRef",
                        r.name
                    ),
                )
            }))
        }
        None => {
            let api: Api<Provider> = Api::namespaced(ctx.client.clone(), ns);
            let mut all = api.list(&ListParams::default()).await?.items;
            match all.len() {
                1 => Ok(Ok(all.remove(0))),
                0 => Ok(Err(refuse(
                    "ProviderNotFound",
                    format!("namespace `{ns}` has no Provider: create one or set spec.providerRef"),
                ))),
                n => Ok(Err(refuse(
                    "ProviderAmbiguous",
                    format!(
                        "namespace `{ns}` has {n} Providers ({}): name one in spec.providerRef",
                        all.iter().map(|p| p.name_any()).collect::<Vec<_>>().join(", ")
                    ),
                ))),
            }
        }
    }
}

/// How often a Provider's hosts are asked for their state.
const PROBE_EVERY: Duration = Duration::from_secs(60);

/// The Provider reconciler: asks every host whether libvirtd answers and what it has free, and
/// writes `status.hosts[]` (server-side apply on the status subresource). Its own status write
/// brings it back at once: a Provider probed less than [`PROBE_EVERY`] ago at this generation
/// is not asked again before then.
pub async fn reconcile(p: Arc<Provider>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let t = Instant::now();
    let r = reconcile_inner(&p, &ctx).await;
    ctx.metrics.observe("provider", t.elapsed(), r.is_err());
    r
}

async fn reconcile_inner(p: &Provider, ctx: &Ctx) -> Result<Action, Error> {
    let ns = p.namespace().unwrap_or_default();
    let name = p.name_any();
    let key = format!("{ns}/{name}");
    let key_text = key.clone();
    let generation = p.meta().generation;
    {
        let probed = ctx.probed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((g, at)) = probed.get(&key) {
            if *g == generation && at.elapsed() < PROBE_EVERY {
                return Ok(Action::requeue(PROBE_EVERY - at.elapsed()));
            }
        }
    }
    let now = crate::now();
    let creds = crate::vm::credentials(ctx, p).await?;
    let mut hosts = Vec::new();
    for h in &p.spec.hosts {
        let mut st = ProviderHostStatus {
            name: h.name.clone(),
            last_probe_time: Some(now.clone()),
            ..Default::default()
        };
        let asked = match &creds {
            Err(r) => Err(r.message.clone()),
            Ok(c) => {
                let key = HostKey {
                    namespace: ns.clone(),
                    provider: name.clone(),
                    host: h.name.clone(),
                };
                match ctx.hosts.engine(&key, &h.uri, c) {
                    Ok(engine) => crate::vm::resources(engine).await.map_err(|e| {
                        let at = crate::hosts::Unreachable {
                            provider: &key_text,
                            host: &h.name,
                            uri: &h.uri,
                            secret: &p.spec.credentials_secret_ref.name,
                        };
                        crate::hosts::unreachable(&at, &e)
                    }),
                    Err(e) => Err(e),
                }
            }
        };
        match asked {
            Ok(res) => {
                st.reachable = true;
                st.capacity = res.map(|r| HostCapacity {
                    free_memory_bytes: Some(r.free_memory),
                    memory_bytes: Some(r.total_memory),
                    cpus: Some(r.cpus),
                });
            }
            Err(e) => st.reason = Some(e),
        }
        hosts.push(st);
    }
    let status = ProviderStatus {
        hosts,
        observed_generation: generation,
    };
    let patch = json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "Provider",
        "status": status,
    });
    let api: Api<Provider> = Api::namespaced(ctx.client.clone(), &ns);
    api.patch_status(&name, &PatchParams::apply(&ctx.manager).force(), &Patch::Apply(&patch))
        .await?;
    ctx.probed
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, (generation, Instant::now()));
    Ok(Action::requeue(ctx.backoff.jittered(PROBE_EVERY)))
}
