//! The Backend trait every VMM implements, the registry of backends, and selection precedence.
//!
//! Backends never read user files or the environment: the engine hands them a resolved,
//! backend-neutral [`MachineSpec`]. Everything about *how* a VM runs belongs to its backend:
//! runtime files (sockets, pid files) and their path limits, firmware lookup, how the network
//! is realised and where SSH is reached ([`Backend::reach`]), the console
//! ([`Backend::console`], [`Backend::attach_console`]), the launch description (argv, domain
//! XML, API JSON), host checks for `nubo doctor`, and its per-VM state, which the engine stores
//! in the VM's record as an opaque JSON value and hands back on every call ([`VmRef`]).
//!
//! Each backend is split into `render` (pure) and `driver` (processes, sockets).

pub mod chain;
pub mod cloud_hypervisor;
pub mod config;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod host;
pub mod host_env;
pub mod libvirt;
pub mod ports;
pub mod process;
pub mod qemu;
pub mod registry;
pub mod spec;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nubo_core::{ErrorKind, VmState};
use serde::{Deserialize, Serialize};

pub use config::BackendConfig;
pub use host_env::HostEnv;
pub use registry::{select, Registry, Selection, SelectionInput, Source};
pub use spec::{
    free_mount_tag, mount_tag, Boot, Disk, Firmware, MachineKind, MachineSpec, MountTransport, NetworkMode, SeedDevice,
    SeedFormat, SharedDir,
};

/// Every built-in backend, with libvirt on its default URI.
pub fn builtin_registry() -> Registry {
    builtin_registry_with(None)
}

/// Every built-in backend; `libvirt_uri` (`NUBO_LIBVIRT_URI`, read by the binary) replaces
/// libvirt's default URI (`qemu:///system` for root, `qemu:///session` otherwise). The host
/// environment is this process's, read now: a daemon uses [`builtin_registry_from`].
pub fn builtin_registry_with(libvirt_uri: Option<nubo_spec::ConnectUri>) -> Registry {
    builtin_registry_for(libvirt_uri, &HostEnv::from_process())
}

/// [`builtin_registry_with`] over the host environment `host`, read by the caller.
pub fn builtin_registry_for(libvirt_uri: Option<nubo_spec::ConnectUri>, host: &HostEnv) -> Registry {
    builtin_registry_from(
        &BackendConfig::new(host.clone()).with("libvirt", libvirt::LibvirtConfig { uri: libvirt_uri }),
    )
}

/// Every built-in backend, each configured from `config` (its own part, by id, and the host
/// environment). One line per backend: adding a backend is its folder plus its line here
/// (docs/adding-a-backend.md).
pub fn builtin_registry_from(config: &BackendConfig) -> Registry {
    Registry::new(vec![
        Box::new(qemu::QemuBackend::with_host(config.host.clone())),
        Box::new(cloud_hypervisor::CloudHypervisorBackend::with_host(config.host.clone())),
        Box::new(libvirt::LibvirtBackend::configured(config)),
    ])
}

/// A backend's answer to "can you run here?": three answers, not a bool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    Available {
        version: String,
    },
    /// Not installed: what is missing and the Debian package (or command) that provides it.
    Missing {
        what: String,
        package: String,
    },
    /// Installed but not working.
    Broken {
        error: String,
    },
}

