//! The nubo VM artifact as an OCI image manifest (v1.1), pure: render from an image record,
//! classify and check what a registry returns, and restore the record's metadata from the
//! manifest's annotations. Golden-tested; no I/O.
//!
//! ```text
//! mediaType     application/vnd.oci.image.manifest.v1+json
//! artifactType  application/vnd.nubo.vm.v1
//! config        application/vnd.oci.empty.v1+json  (the 2-byte `{}`)
//! layers[0]     application/vnd.nubo.vm.disk.qcow2.v1  (or .raw.v1): the disk, as stored;
//!               with `push --compress`, ...disk.qcow2.v1+zstd: the disk as one zstd frame, its
//!               digest and size over the compressed bytes, the disk's own in the annotations
//! layers[1..]   application/vnd.nubo.vm.kernel.v1, application/vnd.nubo.vm.initrd.v1 when recorded
//! annotations   io.nubo.image.* (what `nubo image inspect` shows) + org.opencontainers.image.*
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::{BootFiles, Firmware, ImageRecord, ImageSource, SourceKind};

pub const MANIFEST_V1: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_V1: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST_V2: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST_V2: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST_V1: &str = "application/vnd.docker.distribution.manifest.v1+prettyjws";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const EMPTY: &str = "application/vnd.oci.empty.v1+json";
/// The empty JSON object `{}` every artifact without a config points at (OCI image spec 1.1).
pub const EMPTY_BYTES: &[u8] = b"{}";
pub const EMPTY_DIGEST: &str = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

/// What a nubo VM image is, to a registry.
pub const ARTIFACT_TYPE: &str = "application/vnd.nubo.vm.v1";
pub const DISK_QCOW2: &str = "application/vnd.nubo.vm.disk.qcow2.v1";
pub const DISK_RAW: &str = "application/vnd.nubo.vm.disk.raw.v1";
/// The same disks zstd-compressed (`nubo image push --compress`): OCI's `+zstd` suffix.
pub const DISK_QCOW2_ZSTD: &str = "application/vnd.nubo.vm.disk.qcow2.v1+zstd";
pub const DISK_RAW_ZSTD: &str = "application/vnd.nubo.vm.disk.raw.v1+zstd";
/// A bootable ISO (`image from-container --format iso`).
pub const DISK_ISO: &str = "application/vnd.nubo.vm.disk.iso.v1";
pub const DISK_ISO_ZSTD: &str = "application/vnd.nubo.vm.disk.iso.v1+zstd";
pub const KERNEL: &str = "application/vnd.nubo.vm.kernel.v1";
pub const INITRD: &str = "application/vnd.nubo.vm.initrd.v1";

/// Every media type a pull asks for, so the registry answers with what it has and nubo can say
/// what it is.
pub const ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json, application/vnd.docker.distribution.manifest.list.v2+json";

/// The distribution spec asks registries to accept manifests up to 4 MiB; a bigger answer is not
/// a manifest and is not read.
pub const MAX_MANIFEST: u64 = 4 << 20;

/// Longest annotation value nubo restores (a kernel command line, a URL); longer is refused.
const MAX_VALUE: usize = 4096;
/// A kernel or initrd bigger than this is not one.
pub const MAX_BOOT_FILE: u64 = 1 << 30;

pub mod key {
    pub const TYPE: &str = "io.nubo.image.type";
    pub const FORMAT: &str = "io.nubo.image.disk.format";
    pub const DISK_DIGEST: &str = "io.nubo.image.disk.digest";
    pub const VIRTUAL_SIZE: &str = "io.nubo.image.disk.virtual-size";
    /// The disk file's size once decompressed: set (and required) for a compressed disk layer,
    /// it bounds the decompression.
    pub const DISK_SIZE: &str = "io.nubo.image.disk.size";
    pub const VCPUS: &str = "io.nubo.image.default.vcpus";
    pub const MEMORY_MIB: &str = "io.nubo.image.default.memory-mib";
    pub const USER: &str = "io.nubo.image.default.user";
    pub const HYPERVISOR: &str = "io.nubo.image.hypervisor";
    pub const OS: &str = "io.nubo.image.os";
    pub const RELEASE: &str = "io.nubo.image.release";
    pub const ARCH: &str = "io.nubo.image.arch";
    pub const FIRMWARE: &str = "io.nubo.image.firmware";
    pub const CMDLINE: &str = "io.nubo.image.kernel.cmdline";
    pub const SOURCE_KIND: &str = "io.nubo.image.source.kind";
    pub const SOURCE_URL: &str = "io.nubo.image.source.url";
    pub const SOURCE_CHECKSUM: &str = "io.nubo.image.source.checksum";
    pub const SOURCE_SERIAL: &str = "io.nubo.image.source.serial";
    pub const SOURCE_RECIPE: &str = "io.nubo.image.source.recipe";
    pub const VERIFIED: &str = "io.nubo.image.verified";
    pub const CREATED: &str = "org.opencontainers.image.created";
    pub const TITLE: &str = "org.opencontainers.image.title";
    pub const VERSION: &str = "org.opencontainers.image.version";
    pub const DESCRIPTION: &str = "org.opencontainers.image.description";
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    pub fn new(media_type: &str, digest: &str, size: u64) -> Self {
        Descriptor {
            media_type: media_type.to_owned(),
            digest: digest.to_owned(),
            size,
            annotations: BTreeMap::new(),
        }
    }

