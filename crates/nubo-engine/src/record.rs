//! The VM record, `vms/<name>/vm.json`: the user's request, what it resolved to, and what the
//! backend reported at boot. Written atomically; the VM's live state is never trusted from it.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nubo_backend::MachineSpec;
use serde::{Deserialize, Serialize};

use crate::create::CreateRequest;
use crate::EngineError;

pub const RECORD_FILE: &str = "vm.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// `create` is under way, or was interrupted: the next `create` of this name cleans up
    /// whatever was made and starts over.
    Creating,
    Created,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageUse {
    pub reference: String,
    pub digest: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshInfo {
    /// 127.0.0.1:<port> forwards to the guest's port 22.
    pub port: u16,
    pub user: String,
    /// Whether nubo's own key was put into the seed (false with `--seed` or when the user's
    /// user-data may override the vendor-data key).
    pub nubo_key: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    pub name: String,
    pub uuid: String,
    pub backend: String,
    pub phase: Phase,
    /// RFC 3339 UTC.
    pub created: String,
    /// What the user asked for, normalised: `create` with the same request is a no-op.
    pub request: CreateRequest,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageUse>,
    pub machine: MachineSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshInfo>,
    /// How the accelerator was chosen at the last boot (`TCG, because ...`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel_reason: Option<String>,
    /// The VMM command line of the last boot.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
}

pub fn record_path(vm_dir: &Path) -> PathBuf {
    vm_dir.join(RECORD_FILE)
}

pub fn load(vm_dir: &Path) -> Result<Option<VmRecord>, EngineError> {
    let path = record_path(vm_dir);
    match fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| EngineError::Corrupt { path, source }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(EngineError::Io {
            name: dir_name(vm_dir),
            what: format!("reading {}", path.display()),
            source: e,
        }),
    }
}

pub fn save(vm_dir: &Path, rec: &VmRecord) -> Result<(), EngineError> {
    let path = record_path(vm_dir);
    nubo_core::write_json_atomic(&path, rec).map_err(EngineError::io(&rec.name, format!("writing {}", path.display())))
}

/// [`save`] without the fsyncs, for the `creating` record on the way to QEMU's start; `create`
/// makes it durable with one syncfs afterwards.
pub fn save_unsynced(vm_dir: &Path, rec: &VmRecord) -> Result<(), EngineError> {
    let path = record_path(vm_dir);
    nubo_core::write_json_atomic_unsynced(&path, rec)
        .map_err(EngineError::io(&rec.name, format!("writing {}", path.display())))
}

fn dir_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Names of every directory under `vms/` that holds a record, sorted.
pub fn names(vms: &Path) -> Result<Vec<String>, EngineError> {
    let entries = match fs::read_dir(vms) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(EngineError::Io {
                name: String::new(),
                what: format!("listing {}", vms.display()),
                source: e,
            })
        }
    };
    let mut out: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().join(RECORD_FILE).is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    Ok(out)
}
