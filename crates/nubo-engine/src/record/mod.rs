//! The VM record, `vms/<name>/vm.json`: the spec as asked, what it resolved to, the backend's
//! own state, and how the VM was last launched. Written atomically; the VM's live state is
//! never trusted from it. Records carry a schema version; older ones are migrated on load
//! (see [`v1`]) and rewritten in the current schema by the next command that saves them.

pub mod v1;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nubo_backend::{Launch, MachineSpec, VmRef};
use nubo_spec::VmSpec;
use serde::{Deserialize, Serialize};

use crate::EngineError;

pub const RECORD_FILE: &str = "vm.json";
/// 1: wave 1 (no `schema` field; QEMU's runtime files in `machine.handle`). 2: the VmSpec and
/// the backend's own state.
pub const SCHEMA: u32 = 2;

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

/// Who `nubo vm ssh` logs in as, and whether nubo's own key reached the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshLogin {
    pub user: String,
    /// Whether nubo's own key was put into the seed (false with an own seed or when the
    /// user's user-data may override the vendor-data key).
    pub nubo_key: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmRecord {
    pub schema: u32,
    pub name: String,
    pub uuid: String,
    pub backend: String,
    pub phase: Phase,
    /// RFC 3339 UTC.
    pub created: String,
    /// What was asked for (payloads by digest only): `create` with the same spec is a no-op.
    pub spec: VmSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageUse>,
    /// The resolved, backend-neutral machine.
    pub machine: MachineSpec,
    /// The backend's own per-VM state (runtime files, ports, ...), opaque to the engine.
    #[serde(default)]
    pub backend_state: serde_json::Value,
    pub ssh: SshLogin,
    /// How the VMM was launched last (argv, domain XML, API JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<Launch>,
    /// What the backend said at the last boot (`accelerator: TCG, because ...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The snapshots nubo took, oldest first; the backend's own table is the truth of what
    /// exists, and `snapshot ls` cross-checks the two. Absent in records written before
    /// snapshots (still schema 2: older nubos ignore the field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotRecord>,
    /// The snapshot the VM's disk (and memory) currently descend from: the last one taken or
    /// restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_snapshot: Option<String>,
    /// `sha256:<hex>` of the spec's seed inputs at create ([`crate::observe::seed_inputs_digest`]),
    /// so `observe` can say whether the seed is still what the spec asks. Absent in records
    /// written before it (still schema 2: older nubos ignore the field), which observe as unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed_inputs: Option<String>,
}

/// One snapshot as nubo recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// RFC 3339 UTC, when nubo started taking it.
    pub created: String,
    /// `creating` until the backend finished: a command killed in between leaves it so, and
    /// `snapshot ls` shows it as incomplete (removable with `snapshot rm`).
    pub phase: SnapshotPhase,
    pub has_memory: bool,
    #[serde(default)]
    pub vm_state_size: u64,
    /// The machine its memory state belongs to: a memory restore onto another is refused.
    pub vcpus: u32,
    pub memory_mib: u64,
    /// The snapshot the VM descended from when this one was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// How long the guest was paused for it, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frozen_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotPhase {
    Creating,
    Complete,
}

impl VmRecord {
    pub fn vm_ref<'a>(&'a self, vm_dir: &'a Path) -> VmRef<'a> {
        VmRef {
            name: &self.name,
            uuid: &self.uuid,
            vm_dir,
            state: &self.backend_state,
        }
    }
}

pub fn record_path(vm_dir: &Path) -> PathBuf {
    vm_dir.join(RECORD_FILE)
}

/// Parses a record of any known schema.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<VmRecord, EngineError> {
    let corrupt = |detail: String| EngineError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| corrupt(e.to_string()))?;
    match v.get("schema").and_then(|s| s.as_u64()) {
        None => v1::migrate(v).map_err(corrupt),
        Some(2) => serde_json::from_value(v).map_err(|e| corrupt(e.to_string())),
        Some(n) => Err(corrupt(format!(
            "schema {n} is newer than this nubo understands (schema {SCHEMA}): upgrade nubo"
        ))),
    }
}

pub fn load(vm_dir: &Path) -> Result<Option<VmRecord>, EngineError> {
    let path = record_path(vm_dir);
    match nubo_core::file::read_bounded(&path, "vm record", MAX_RECORD) {
        Ok(bytes) => parse(&path, &bytes).map(Some),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(EngineError::Corrupt {
            path,
            detail: e.to_string(),
        }),
    }
}

/// Records are a few KiB; a bigger one is not nubo's.
const MAX_RECORD: u64 = 4 << 20;

pub fn save(vm_dir: &Path, rec: &VmRecord) -> Result<(), EngineError> {
    let path = record_path(vm_dir);
    nubo_core::write_json_atomic(&path, rec).map_err(EngineError::io(&rec.name, format!("writing {}", path.display())))
}

/// [`save`] without the fsyncs, for the `creating` record on the way to the VMM's start;
/// `create` makes it durable with one syncfs afterwards.
pub fn save_unsynced(vm_dir: &Path, rec: &VmRecord) -> Result<(), EngineError> {
    let path = record_path(vm_dir);
    nubo_core::write_json_atomic_unsynced(&path, rec)
        .map_err(EngineError::io(&rec.name, format!("writing {}", path.display())))
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
