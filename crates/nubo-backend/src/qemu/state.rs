//! The qemu backend's own per-VM state and runtime layout, kept in the VM's record.
//!
//! The field names are those wave 1 stored in the record's `machine.handle`, so a wave-1
//! record migrates by moving that object here (see nubo-engine's record migration).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{BackendError, MachineSpec, VmRef};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QemuState {
    pub run_dir: PathBuf,
    pub qmp_socket: PathBuf,
    pub serial_socket: PathBuf,
    pub pid_file: PathBuf,
    /// Written by QEMU itself (the serial chardev's `logfile`), whether or not anyone attaches.
    pub console_log: PathBuf,
    /// The VM's own copy of the UEFI variable store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efi_vars: Option<PathBuf>,
    /// 127.0.0.1:<port> forwards to the guest's port 22 (user-mode networking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_port: Option<u16>,
}

impl QemuState {
    /// Where this backend keeps a VM's runtime files.
    pub fn layout(spec: &MachineSpec) -> QemuState {
        let run = &spec.run_dir;
        QemuState {
            qmp_socket: run.join("qmp.sock"),
            serial_socket: run.join("serial.sock"),
            pid_file: run.join("vmm.pid"),
            run_dir: run.clone(),
            console_log: spec.vm_dir.join("console.log"),
            efi_vars: None,
            ssh_port: None,
        }
    }

    pub fn from_value(name: &str, v: &serde_json::Value) -> Result<QemuState, BackendError> {
        QemuState::deserialize(v).map_err(|e| BackendError::BadState {
            name: name.to_owned(),
            detail: e.to_string(),
        })
    }

    pub fn of(vm: &VmRef) -> Result<QemuState, BackendError> {
        QemuState::from_value(vm.name, vm.state)
    }

    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a struct of paths and numbers serialises")
    }

    pub fn sockets(&self) -> [&Path; 2] {
        [&self.qmp_socket, &self.serial_socket]
    }
}

// Shared with the other backends; kept here under its old path.
pub use crate::host::check_socket_path;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_value_wave1_handle_fields_parse() {
        let v = serde_json::json!({
            "name": "web", "uuid": "u", "run_dir": "/run/nubo/vms/web",
            "qmp_socket": "/run/nubo/vms/web/qmp.sock", "serial_socket": "/run/nubo/vms/web/serial.sock",
            "pid_file": "/run/nubo/vms/web/vmm.pid", "console_log": "/v/web/console.log", "ssh_port": 40022
        });

        let s = QemuState::from_value("web", &v).unwrap();

        assert_eq!(s.ssh_port, Some(40022));
    }
}