    fn titled(mut self, title: &str) -> Self {
        self.annotations.insert(key::TITLE.into(), title.into());
        self
    }

    pub fn empty_config() -> Self {
        Descriptor::new(EMPTY, EMPTY_DIGEST, EMPTY_BYTES.len() as u64)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The blobs of a VM image, with their digests and sizes known (the caller hashed them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blobs {
    pub disk: Descriptor,
    pub kernel: Option<Descriptor>,
    pub initrd: Option<Descriptor>,
}

/// The manifest describing `record` whose blobs are `blobs`. The same inputs give the same
/// bytes ([`Manifest::to_bytes`]), so pushing an unchanged image pushes the same digest.
pub fn render(record: &ImageRecord, blobs: &Blobs) -> Manifest {
    // A VMfile's LABELs first, so nubo's own keys always win over a label of the same name.
    let mut a: BTreeMap<String, String> = record.labels.clone();
    let mut put = |k: &str, v: String| {
        a.insert(k.to_owned(), v);
    };
    put(key::TYPE, record.kind_label().to_owned());
    put(key::FORMAT, record.format.clone());
    put(key::DISK_DIGEST, record.digest.clone());
    put(key::VIRTUAL_SIZE, record.virtual_size.to_string());
    put(key::VCPUS, record.default_vcpus.to_string());
    put(key::MEMORY_MIB, record.default_memory_mib.to_string());
    put(key::ARCH, record.arch.clone());
    put(key::CREATED, record.created.clone());
    put(key::TITLE, record.reference.clone());
    put(key::VERIFIED, record.verified.to_string());
    put(
        key::DESCRIPTION,
        format!("nubo VM image ({}, {})", record.kind_label(), record.format),
    );
    if let Some(v) = record.reference.split_once(':').map(|(_, t)| t) {
        put(key::VERSION, v.to_owned());
    }
    let firmware: Vec<&str> = record
        .firmware
        .iter()
        .map(|f| match f {
            Firmware::Bios => "bios",
            Firmware::Efi => "efi",
        })
        .collect();
    if !firmware.is_empty() {
        put(key::FIRMWARE, firmware.join(","));
    }
    let optional = [
        (key::USER, &record.default_user),
        (key::HYPERVISOR, &record.hypervisor),
        (key::OS, &record.os),
        (key::RELEASE, &record.release),
    ];
    for (k, v) in optional {
        if let Some(v) = v {
            put(k, v.clone());
        }
    }
    if let Some(b) = &record.boot {
        put(key::CMDLINE, b.cmdline.clone());
    }
    // Provenance: how the image was made, as the record says (a pulled image keeps the origin).
    let origin = record.source.origin.as_deref().unwrap_or(&record.source);
    put(key::SOURCE_KIND, kind_name(origin.kind).to_owned());
    for (k, v) in [
        (key::SOURCE_URL, &origin.url),
        (key::SOURCE_CHECKSUM, &origin.checksum),
        (key::SOURCE_SERIAL, &origin.serial),
        (key::SOURCE_RECIPE, &origin.recipe),
    ] {
        if let Some(v) = v {
            put(k, v.clone());
        }
    }

    let compressed = is_compressed(&blobs.disk.media_type);
    if compressed {
        put(key::DISK_SIZE, record.size.to_string());
    }
    let disk_name = if compressed {
        format!("disk.{}.zst", record.format)
    } else {
        format!("disk.{}", record.format)
    };
    let mut layers = vec![blobs.disk.clone().titled(&disk_name)];
    if let Some(k) = &blobs.kernel {
        layers.push(k.clone().titled("vmlinuz"));
    }
    if let Some(i) = &blobs.initrd {
        layers.push(i.clone().titled("initrd.img"));
    }
    Manifest {
        schema_version: 2,
        media_type: MANIFEST_V1.to_owned(),
        artifact_type: Some(ARTIFACT_TYPE.to_owned()),
        config: Descriptor::empty_config(),
        layers,
        annotations: a,
    }
}

/// The disk layer's media type for a store format, zstd-compressed or not.
pub fn disk_media_type(format: &str, compressed: bool) -> Option<&'static str> {
    match (format, compressed) {
        ("qcow2", false) => Some(DISK_QCOW2),
        ("raw", false) => Some(DISK_RAW),
        ("qcow2", true) => Some(DISK_QCOW2_ZSTD),
        ("raw", true) => Some(DISK_RAW_ZSTD),
        ("iso", false) => Some(DISK_ISO),
        ("iso", true) => Some(DISK_ISO_ZSTD),
        _ => None,
    }
}

/// Whether a disk layer's media type says zstd.
pub fn is_compressed(media_type: &str) -> bool {
    media_type.ends_with("+zstd")
}

fn kind_name(k: SourceKind) -> &'static str {
    match k {
        SourceKind::Bootstrap => "bootstrap",
        SourceKind::Pull => "pull",
        SourceKind::Import => "import",
        SourceKind::Oci => "oci",
        SourceKind::Build => "build",
        SourceKind::Container => "container",
    }
}

impl Manifest {
    /// Compact JSON: the bytes pushed and digested.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a manifest always serialises")
    }
}