/// One thing a backend can do. The engine refuses a spec needing one its backend lacks in
/// `plan`, before any file exists, and selection ([`select`]) picks backends by them: nothing
/// outside a backend's folder names backend ids to decide behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Capability {
    /// Snapshots of disks (stopped) and memory (running).
    Snapshot,
    Pause,
    /// Boots a kernel the user gives (`--kernel`).
    DirectKernel,
    /// UEFI boot with firmware it finds itself (`--firmware efi`).
    Efi,
    /// Boots a disk through its own boot loader under a legacy BIOS: a distro cloud image
    /// without `--kernel`.
    Bios,
    /// Runs a microVM machine ([`MachineKind::Microvm`]).
    Microvm,
    /// Its VMM is built for microVMs (not a general VMM with a microvm machine): selection
    /// prefers it for microVM workloads.
    MicrovmNative,
    /// A daemon supervises its VMs (libvirtd: autostart, `virsh`, other tools see them):
    /// selection prefers it for cloud images.
    Supervised,
    /// Networks known by name ([`NetworkMode::Named`]).
    NamedNetworks,
    /// Host ports forwarded to the guest ([`MachineSpec::ports`]); the guest is reachable
    /// without privileges.
    PortForwards,
    /// The restricted network ([`NetworkMode::Restricted`]: the SSH forward and nothing else).
    RestrictedNetwork,
    /// Freezes the running VM's active disk layer into a new top file
    /// ([`Backend::freeze_disk_layer`]), which `nubo image build` needs.
    FreezeDiskLayer,
    /// Reports its host's free memory and CPUs ([`Backend::host_resources`]), which a
    /// scheduler placing VMs on hosts asks.
    HostResources,
}

impl Capability {
    /// Every capability, in declaration order.
    pub const ALL: &'static [Capability] = &[
        Capability::Snapshot,
        Capability::Pause,
        Capability::DirectKernel,
        Capability::Efi,
        Capability::Bios,
        Capability::Microvm,
        Capability::MicrovmNative,
        Capability::Supervised,
        Capability::NamedNetworks,
        Capability::PortForwards,
        Capability::RestrictedNetwork,
        Capability::FreezeDiskLayer,
        Capability::HostResources,
    ];
}

/// A host's memory and CPUs ([`Backend::host_resources`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HostResources {
    /// Memory not in use on the host now, in bytes.
    pub free_memory: u64,
    /// The host's memory, in bytes.
    pub total_memory: u64,
    /// Its logical CPUs.
    pub cpus: u32,
}

/// What a backend can do ([`Backend::capabilities`], the one call that asks): a set of
/// [`Capability`] and the per-backend option keys it accepts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capabilities {
    set: std::collections::BTreeSet<Capability>,
    /// The per-backend option keys it accepts (`machine`, `accel`, ...).
    pub options: &'static [&'static str],
}

impl Capabilities {
    pub fn new(caps: &[Capability], options: &'static [&'static str]) -> Capabilities {
        Capabilities {
            set: caps.iter().copied().collect(),
            options,
        }
    }

    pub fn has(&self, cap: Capability) -> bool {
        self.set.contains(&cap)
    }

    /// Adds `cap` when `yes` (a capability that depends on the host, such as firmware found).
    pub fn with(mut self, cap: Capability, yes: bool) -> Capabilities {
        if yes {
            self.set.insert(cap);
        }
        self
    }

    pub fn insert(&mut self, cap: Capability) {
        self.set.insert(cap);
    }

    pub fn remove(&mut self, cap: Capability) {
        self.set.remove(&cap);
    }

    pub fn iter(&self) -> impl Iterator<Item = Capability> + '_ {
        self.set.iter().copied()
    }
}

/// One host check for `nubo doctor`, from the backend that needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostCheck {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
    /// What fixes it (`install the ovmf package`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// What cannot work while this check fails (`--firmware efi`); `None` = the backend itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocks: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckStatus {
    Ok,
    /// Works, with a limitation worth knowing (KVM unusable: TCG is slower).
    Warn,
    /// Something fails until it is fixed.
    Broken,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// ACPI power-down, wait up to the timeout, then kill.
    Graceful(Duration),
    Force,
}

/// How the VMM was launched, recorded for `nubo vm inspect` and bug reports, in the backend's
/// own language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind", content = "value")]
pub enum Launch {
    /// A command line (qemu).
    Argv(Vec<String>),
    /// A libvirt domain XML document.
    Xml(String),
    /// API request bodies (Cloud Hypervisor).
    Json(serde_json::Value),
}

