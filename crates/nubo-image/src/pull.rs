//! `pull`: a catalog reference or a URL in, a verified, read-only image in the store out.
//!
//! Order matters for safety and for sharing work: resolve the concrete build, fetch and parse the
//! checksum first (so nothing is downloaded that cannot be verified), then take the per-target lock,
//! look for an image already stored with that checksum, and only then download.

use std::path::PathBuf;
use std::time::SystemTime;

use crate::catalog::{self, CatalogEntry};
use crate::checksum::{parse_sidecar, Algorithm, Checksum};
use crate::digest::StreamHasher;
use crate::download::{fetch, DownloadEvent, Fetch};
use crate::error::PullError;
use crate::http::{self, TlsSettings};
use crate::lock::TargetLock;
use crate::record::{ImageRecord, ImageSource, SourceKind};
use crate::reference::{AnyRef, ImageRef, OciRef};
use crate::store::{Added, ImageStore, Overwrite, StoreError};

/// What to pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullSource {
    /// A catalog reference such as `debian:12` (aliases already canonical).
    Catalog(ImageRef),
    /// Any https URL of a disk image.
    Url(String),
    /// An OCI registry reference: pulled by [`crate::oci::pull`], not by [`pull`].
    Oci(OciRef),
}

impl PullSource {
    /// `REF|URL` as the CLI takes it: anything with `://` is a URL, anything with `/` or `@` an
    /// OCI reference, the rest `name:tag`.
    pub fn parse(s: &str) -> Result<Self, crate::reference::RefError> {
        if s.contains("://") {
            return Ok(PullSource::Url(s.to_owned()));
        }
        Ok(match AnyRef::parse(s)? {
            AnyRef::Local(r) => PullSource::Catalog(r),
            AnyRef::Oci(r) => PullSource::Oci(r),
        })
    }
}

/// A pull, fully resolved by the caller (the CLI reads flags and the environment; this crate
/// reads neither).
#[derive(Debug, Clone)]
pub struct PullRequest {
    pub source: PullSource,
    /// Store the image under this reference instead of the catalog's or the URL's file name.
    pub name: Option<ImageRef>,
    /// Verify against this instead of the published checksum file or `<url>.sha256`.
    pub checksum: Option<Checksum>,
    /// Base URL replacing the distro's own (`--mirror`, `NUBO_MIRROR_<DISTRO>`).
    pub mirror: Option<String>,
    pub tls: TlsSettings,
    pub allow_http: bool,
    /// Accept a URL with no checksum anywhere; the record says `verified: false`.
    pub insecure_no_checksum: bool,
    /// Reconnections after a transient failure before giving up (the partial is kept).
    pub retries: u32,
    /// Re-point an existing tag that has another digest (otherwise refused).
    pub force: bool,
    /// `--timeout`, `--speed-limit`, `--speed-time`.
    pub limits: http::Limits,
    /// Ends the download between reads once tripped ([`PullError::Cancelled`]; the partial
    /// is kept and the same pull resumes it).
    pub cancel: Option<nubo_core::Cancel>,
}

impl PullRequest {
    pub fn new(source: PullSource) -> Self {
        PullRequest {
            source,
            name: None,
            checksum: None,
            mirror: None,
            tls: TlsSettings::default(),
            allow_http: false,
            insecure_no_checksum: false,
            retries: 5,
            force: false,
            limits: http::Limits::default(),
            cancel: None,
        }
    }
}

/// What every pull of one caller shares: each distro's mirror and the TLS trust. The CLI
/// builds it once from its environment and flags (`NUBO_MIRROR_<DISTRO>`, `SSL_CERT_FILE`,
/// `--ca-cert`); a daemon builds its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PullConfig {
    /// (distro, base URL) replacing that distro's own.
    pub mirrors: Vec<(String, String)>,
    pub tls: TlsSettings,
    /// Registry credentials for OCI pulls ([`PullConfig::oci_request`]).
    pub credentials: crate::oci::CredentialSource,
}

impl PullConfig {
    /// A request for `source` under this configuration: a catalog image gets its distro's
    /// mirror (a URL or registry reference names its own host), every pull the TLS trust.
    pub fn request(&self, source: PullSource) -> PullRequest {
        let mut req = PullRequest::new(source);
        req.mirror = match &req.source {
            PullSource::Catalog(r) => self
                .mirrors
                .iter()
                .find(|(d, _)| *d == r.name)
                .map(|(_, url)| url.clone()),
            PullSource::Url(_) | PullSource::Oci(_) => None,
        };
        req.tls = self.tls.clone();
        req
    }

