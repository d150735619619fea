//! The resolved, backend-neutral description of a machine that the engine hands a backend.
//!
//! It says *what* to run (resources, disks, seed, boot, machine kind, network mode), never *how*:
//! sockets, pid files, firmware variable stores, forwarded ports and the console's plumbing are
//! the backend's own, kept in its per-VM state (see [`crate::Backend::prepare`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The kind of machine, in words every backend understands. Backend-specific machine types
/// (QEMU's `pc`/`q35`) are per-backend options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MachineKind {
    /// A general-purpose PC the backend picks (QEMU `pc`, libvirt `pc`, Cloud Hypervisor's only one).
    #[default]
    Default,
    /// A minimal virtio-only machine that boots a kernel directly.
    Microvm,
}

/// How the guest is networked; each backend realises it its own way.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Outbound access (NAT) plus the SSH endpoint nubo needs.
    #[default]
    Forward,
    /// Nothing but the SSH endpoint: the guest reaches no other address (tests use it).
    Restricted,
    /// A network the backend knows by name (a libvirt network).
    Named(String),
    /// No network device at all.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeedFormat {
    Iso,
    Vfat,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedDevice {
    pub path: PathBuf,
    pub format: SeedFormat,
}

/// Firmware for a boot through the image's own boot loader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "path")]
pub enum Firmware {
    Bios,
    /// UEFI from the backend's firmware search.
    Efi,
    /// UEFI from this firmware code file.
    EfiCode(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum Boot {
    Firmware {
        firmware: Firmware,
    },
    /// Direct-kernel boot.
    Kernel {
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        cmdline: String,
    },
}

/// The VM's disk: a writable qcow2 overlay over a read-only base whose format was proven by
/// nubo's inspector. Backends spell the whole chain out with explicit formats, so the VMM
/// never probes a format or follows a backing file nubo did not name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    pub overlay: PathBuf,
    pub base: PathBuf,
    /// The base's QEMU block driver (`qcow2`, `raw`, `vmdk`).
    pub base_format: String,
    /// The base's virtual size when the VM was created: a base of another size was replaced.
    /// Absent in records made before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_size: Option<u64>,
    /// Set only on the machine the engine hands a backend for one boot, once
    /// `nubo_disk::verify_vm_chain` proved the chain just now (the overlay's one backing file
    /// is the base, which is self-contained); never recorded. A backend whose VMM follows the
    /// overlay's backing file itself (Cloud Hypervisor's `backing_files`) turns that on only
    /// when this is set.
    #[serde(skip)]
    pub chain_inspected: bool,
    /// The overlay is a volume on a remote host (`Backend::disk_is_remote`): its chain is
    /// checked there by the backend, not opened here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remote: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineSpec {
    pub name: String,
    /// Identifies the VM to the VMM and the guest (SMBIOS UUID, cloud-init instance-id).
    pub uuid: String,
    /// The VM's persistent directory (owned by the engine; a backend may keep files in it).
    pub vm_dir: PathBuf,
    /// The VM's runtime directory; what goes in it is the backend's choice.
    pub run_dir: PathBuf,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub disk: Disk,
    pub seed: Option<SeedDevice>,
    pub boot: Boot,
    pub machine: MachineKind,
    pub network: NetworkMode,
    /// Host ports forwarded to the guest (user-mode networking); checked free before create.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<nubo_core::PortForward>,
    /// This backend's own options from the spec's per-backend overrides (validated by
    /// [`crate::Backend::check`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub options: BTreeMap<String, String>,
    /// Host directories shared with the guest, resolved (canonical host paths, tags, transport).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<SharedDir>,
}

/// How a shared folder reaches the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MountTransport {
    /// virtio-fs: a `virtiofsd` per folder on a vhost-user socket; guest memory shared (memfd).
    Virtiofs,
    /// virtio-9p served by the VMM itself (QEMU's `-fsdev local`).
    #[serde(rename = "9p")]
    NineP,
}

impl MountTransport {
    /// The guest's filesystem type (fstab's third field).
    pub fn fs_type(self) -> &'static str {
        match self {
            MountTransport::Virtiofs => "virtiofs",
            MountTransport::NineP => "9p",
        }
    }
}

/// One shared folder as the backend realises it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedDir {
    /// The device's tag, which the guest mounts by: `mount0`, `mount1`, ... (ASCII, no escaping).
    pub tag: String,
    /// The host directory, canonical (no symlink left to swap), checked to be a directory.
    pub host: PathBuf,
    /// Where the guest mounts it.
    pub guest: PathBuf,
    /// Enforced by the device: virtiofsd `--readonly`, 9p `readonly=on`, libvirt `<readonly/>`.
    pub read_only: bool,
    pub transport: MountTransport,
}

impl SharedDir {
    /// The folder's slot: the number in its tag (`mount3` is 3), which also names its device,
    /// socket and virtiofsd on the host, so a folder keeps them when another is unmounted;
    /// `position` (its place in the machine's list) for a tag of another form.
    pub fn slot(&self, position: usize) -> usize {
        self.tag
            .strip_prefix("mount")
            .and_then(|n| n.parse().ok())
            .unwrap_or(position)
    }
}

/// The tag of the `index`th shared folder.
pub fn mount_tag(index: usize) -> String {
    format!("mount{index}")
}

/// Each folder of `dirs` with its [`SharedDir::slot`].
pub fn slots(dirs: &[SharedDir]) -> impl Iterator<Item = (usize, &SharedDir)> {
    dirs.iter().enumerate().map(|(pos, d)| (d.slot(pos), d))
}

/// The tag of a folder added beside `dirs`: the lowest `mountN` none of them holds.
pub fn free_mount_tag(dirs: &[SharedDir]) -> String {
    let used: Vec<usize> = slots(dirs).map(|(n, _)| n).collect();
    let n = (0..).find(|n| !used.contains(n)).expect("a free slot below usize::MAX");
    mount_tag(n)
}