/// What a successful boot reports back, to be recorded with the VM.
#[derive(Debug, Clone, PartialEq)]
pub struct BootInfo {
    pub pid: Option<u32>,
    pub launch: Launch,
    /// What the user should know about how it was launched (`accelerator: TCG, because ...`).
    pub notes: Vec<String>,
}

/// Where and how the guest is reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reach {
    /// Where an SSH client connects to reach the guest's port 22.
    pub ssh: Option<SocketAddr>,
    /// The guest's own addresses, when known or predicted.
    pub guest_addresses: Vec<String>,
    /// The addresses were computed (from the MAC), not observed: `--wait` checks them
    /// ([`Backend::check_address`]) and `vm ip` says so.
    pub predicted: bool,
    /// How the network is realised, in words.
    pub network: String,
}

/// What the host can tell, right now, about an address the backend predicted for the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state", content = "detail")]
pub enum AddressCheck {
    /// The host sees the guest there: the evidence (its neighbour entry with the VM's MAC).
    Seen(String),
    /// The host could see it, and does not (yet).
    NotSeen,
    /// The host cannot check from here: why (no route to the guest's network, say).
    Unverifiable(String),
}

/// A static address the backend's network gives the guest (no DHCP server), which the engine
/// writes into the seed's network-config, matched by MAC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestNetwork {
    pub mac: String,
    /// `a.b.c.d/prefix`.
    pub address: String,
    pub gateway: String,
}

/// The VM as its backend sees it: identity, directories, and the backend's own state (what
/// [`Backend::prepare`] returned and [`Backend::boot`] updated), stored in the VM's record.
#[derive(Debug, Clone, Copy)]
pub struct VmRef<'a> {
    pub name: &'a str,
    pub uuid: &'a str,
    pub vm_dir: &'a Path,
    pub state: &'a serde_json::Value,
}

/// The serial console's readable log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsoleLog {
    /// This boot's output, growing while the VM runs.
    pub current: PathBuf,
    /// The previous boot's output, if kept.
    pub previous: Option<PathBuf>,
}

/// An attached, bidirectional console stream (`nubo vm console`).
pub trait ConsoleStream: Read + Write + Send {
    /// A second handle for reading while another thread writes.
    fn try_clone_reader(&self) -> std::io::Result<Box<dyn Read + Send>>;
    fn shutdown(&self);
}