    /// A pull of the registry reference `r` under this configuration: the TLS trust, and the
    /// registry's credentials looked up in [`PullConfig::credentials`] (a bad auth file is an
    /// error naming it).
    pub fn oci_request(&self, r: &crate::OciRef) -> Result<crate::oci::pull::OciPullRequest, crate::oci::OciError> {
        let (registry, _, _) = crate::oci::pull::split(r)?;
        Ok(crate::oci::pull::OciPullRequest {
            reference: r.clone(),
            name: None,
            force: false,
            client: crate::oci::ClientSettings {
                tls: self.tls.clone(),
                insecure: false,
                credentials: self.credentials.lookup(registry)?,
                retries: 5,
                limits: Default::default(),
                cancel: None,
            },
        })
    }
}

/// What a pull reports as it goes, for a progress bar or plain log lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullEvent {
    /// The concrete image URL; `serial` is what a mutable alias (`release/`, `.latest.`) pinned to.
    Resolved {
        url: String,
        serial: Option<String>,
    },
    /// The checksum the download will be verified against, and where it came from.
    Checksum {
        checksum: String,
        from: String,
    },
    /// No checksum exists and the user accepted that: only TLS vouches for the bytes.
    Unverified {
        url: String,
    },
    /// Another pull holds this target's lock; waiting for it.
    Waiting {
        lock: PathBuf,
    },
    /// The store already holds an image with this checksum: nothing downloaded.
    AlreadyPresent {
        digest: String,
    },
    /// The download (or, for a push, the upload) moving: start, progress, retries, restarts.
    /// One set of variants, [`DownloadEvent`]'s, for every transfer.
    Transfer(DownloadEvent),
    Verified {
        checksum: String,
    },
    /// A line worth showing (a registry reference resolved, a blob skipped).
    Note(String),
}

impl From<DownloadEvent> for PullEvent {
    fn from(e: DownloadEvent) -> Self {
        PullEvent::Transfer(e)
    }
}

/// Where the bytes come from and how to check them, once aliases and checksum files are read.
struct Plan {
    reference: ImageRef,
    url: String,
    expected: Option<Checksum>,
    expected_size: Option<u64>,
    checksum_from: Option<String>,
    serial: Option<String>,
    os: Option<String>,
    release: Option<String>,
    default_user: Option<String>,
}

