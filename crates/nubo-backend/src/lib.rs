//! The Backend trait every VMM implements, the registry of backends, and selection precedence.
//!
//! Backends never read user files or the environment: the engine hands them a fully resolved
//! [`MachineSpec`]. Each backend is split into `render` (pure) and `driver` (processes, sockets).

pub mod qemu;
pub mod registry;
pub mod spec;
#[cfg(test)]
mod testing;

use std::time::Duration;

use nubo_core::{ErrorKind, VmState};

pub use registry::{select, Registry, Selection, SelectionInput, Source};
pub use spec::{Accel, BootMode, MachineSpec, MachineType, NetworkSpec, SeedDevice, SeedFormat, VmHandle};

/// Every built-in backend. libvirt and cloud-hypervisor join here when they land.
pub fn builtin_registry() -> Registry {
    Registry::new(vec![Box::new(qemu::QemuBackend::default())])
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

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Capabilities {
    pub snapshot: bool,
    pub pause: bool,
    pub direct_kernel: bool,
    pub efi: bool,
    pub machines: Vec<MachineType>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// ACPI power-down, wait up to the timeout, then kill.
    Graceful(Duration),
    Force,
}

/// What a successful boot reports back, to be recorded with the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootInfo {
    pub pid: u32,
    /// The VMM's command line, recorded for `nubo vm inspect` and bug reports.
    pub argv: Vec<String>,
    /// The accelerator actually used, after `auto` was resolved.
    pub accel: Accel,
    /// Why `auto` chose it (shown by `vm create` and `doctor`).
    pub accel_reason: String,
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{verb} is unsupported by the {backend} backend: use {alternative}")]
    Unsupported {
        backend: &'static str,
        verb: &'static str,
        alternative: &'static str,
    },
    #[error("the {backend} backend is unavailable: {why}")]
    Unavailable { backend: &'static str, why: String },
    #[error("{0}")]
    InvalidSpec(String),
    #[error("unknown backend `{name}`: known backends are {known}")]
    UnknownBackend { name: String, known: String },
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
            BackendError::Unavailable { .. } => ErrorKind::Unavailable,
            BackendError::InvalidSpec(_) | BackendError::UnknownBackend { .. } => ErrorKind::InvalidInput,
            BackendError::Io { .. } => ErrorKind::Io,
            BackendError::Remote { .. } => ErrorKind::Remote,
        }
    }
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
    /// Starts the VM described by `spec`; returns once the VMM is running (not the guest).
    fn boot(&self, spec: &MachineSpec) -> Result<BootInfo, BackendError>;
    /// Derived from the VMM itself (process, QMP), never from a record.
    fn state(&self, vm: &VmHandle) -> Result<VmState, BackendError>;
    /// Whether the VMM is up, cheaply enough to ask every few milliseconds while waiting.
    fn alive(&self, vm: &VmHandle) -> bool {
        self.state(vm).is_ok_and(|s| s.is_active())
    }
    fn stop(&self, vm: &VmHandle, mode: StopMode) -> Result<(), BackendError>;
    /// Kills the VMM if running and removes its runtime files. Succeeds when already gone.
    fn destroy(&self, vm: &VmHandle) -> Result<(), BackendError>;

    fn pause(&self, _vm: &VmHandle) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.id(),
            verb: "pause",
            alternative: "the qemu backend",
        })
    }
    fn resume(&self, _vm: &VmHandle) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.id(),
            verb: "resume",
            alternative: "the qemu backend",
        })
    }
    fn snapshot(&self, _vm: &VmHandle, _name: &str) -> Result<(), BackendError> {
        Err(BackendError::Unsupported {
            backend: self.id(),
            verb: "snapshot",
            alternative: "the libvirt backend",
        })
    }
}
