//! `Engine::observe`: one VM's status, typed, as a controller copies it into a Kubernetes
//! object: the record's phase, the backend's view of the domain, readiness read from the
//! console (phase, or failure with its evidence line), addresses, snapshots, and conditions in
//! `metav1.Condition`'s shape. Reads only: no lock, no write, no probe that blocks (no SSH).
//! `lastTransitionTime` and `observedGeneration` are the controller's to keep: the engine has
//! no history of earlier observations.

use std::io::Read;
use std::path::{Path, PathBuf};

use nubo_core::VmState;
use nubo_spec::VmSpec;
use serde::Serialize;

use crate::readiness::{ConsoleTrack, Failure, Finished, LineVerdict, Phase, ReadinessError};
use crate::record::{self, VmRecord};
use crate::{Engine, EngineError};

/// How much of a console log `observe` reads: a boot to cloud-init's closing line writes a
/// few hundred KiB; a log past this is judged from its start (its closing line may be later).
const CONSOLE_READ: u64 = 8 << 20;

/// Everything nubo can say about a VM now, without waiting.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VmStatus {
    pub name: String,
    pub uuid: String,
    pub backend: String,
    /// The record's phase: `created`, or `creating` for a create under way or interrupted.
    pub phase: record::Phase,
    pub domain: DomainView,
    pub readiness: ReadinessView,
    pub addresses: Addresses,
    pub snapshots: SnapshotSummary,
    /// The truth a controller copies; `phase` and the views above are summaries and evidence.
    pub conditions: Vec<Condition>,
}

/// The backend's view of the domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DomainView {
    /// `running`, `paused`, `stopped`, `creating`; absent when the backend could not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Why the backend could not answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the VM's console log says of its (current or last) boot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessView {
    /// The last phase the console shows (`vmm-running` needs the VMM alive now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// cloud-init's closing line, when it finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished: Option<Finished>,
    /// Why the guest will not get ready, when the console proves it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<Failure>,
    /// The console line that proves the failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    pub console_log: PathBuf,
    /// Why the console log could not be read (absent when it was, or does not exist yet).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub console_error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Addresses {
    /// `user@host:port` for `nubo vm ssh`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    pub guest: Vec<String>,
    /// The guest addresses were computed, not observed.
    pub predicted: bool,
    /// How the network is realised, in words (empty when the backend could not answer).
    pub network: String,
    /// Published ports, `127.0.0.1:8080->80/tcp`.
    pub ports: Vec<String>,
}

/// The snapshots nubo recorded (`nubo vm snapshot ls` cross-checks them with the disk).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSummary {
    pub count: usize,
    /// Oldest first.
    pub names: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latest: Option<String>,
    /// The snapshot the VM's disk descends from now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ConditionType {
    /// The record says the create finished (disk, seed and domain made).
    Provisioned,
    /// The VMM runs the guest.
    Running,
    /// cloud-init finished this boot, read nubo's seed and reported no error.
    CloudInitDone,
    /// The seed was made from the inputs the spec asks now.
    SeedCurrent,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
}

/// One condition, in `metav1.Condition`'s shape (`type`, `status`, `reason`, `message`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: ConditionType,
    pub status: ConditionStatus,
    /// CamelCase, machine-readable.
    pub reason: String,
    /// For people: the cause and, where there is one, the fix.
    pub message: String,
}

impl Condition {
    fn new(kind: ConditionType, status: ConditionStatus, reason: &str, message: impl Into<String>) -> Condition {
        Condition {
            kind,
            status,
            reason: reason.to_owned(),
            message: message.into(),
        }
    }
}

impl VmStatus {
    pub fn condition(&self, kind: ConditionType) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.kind == kind)
    }
}

/// What the seed is made from, hashed by [`seed_inputs_digest`]: the VM's name (its default
/// hostname), the cloud-init section (payloads by digest) and the shared folders (their
/// `mounts:` ride in the seed). The UUID (instance-id) is fixed for a VM's life.
#[derive(Serialize)]
struct SeedInputs<'a> {
    name: &'a nubo_core::VmName,
    cloud_init: &'a nubo_spec::CloudInitSpec,
    mounts: &'a [nubo_spec::MountSpec],
}

/// `sha256:<hex>` of the spec's seed inputs, recorded at create.
pub fn seed_inputs_digest(spec: &VmSpec) -> String {
    let inputs = SeedInputs {
        name: &spec.name,
        cloud_init: &spec.cloud_init,
        mounts: &spec.mounts,
    };
    let json = serde_json::to_vec(&inputs).expect("a spec always serialises");
    let d = ring::digest::digest(&ring::digest::SHA256, &json);
    format!("sha256:{}", nubo_core::hex(d.as_ref()))
}

