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
use nubo_engine::{EngineError, Fetch, ImageFetcher};
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

/// The image's source for libvirt Providers, if it has one.
pub fn libvirt_source(img: &VMImage) -> Option<&ImageSource> {
    img.spec.sources.iter().find(|s| s.provider_class == "libvirt")
}

/// The fetch the image's libvirt source asks for, and for an Oci source the sha256 its disk
/// must have after the pull (its optional `checksum`; a Url's is verified while streaming).
pub fn fetch_of(img: &VMImage) -> Result<(Fetch, Option<String>), (&'static str, &'static str, String)> {
    let name = img.name_any();
    let Some(src) = libvirt_source(img) else {
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
            Ok((
                Fetch::Url {
                    url: src.reference.clone(),
                    checksum: Some(sum.clone()),
                    insecure_no_checksum: false,
                    allow_http: src.reference.starts_with("http://"),
                },
                None,
            ))
        }
        SourceKind::Oci => {
            let r = nubo_image::OciRef::parse(&src.reference)
                .map_err(|e| bad("BadReference", format!("vmimage `{name}`: ref: {e}")))?;
            if r.registry.is_none() {
                return Err(bad(
                    "BadReference",
                    format!(
                        "vmimage `{name}`: Oci ref `{}` names no registry: write it as `registry.example:5000/team/image@sha256:<hex>`",
                        src.reference
                    ),
                ));
            }
            if r.digest.is_none() && !img.spec.allow_mutable_tag {
                return Err(bad("MutableTag", format!("vmimage `{name}`: Oci ref `{}` is not pinned by digest: use `@sha256:<hex>` or set allowMutableTag: true", src.reference)));
            }
            let expected = src
                .checksum
                .as_deref()
                .map(|sum| oci_checksum(&name, sum))
                .transpose()?;
            Ok((Fetch::Oci(r), expected))
        }
    }
}

/// An Oci source's optional `checksum`: the sha256 of the disk as stored (what `nubo image
/// inspect` shows as its digest), compared after the pull (whose bytes the registry's digests
/// verify): a mismatch fails the VMImage.
fn oci_checksum(name: &str, sum: &str) -> Result<String, (&'static str, &'static str, String)> {
    match sum.parse::<nubo_image::Checksum>() {
        Ok(c) if c.to_string().starts_with("sha256:") => Ok(c.to_string()),
        Ok(_) => Err(bad(
            "BadChecksum",
            format!("vmimage `{name}`: an Oci source's checksum is the disk's sha256 (`sha256:<hex>`), or leave it out: the digest in the ref verifies the pull"),
        )),
        Err(e) => Err(bad("BadChecksum", format!("vmimage `{name}`: checksum: {e}"))),
    }
}

/// The registry credentials of an Oci source from the VMImage's `pullSecretRef` (a
/// `kubernetes.io/dockerconfigjson` Secret), as (phase, reason, message) when they cannot be
/// read. Nothing of the Secret's contents reaches a message.
async fn pull_credentials(
    img: &VMImage,
    fetch: &Fetch,
    ctx: &Ctx,
) -> Result<Result<nubo_image::oci::CredentialSource, (&'static str, &'static str, String)>, Error> {
    let mut out = nubo_image::oci::CredentialSource::default();
    let (Some(sref), Fetch::Oci(r)) = (&img.spec.pull_secret_ref, fetch) else {
        return Ok(Ok(out));
    };
    let ns = img.namespace().unwrap_or_default();
    let name = img.name_any();
    let registry = r.registry.clone().unwrap_or_default();
    let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(s) = api.get_opt(&sref.name).await? else {
        return Ok(Err((
            "Pending",
            "PullSecretNotFound",
            format!(
                "vmimage `{name}`: its pullSecretRef `{ns}/{}` does not exist: create it (`kubectl create secret docker-registry`)",
                sref.name
            ),
        )));
    };
    let data = s
        .data
        .as_ref()
        .and_then(|d| d.get(".dockerconfigjson"))
        .map(|b| b.0.as_slice());
    match docker_config_credentials(data, &registry) {
        Ok(c) => {
            out.entries.insert(registry, c);
            Ok(Ok(out))
        }
        Err(why) => Ok(Err((
            "Failed",
            "PullSecretInvalid",
            format!("vmimage `{name}`: pullSecretRef `{ns}/{}` {why}", sref.name),
        ))),
    }
}