/// Pulls `req` into `store` and returns the stored record and what happened to its tag. See
/// the module doc for the order. An existing tag with another digest is refused before anything
/// is downloaded (when the checksum is known up front) unless `req.force`.
pub fn pull(store: &ImageStore, req: &PullRequest, progress: &mut dyn FnMut(PullEvent)) -> Result<Added, PullError> {
    if let PullSource::Oci(r) = &req.source {
        // OCI references have their own pull (`oci::pull`), with registry auth and manifests.
        return Err(PullError::OciUnsupported(r.to_string()));
    }
    let agent = http::agent(&req.tls, req.allow_http, &req.limits)?;
    let plan = match &req.source {
        PullSource::Catalog(r) => plan_catalog(&agent, req, r, progress)?,
        PullSource::Url(u) => plan_url(&agent, req, u, progress)?,
        PullSource::Oci(r) => return Err(PullError::OciUnsupported(r.to_string())),
    };
    let reference = req.name.clone().unwrap_or_else(|| plan.reference.clone());
    let overwrite = Overwrite::from_force(req.force);
    precheck_tag(store, &reference, plan.expected.as_ref(), overwrite)?;

    let key = target_key(&plan.url, plan.expected.as_ref());
    let tmp = store.tmp_dir();
    let lock_path = tmp.join(format!("{key}.lock"));
    let _lock = TargetLock::acquire(&lock_path, &mut || {
        progress(PullEvent::Waiting {
            lock: lock_path.clone(),
        })
    })
    .map_err(|source| PullError::Lock {
        path: lock_path.clone(),
        source,
    })?;

    if let Some(expected) = &plan.expected {
        if let Some(existing) = stored_with(store, expected)? {
            progress(PullEvent::AlreadyPresent {
                digest: existing.digest.clone(),
            });
            let rec = ImageRecord {
                reference: reference.to_string(),
                created: now(),
                ..existing
            };
            return Ok(store.tag(rec, overwrite)?);
        }
    }

    let part = tmp.join(format!("{key}.part"));
    let f = Fetch {
        agent: &agent,
        url: &plan.url,
        verify_with: plan.expected.as_ref().map(|c| c.algorithm),
        retries: req.retries,
        allow_http: req.allow_http,
        http_host: None,
        auth: None,
        expected_size: plan.expected_size,
        limits: req.limits,
        cancel: req.cancel.as_ref(),
    };
    let (digests, size) = fetch(&f, &part, &mut |e| progress(e.into()))?;
    let fail = |e: PullError| {
        let _ = std::fs::remove_file(&part);
        e
    };
    if let Some(n) = plan.expected_size.filter(|n| *n != size) {
        return Err(fail(PullError::SizeMismatch {
            url: plan.url.clone(),
            expected: n,
            got: size,
        }));
    }
    if let Some(expected) = &plan.expected {
        let actual = digests
            .get(expected.algorithm)
            .cloned()
            .unwrap_or_else(|| digests.sha256.clone());
        if actual != *expected {
            return Err(fail(PullError::Mismatch {
                url: plan.url.clone(),
                expected: expected.to_string(),
                actual: actual.to_string(),
            }));
        }
        progress(PullEvent::Verified {
            checksum: expected.to_string(),
        });
    }
    let info = nubo_disk::inspect(&part).map_err(|source| {
        fail(PullError::Disk {
            url: plan.url.clone(),
            source,
        })
    })?;
    if info.backing.is_some() {
        return Err(fail(PullError::HasBacking { url: plan.url.clone() }));
    }

    let record = ImageRecord {
        reference: reference.to_string(),
        digest: digests.sha256.to_string(),
        path: PathBuf::new(),
        format: info.format.as_str().to_owned(),
        size,
        virtual_size: info.virtual_size,
        cloud_init: true,
        os: plan.os,
        release: plan.release,
        arch: "x86_64".into(),
        firmware: vec![],
        boot: None,
        default_vcpus: DEFAULT_VCPUS,
        default_memory_mib: DEFAULT_MEMORY_MIB,
        default_user: plan.default_user,
        hypervisor: None,
        source: ImageSource {
            url: Some(plan.url),
            checksum: plan.expected.as_ref().map(ToString::to_string),
            serial: plan.serial,
            ..ImageSource::new(SourceKind::Pull)
        },
        verified: plan.expected.is_some(),
        created: now(),
        build_seconds: None,
        labels: Default::default(),
        build: None,
    };
    let _ = plan.checksum_from;
    store.commit(&part, record, overwrite).map_err(|e| fail(e.into()))
}