impl Engine {
    /// The VM's status now, against the spec it was created with. Reads only.
    pub fn observe(&self, name: &str) -> Result<VmStatus, EngineError> {
        let rec = self.load(name)?;
        Ok(self.status_of(&rec, &rec.spec))
    }

    /// [`Engine::observe`], with `SeedCurrent` judged against `desired` (a controller's spec
    /// of the VM) rather than the spec recorded at create.
    pub fn observe_against(&self, desired: &VmSpec) -> Result<VmStatus, EngineError> {
        let rec = self.load(desired.name.as_str())?;
        Ok(self.status_of(&rec, desired))
    }

    fn status_of(&self, rec: &VmRecord, desired: &VmSpec) -> VmStatus {
        let dir = self.roots.vm_dir(&rec.name);
        let backend = self.backend_of(rec);
        let state = self.state(rec);
        let domain = match &state {
            Ok(s) => DomainView {
                state: Some(s.to_string()),
                error: None,
            },
            Err(e) => DomainView {
                state: None,
                error: Some(e.to_string()),
            },
        };
        let reach = backend.as_ref().ok().and_then(|b| b.reach(&rec.vm_ref(&dir)).ok());
        let addresses = Addresses {
            ssh: reach
                .as_ref()
                .and_then(|r| r.ssh)
                .map(|a| format!("{}@{a}", rec.ssh.user)),
            guest: reach.as_ref().map(|r| r.guest_addresses.clone()).unwrap_or_default(),
            predicted: reach.as_ref().is_some_and(|r| r.predicted),
            network: reach.map(|r| r.network).unwrap_or_default(),
            ports: rec.machine.ports.iter().map(nubo_backend::ports::shown).collect(),
        };
        let console_log = match &backend {
            Ok(b) => b.console(&rec.vm_ref(&dir)).current,
            Err(_) => dir.join("console.log"),
        };
        let alive = matches!(state, Ok(VmState::Running | VmState::Paused));
        let readiness = read_console(&console_log, alive);
        let snapshots = SnapshotSummary {
            count: rec.snapshots.len(),
            names: rec.snapshots.iter().map(|s| s.name.clone()).collect(),
            latest: rec.snapshots.last().map(|s| s.name.clone()),
            current: rec.current_snapshot.clone(),
        };
        let conditions = conditions(rec, &state, &readiness, desired);
        VmStatus {
            name: rec.name.clone(),
            uuid: rec.uuid.clone(),
            backend: rec.backend.clone(),
            phase: rec.phase,
            domain,
            readiness,
            addresses,
            snapshots,
            conditions,
        }
    }
}

/// Reads the console log from its start (at most [`CONSOLE_READ`]) through the same line
/// classifier as the wait. A log that does not exist reads as empty (the VM has not written
/// one yet); one that cannot be read (not a regular file, no permission) says why.
pub fn read_console(path: &Path, alive: bool) -> ReadinessView {
    let mut bytes = Vec::new();
    let read = nubo_core::file::open_regular(path, "console log").and_then(|f| {
        f.take(CONSOLE_READ)
            .read_to_end(&mut bytes)
            .map_err(|e| nubo_core::file::FileError::io("reading console log", path, e))
    });
    let console_error = match read {
        Err(e) if !e.is_not_found() => Some(e.to_string()),
        _ => None,
    };
    let text = String::from_utf8_lossy(&bytes);
    ReadinessView {
        console_error,
        ..console_view(text.split_inclusive('\n'), alive, path)
    }
}

/// The readiness a console's lines prove. Pure. `alive` says the VMM runs now.
pub fn console_view<'a>(lines: impl IntoIterator<Item = &'a str>, alive: bool, console_log: &Path) -> ReadinessView {
    let mut view = ReadinessView {
        phase: alive.then_some(Phase::VmmRunning),
        finished: None,
        failure: None,
        evidence: None,
        console_log: console_log.to_path_buf(),
        console_error: None,
    };
    let mut track = ConsoleTrack::default();
    for line in lines {
        match track.feed(line) {
            Some(LineVerdict::KernelBooting) => view.phase = Some(Phase::KernelBooting),
            Some(LineVerdict::Finished(f)) => {
                view.phase = Some(Phase::CloudInitFinished);
                view.finished = Some(f);
                break;
            }
            Some(LineVerdict::Failed {
                failure,
                evidence,
                finished,
            }) => {
                if finished {
                    view.phase = Some(Phase::CloudInitFinished);
                }
                view.failure = Some(failure);
                view.evidence = Some(evidence);
                break;
            }
            None => {}
        }
    }
    view
}