/// `registry`'s credentials in a `.dockerconfigjson`, or what is wrong with it (never quoting it).
fn docker_config_credentials(data: Option<&[u8]>, registry: &str) -> Result<nubo_image::oci::Credentials, String> {
    const MAKE: &str = "make it with `kubectl create secret docker-registry`";
    let Some(bytes) = data else {
        return Err(format!("has no `.dockerconfigjson` key: {MAKE}"));
    };
    let Ok(file) = serde_json::from_slice::<nubo_image::oci::AuthFile>(bytes) else {
        return Err(format!("is not JSON of the `{{\"auths\": ...}}` form: {MAKE}"));
    };
    match file.get(registry, std::path::Path::new("-")) {
        Ok(Some(c)) => Ok(c),
        Ok(None) => Err(format!("has no `auths` entry for registry `{registry}`: add one")),
        Err(_) => Err(format!(
            "has an `auths` entry for `{registry}` whose `auth` is not base64 of `user:password`: fix it"
        )),
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
    let (fetch, expected) = match fetch_of(img) {
        Ok(f) => f,
        Err((phase, reason, msg)) => {
            status.phase = Some(phase.into());
            set_condition(&mut status.conditions, generation, "Ready", "False", reason, &msg);
            apply(&api, &name, &status, &ctx.manager).await?;
            return Ok(Action::requeue(ctx.backoff.jittered(Duration::from_secs(300))));
        }
    };
    let credentials = match pull_credentials(img, &fetch, ctx).await? {
        Ok(c) => c,
        Err((phase, reason, msg)) => {
            status.phase = Some(phase.into());
            set_condition(&mut status.conditions, generation, "Ready", "False", reason, &msg);
            if status != old {
                apply(&api, &name, &status, &ctx.manager).await?;
            }
            return Ok(Action::requeue(ctx.backoff.jittered(Duration::from_secs(30))));
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
                    // The engine's own fetcher, with this image's registry credentials.
                    let fetcher = ctx.hosts.fetcher(engine.roots.images(), credentials.clone());
                    let expected = expected.clone();
                    let r = tokio::task::spawn_blocking(move || {
                        let rec = fetcher.fetch(&f, &engine.cancel, &mut |_| {})?;
                        let mismatch = match expected {
                            Some(want) if want != rec.digest => Some(oci_mismatch(&rec, &want)),
                            _ => None,
                        };
                        Ok::<_, EngineError>((rec, mismatch))
                    })
                    .await
                    .map_err(|e| Error::Engine(format!("the fetch task failed: {e}")))?;
                    match r {
                        Ok((_, Some(mismatch))) => {
                            let msg = format!("host `{}`: {mismatch}", h.name);
                            failed.get_or_insert(msg.clone());
                            ps.reason.get_or_insert(msg);
                        }
                        Ok((rec, None)) => {
                            hs.ready = true;
                            status.digest = Some(rec.digest.clone());
                        }
                        Err(e) => {
                            let integrity = e.kind() == nubo_core::ErrorKind::Integrity
                                || std::error::Error::source(&e)
                                    .and_then(|s| s.downcast_ref::<nubo_image::PullError>())
                                    .is_some_and(|p| p.kind() == nubo_core::ErrorKind::Integrity);
                            let msg = format!("host `{}`: {}", h.name, nubo_core::error::chain(&e));
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

/// A pulled disk whose sha256 is not the Oci source's checksum. The bytes are the registry's,
/// verified by its digests, and stay in the host's store (another VMImage may name the same
/// reference); the VMImage is Failed, so no VM takes it into a pool.
fn oci_mismatch(rec: &nubo_image::ImageRecord, want: &str) -> String {
    format!(
        "the disk pulled from `{}` has {}, not the checksum {want} the VMImage gives: fix the checksum or the ref",
        rec.source.url.as_deref().unwrap_or(&rec.reference),
        rec.digest
    )
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

#[cfg(test)]
mod oci_tests {
    use super::*;

    fn image(r: &str, checksum: Option<&str>, mutable: bool) -> VMImage {
        let mut i = VMImage::new(
            "img",
            VMImageSpec {
                sources: vec![ImageSource {
                    provider_class: "libvirt".into(),
                    kind: SourceKind::Oci,
                    reference: r.into(),
                    checksum: checksum.map(Into::into),
                }],
                allow_mutable_tag: mutable,
                pull_secret_ref: None,
            },
        );
        i.metadata.namespace = Some("ns".into());
        i
    }

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn oci_sources_pinned_by_digest_or_allowed_by_tag() {
        let pinned = format!("127.0.0.1:5000/vm/debian@{D}");
        match fetch_of(&image(&pinned, None, false)) {
            Ok((Fetch::Oci(r), None)) => {
                assert_eq!(r.registry.as_deref(), Some("127.0.0.1:5000"));
                assert_eq!(r.digest.as_deref(), Some(D));
            }
            other => panic!("{other:?}"),
        }
        let tag = "127.0.0.1:5000/vm/debian:12";
        let (phase, reason, msg) = fetch_of(&image(tag, None, false)).unwrap_err();
        assert_eq!((phase, reason), ("Failed", "MutableTag"));
        assert!(msg.contains("allowMutableTag"), "{msg}");
        assert!(matches!(fetch_of(&image(tag, None, true)), Ok((Fetch::Oci(_), None))));
    }

    #[test]
    fn oci_refusals_name_the_fix() {
        let (_, reason, msg) = fetch_of(&image(&format!("vm/debian@{D}"), None, false)).unwrap_err();
        assert_eq!(reason, "BadReference");
        assert!(msg.contains("names no registry"), "{msg}");
        let (_, reason, _) = fetch_of(&image("127.0.0.1:5000/Vm/../x@sha256:zz", None, false)).unwrap_err();
        assert_eq!(reason, "BadReference");
        let pinned = format!("127.0.0.1:5000/vm/debian@{D}");
        let sha512 = format!("sha512:{}", "ab".repeat(64));
        let (_, reason, msg) = fetch_of(&image(&pinned, Some(&sha512), false)).unwrap_err();
        assert_eq!(reason, "BadChecksum");
        assert!(msg.contains("sha256"), "{msg}");
        assert!(matches!(fetch_of(&image(&pinned, Some(D), false)), Ok((Fetch::Oci(_), Some(d))) if d == D));
    }

    #[test]
    fn docker_config_secrets() {
        let auth = "bnVibzpzM2NyZXQ="; // base64 of nubo:s3cret
        let json =
            format!(r#"{{"auths":{{"127.0.0.1:5000":{{"username":"nubo","password":"s3cret","auth":"{auth}"}}}}}}"#);
        let c = docker_config_credentials(Some(json.as_bytes()), "127.0.0.1:5000").unwrap();
        assert_eq!((c.username.as_str(), c.password.as_str()), ("nubo", "s3cret"));
        let other = docker_config_credentials(Some(json.as_bytes()), "other:5000").unwrap_err();
        assert!(other.contains("no `auths` entry for registry `other:5000`"), "{other}");
        let missing = docker_config_credentials(None, "x").unwrap_err();
        assert!(missing.contains("kubectl create secret docker-registry"), "{missing}");
        // What is wrong is said without quoting the Secret's bytes.
        for bad in [&b"s3cret-not-json"[..], br#"{"auths":{"x":{"auth":"s3cret!!"}}}"#] {
            let e = docker_config_credentials(Some(bad), "x").unwrap_err();
            assert!(!e.contains("s3cret"), "{e}");
        }
    }
}