/// Refuses, before any download, to re-point `reference` at an image other than the one it
/// holds. Only a known checksum can tell; without one, [`ImageStore::commit`] decides after.
fn precheck_tag(
    store: &ImageStore,
    reference: &ImageRef,
    expected: Option<&Checksum>,
    overwrite: Overwrite,
) -> Result<(), PullError> {
    let Some(expected) = expected else { return Ok(()) };
    let want = expected.to_string();
    match store.get(reference) {
        Ok(Some(old))
            if overwrite == Overwrite::Refuse
                && old.digest != want
                && old.source.checksum.as_deref() != Some(want.as_str()) =>
        {
            Err(StoreError::TagExists {
                reference: reference.to_string(),
                digest: old.digest,
                verified: old.verified,
            }
            .into())
        }
        Ok(_) => Ok(()),
        Err(StoreError::Corrupt { .. }) if overwrite == Overwrite::Replace => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Distro cloud images boot comfortably (cloud-init, package caches) with this much.
pub const DEFAULT_VCPUS: u32 = 2;
pub const DEFAULT_MEMORY_MIB: u64 = 2048;

fn plan_catalog(
    agent: &ureq::Agent,
    req: &PullRequest,
    r: &ImageRef,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<Plan, PullError> {
    let entry: &CatalogEntry = catalog::lookup(r).ok_or_else(|| PullError::NotInCatalog {
        reference: r.to_string(),
        known: catalog::references(),
    })?;
    let base = req.mirror.as_deref().unwrap_or(entry.distro.default_base());
    http::check_scheme(base, req.allow_http)?;

    // Pin Ubuntu's mutable `release/` to the newest `release-<serial>/`; a mirror without a
    // listing still works, unpinned.
    let mut serial = match entry.listing_url(base) {
        Some(listing) => {
            http::get_text(agent, &listing, req.allow_http)?.and_then(|html| catalog::newest_ubuntu_serial(&html))
        }
        None => None,
    };
    let loc = entry.location(base, serial.as_deref());
    let (file, expected, expected_size, from) = match &req.checksum {
        Some(c) => (loc.file.clone(), c.clone(), None, "--checksum".to_owned()),
        None => {
            let sums_url = loc.sums_url();
            let bad = |source| PullError::Checksum {
                url: sums_url.clone(),
                source,
            };
            let text = http::get_text(agent, &sums_url, req.allow_http)?.ok_or_else(|| PullError::Status {
                url: sums_url.clone(),
                status: 404,
            })?;
            let list = loc.sums_format.parse(&text).map_err(bad)?;
            let (file, pinned) = entry.pick(&loc, &list).map_err(bad)?;
            serial = serial.or(pinned);
            let sum = list.get(&file).map_err(bad)?.clone();
            (file.clone(), sum, list.size(&file), sums_url.clone())
        }
    };
    let url = format!("{}{file}", loc.dir);
    progress(PullEvent::Resolved {
        url: url.clone(),
        serial: serial.clone(),
    });
    progress(PullEvent::Checksum {
        checksum: expected.to_string(),
        from: from.clone(),
    });
    Ok(Plan {
        reference: entry.reference(),
        url,
        expected: Some(expected),
        expected_size,
        checksum_from: Some(from),
        serial,
        os: Some(entry.distro.name().to_owned()),
        release: Some(entry.release.to_owned()),
        default_user: Some(entry.distro.default_user().to_owned()),
    })
}

fn plan_url(
    agent: &ureq::Agent,
    req: &PullRequest,
    url: &str,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<Plan, PullError> {
    http::check_scheme(url, req.allow_http)?;
    let file = url_file_name(url).ok_or_else(|| PullError::NoName(url.to_owned()))?;
    let reference = match &req.name {
        Some(r) => r.clone(),
        None => name_from_file(file).ok_or_else(|| PullError::NoName(url.to_owned()))?,
    };
    progress(PullEvent::Resolved {
        url: url.to_owned(),
        serial: None,
    });
    let (expected, from) = match &req.checksum {
        Some(c) => (Some(c.clone()), Some("--checksum".to_owned())),
        None => {
            let side = format!("{url}.sha256");
            match http::get_text(agent, &side, req.allow_http)? {
                Some(text) => {
                    let sum = parse_sidecar(&text, Algorithm::Sha256, file).map_err(|source| PullError::Checksum {
                        url: side.clone(),
                        source,
                    })?;
                    (Some(sum), Some(side))
                }
                None if req.insecure_no_checksum => {
                    progress(PullEvent::Unverified { url: url.to_owned() });
                    (None, None)
                }
                None => return Err(PullError::NoChecksum { url: url.to_owned() }),
            }
        }
    };
    if let (Some(c), Some(f)) = (&expected, &from) {
        progress(PullEvent::Checksum {
            checksum: c.to_string(),
            from: f.clone(),
        });
    }
    Ok(Plan {
        reference,
        url: url.to_owned(),
        expected,
        expected_size: None,
        checksum_from: from,
        serial: None,
        os: None,
        release: None,
        default_user: None,
    })
}

/// The last path segment, without query or fragment.
fn url_file_name(url: &str) -> Option<&str> {
    let path = url.split(['?', '#']).next()?;
    let (_, after_scheme) = path.split_once("://")?;
    let (_, p) = after_scheme.split_once('/')?;
    p.rsplit('/').next().filter(|s| !s.is_empty())
}

/// `Foo_Bar-1.2.qcow2` -> `foo_bar-1.2:latest`.
fn name_from_file(file: &str) -> Option<ImageRef> {
    let stem = [".qcow2", ".img", ".raw", ".vmdk", ".vhdx", ".vdi"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))
        .unwrap_or(file);
    let name: String = stem
        .chars()
        .map(|c| c.to_ascii_lowercase())
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    ImageRef::parse(name.trim_start_matches('.')).ok()
}

/// A file name for the target's lock and partial: the same URL verified against the same checksum
/// is the same download, so concurrent pulls share it and a rerun resumes it.
fn target_key(url: &str, expected: Option<&Checksum>) -> String {
    let mut h = StreamHasher::new(None);
    h.update(url.as_bytes());
    h.update(b"\n");
    h.update(expected.map(ToString::to_string).unwrap_or_default().as_bytes());
    h.finish().sha256.hex[..24].to_owned()
}

/// An image already stored and verified against `expected`.
fn stored_with(store: &ImageStore, expected: &Checksum) -> Result<Option<ImageRecord>, PullError> {
    let want = expected.to_string();
    Ok(store.scan()?.records.into_iter().find(|r| {
        (r.source.checksum.as_deref() == Some(want.as_str()) || r.digest == want) && r.verified && r.path.is_file()
    }))
}

/// RFC 3339 UTC, second precision, for records.
pub fn now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_config_oci_request_gets_its_registrys_credentials_and_tls() {
        let mut config = PullConfig {
            tls: TlsSettings {
                ca_bundle: Some("/ca.pem".into()),
                extra_ca: Vec::new(),
            },
            ..Default::default()
        };
        let creds = crate::oci::Credentials {
            username: "u".into(),
            password: "p".into(),
        };
        config
            .credentials
            .entries
            .insert("127.0.0.1:5000".into(), creds.clone());

        let mine = config
            .oci_request(&crate::OciRef::parse("127.0.0.1:5000/team/vm:1").unwrap())
            .unwrap();
        let other = config
            .oci_request(&crate::OciRef::parse("127.0.0.1:5001/team/vm:1").unwrap())
            .unwrap();

        assert_eq!(mine.client.credentials, Some(creds));
        assert_eq!(mine.client.tls, config.tls);
        assert!(!mine.client.insecure);
        assert_eq!(other.client.credentials, None);
    }

    #[test]
    fn pull_config_request_catalog_gets_its_distro_mirror_url_none() {
        let config = PullConfig {
            mirrors: vec![("debian".into(), "http://127.0.0.1:9/debian".into())],
            tls: TlsSettings {
                ca_bundle: Some("/ca.pem".into()),
                extra_ca: Vec::new(),
            },
            ..Default::default()
        };

        let catalog = config.request(PullSource::Catalog(ImageRef::parse("debian:12").unwrap()));
        let other = config.request(PullSource::Catalog(ImageRef::parse("ubuntu:24.04").unwrap()));
        let url = config.request(PullSource::Url("https://127.0.0.1/a.qcow2".into()));

        assert_eq!(catalog.mirror.as_deref(), Some("http://127.0.0.1:9/debian"));
        assert_eq!(other.mirror, None);
        assert_eq!(url.mirror, None);
        assert_eq!(url.tls, config.tls);
    }

    #[test]
    fn pull_source_url_is_url() {
        assert_eq!(
            PullSource::parse("https://h/x.qcow2").unwrap(),
            PullSource::Url("https://h/x.qcow2".into())
        );
    }

    #[test]
    fn pull_source_codename_is_canonical_catalog_ref() {
        let s = PullSource::parse("ubuntu:noble").unwrap();

        assert_eq!(s, PullSource::Catalog(ImageRef::parse("ubuntu:24.04").unwrap()));
    }

    #[test]
    fn pull_source_registry_ref_is_oci() {
        let s = PullSource::parse("registry.example:5000/team/repo:tag").unwrap();

        assert!(matches!(s, PullSource::Oci(_)), "{s:?}");
    }

    #[test]
    fn pull_oci_source_points_at_registry_pull_without_network() {
        let dir = tempfile::tempdir().unwrap();
        let store = ImageStore::open(dir.path()).unwrap();
        let req = PullRequest::new(PullSource::parse("localhost:5000/repo:1").unwrap());

        let err = pull(&store, &req, &mut |_| {}).unwrap_err();

        assert!(matches!(err, PullError::OciUnsupported(_)), "{err:?}");
        assert!(err.to_string().contains("registry client"), "{err}");
    }

    #[test]
    fn url_file_name_strips_query() {
        assert_eq!(url_file_name("https://h/a/b/Img.qcow2?x=1"), Some("Img.qcow2"));
    }

    #[test]
    fn url_file_name_of_directory_is_none() {
        assert_eq!(url_file_name("https://h/a/"), None);
    }

    #[test]
    fn name_from_file_lowercases_and_drops_extension() {
        assert_eq!(
            name_from_file("Rocky-9 Base.qcow2").unwrap().to_string(),
            "rocky-9-base:latest"
        );
    }

    #[test]
    fn target_key_differs_by_checksum() {
        let a: Checksum = format!("sha256:{}", "a".repeat(64)).parse().unwrap();

        assert_ne!(target_key("https://h/x", Some(&a)), target_key("https://h/x", None));
    }
}