/// Why a manifest is not a nubo VM image nubo can pull.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("is not a JSON manifest ({0})")]
    NotJson(String),
    #[error("is a manifest list (an index of {count} manifests, one per platform): nubo VM images are single manifests; pull one entry by its digest, or push a nubo image with `nubo image push`")]
    Index { count: usize },
    #[error("is a container image ({config}), not a nubo VM image (artifactType {ARTIFACT_TYPE}): run it with a container runtime, or push a VM image with `nubo image push`")]
    Container { config: String },
    #[error("is an OCI artifact of type `{0}`, not a nubo VM image ({ARTIFACT_TYPE})")]
    OtherArtifact(String),
    #[error("has media type `{0}`, which is not an OCI image manifest")]
    MediaType(String),
    #[error("is a nubo VM image that is malformed: {0}")]
    Malformed(String),
}

impl ManifestError {
    pub fn kind(&self) -> nubo_core::ErrorKind {
        match self {
            ManifestError::NotJson(_) | ManifestError::Malformed(_) => nubo_core::ErrorKind::Integrity,
            _ => nubo_core::ErrorKind::Unsupported,
        }
    }
}

/// A nubo VM image as read from a registry: its blobs (checked to be well formed) and the
/// metadata from its annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct VmArtifact {
    pub blobs: Blobs,
    pub format: String,
    pub meta: Meta,
    /// The disk as stored: its sha256 (the store's name for it) and, for a compressed layer,
    /// the size decompression must reach and may not pass. The layer's own digest and size
    /// (`blobs.disk`) are the compressed bytes'.
    pub disk: StoredDisk,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDisk {
    pub digest: String,
    /// `Some` exactly when the layer is zstd-compressed.
    pub compressed_to: Option<u64>,
}

impl VmArtifact {
    /// The disk file's size once stored.
    pub fn disk_size(&self) -> u64 {
        self.disk.compressed_to.unwrap_or(self.blobs.disk.size)
    }
}

/// What the annotations carry for the record.
#[derive(Debug, Clone, PartialEq)]
pub struct Meta {
    pub cloud_init: bool,
    pub virtual_size: Option<u64>,
    pub default_vcpus: Option<u32>,
    pub default_memory_mib: Option<u64>,
    pub default_user: Option<String>,
    pub hypervisor: Option<String>,
    pub os: Option<String>,
    pub release: Option<String>,
    pub arch: Option<String>,
    pub firmware: Vec<Firmware>,
    pub cmdline: Option<String>,
    pub created: Option<String>,
    pub origin: Option<ImageSource>,
}

