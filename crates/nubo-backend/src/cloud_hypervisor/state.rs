//! The cloud-hypervisor backend's own per-VM state and runtime layout, kept (opaquely) in the
//! VM's record.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::{BackendError, MachineSpec, NetworkMode, VmRef};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChState {
    pub run_dir: PathBuf,
    /// The VMM's REST API (`--api-socket path=`); also how its process is told apart from
    /// others (its command line carries this path).
    pub api_socket: PathBuf,
    /// Written by nubo when it starts the VMM.
    pub pid_file: PathBuf,
    /// The serial port, written by Cloud Hypervisor itself (`serial: File`): readiness and
    /// `nubo vm logs` read it.
    pub console_log: PathBuf,
    /// The VMM's own stderr (its log), kept for error reports.
    pub vmm_log: PathBuf,
    /// Firmware resolved at prepare time (a firmware boot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<PathBuf>,
    /// The tap on the nubo bridge, and the MAC the guest's address is computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tap: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

impl ChState {
    /// Where this backend keeps a VM's files.
    pub fn layout(spec: &MachineSpec) -> ChState {
        let run = &spec.run_dir;
        let networked = !matches!(spec.network, NetworkMode::None);
        ChState {
            api_socket: run.join("ch.sock"),
            pid_file: run.join("vmm.pid"),
            run_dir: run.clone(),
            console_log: spec.vm_dir.join("console.log"),
            vmm_log: spec.vm_dir.join("vmm.log"),
            firmware: None,
            tap: networked.then(|| super::net::tap_name(&spec.uuid)),
            mac: networked.then(|| super::net::mac_for(&spec.uuid)),
        }
    }

    pub fn from_value(name: &str, v: &serde_json::Value) -> Result<ChState, BackendError> {
        ChState::deserialize(v).map_err(|e| BackendError::BadState {
            name: name.to_owned(),
            detail: e.to_string(),
        })
    }

    pub fn of(vm: &VmRef) -> Result<ChState, BackendError> {
        ChState::from_value(vm.name, vm.state)
    }

    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a struct of paths and strings serialises")
    }
}

/// Where snapshot `name` of the VM in `vm_dir` lives.
pub fn snapshot_dir(vm_dir: &Path, name: &str) -> PathBuf {
    vm_dir.join("snapshots").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_value_garbage_is_bad_state_naming_vm() {
        let err = ChState::from_value("web", &serde_json::json!({"api_socket": 3})).unwrap_err();

        assert!(
            matches!(err, BackendError::BadState { ref name, .. } if name == "web"),
            "{err}"
        );
    }
}