/// How long a guest may take to release a shared folder's device on `vm umount` (ACPI eject).
const UNPLUG_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// After a hot-unplug request: polls `present` until the device of folder `dir` is gone, for at
/// most [`UNPLUG_WAIT`]; the error names `what` (the VM) and the fix.
pub(crate) fn wait_unplugged(
    what: String,
    dir: &SharedDir,
    mut present: impl FnMut() -> Result<bool, BackendError>,
) -> Result<(), BackendError> {
    let deadline = std::time::Instant::now() + UNPLUG_WAIT;
    while present()? {
        if std::time::Instant::now() >= deadline {
            return Err(BackendError::Remote {
                what,
                detail: format!(
                    "the guest did not release shared folder {} ({}) within {} s: unmount it inside the guest, then run `nubo vm umount` again",
                    dir.guest.display(),
                    dir.tag,
                    UNPLUG_WAIT.as_secs()
                ),
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(())
}

/// `vm mount`'s refusal for running VM `vm`, booted without the shared memory vhost-user needs.
pub(crate) fn memory_not_shared(backend: &'static str, vm: &str, dir: &SharedDir) -> BackendError {
    BackendError::unsupported(
        backend,
        format!(
            "adding shared folder {} to running VM `{vm}` (its memory is not shared with a file server: only a VM booted with a virtio-fs folder has that)",
            dir.host.display(),
        ),
        format!(
            "`nubo vm rm {vm}` and `nubo vm create {vm} --mount {}:{}` (a VM created with at least one --mount takes more with `vm mount`)",
            dir.host.display(),
            dir.guest.display()
        ),
    )
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{verb} is unsupported by the {backend} backend: use {alternative}")]
    Unsupported {
        backend: &'static str,
        verb: String,
        alternative: String,
    },
    #[error("the {backend} backend is unavailable: {why}")]
    Unavailable { backend: &'static str, why: String },
    #[error("{0}")]
    InvalidSpec(String),
    #[error("unknown backend `{name}`: known backends are {known}")]
    UnknownBackend { name: String, known: String },
    #[error("port {port} on 127.0.0.1 is in use by another program: {fix}")]
    PortInUse { port: u16, fix: String },
    #[error("vm `{name}` is already running")]
    AlreadyRunning { name: String },
    #[error("backend state of vm `{name}` is unreadable ({detail}): remove the VM with `nubo vm rm --force {name}`")]
    BadState { name: String, detail: String },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {detail}")]
    Remote { what: String, detail: String },
}

impl BackendError {
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackendError {
        let what = what.into();
        move |source| BackendError::Io { what, source }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            BackendError::Unsupported { .. } => ErrorKind::Unsupported,
            BackendError::Unavailable { .. } | BackendError::PortInUse { .. } => ErrorKind::Unavailable,
            BackendError::InvalidSpec(_) | BackendError::UnknownBackend { .. } => ErrorKind::InvalidInput,
            BackendError::AlreadyRunning { .. } => ErrorKind::InvalidState,
            BackendError::BadState { .. } => ErrorKind::Integrity,
            BackendError::Io { .. } => ErrorKind::Io,
            BackendError::Remote { .. } => ErrorKind::Remote,
        }
    }

    /// The typed "unsupported" answer for a verb a backend cannot honour.
    pub fn unsupported(backend: &'static str, verb: impl Into<String>, alternative: impl Into<String>) -> BackendError {
        BackendError::Unsupported {
            backend,
            verb: verb.into(),
            alternative: alternative.into(),
        }
    }
}

/// What [`Backend::define`] returns for a backend that gives the VM its identity.
#[derive(Debug, Clone, PartialEq)]
pub struct Defined {
    /// The UUID the backend assigned: the VM's UUID from now on (record, seed instance-id).
    pub uuid: String,
    /// The backend's per-VM state so far, recorded at once so an interrupted create converges.
    pub state: serde_json::Value,
}

/// What a backend's own snapshot storage holds (the qcow2 snapshot table, Cloud Hypervisor's
/// snapshot directories): the engine reconciles it with the VM's record, so a snapshot made
/// outside nubo, or lost from the record, is reported rather than ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendSnapshot {
    pub name: String,
    /// Whether it holds the guest's memory and device state (taken while running).
    pub has_memory: bool,
    /// Bytes of saved VM state (0 when disk-only).
    pub vm_state_size: u64,
    /// RFC 3339 UTC, when the backend records it.
    pub created: Option<String>,
}

/// What taking a snapshot did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotTaken {
    pub snapshot: BackendSnapshot,
    /// How long the guest was paused for it (`None` for a stopped VM).
    pub frozen: Option<Duration>,
}

/// A host command that does by hand what nubo will not (deleting a snapshot whose name nubo's
/// grammar refuses), as argv: the engine quotes it for the user's shell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByHand {
    pub argv: Vec<String>,
    /// It must run with the VM stopped (it edits a disk the VMM holds open).
    pub while_stopped: bool,
}

impl ByHand {
    /// `qemu-img snapshot -d NAME OVERLAY`, with the VM stopped: for backends whose snapshots
    /// live in the qcow2 overlay's own table.
    pub fn qcow2_snapshot_delete(spec: &MachineSpec, name: &str) -> ByHand {
        ByHand {
            argv: vec![
                "qemu-img".into(),
                "snapshot".into(),
                "-d".into(),
                name.into(),
                spec.disk.overlay.to_string_lossy().into_owned(),
            ],
            while_stopped: true,
        }
    }
}

/// What restoring a snapshot did.
#[derive(Debug, Clone, PartialEq)]
pub enum Restored {
    /// The running VM now runs from the snapshot's memory and disks.
    Running,
    /// The disks were reverted; the (stopped) VM stays stopped.
    DiskOnly,
    /// The stopped VM was started from the snapshot's memory state.
    Started(BootInfo),
}

pub trait Backend: Send + Sync {
    /// Unique id, e.g. `qemu`.
    fn id(&self) -> &'static str;
    /// Other names accepted for it, e.g. `ch` for `cloud-hypervisor`.
    fn aliases(&self) -> &'static [&'static str] {
        &[]
    }
    /// Built-in, local, zero-configuration: may be picked by the heuristic.
    fn auto_selectable(&self) -> bool;
    fn probe(&self) -> Probe;
    /// A cheap "could this backend be picked here" for selection (no processes run), so
    /// `vm create` does not pay for a full probe; `nubo doctor` runs the real [`probe`](Self::probe).
    fn installed(&self) -> bool {
        matches!(self.probe(), Probe::Available { .. })
    }
    fn capabilities(&self) -> Capabilities;
    /// Everything this backend needs from the host, for `nubo doctor` (its own probe included).
    fn host_checks(&self) -> Vec<HostCheck>;

    /// Refuses what this backend cannot run, before anything is made: options it does not
    /// know, paths its VMM cannot use (AF_UNIX limits), firmware it cannot find. Returns notes
    /// for the user. Reads nothing but host facts; writes nothing.
    fn check(&self, spec: &MachineSpec) -> Result<Vec<String>, BackendError>;
    /// For a backend that assigns the VM's identity itself (libvirt gives each domain its
    /// UUID): defines the VM without its seed and returns the assigned UUID, which the engine
    /// then builds the seed with. Called at create after the overlay exists. The default
    /// (`None`) keeps the engine's UUID.
    fn define(&self, _spec: &MachineSpec) -> Result<Option<Defined>, BackendError> {
        Ok(None)
    }
    /// For a backend that stores the seed itself (a libvirt storage volume): stores `bytes`
    /// and returns where the seed now is. `state` is what [`define`](Self::define) returned.
    /// The default (`None`) lets the engine write `seed.img` in the VM's directory.
    fn store_seed(
        &self,
        _spec: &MachineSpec,
        _state: &serde_json::Value,
        _bytes: &[u8],
        _format: SeedFormat,
    ) -> Result<Option<SeedDevice>, BackendError> {
        Ok(None)
    }
    /// For a backend that keeps the VM's OS disk itself (a libvirt storage volume): makes it, a
    /// thin qcow2 of `size` bytes over `spec.disk.base` (as `spec.disk.base_format`, which the
    /// engine has inspected), and returns its path, which becomes `spec.disk.overlay`. `state`
    /// is what [`define`](Self::define) returned; [`destroy`](Self::destroy) deletes the disk.
    /// Called at create after `define`. The default (`None`) lets the engine write its own
    /// overlay, `disk.qcow2` in the VM's directory.
    fn store_disk(
        &self,
        _spec: &MachineSpec,
        _state: &serde_json::Value,
        _size: u64,
    ) -> Result<Option<PathBuf>, BackendError> {
        Ok(None)
    }
    /// Whether the OS disk [`store_disk`](Self::store_disk) made lives on another host (a
    /// remote libvirt pool), where this host cannot open it: the engine then leaves the
    /// chain check before each boot to the backend, which checks it where the disk is.
    fn disk_is_remote(&self, _state: &serde_json::Value) -> bool {
        false
    }
    /// Makes the backend's per-VM files (a UEFI variable store, say) and returns its state,
    /// which the engine records. Called once, at create, after the disk and seed exist.
    fn prepare(&self, spec: &MachineSpec) -> Result<serde_json::Value, BackendError>;
    /// Starts the VM; returns once the VMM is running (not the guest). May update `state`
    /// (a re-chosen port), which the engine records.
    fn boot(&self, spec: &MachineSpec, state: &mut serde_json::Value) -> Result<BootInfo, BackendError>;
    /// The launch description as the VMM holds it now (libvirt: the domain XML read fresh),
    /// for `vm inspect`. `None` when the backend has nothing fresher than what
    /// [`boot`](Self::boot) returned and the engine recorded.
    fn launch_now(&self, _vm: &VmRef) -> Option<Result<Launch, BackendError>> {
        None
    }
    /// Derived from the VMM itself (process, QMP, API), never from a record.
    fn state(&self, vm: &VmRef) -> Result<VmState, BackendError>;
    /// Whether the VMM is up, cheaply enough to ask every few milliseconds while waiting.
    fn alive(&self, vm: &VmRef) -> bool {
        self.state(vm).is_ok_and(|s| s.is_active())
    }
    fn stop(&self, vm: &VmRef, mode: StopMode) -> Result<(), BackendError>;
    /// Kills the VMM if running and removes its runtime files. Succeeds when already gone.
    fn destroy(&self, vm: &VmRef) -> Result<(), BackendError>;

    /// Where SSH reaches the guest and what is known of its addresses.
    fn reach(&self, vm: &VmRef) -> Result<Reach, BackendError>;
    /// The console log readiness follows and `nubo vm logs` prints.
    fn console(&self, vm: &VmRef) -> ConsoleLog;
    /// Attaches to the running VM's serial console.
    fn attach_console(&self, vm: &VmRef) -> Result<Box<dyn ConsoleStream>, BackendError>;
    /// For a VM whose console log no VMM writes on this host (a domain of a remote libvirt
    /// host): the running console's stream, which the engine records into
    /// [`console`](Self::console)'s file while a caller follows it. Opened without taking the
    /// console over from an interactive client. `None` (the default): the log is written here.
    fn console_feed(&self, _vm: &VmRef) -> Option<Result<Box<dyn ConsoleStream>, BackendError>> {
        None
    }

    fn pause(&self, _vm: &VmRef) -> Result<(), BackendError> {
        Err(BackendError::unsupported(self.id(), "pause", "the qemu backend"))
    }

    // Snapshots. `spec` is the VM's machine; a running VM's snapshot holds memory, a stopped
    // VM's only its disks. Names are validated by the engine. The engine holds the VM's lock
    // and keeps the record; backends keep the bytes. The defaults fail closed, before doing
    // anything, with the typed "unsupported" error (`capabilities().snapshot` says the same).

    /// Takes snapshot `name` of the VM.
    fn snapshot_create(&self, _vm: &VmRef, _spec: &MachineSpec, _name: &str) -> Result<SnapshotTaken, BackendError> {
        Err(BackendError::unsupported(self.id(), "snapshots", "the qemu backend"))
    }
    /// The snapshots the backend's own storage holds.
    fn snapshot_list(&self, _vm: &VmRef, _spec: &MachineSpec) -> Result<Vec<BackendSnapshot>, BackendError> {
        Err(BackendError::unsupported(self.id(), "snapshots", "the qemu backend"))
    }
    /// Deletes snapshot `name`; one that is already gone is success.
    fn snapshot_delete(&self, _vm: &VmRef, _spec: &MachineSpec, _name: &str) -> Result<(), BackendError> {
        Err(BackendError::unsupported(self.id(), "snapshots", "the qemu backend"))
    }
    /// Returns the VM to snapshot `name`. `state` is the backend's per-VM state, which a
    /// restore that starts the VM updates (as `boot` does); the engine records it.
    fn snapshot_restore(
        &self,
        _spec: &MachineSpec,
        _state: &mut serde_json::Value,
        _name: &str,
    ) -> Result<Restored, BackendError> {
        Err(BackendError::unsupported(self.id(), "snapshots", "the qemu backend"))
    }
    fn resume(&self, _vm: &VmRef) -> Result<(), BackendError> {
        Err(BackendError::unsupported(self.id(), "resume", "the qemu backend"))
    }

    /// How to delete snapshot `name` from the backend's own storage by hand, for a name made
    /// outside nubo that nubo's grammar refuses (so `vm snapshot rm` cannot take it). `None`
    /// when the backend knows no such command.
    fn snapshot_delete_by_hand(&self, _vm: &VmRef, _spec: &MachineSpec, _name: &str) -> Option<ByHand> {
        None
    }

    /// Freezes the running VM's active disk layer ([`Capability::FreezeDiskLayer`]): the VMM
    /// opens `new_top`, a new qcow2 file over the current top, as the OS disk's top, and writes
    /// the old one no more, which `nubo image build` keeps as a step's cached layer. `frozen` is
    /// how many layers this boot froze before (0 for the first), so each layer's name in the
    /// VMM is unique. Typed "unsupported" by default.
    fn freeze_disk_layer(&self, _vm: &VmRef, _frozen: usize, _new_top: &Path) -> Result<(), BackendError> {
        Err(BackendError::unsupported(
            self.id(),
            "freezing a disk layer (image build)",
            "a backend with the freeze-disk-layer capability",
        ))
    }

    /// The memory and CPUs of the host its VMs run on, as the hypervisor reports them now
    /// ([`Capability::HostResources`]; libvirt: `virNodeGetFreeMemory`, `virNodeGetInfo`).
    /// One round trip to the host; typed "unsupported" by default.
    fn host_resources(&self) -> Result<HostResources, BackendError> {
        Err(BackendError::unsupported(
            self.id(),
            "reporting the host's free memory",
            "the libvirt backend",
        ))
    }

    /// The hostname of the guest's DHCP lease on the backend's network, when the backend
    /// sees leases (libvirt). A lease bearing the VM's name can only come from a guest that
    /// read the seed: readiness reports it as its own phase. `None` by default.
    fn lease_hostname(&self, _vm: &VmRef) -> Option<String> {
        None
    }

    /// For a guest whose address is predicted ([`Reach::predicted`]): what the host sees of it
    /// now. `None` when the backend observes addresses (or there is none). Cheap: no packet.
    fn check_address(&self, _vm: &VmRef) -> Option<AddressCheck> {
        None
    }

    /// The static address this backend's network needs in the guest's seed, if any (a tap
    /// on a bridge without DHCP). Pure over `spec`; `None` by default.
    fn guest_network(&self, _spec: &MachineSpec) -> Option<GuestNetwork> {
        None
    }

    /// How this backend shares a host directory with the guest, with a note when it chose a
    /// fallback; a typed "unsupported" by default. Asked while planning, before any file exists.
    fn mount_transport(&self) -> Result<(MountTransport, Option<String>), BackendError> {
        Err(BackendError::unsupported(
            self.id(),
            "shared folders (--mount)",
            "the qemu, libvirt or cloud-hypervisor backend",
        ))
    }

    /// Whether shared folder `dir` can be added to or removed from a running VM of `machine`
    /// (`vm mount`, `vm umount`), asked before anything changes. Refused by default: hot-plug
    /// needs a device the backend can add live, and virtio-fs guest memory shared from boot.
    fn check_hot_plug(&self, _machine: &MachineSpec, _dir: &SharedDir) -> Result<(), BackendError> {
        Err(BackendError::unsupported(
            self.id(),
            "adding or removing a shared folder on a running VM (vm mount, vm umount)",
            "the qemu backend, or `nubo vm rm` and `nubo vm create` with the folders wanted (--mount HOST_DIR[:GUEST_DIR][:ro])",
        ))
    }

    /// Adds shared folder `dir` to running VM `vm`, whose machine is `machine` (`vm mount`),
    /// after [`Backend::check_hot_plug`]; the guest-side mount is the engine's.
    fn mount_running(&self, _vm: &VmRef, machine: &MachineSpec, dir: &SharedDir) -> Result<(), BackendError> {
        self.check_hot_plug(machine, dir)
    }

    /// Removes shared folder `dir` from running VM `vm` (`vm umount`), once the guest has
    /// unmounted it.
    fn unmount_running(&self, _vm: &VmRef, machine: &MachineSpec, dir: &SharedDir) -> Result<(), BackendError> {
        self.check_hot_plug(machine, dir)
    }
}
