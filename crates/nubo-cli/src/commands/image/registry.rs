//! `nubo image pull REGISTRY/REPO`, `push`, `ls-remote`: the store and OCI registries.

use anyhow::Context;
use nubo_image::oci::{self, manifest, Client, OciPullRequest, PushRequest};
use nubo_image::{Added, ImageRecord, ImageStore, OciRef, PullEvent};
use serde::Serialize;

use super::progress::Reporter;
use super::{human, open_store, parse_ref, report_change, stored_ref};
use crate::cli::image::{LsRemoteArgs, PullArgs, PushArgs};
use crate::commands::registry::client_settings;
use crate::output::{print_json, print_table, Format as OutputFormat};
use crate::settings::Settings;

fn oci_ref(s: &str) -> anyhow::Result<OciRef> {
    match nubo_image::AnyRef::parse(s)? {
        nubo_image::AnyRef::Oci(r) if r.registry.is_some() => Ok(r),
        _ => Err(oci::OciError::NoRegistry(s.to_owned()).into()),
    }
}

fn registry_of(r: &OciRef) -> &str {
    r.registry.as_deref().unwrap_or_default()
}

pub fn pull(a: &PullArgs, r: &OciRef, settings: &Settings) -> anyhow::Result<()> {
    if a.checksum.is_some() || a.mirror.is_some() || a.allow_http || a.insecure_no_checksum {
        anyhow::bail!(
            "--checksum, --mirror, --allow-http and --insecure-no-checksum are for catalog and URL pulls: a registry pull is verified by the manifest's digests (pin one with `REPO@sha256:<hex>`) and uses --insecure-registry for plain http"
        );
    }
    oci_ref(&r.to_string())?;
    let req = OciPullRequest {
        reference: r.clone(),
        name: a.name.as_deref().map(parse_ref).transpose()?,
        force: a.force,
        client: client_settings(
            registry_of(r),
            &a.ca_cert,
            a.insecure_registry,
            a.limits.limits(),
            settings,
        )?,
    };
    let added = run(&req, settings)?;
    let rec = &added.record;
    println!(
        "{} {} ({}, verified sha256, from {}@{})",
        rec.reference,
        rec.digest,
        human(rec.size),
        r,
        rec.source.manifest.as_deref().unwrap_or("?")
    );
    report_change(&added);
    Ok(())
}

fn run(req: &OciPullRequest, settings: &Settings) -> anyhow::Result<Added> {
    let store = open_store(settings)?;
    let mut reporter = Reporter::new(settings.stderr_tty);
    let r = oci::pull(&store, req, &mut |e: PullEvent| reporter.event(e));
    reporter.finish();
    Ok(r?)
}

/// For the engine (`vm create --image REGISTRY/REPO:TAG`): the image already pulled from that
/// reference, or a pull of it (trusting the system CAs or SSL_CERT_FILE, plus `vm create
/// --ca-cert`, with stored credentials).
pub(crate) fn pull_oci(r: &OciRef, settings: &Settings) -> anyhow::Result<ImageRecord> {
    let store: ImageStore = open_store(settings)?;
    if let Some(rec) = oci::stored(&store, r)? {
        return Ok(rec);
    }
    let req = OciPullRequest {
        reference: r.clone(),
        name: None,
        force: false,
        client: client_settings(registry_of(r), &settings.extra_ca, false, Default::default(), settings)?,
    };
    Ok(run(&req, settings)?.record)
}

pub fn push(a: &PushArgs, settings: &Settings) -> anyhow::Result<()> {
    let target = oci_ref(&a.target)?;
    let req = PushRequest {
        image: stored_ref(&a.image)?,
        target: target.clone(),
        client: client_settings(
            registry_of(&target),
            &a.ca_cert,
            a.insecure_registry,
            a.limits.limits(),
            settings,
        )?,
        compress: a.compress,
    };
    let store = open_store(settings)?;
    let mut reporter = Reporter::new(settings.stderr_tty);
    let r = oci::push(&store, &req, &mut |e: PullEvent| reporter.event(e));
    reporter.finish();
    let pushed = r.with_context(|| format!("pushing {} to {target}", a.image))?;
    eprintln!(
        "pushed {} ({} blob(s) uploaded, {} already there)",
        pushed.tagged, pushed.uploaded, pushed.skipped
    );
    println!("{}", pushed.pinned);
    Ok(())
}

#[derive(Debug, Serialize)]
struct RemoteTag {
    tag: String,
    digest: Option<String>,
    /// `nubo-vm`, `container-image`, `index`, `invalid-tag` (listed escaped, not fetched), or what else it is.
    kind: String,
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    os: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    release: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<String>,
}

pub fn ls_remote(a: &LsRemoteArgs, settings: &Settings) -> anyhow::Result<()> {
    let r = oci_ref(&a.repository)?;
    if r.tag.is_some() || r.digest.is_some() {
        anyhow::bail!(
            "`{}`: ls-remote takes a repository (`REGISTRY/REPO`), without a tag or digest",
            a.repository
        );
    }
    let registry = registry_of(&r);
    let client = Client::new(
        registry,
        &client_settings(registry, &a.ca_cert, a.insecure_registry, a.limits.limits(), settings)?,
    )?;
    let shown = r.to_string();
    let mut rows = Vec::new();
    for tag in client.tags(&r.repository, &shown)? {
        if !nubo_image::reference::is_tag(&tag) {
            // Not a tag by the spec's grammar (a newline, a `/`): listed as the registry
            // gave it, escaped, and never put into a URL.
            rows.push(RemoteTag {
                tag,
                digest: None,
                kind: "invalid-tag".into(),
                size: None,
                os: None,
                release: None,
                created: None,
            });
            continue;
        }
        let bytes = client.manifest(&r.repository, &tag, &format!("{shown}:{tag}"))?;
        let row = match bytes {
            None => RemoteTag {
                tag,
                digest: None,
                kind: "missing".into(),
                size: None,
                os: None,
                release: None,
                created: None,
            },
            Some(b) => {
                let digest = Some(nubo_image::digest::sha256_bytes(&b));
                match manifest::classify(&b) {
                    Ok(art) => RemoteTag {
                        tag,
                        digest,
                        kind: "nubo-vm".into(),
                        size: Some(
                            art.blobs.disk.size
                                + art.blobs.kernel.map_or(0, |k| k.size)
                                + art.blobs.initrd.map_or(0, |i| i.size),
                        ),
                        os: art.meta.os,
                        release: art.meta.release,
                        created: art.meta.created,
                    },
                    Err(e) => RemoteTag {
                        tag,
                        digest,
                        kind: match e {
                            manifest::ManifestError::Container { .. } => "container-image".into(),
                            manifest::ManifestError::Index { .. } => "index".into(),
                            _ => "other".into(),
                        },
                        size: None,
                        os: None,
                        release: None,
                        created: None,
                    },
                }
            }
        };
        rows.push(row);
    }
    if a.output == OutputFormat::Json {
        return print_json(&rows);
    }
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|t| {
            vec![
                t.tag.clone(),
                t.kind.clone(),
                t.digest.clone().unwrap_or_else(|| "-".into()),
                t.size.map(human).unwrap_or_else(|| "-".into()),
                match (&t.os, &t.release) {
                    (Some(o), Some(r)) => format!("{o} {r}"),
                    (Some(o), None) => o.clone(),
                    _ => "-".into(),
                },
            ]
        })
        .collect();
    print_table(&["TAG", "TYPE", "DIGEST", "SIZE", "OS"], &table)?;
    Ok(())
}
