//! The fully resolved description of a machine that the engine hands a backend.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MachineType {
    Pc,
    Q35,
    Microvm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// KVM where a probe shows it runs stock kernels, else TCG (and the reason is said).
    #[default]
    Auto,
    Kvm,
    Tcg,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "mode")]
pub enum BootMode {
    Bios,
    /// UEFI: read-only code and the VM's own writable copy of the variable store.
    Efi {
        code: PathBuf,
        vars: PathBuf,
    },
    /// Direct-kernel boot.
    Kernel {
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        cmdline: String,
    },
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum NetworkSpec {
    None,
    /// QEMU user-mode networking; guest port 22 forwarded from `ssh_forward` (127.0.0.1:port).
    /// `restrict` cuts the guest off from everything but the forwards (tests use it).
    User {
        ssh_forward: Option<SocketAddr>,
        restrict: bool,
        mac: String,
    },
}

/// Runtime files a backend keeps for one VM. Paths are chosen by the engine and fit AF_UNIX.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmHandle {
    pub name: String,
    /// Identifies the VMM process as this VM's (a reused pid is not mistaken for it).
    pub uuid: String,
    pub run_dir: PathBuf,
    pub qmp_socket: PathBuf,
    pub serial_socket: PathBuf,
    pub pid_file: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineSpec {
    pub handle: VmHandle,
    pub uuid: String,
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The VM's writable disk (a qcow2 overlay over the verified base).
    pub disk: PathBuf,
    pub disk_format: String,
    pub seed: Option<SeedDevice>,
    pub boot: BootMode,
    pub machine: MachineType,
    pub accel: Accel,
    pub network: NetworkSpec,
    /// Where the serial console's output is kept (bounded by the engine).
    pub console_log: PathBuf,
}
