//! The JSON record kept for every image in the store (`nubo image inspect` prints it).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Firmware {
    Bios,
    Efi,
}

/// Kernel and initrd extracted from the image, for direct-kernel boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootFiles {
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    /// Kernel command line that boots this image's root filesystem (without console= arguments,
    /// which the backend adds for its own serial device).
    pub cmdline: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    Bootstrap,
    Pull,
    Import,
    /// Pulled from an OCI registry (`url` is the reference as pulled, `manifest` its digest).
    Oci,
    /// Built from a VMfile by `nubo image build` (the record's `build` says how).
    Build,
    /// Made from a container image by `nubo image from-container` (`url` the reference,
    /// `manifest` the linux/amd64 manifest digest; labels list the config and layer digests).
    Container,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageSource {
    pub kind: SourceKind,
    /// Where the bytes came from: a URL for pulls, a path for imports, the mirror for bootstraps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The checksum the image was verified against (`sha256:<hex>` / `sha512:<hex>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
    /// Concrete serial or release an alias such as Ubuntu's `current` resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// For bootstraps: the key of the recipe (packages, mirror, suite, size) that built it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipe: Option<String>,
    /// For bootstraps: the `SOURCE_DATE_EPOCH` the image's file times are clamped to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_date_epoch: Option<u64>,
    /// For bootstraps: every installed package, name to version. With the recipe, what a rebuild
    /// needs to give the same bytes (the same recipe on a mirror that moved on does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packages: Option<BTreeMap<String, String>>,
    /// For OCI pulls: the manifest digest the reference resolved to when pulled, so a tag
    /// that moves later shows (`nubo image ls-remote` prints where it points now).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest: Option<String>,
    /// For OCI pulls: how the image was made before it was pushed (its annotations' provenance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Box<ImageSource>>,
}

impl ImageSource {
    /// A source of `kind` that records nothing else yet; callers fill in what they know
    /// (`ImageSource { url: Some(..), ..ImageSource::new(SourceKind::Pull) }`).
    pub fn new(kind: SourceKind) -> ImageSource {
        ImageSource {
            kind,
            url: None,
            checksum: None,
            serial: None,
            recipe: None,
            source_date_epoch: None,
            packages: None,
            manifest: None,
            origin: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// `name:tag`, canonical (aliases resolved: `debian:bookworm` is stored as `debian:12`).
    pub reference: String,
    /// `sha256:<hex>` of the stored file's bytes.
    pub digest: String,
    /// The read-only file in the store.
    pub path: PathBuf,
    /// `qcow2` or `raw`.
    pub format: String,
    /// Bytes on disk.
    pub size: u64,
    /// Bytes the guest sees.
    pub virtual_size: u64,
    /// `false` for appliances: no seed is made and personalisation options are refused.
    pub cloud_init: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<String>,
    pub arch: String,
    /// Firmware the image boots with.
    #[serde(default)]
    pub firmware: Vec<Firmware>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<BootFiles>,
    pub default_vcpus: u32,
    pub default_memory_mib: u64,
    /// The account cloud-init creates and gives the SSH keys to (`debian`, `ubuntu`, `rocky`):
    /// the user `nubo vm ssh` logs in as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_user: Option<String>,
    /// Backend the image asks for (`qemu`, `libvirt`, `cloud-hypervisor`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hypervisor: Option<String>,
    pub source: ImageSource,
    /// Whether the bytes were checked against a published or given checksum (always true for
    /// bootstraps, which nubo built itself).
    pub verified: bool,
    /// RFC 3339 UTC.
    pub created: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_seconds: Option<f64>,
    /// A VMfile's `LABEL`s (annotations when pushed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// How `nubo image build` made the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildProvenance>,
}

/// The provenance of a built image: enough to tell what went into it and to rebuild it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildProvenance {
    /// `sha256:<hex>` of the VMfile's bytes.
    pub vmfile_digest: String,
    /// FROM as written, and the digest of the image it resolved to.
    pub from: String,
    pub from_digest: String,
    /// Build arguments in effect (ARG defaults and `--build-arg`s).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub args: BTreeMap<String, String>,
    /// Each step that ran in the guest, in order.
    pub steps: Vec<BuildStep>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BuildStep {
    /// The VMfile line the instruction starts on.
    pub line: usize,
    pub instruction: String,
    /// The step's cache key: its parent's key, the instruction and the content of the files it reads.
    pub key: String,
}

impl ImageRecord {
    pub fn kind_label(&self) -> &'static str {
        if self.cloud_init {
            "cloud-init"
        } else {
            "appliance"
        }
    }
}
