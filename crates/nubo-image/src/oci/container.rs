//! A container image from a registry, for `nubo image from-container`: the reference resolved
//! to the `linux/amd64` manifest (through an index when it names one), its config and layers
//! downloaded into a work directory, each blob's digest and size verified while it streams
//! (the same client and bounds as `image pull`). [`super::unpack`] then applies the layers.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use serde::Deserialize;

use super::client::{Client, ClientSettings};
use super::error::OciError;
use super::manifest::{Descriptor, DOCKER_CONFIG, DOCKER_LIST_V2, INDEX_V1, OCI_CONFIG};
use super::pull::{get_blob, split};
use super::unpack::{Compression, Layer};
use crate::digest::StreamHasher;
use crate::pull::PullEvent;
use crate::reference::OciRef;

/// More layers than any real image has (Docker's own limit is 127).
pub const MAX_LAYERS: usize = 256;
/// An image config: environment, history, diff_ids.
pub const MAX_CONFIG: u64 = 4 << 20;

#[derive(Debug, Clone)]
pub struct ContainerRequest {
    pub reference: OciRef,
    /// A tag is refused unless this is set (a tag can move; a digest names one image).
    pub allow_mutable_tag: bool,
    pub client: ClientSettings,
}

/// What was downloaded, all verified.
#[derive(Debug, Clone)]
pub struct ContainerImage {
    /// `registry/repository`.
    pub repository: String,
    /// The index the reference named, when it named one.
    pub index_digest: Option<String>,
    /// The `linux/amd64` image manifest: the source digest of everything made from it.
    pub manifest_digest: String,
    pub config_digest: String,
    pub layers: Vec<Layer>,
    /// The config's `created`, as given, and in seconds (0 when absent or unreadable).
    pub created: Option<String>,
    pub created_epoch: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnyManifest {
    #[serde(default)]
    media_type: String,
    #[serde(default)]
    manifests: Option<Vec<IndexEntry>>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    artifact_type: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct IndexEntry {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: u64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Deserialize)]
struct Platform {
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
}

#[derive(Deserialize)]
struct Config {
    #[serde(default)]
    created: Option<String>,
    #[serde(default)]
    architecture: String,
    #[serde(default)]
    os: String,
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    #[serde(default)]
    diff_ids: Vec<String>,
}

fn is_sha256(d: &str) -> bool {
    d.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

fn sha256(bytes: &[u8]) -> String {
    let mut h = StreamHasher::new(None);
    h.update(bytes);
    h.finish().sha256.to_string()
}

/// The config's `created` in seconds since the epoch, if it is RFC 3339 (UTC).
pub fn created_epoch(created: Option<&str>) -> u64 {
    created
        .and_then(|c| humantime::parse_rfc3339_weak(c).ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// Downloads the container image `req` names into `work` (an existing, empty directory).
pub fn fetch(
    req: &ContainerRequest,
    work: &Path,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<ContainerImage, OciError> {
    let r = &req.reference;
    let shown = r.to_string();
    let bad = |why: String| OciError::Container {
        reference: shown.clone(),
        why,
    };
    if r.digest.is_none() && !req.allow_mutable_tag {
        return Err(OciError::MutableTag(shown.clone()));
    }
    let (registry, repository, at) = split(r)?;
    let client = Client::new(registry, &req.client)?;
    let not_found = |what: String| OciError::NotFound {
        reference: shown.clone(),
        registry: registry.to_owned(),
        repository: repository.to_owned(),
        what,
    };
    let bytes = client
        .manifest(repository, &at, &shown)?
        .ok_or_else(|| not_found(format!("manifest `{at}`")))?;
    let first_digest = sha256(&bytes);
    if let Some(want) = &r.digest {
        if *want != first_digest {
            return Err(OciError::ManifestMismatch {
                reference: shown.clone(),
                actual: first_digest,
            });
        }
    }
    let parse = |b: &[u8]| {
        serde_json::from_slice::<AnyManifest>(b).map_err(|e| bad(format!("its manifest is not valid JSON ({e})")))
    };
    let mut m = parse(&bytes)?;
    let mut index_digest = None;
    let mut manifest_digest = first_digest.clone();
    if m.media_type == INDEX_V1 || m.media_type == DOCKER_LIST_V2 || m.manifests.is_some() {
        let entries = m.manifests.take().unwrap_or_default();
        let e = entries
            .iter()
            .find(|e| {
                e.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == "amd64")
            })
            .ok_or_else(|| bad("its index has no linux/amd64 image; nubo boots x86_64 VMs".into()))?;
        if !is_sha256(&e.digest) {
            return Err(bad(format!(
                "its index names manifest `{}`, not a sha256 digest",
                e.digest
            )));
        }
        if e.size > super::manifest::MAX_MANIFEST {
            return Err(OciError::ManifestTooBig {
                reference: shown.clone(),
                size: e.size,
                max: super::manifest::MAX_MANIFEST,
            });
        }
        let inner = client
            .manifest(repository, &e.digest, &shown)?
            .ok_or_else(|| not_found(format!("manifest {} (linux/amd64 of the index)", e.digest)))?;
        let got = sha256(&inner);
        if got != e.digest || inner.len() as u64 != e.size {
            return Err(OciError::ManifestMismatch {
                reference: format!("{shown} (linux/amd64 {})", e.digest),
                actual: got,
            });
        }
        let _ = &e.media_type;
        index_digest = Some(first_digest);
        manifest_digest = got;
        m = parse(&inner)?;
    }
    let resolved = format!("{registry}/{repository}@{manifest_digest}");
    progress(PullEvent::Note(if resolved == shown {
        format!("{shown} (linux/amd64)")
    } else {
        format!("{shown} is {resolved} (linux/amd64)")
    }));
    let config = m.config.ok_or_else(|| bad("its manifest has no config".into()))?;
    if m.artifact_type.is_some() || (config.media_type != OCI_CONFIG && config.media_type != DOCKER_CONFIG) {
        return Err(bad(format!(
            "it is not a container image (config {}); `nubo image pull` takes nubo VM images",
            config.media_type
        )));
    }
    let descs = m.layers.unwrap_or_default();
    if descs.is_empty() || descs.len() > MAX_LAYERS {
        return Err(bad(format!(
            "it has {} layers; a container image has 1 to {MAX_LAYERS}",
            descs.len()
        )));
    }
    for d in std::iter::once(&config).chain(&descs) {
        if !is_sha256(&d.digest) {
            return Err(bad(format!("blob `{}` is not named by a sha256 digest", d.digest)));
        }
    }
    for d in &descs {
        if Compression::of_media_type(&d.media_type).is_none() {
            return Err(bad(format!(
                "layer {} is `{}`, not a tar layer nubo reads (tar, tar+gzip, tar+zstd)",
                d.digest, d.media_type
            )));
        }
    }
    if config.size > MAX_CONFIG {
        return Err(bad(format!(
            "its config is {} bytes, more than the {MAX_CONFIG} nubo reads",
            config.size
        )));
    }
    let cpath = work.join("config.json");
    get_blob(&client, repository, &config, "config", &cpath, &shown, progress)?;
    let cbytes = fs::read(&cpath).map_err(|source| OciError::Io {
        path: cpath.clone(),
        source,
    })?;
    let cfg: Config =
        serde_json::from_slice(&cbytes).map_err(|e| bad(format!("its config is not an image config ({e})")))?;
    if cfg.os != "linux" || cfg.architecture != "amd64" {
        return Err(bad(format!(
            "it is a {}/{} image; nubo boots linux/amd64",
            cfg.os, cfg.architecture
        )));
    }
    if cfg.rootfs.diff_ids.len() != descs.len() {
        return Err(bad(format!(
            "its config lists {} diff_ids for {} layers",
            cfg.rootfs.diff_ids.len(),
            descs.len()
        )));
    }
    let mut layers = Vec::new();
    for (i, (d, diff)) in descs.iter().zip(&cfg.rootfs.diff_ids).enumerate() {
        if !is_sha256(diff) {
            return Err(bad(format!("diff_id `{diff}` is not a sha256 digest")));
        }
        let path = work.join(format!("layer-{i}"));
        get_blob(&client, repository, d, "layer", &path, &shown, progress)?;
        layers.push(Layer {
            path,
            media_type: d.media_type.clone(),
            digest: d.digest.clone(),
            size: d.size,
            diff_id: Some(diff.clone()),
        });
    }
    Ok(ContainerImage {
        repository: format!("{registry}/{repository}"),
        index_digest,
        manifest_digest,
        config_digest: config.digest.clone(),
        layers,
        created_epoch: created_epoch(cfg.created.as_deref()),
        created: cfg.created,
    })
}

/// The provenance labels recorded on the stored image.
pub fn provenance(img: &ContainerImage) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("io.nubo.source.container.manifest".into(), img.manifest_digest.clone());
    if let Some(i) = &img.index_digest {
        m.insert("io.nubo.source.container.index".into(), i.clone());
    }
    m.insert("io.nubo.source.container.config".into(), img.config_digest.clone());
    m.insert(
        "io.nubo.source.container.layers".into(),
        img.layers
            .iter()
            .map(|l| l.digest.as_str())
            .collect::<Vec<_>>()
            .join(","),
    );
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_epoch_reads_rfc3339_and_defaults_to_zero() {
        assert_eq!(created_epoch(Some("2024-06-01T00:00:00Z")), 1_717_200_000);
        assert_eq!(created_epoch(Some("2024-06-01T00:00:00.123456789Z")), 1_717_200_000);
        assert_eq!(created_epoch(Some("yesterday")), 0);
        assert_eq!(created_epoch(None), 0);
    }

    #[test]
    fn is_sha256_refuses_traversal_and_uppercase() {
        assert!(is_sha256(&format!("sha256:{}", "a".repeat(64))));
        assert!(!is_sha256("sha256:../../etc/passwd"));
        assert!(!is_sha256(&format!("sha256:{}", "A".repeat(64))));
        assert!(!is_sha256(&format!("sha512:{}", "a".repeat(64))));
    }
}
