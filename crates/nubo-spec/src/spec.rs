//! The types of a [`VmSpec`]. Serde names are camelCase so a manifest's `spec:` reads straight
//! into them; [`crate::Field`] lists the same names as field paths.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use nubo_core::{ByteSize, PortForward, VmName};
use serde::{Deserialize, Serialize};

use crate::payload::Payload;

/// The desired state of one VM: what `vm create` flags, a manifest and (later) a Kubernetes
/// object all produce, and what a dry run prints. Pure data: nothing here has been resolved
/// against the host (relative paths, image references, the backend's defaults); `None` means
/// "the image's or backend's default".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VmSpec {
    /// The VM's name: a DNS label, also its default hostname and its directory name.
    pub name: VmName,
    /// Where the VM's disk comes from.
    pub source: DiskSource,
    /// vCPUs, memory and disk size.
    #[serde(default)]
    pub resources: Resources,
    /// How the VM boots when no kernel is given directly.
    #[serde(default)]
    pub firmware: Firmware,
    /// A kernel booted directly; `None` boots the image's recorded kernel if it has one, else
    /// through the firmware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<KernelBoot>,
    /// The backend-neutral machine model.
    #[serde(default)]
    pub machine: Machine,
    /// Options the neutral spec cannot say, keyed by backend id, then option:
    /// `{"qemu": {"machine": "q35", "accel": "tcg"}}`. Only their syntax is checked here; the
    /// backend they name validates their meaning (and refuses keys it does not know).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub overrides: BTreeMap<String, BTreeMap<String, String>>,
    /// The VM's network.
    #[serde(default)]
    pub network: Network,
    /// Host ports forwarded to the guest (user-mode networking), written
    /// `[HOST_IP:]HOST_PORT:GUEST_PORT[/tcp|udp]`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortForward>,
    /// What the NoCloud seed carries.
    #[serde(default)]
    pub cloud_init: CloudInitSpec,
    /// The backend by id (`qemu`, `libvirt`, ...); `None` lets nubo's selection precedence choose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// The user `vm ssh` logs in as; `None` uses the image's default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_user: Option<String>,
    /// How long `--wait` waits for cloud-init to finish; `None` uses the engine's default.
    /// Written as humantime text (`5m`, `90s`).
    #[serde(default, with = "humantime_opt", skip_serializing_if = "Option::is_none")]
    pub boot_timeout: Option<Duration>,
    /// Host directories shared with the guest (`--mount`, a manifest's `mounts:`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<crate::mount::MountSpec>,
}

/// Where the VM's disk comes from. The engine makes a copy-on-write overlay on top of it, so the
/// source itself is never written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", rename_all_fields = "camelCase", deny_unknown_fields)]
pub enum DiskSource {
    /// An image in the local store, or to be pulled into it: a catalog name (`debian:12`) or an
    /// OCI reference (`registry/repo:tag`, `registry/repo@sha256:...`). The engine parses it with
    /// `nubo_image::ImageRef`; here only its shape is checked.
    Image {
        /// The reference as the user wrote it.
        reference: String,
    },
    /// A disk image file used as the base, read-only.
    Disk {
        /// Absolute path (callers resolve a relative one against the cwd or the manifest's directory).
        path: PathBuf,
    },
    /// An image downloaded through the store and verified before use.
    Url {
        /// `https://` URL (or `http://` with `allow_http`).
        url: String,
        /// `sha256:<64 hex>` or `sha512:<128 hex>`; required unless `insecure_no_checksum`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        checksum: Option<String>,
        /// Accept the download unverified: the user's explicit choice, never a default.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        insecure_no_checksum: bool,
        /// Accept a plain `http://` URL (its content is then only as safe as its checksum).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        allow_http: bool,
    },
}

/// What the guest gets. `None` in each takes the image's default, then the engine's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    /// Virtual CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    /// Guest memory in bytes, serialised as a number of bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ByteSize>,
    /// The overlay's virtual size; `None` keeps the base image's size. It cannot shrink the base.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<ByteSize>,
}

/// Firmware for a VM booted through its boot loader.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Firmware {
    /// What the image records it boots with (BIOS when it says nothing); required with a kernel boot.
    #[default]
    Auto,
    /// Legacy BIOS (SeaBIOS).
    Bios,
    /// UEFI from the host's OVMF package.
    Efi,
    /// UEFI firmware code at this absolute path.
    Path(PathBuf),
}

/// A kernel booted directly, skipping firmware and boot loader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KernelBoot {
    /// Absolute path to the kernel image.
    pub kernel: PathBuf,
    /// Absolute path to the initial ramdisk, if the kernel needs one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    /// The kernel command line; `None` uses the backend's default (root and console).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
}

/// The machine model, named neutrally; each backend maps it (qemu: q35 or pc per image, or
/// `microvm`). Anything finer goes in [`VmSpec::overrides`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Machine {
    /// The backend's usual PC-like machine.
    #[default]
    Default,
    /// A minimal machine without firmware or PCI, booted from a kernel (qemu microvm, Cloud Hypervisor).
    Microvm,
}

/// The VM's network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Network {
    /// NAT to the outside, with the guest's SSH port forwarded to the host's loopback.
    #[default]
    Forward,
    /// Nothing but the forwards: the guest reaches no other address (what tests use).
    Restricted,
    /// A named host network (a libvirt network such as `default`).
    Named(String),
    /// No network device at all: the guest is reached through its console only (qemu
    /// `-nic none`, Cloud Hypervisor without a net device or tap).
    None,
}

/// What cloud-init receives through the NoCloud seed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudInitSpec {
    /// The guest's hostname (RFC 1123); `None` uses the VM's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Authorised SSH public keys, one key line each (the caller has read any `@file`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_keys: Vec<String>,
    /// User-data passed through byte for byte (`#cloud-config`, a script, MIME or gzip).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<Payload>,
    /// Network config (version 1 or 2), passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_config: Option<Payload>,
    /// Vendor-data, passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor_data: Option<Payload>,
    /// The user's own seed image (absolute path), attached as is; excludes every field above.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<PathBuf>,
}

impl VmSpec {
    /// A spec with every default: `name` booting `source`.
    pub fn new(name: VmName, source: DiskSource) -> VmSpec {
        VmSpec {
            name,
            source,
            resources: Resources::default(),
            firmware: Firmware::Auto,
            boot: None,
            machine: Machine::Default,
            overrides: BTreeMap::new(),
            network: Network::Forward,
            ports: Vec::new(),
            cloud_init: CloudInitSpec::default(),
            backend: None,
            ssh_user: None,
            boot_timeout: None,
            mounts: Vec::new(),
        }
    }
}

/// `Option<Duration>` as humantime text, so a manifest says `bootTimeout: 5m`.
mod humantime_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.collect_str(&humantime::format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| {
            humantime::parse_duration(&t).map_err(|e| {
                serde::de::Error::custom(format!(
                    "duration `{t}` is not a duration ({e}): write e.g. `90s` or `5m`"
                ))
            })
        })
        .transpose()
    }
}