fn conditions(
    rec: &VmRecord,
    state: &Result<VmState, EngineError>,
    readiness: &ReadinessView,
    desired: &VmSpec,
) -> Vec<Condition> {
    use ConditionStatus::{False, True, Unknown};
    use ConditionType::*;
    let name = &rec.name;
    let provisioned = match rec.phase {
        record::Phase::Created => Condition::new(Provisioned, True, "Created", format!("vm `{name}` was created")),
        record::Phase::Creating => Condition::new(
            Provisioned,
            False,
            "Creating",
            format!("a create of vm `{name}` is under way or was interrupted: run the same `nubo vm create {name} ...` again to finish it, or `nubo vm rm {name}`"),
        ),
    };
    let running = match state {
        Ok(VmState::Running) => Condition::new(Running, True, "Running", "the VMM runs the guest"),
        Ok(VmState::Paused) => Condition::new(
            Running,
            False,
            "Paused",
            format!("the guest is paused: `nubo vm resume {name}`"),
        ),
        Ok(VmState::Stopped) => Condition::new(
            Running,
            False,
            "Stopped",
            format!("the VM is stopped: `nubo vm start {name}`"),
        ),
        Ok(VmState::Creating) => Condition::new(Running, False, "NotProvisioned", "the VM is not fully created"),
        Err(e) => Condition::new(Running, Unknown, "BackendError", e.to_string()),
    };
    vec![
        provisioned,
        running,
        cloud_init_done(rec, state, readiness),
        seed_current(rec, desired),
    ]
}

fn cloud_init_done(rec: &VmRecord, state: &Result<VmState, EngineError>, r: &ReadinessView) -> Condition {
    use ConditionStatus::{False, True, Unknown};
    let c =
        |status, reason: &str, message: String| Condition::new(ConditionType::CloudInitDone, status, reason, message);
    if rec.machine.seed.is_none() {
        return c(
            Unknown,
            "NoSeed",
            "the VM has no seed (an appliance image): nubo does not follow its cloud-init".into(),
        );
    }
    if let Some(failure) = &r.failure {
        let reason = match failure {
            Failure::BootFailed => "BootFailed",
            Failure::SeedNotRead { .. } => "SeedNotRead",
            Failure::CloudInitErrors { .. } => "CloudInitErrors",
            _ => "Failed",
        };
        let err = ReadinessError {
            failure: failure.clone(),
            last_phase: r.phase,
            evidence: r.evidence.clone(),
            console_log: r.console_log.clone(),
        };
        return c(False, reason, err.to_string());
    }
    let alive = matches!(state, Ok(VmState::Running | VmState::Paused));
    if let Some(why) = &r.console_error {
        return c(Unknown, "ConsoleUnreadable", why.clone());
    }
    match (&r.finished, alive) {
        (Some(f), true) => c(
            True,
            "Finished",
            format!(
                "cloud-init {} finished, datasource {} [seed={}]",
                f.version,
                f.datasource,
                f.seed.as_deref().unwrap_or("?")
            ),
        ),
        (_, false) => c(
            Unknown,
            "NotRunning",
            format!(
                "the VM is not running; its last boot's console {} shows: {}",
                r.console_log.display(),
                r.phase.map_or("nothing nubo recognises", Phase::label)
            ),
        ),
        (None, true) => c(
            False,
            "Booting",
            format!(
                "cloud-init has not finished yet (last phase on the console: {}): `nubo vm wait {}` follows it",
                r.phase.map_or("none", Phase::label),
                rec.name,
            ),
        ),
    }
}

fn seed_current(rec: &VmRecord, desired: &VmSpec) -> Condition {
    use ConditionStatus::{False, True, Unknown};
    let c = |status, reason: &str, message: String| Condition::new(ConditionType::SeedCurrent, status, reason, message);
    let Some(made) = &rec.seed_inputs else {
        return c(
            Unknown,
            "NotRecorded",
            format!(
                "vm `{}` was created by a nubo that did not record its seed's inputs",
                rec.name
            ),
        );
    };
    if *made == seed_inputs_digest(desired) {
        return c(
            True,
            "InputsUnchanged",
            "the seed was made from the inputs the spec asks".into(),
        );
    }
    let changed = rec.spec.differences(desired);
    let fields: Vec<&String> = changed
        .iter()
        .filter(|d| d.starts_with("spec.cloudInit") || d.starts_with("spec.mounts") || d.starts_with("spec.name"))
        .collect();
    c(
        False,
        "InputsChanged",
        format!(
            "the seed's inputs changed since vm `{}` was created{}: cloud-init runs once per instance, so the guest keeps what it was first given; remove the VM and create it again to apply them",
            rec.name,
            if fields.is_empty() {
                String::new()
            } else {
                format!(
                    " ({})",
                    fields.iter().map(|s| s.as_str()).collect::<Vec<_>>().join("; ")
                )
            }
        ),
    )
}

#[cfg(test)]
mod tests;