/// Reads `bytes` (at most [`MAX_MANIFEST`], the caller bounded the read) as a nubo VM image, or
/// says what it is instead.
pub fn classify(bytes: &[u8]) -> Result<VmArtifact, ManifestError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| ManifestError::NotJson(e.to_string()))?;
    let media_type = value.get("mediaType").and_then(|v| v.as_str()).unwrap_or_default();
    if let Some(list) = value.get("manifests").and_then(|m| m.as_array()) {
        return Err(ManifestError::Index { count: list.len() });
    }
    if media_type == INDEX_V1 || media_type == DOCKER_LIST_V2 {
        return Err(ManifestError::Index { count: 0 });
    }
    if media_type == DOCKER_MANIFEST_V1 || value.get("fsLayers").is_some() {
        return Err(ManifestError::Container {
            config: "a Docker schema 1 manifest".into(),
        });
    }
    if !media_type.is_empty() && media_type != MANIFEST_V1 && media_type != DOCKER_MANIFEST_V2 {
        return Err(ManifestError::MediaType(shown(media_type)));
    }
    let m: Manifest = serde_json::from_value(value).map_err(|e| ManifestError::Malformed(e.to_string()))?;
    // OCI 1.1: without artifactType, the config's media type is the artifact's type.
    let artifact = m.artifact_type.clone().unwrap_or_else(|| m.config.media_type.clone());
    if artifact != ARTIFACT_TYPE {
        return Err(match artifact.as_str() {
            OCI_CONFIG | DOCKER_CONFIG => ManifestError::Container {
                config: format!("config {artifact}"),
            },
            other => ManifestError::OtherArtifact(shown(other)),
        });
    }
    if m.schema_version != 2 {
        return Err(ManifestError::Malformed(format!(
            "schemaVersion is {}, not 2",
            m.schema_version
        )));
    }
    let malformed = |s: String| ManifestError::Malformed(s);
    check_descriptor(&m.config).map_err(malformed)?;
    let mut disk = None;
    let mut kernel = None;
    let mut initrd = None;
    for l in &m.layers {
        check_descriptor(l).map_err(malformed)?;
        let slot = match l.media_type.as_str() {
            DISK_QCOW2 | DISK_RAW | DISK_QCOW2_ZSTD | DISK_RAW_ZSTD | DISK_ISO | DISK_ISO_ZSTD => &mut disk,
            KERNEL => &mut kernel,
            INITRD => &mut initrd,
            other => {
                return Err(malformed(format!(
                    "layer of unknown media type `{}` (this nubo reads {DISK_QCOW2}, {DISK_RAW}, {DISK_ISO}, their +zstd forms, {KERNEL}, {INITRD}; a newer nubo may have pushed it)",
                    shown(other)
                )))
            }
        };
        if slot.replace(l.clone()).is_some() {
            return Err(malformed(format!("two layers of media type {}", l.media_type)));
        }
        if matches!(l.media_type.as_str(), KERNEL | INITRD) && l.size > MAX_BOOT_FILE {
            return Err(malformed(format!(
                "its {} layer claims {} bytes (at most {MAX_BOOT_FILE})",
                l.media_type, l.size
            )));
        }
    }
    let disk = disk.ok_or_else(|| malformed("no disk layer".into()))?;
    if initrd.is_some() && kernel.is_none() {
        return Err(malformed("an initrd layer without a kernel layer".into()));
    }
    let compressed = is_compressed(&disk.media_type);
    let format = if disk.media_type.starts_with(DISK_QCOW2) {
        "qcow2"
    } else if disk.media_type.starts_with(DISK_ISO) {
        "iso"
    } else {
        "raw"
    }
    .to_owned();
    let meta = meta(&m.annotations).map_err(malformed)?;
    let stored = if compressed {
        let digest = m
            .annotations
            .get(key::DISK_DIGEST)
            .ok_or_else(|| malformed(format!("a compressed disk layer without {}", key::DISK_DIGEST)))?;
        crate::store::digest_hex(digest).map_err(|_| {
            malformed(format!(
                "annotation {} is `{}`, not sha256:<64 lowercase hex digits>",
                key::DISK_DIGEST,
                shown(digest)
            ))
        })?;
        let size = m
            .annotations
            .get(key::DISK_SIZE)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| malformed(format!("a compressed disk layer without a numeric {}", key::DISK_SIZE)))?;
        // A disk file is its virtual size plus metadata (qcow2's tables are ~1/8000 of it): an
        // annotation far beyond would let decompression fill the host's disk.
        if let Some(v) = meta.virtual_size {
            let most = v.saturating_add(v / 16).saturating_add(64 << 20);
            if size > most {
                return Err(malformed(format!(
                    "annotation {} says {size} bytes, more than a disk of virtual size {v} can be ({most})",
                    key::DISK_SIZE
                )));
            }
        }
        StoredDisk {
            digest: digest.clone(),
            compressed_to: Some(size),
        }
    } else {
        StoredDisk {
            digest: disk.digest.clone(),
            compressed_to: None,
        }
    };
    if let Some(d) = m.annotations.get(key::DISK_DIGEST) {
        if *d != stored.digest {
            return Err(malformed(format!(
                "annotation {} says {} but the disk layer is {}",
                key::DISK_DIGEST,
                shown(d),
                disk.digest
            )));
        }
    }
    if let Some(f) = m.annotations.get(key::FORMAT) {
        if *f != format {
            return Err(malformed(format!(
                "annotation {} says `{}` but the disk layer is {}",
                key::FORMAT,
                shown(f),
                disk.media_type
            )));
        }
    }
    if kernel.is_some() && meta.cmdline.is_none() {
        return Err(malformed(format!("a kernel layer without {}", key::CMDLINE)));
    }
    Ok(VmArtifact {
        blobs: Blobs { disk, kernel, initrd },
        format,
        meta,
        disk: stored,
    })
}

