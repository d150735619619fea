//! Host helpers every local backend shares: finding executables, probing KVM, the AF_UNIX path
//! limit, a VMM's version line, the per-boot console log rotation, and free ports on 127.0.0.1.
//! A new backend uses these rather than copy them out of another backend's folder.

use std::fs::{self, OpenOptions};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::BackendError;

/// An executable on `PATH`.
pub fn which(cmd: &str, path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path_var?).map(|d| d.join(cmd)).find(|p| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmStatus {
    /// `/dev/kvm` opens read-write and `KVM_CREATE_VM` succeeds.
    Usable,
    /// The host's KVM is PVM (`kvm_pvm`): it runs only guest kernels built for PVM, and a stock
    /// distro kernel hangs at boot.
    Pvm,
    NoDevice,
    NoPermission(String),
    Broken(String),
}

impl KvmStatus {
    pub fn describe(&self) -> String {
        match self {
            KvmStatus::Usable => "KVM is usable".into(),
            KvmStatus::Pvm => "/dev/kvm is provided by kvm_pvm (PVM), which cannot run stock distro kernels".into(),
            KvmStatus::NoDevice => "/dev/kvm does not exist (no hardware virtualisation, or the kvm module is not loaded: `modprobe kvm_intel` or `kvm_amd`)".into(),
            KvmStatus::NoPermission(e) => format!("/dev/kvm cannot be opened ({e}): add yourself to the `kvm` group (`sudo adduser $USER kvm`, then log in again)"),
            KvmStatus::Broken(e) => format!("KVM_CREATE_VM failed: {e}"),
        }
    }

    /// What makes KVM usable, for `nubo doctor`; `None` when it is.
    pub fn fix(&self) -> Option<String> {
        match self {
            KvmStatus::Usable => None,
            KvmStatus::Pvm => Some(
                "nothing to do for correctness (guests run under TCG here); for KVM speed, run on a host with hardware KVM (kvm_intel or kvm_amd)".into(),
            ),
            KvmStatus::NoDevice => Some(
                "enable virtualisation (VT-x/AMD-V) in the firmware, or load the module: `modprobe kvm_intel` or `modprobe kvm_amd`".into(),
            ),
            KvmStatus::NoPermission(_) => {
                Some("add yourself to the `kvm` group (`sudo adduser $USER kvm`), then log in again".into())
            }
            KvmStatus::Broken(_) => Some("see the kernel log (`dmesg | grep -i kvm`) for why KVM refuses to create a VM".into()),
        }
    }
}

const KVMIO: u8 = 0xAE;
nix::ioctl_write_int_bad!(kvm_create_vm, nix::request_code_none!(KVMIO, 0x01));

/// Probes KVM the way QEMU will use it: module, device, permission, and creating a VM.
pub fn probe_kvm(sys_module: &Path, dev_kvm: &Path) -> KvmStatus {
    if sys_module.join("kvm_pvm").exists() {
        return KvmStatus::Pvm;
    }
    if !dev_kvm.exists() {
        return KvmStatus::NoDevice;
    }
    let f = match OpenOptions::new().read(true).write(true).open(dev_kvm) {
        Ok(f) => f,
        Err(e) => return KvmStatus::NoPermission(e.to_string()),
    };
    // SAFETY: KVM_CREATE_VM takes an integer machine type (0 = default) and returns a new fd or
    // -1; it reads and writes no memory of ours. The returned fd is closed right away.
    #[allow(unsafe_code)]
    let r = unsafe { kvm_create_vm(f.as_raw_fd(), 0) };
    match r {
        Ok(fd) => {
            let _ = nix::unistd::close(fd);
            KvmStatus::Usable
        }
        Err(e) => KvmStatus::Broken(e.to_string()),
    }
}

/// AF_UNIX `sun_path` holds 107 bytes plus NUL: refuse up front, naming the path.
pub fn check_socket_path(p: &Path) -> Result<(), BackendError> {
    let len = p.as_os_str().len();
    if len > nubo_core::roots::MAX_SOCKET_PATH {
        return Err(BackendError::InvalidSpec(format!(
            "socket path {} is {len} bytes, more than the {} a unix socket allows: set NUBO_RUN_DIR to a shorter directory",
            p.display(),
            nubo_core::roots::MAX_SOCKET_PATH
        )));
    }
    Ok(())
}

/// `QEMU emulator version 10.0.2 (Debian ...)` -> `10.0.2`.
pub fn parse_version(output: &str) -> Option<String> {
    let rest = output.split("version ").nth(1)?;
    let v: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    (!v.is_empty()).then_some(v)
}

/// The console log is bounded per boot: each start moves the previous boot's log to
/// `console.log.1` (replacing the one before), so at most two boots are kept.
pub fn rotate_console(log: &Path) -> std::io::Result<()> {
    match fs::rename(log, previous_log(log)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Where [`rotate_console`] keeps the previous boot's log.
pub fn previous_log(log: &Path) -> PathBuf {
    log.with_extension("log.1")
}

/// A port on 127.0.0.1 nothing listens on now (the kernel's pick).
pub fn free_port() -> Result<u16, BackendError> {
    let what = "finding a free port on 127.0.0.1";
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(BackendError::io(what))?;
    Ok(l.local_addr().map_err(BackendError::io(what))?.port())
}

/// Whether `port` on 127.0.0.1 can be bound now.
pub fn port_free(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_socket_path_too_long_names_fix() {
        let p = PathBuf::from(format!("/{}", "a".repeat(120)));

        let err = check_socket_path(&p).unwrap_err().to_string();

        assert!(err.contains("NUBO_RUN_DIR"), "{err}");
    }

    #[test]
    fn rotate_console_keeps_previous_boot_only() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("console.log");
        std::fs::write(&log, "boot 1").unwrap();
        rotate_console(&log).unwrap();
        std::fs::write(&log, "boot 2").unwrap();

        rotate_console(&log).unwrap();

        assert!(!log.exists());
        assert_eq!(std::fs::read_to_string(previous_log(&log)).unwrap(), "boot 2");
    }

    #[test]
    fn rotate_console_no_log_yet_is_ok() {
        let d = tempfile::tempdir().unwrap();

        assert!(rotate_console(&d.path().join("console.log")).is_ok());
    }

    #[test]
    fn free_port_is_bindable() {
        let port = free_port().unwrap();

        assert!(port_free(port));
    }
}