/// nubo verifies sha256 only; any other algorithm, or a digest that is not one, is refused.
fn check_descriptor(d: &Descriptor) -> Result<(), String> {
    crate::store::digest_hex(&d.digest)
        .map(drop)
        .map_err(|_| format!("digest `{}` is not sha256:<64 lowercase hex digits>", shown(&d.digest)))
}

fn meta(a: &BTreeMap<String, String>) -> Result<Meta, String> {
    for (k, v) in a {
        if k.starts_with("io.nubo.") && v.len() > MAX_VALUE {
            return Err(format!(
                "annotation {} is {} bytes (at most {MAX_VALUE})",
                shown(k),
                v.len()
            ));
        }
    }
    let text = |k: &str| a.get(k).map(|v| nubo_core::file::escape_control(v));
    fn num<T: std::str::FromStr>(a: &BTreeMap<String, String>, k: &str) -> Result<Option<T>, String> {
        a.get(k)
            .map(|v| {
                v.parse()
                    .map_err(|_| format!("annotation {k} is `{}`, not a number", shown(v)))
            })
            .transpose()
    }
    let cloud_init = match a.get(key::TYPE).map(String::as_str) {
        None | Some("cloud-init") => true,
        Some("appliance") => false,
        Some(other) => {
            return Err(format!(
                "annotation {} is `{}`, not cloud-init or appliance",
                key::TYPE,
                shown(other)
            ))
        }
    };
    let mut firmware = Vec::new();
    for f in a.get(key::FIRMWARE).map(|s| s.split(',')).into_iter().flatten() {
        firmware.push(match f {
            "bios" => Firmware::Bios,
            "efi" => Firmware::Efi,
            other => {
                return Err(format!(
                    "annotation {} names firmware `{}`",
                    key::FIRMWARE,
                    shown(other)
                ))
            }
        });
    }
    let vcpus: Option<u32> = num(a, key::VCPUS)?;
    let memory: Option<u64> = num(a, key::MEMORY_MIB)?;
    if vcpus == Some(0) || memory == Some(0) {
        return Err("a default of 0 vcpus or 0 MiB of memory".into());
    }
    let origin = match a.get(key::SOURCE_KIND).map(String::as_str) {
        None => None,
        Some(k) => Some(ImageSource {
            kind: match k {
                "bootstrap" => SourceKind::Bootstrap,
                "pull" => SourceKind::Pull,
                "import" => SourceKind::Import,
                "oci" => SourceKind::Oci,
                "build" => SourceKind::Build,
                "container" => SourceKind::Container,
                other => return Err(format!("annotation {} is `{}`", key::SOURCE_KIND, shown(other))),
            },
            url: text(key::SOURCE_URL),
            checksum: text(key::SOURCE_CHECKSUM),
            serial: text(key::SOURCE_SERIAL),
            recipe: text(key::SOURCE_RECIPE),
            source_date_epoch: None,
            packages: None,
            manifest: None,
            origin: None,
        }),
    };
    Ok(Meta {
        cloud_init,
        virtual_size: num(a, key::VIRTUAL_SIZE)?,
        default_vcpus: vcpus,
        default_memory_mib: memory,
        default_user: text(key::USER),
        hypervisor: text(key::HYPERVISOR),
        os: text(key::OS),
        release: text(key::RELEASE),
        arch: text(key::ARCH),
        firmware,
        cmdline: a.get(key::CMDLINE).cloned(),
        created: text(key::CREATED),
        origin,
    })
}

impl Meta {
    /// Boot files for the record, once the caller stored the kernel and initrd.
    pub fn boot(&self, kernel: std::path::PathBuf, initrd: Option<std::path::PathBuf>) -> Option<BootFiles> {
        self.cmdline.clone().map(|cmdline| BootFiles {
            kernel,
            initrd,
            cmdline,
        })
    }
}

fn shown(s: &str) -> String {
    let e = nubo_core::file::escape_control(s);
    if e.chars().count() > 100 {
        format!("{}…", e.chars().take(100).collect::<String>())
    } else {
        e
    }
}

#[cfg(test)]
#[path = "manifest_tests.rs"]
mod tests;
