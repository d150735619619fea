//! `nubo vm snapshot create|ls|rm|restore`: the verbs every backend shares. The engine holds
//! the VM's lock and keeps the record (what nubo took, each snapshot's machine, the current
//! parent); the backend keeps the bytes (QEMU: the overlay's internal snapshot table). `ls`
//! cross-checks the two, so a snapshot made outside nubo, one lost from the record, or one a
//! killed command left half-made is reported, never silently ignored.
//!
//! Convergence after `kill -9`: `create` writes a `creating` entry before the backend starts
//! and completes it after, so a killed create leaves an entry shown as `incomplete` (removable
//! with `snapshot rm`); `restore` changes the record only after the backend is done.

use std::time::Duration;

use nubo_backend::{Backend, BackendError, BackendSnapshot, Capability, Restored};
use nubo_core::VmState;
use serde::Serialize;

use crate::record::{self, SnapshotPhase, SnapshotRecord, VmRecord};
use crate::{Engine, EngineError, Event};

/// The longest snapshot name: [`nubo_core::name::MAX_SNAPSHOT_LEN`].
pub const MAX_NAME: usize = nubo_core::name::MAX_SNAPSHOT_LEN;
pub const MAX_DESCRIPTION: usize = 1024;

/// A snapshot name becomes a QMP tag, a `qemu-img` argument and a record key, so it follows
/// [`nubo_core::name::NameKind::Snapshot`]: letters, digits, `.`, `_`, `-`, starting with a
/// letter or digit (never `-`, never `.`/`..`), and not all digits (QEMU looks snapshots up by
/// name *or* numeric id, so `1` could mean another one).
pub fn validate_name(name: &str) -> Result<(), EngineError> {
    nubo_core::name::check(nubo_core::name::NameKind::Snapshot, name).map_err(EngineError::from)
}

fn validate_description(d: &str) -> Result<(), EngineError> {
    if d.chars().count() > MAX_DESCRIPTION || d.chars().any(char::is_control) {
        return Err(EngineError::SnapshotDescription(format!(
            "it must be one line of at most {MAX_DESCRIPTION} characters, without control characters"
        )));
    }
    Ok(())
}

/// How a snapshot stands once record and backend are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotStatus {
    /// In the record and in the backend.
    Ok,
    /// A create was interrupted: removable with `snapshot rm`, never restored.
    Incomplete,
    /// Recorded, but the backend no longer holds it.
    Missing,
    /// The backend holds it, the record does not (made outside nubo, or the record was lost).
    Untracked,
}

impl SnapshotStatus {
    pub fn word(self) -> &'static str {
        match self {
            SnapshotStatus::Ok => "ok",
            SnapshotStatus::Incomplete => "incomplete",
            SnapshotStatus::Missing => "missing",
            SnapshotStatus::Untracked => "untracked",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SnapshotInfo {
    pub name: String,
    pub status: SnapshotStatus,
    pub created: Option<String>,
    pub has_memory: bool,
    pub vm_state_size: u64,
    /// Whether the VM currently descends from it.
    pub current: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frozen_ms: Option<u64>,
    /// What to do about a status other than `ok`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct SnapshotList {
    pub vm: String,
    pub state: String,
    pub current: Option<String>,
    pub snapshots: Vec<SnapshotInfo>,
}

/// What `snapshot create` did.
#[derive(Debug, Clone)]
pub struct SnapshotCreated {
    pub info: SnapshotInfo,
    /// How long the guest was paused (`None`: the VM was stopped, disk only).
    pub frozen: Option<Duration>,
}

/// Compares the record with the backend's table. Pure.
pub fn reconcile(vm: &str, rec: &VmRecord, table: &[BackendSnapshot]) -> Vec<SnapshotInfo> {
    reconcile_with(vm, rec, table, None)
}

/// [`reconcile`], with the VM's backend asked how to delete by hand an untracked snapshot whose
/// name nubo refuses ([`Backend::snapshot_delete_by_hand`]).
pub fn reconcile_with(
    vm: &str,
    rec: &VmRecord,
    table: &[BackendSnapshot],
    backend: Option<&dyn Backend>,
) -> Vec<SnapshotInfo> {
    let current = rec.current_snapshot.as_deref();
    let mut out: Vec<SnapshotInfo> = rec
        .snapshots
        .iter()
        .map(|s| {
            let held = table.iter().find(|t| t.name == s.name);
            let (status, note) = match (s.phase, held) {
                (SnapshotPhase::Complete, Some(_)) => (SnapshotStatus::Ok, None),
                (SnapshotPhase::Complete, None) => (
                    SnapshotStatus::Missing,
                    Some(format!(
                        "the backend no longer holds it (deleted outside nubo?): `nubo vm snapshot rm {vm} {}` forgets it",
                        s.name
                    )),
                ),
                (SnapshotPhase::Creating, _) => (
                    SnapshotStatus::Incomplete,
                    Some(format!(
                        "its create was interrupted: `nubo vm snapshot rm {vm} {}` removes it",
                        s.name
                    )),
                ),
            };
            SnapshotInfo {
                name: s.name.clone(),
                status,
                created: Some(s.created.clone()),
                has_memory: held.map_or(s.has_memory, |t| t.has_memory),
                vm_state_size: held.map_or(s.vm_state_size, |t| t.vm_state_size),
                current: current == Some(s.name.as_str()),
                parent: s.parent.clone(),
                description: s.description.clone(),
                frozen_ms: s.frozen_ms,
                note,
            }
        })
        .collect();
    for t in table {
        if rec.snapshots.iter().any(|s| s.name == t.name) {
            continue;
        }
        let name = nubo_core::file::escape_control(&t.name);
        out.push(SnapshotInfo {
            note: Some(format!(
                "made outside nubo, or lost from its record: nubo will not restore it; {}",
                delete_hint(vm, rec, backend, &t.name)
            )),
            name,
            status: SnapshotStatus::Untracked,
            created: t.created.clone(),
            has_memory: t.has_memory,
            vm_state_size: t.vm_state_size,
            current: false,
            parent: None,
            description: None,
            frozen_ms: None,
        });
    }
    out
}

/// How to delete the untracked snapshot `name`: `nubo vm snapshot rm` when it takes the name;
/// otherwise (a name made outside nubo that its grammar refuses) the backend's own command,
/// every argument quoted for a POSIX shell (control characters as `$'\n'`), since `rm` would
/// refuse it.
fn delete_hint(vm: &str, rec: &VmRecord, backend: Option<&dyn Backend>, name: &str) -> String {
    if validate_name(name).is_ok() {
        return format!("`nubo vm snapshot rm {vm} {name}` deletes it");
    }
    let by_hand = backend.and_then(|b| b.snapshot_delete_by_hand(&rec.vm_ref(&rec.machine.vm_dir), &rec.machine, name));
    match by_hand {
        Some(c) => format!(
            "its name is one `nubo vm snapshot rm` refuses; {}`{}` deletes it",
            if c.while_stopped {
                format!("with the VM stopped (`nubo vm stop {vm}`), ")
            } else {
                String::new()
            },
            c.argv.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ")
        ),
        None => format!(
            "its name is one `nubo vm snapshot rm` refuses; delete it with the {} backend's own tools",
            rec.backend
        ),
    }
}

/// `s` as one word for a POSIX shell: bare when plain, `'...'` otherwise, and bash's `$'...'`
/// when it holds control characters (which must never reach the terminal raw).
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@+,".contains(&b))
    {
        return s.to_owned();
    }
    // Bidirectional overrides reorder what the terminal shows (Trojan Source): escaped too.
    let hostile = |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if s.chars().any(hostile) {
        let mut out = String::from("$'");
        for c in s.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\'' => out.push_str("\\'"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                c if hostile(c) && (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
                c if hostile(c) => out.push_str(&format!("\\u{:04x}", c as u32)),
                c => out.push(c),
            }
        }
        out.push('\'');
        return out;
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `snap-20261202-065301` from the current time, with `-2`, `-3`... when taken.
fn generated_name(taken: impl Fn(&str) -> bool) -> String {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let digits: String = now.chars().filter(char::is_ascii_digit).collect();
    let base = format!("snap-{}-{}", &digits[..8], &digits[8..14]);
    let mut name = base.clone();
    let mut n = 2;
    while taken(&name) {
        name = format!("{base}-{n}");
        n += 1;
    }
    name
}

impl Engine {
    /// The VM's record and backend, refused with the backend's typed "unsupported" answer
    /// before anything is locked or touched when it has no snapshots.
    fn snapshot_backend(&self, vm: &str) -> Result<(VmRecord, &dyn Backend), EngineError> {
        let rec = self.created(vm)?;
        let backend = self.backend_of(&rec)?;
        if !backend.capabilities().has(Capability::Snapshot) {
            let alt = self.registry.alternative(Capability::Snapshot, "another backend");
            return Err(BackendError::unsupported(backend.id(), "snapshots", alt).into());
        }
        Ok((rec, backend))
    }

    fn table(&self, rec: &VmRecord, backend: &dyn Backend) -> Result<Vec<BackendSnapshot>, EngineError> {
        let dir = self.roots.vm_dir(&rec.name);
        Ok(backend.snapshot_list(&rec.vm_ref(&dir), &rec.machine)?)
    }

    pub fn snapshot_list(&self, vm: &str) -> Result<SnapshotList, EngineError> {
        let (rec, backend) = self.snapshot_backend(vm)?;
        let table = self.table(&rec, backend)?;
        let state = self
            .state(&rec)
            .map_or_else(|_| "unknown".to_owned(), |s| s.to_string());
        Ok(SnapshotList {
            vm: vm.to_owned(),
            state,
            current: rec.current_snapshot.clone(),
            snapshots: reconcile_with(vm, &rec, &table, Some(backend)),
        })
    }

    /// Takes a snapshot: disk and memory of a running (or paused) VM, the disk of a stopped one.
    pub fn snapshot_create(
        &self,
        vm: &str,
        name: Option<&str>,
        description: Option<&str>,
        events: &mut dyn FnMut(Event),
    ) -> Result<SnapshotCreated, EngineError> {
        if let Some(n) = name {
            validate_name(n)?;
        }
        if let Some(d) = description {
            validate_description(d)?;
        }
        let (_, backend) = self.snapshot_backend(vm)?;
        let (_lock, mut rec) = self.lock_existing(vm, "snapshot create")?;
        let dir = self.roots.vm_dir(vm);
        let table = self.table(&rec, backend)?;
        let taken = |n: &str| rec.snapshots.iter().any(|s| s.name == n) || table.iter().any(|t| t.name == n);
        let name = match name {
            Some(n) if taken(n) => {
                return Err(EngineError::SnapshotExists {
                    vm: vm.to_owned(),
                    snapshot: n.to_owned(),
                })
            }
            Some(n) => n.to_owned(),
            None => generated_name(taken),
        };
        let state = backend.state(&rec.vm_ref(&dir))?;
        let with_memory = state.is_active();
        let machine = self.machine_in(&rec, state)?;
        events(Event::Step(format!(
            "taking snapshot `{name}` of vm `{vm}` ({})",
            if with_memory {
                "disk and memory: the guest pauses while its state is written"
            } else {
                "stopped: disk only"
            }
        )));
        rec.snapshots.push(SnapshotRecord {
            name: name.clone(),
            description: description.map(str::to_owned),
            created: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            phase: SnapshotPhase::Creating,
            has_memory: with_memory,
            vm_state_size: 0,
            vcpus: rec.machine.vcpus,
            memory_mib: rec.machine.memory_mib,
            parent: rec.current_snapshot.clone(),
            frozen_ms: None,
        });
        record::save(&dir, &rec)?;
        let taken = match backend.snapshot_create(&rec.vm_ref(&dir), &machine, &name) {
            Ok(t) => t,
            Err(e) => {
                // Forget the entry unless the backend holds something under the name after all
                // (then it stays `incomplete`, for `snapshot rm`).
                let held = self
                    .table(&rec, backend)
                    .map(|t| t.iter().any(|s| s.name == name))
                    .unwrap_or(true);
                if !held {
                    rec.snapshots.retain(|s| s.name != name);
                    record::save(&dir, &rec)?;
                }
                return Err(e.into());
            }
        };
        let entry = rec
            .snapshots
            .iter_mut()
            .find(|s| s.name == name)
            .expect("pushed above, under the lock");
        entry.phase = SnapshotPhase::Complete;
        entry.has_memory = taken.snapshot.has_memory;
        entry.vm_state_size = taken.snapshot.vm_state_size;
        entry.frozen_ms = taken.frozen.map(|d| d.as_millis() as u64);
        rec.current_snapshot = Some(name.clone());
        record::save(&dir, &rec)?;
        let info = reconcile_with(vm, &rec, std::slice::from_ref(&taken.snapshot), Some(backend))
            .into_iter()
            .find(|i| i.name == name)
            .expect("the record holds it");
        Ok(SnapshotCreated {
            info,
            frozen: taken.frozen,
        })
    }

    /// Removes snapshots: from the backend (if it holds them) and from the record. Every name
    /// is checked before anything is removed. Removing the current parent makes its own parent
    /// the current one.
    pub fn snapshot_remove(
        &self,
        vm: &str,
        names: &[String],
        events: &mut dyn FnMut(Event),
    ) -> Result<(), EngineError> {
        for n in names {
            validate_name(n)?;
        }
        let (_, backend) = self.snapshot_backend(vm)?;
        let (_lock, mut rec) = self.lock_existing(vm, "snapshot rm")?;
        let dir = self.roots.vm_dir(vm);
        let table = self.table(&rec, backend)?;
        if let Some(n) = names
            .iter()
            .find(|n| !rec.snapshots.iter().any(|s| &s.name == *n) && !table.iter().any(|t| &t.name == *n))
        {
            return Err(EngineError::SnapshotNotFound {
                vm: vm.to_owned(),
                snapshot: n.clone(),
            });
        }
        for n in names {
            backend.snapshot_delete(&rec.vm_ref(&dir), &rec.machine, n)?;
            let parent = rec
                .snapshots
                .iter()
                .find(|s| &s.name == n)
                .and_then(|s| s.parent.clone());
            rec.snapshots.retain(|s| &s.name != n);
            for s in rec.snapshots.iter_mut().filter(|s| s.parent.as_ref() == Some(n)) {
                s.parent = parent.clone();
            }
            if rec.current_snapshot.as_ref() == Some(n) {
                rec.current_snapshot = parent;
            }
            record::save(&dir, &rec)?;
            events(Event::Step(format!("snapshot `{n}` of vm `{vm}` removed")));
        }
        Ok(())
    }

    /// Returns the VM to a snapshot. A running VM gets the snapshot's memory and disk; a
    /// stopped one gets its disk, and is started from its memory when it has some.
    pub fn snapshot_restore(
        &self,
        vm: &str,
        name: &str,
        events: &mut dyn FnMut(Event),
    ) -> Result<(Restored, VmState), EngineError> {
        validate_name(name)?;
        let (_, backend) = self.snapshot_backend(vm)?;
        let (_lock, mut rec) = self.lock_existing(vm, "snapshot restore")?;
        let dir = self.roots.vm_dir(vm);
        let table = self.table(&rec, backend)?;
        let info = reconcile_with(vm, &rec, &table, Some(backend))
            .into_iter()
            .find(|i| i.name == name)
            .ok_or_else(|| EngineError::SnapshotNotFound {
                vm: vm.to_owned(),
                snapshot: name.to_owned(),
            })?;
        let refused = |why: String| EngineError::SnapshotRefused {
            vm: vm.to_owned(),
            snapshot: name.to_owned(),
            why,
        };
        if info.status != SnapshotStatus::Ok {
            return Err(refused(format!(
                "it is {}: {}",
                info.status.word(),
                info.note.unwrap_or_default()
            )));
        }
        let entry = rec
            .snapshots
            .iter()
            .find(|s| s.name == name)
            .expect("status ok means recorded");
        if info.has_memory && (entry.vcpus, entry.memory_mib) != (rec.machine.vcpus, rec.machine.memory_mib) {
            return Err(refused(format!(
                "its memory state belongs to a machine with {} vcpus and {} MiB, and the VM now has {} vcpus and {} MiB; a guest cannot resume on other hardware",
                entry.vcpus, entry.memory_mib, rec.machine.vcpus, rec.machine.memory_mib
            )));
        }
        events(Event::Step(format!("restoring vm `{vm}` to snapshot `{name}`")));
        // A stopped VM's restore rewrites its disk and may start a VMM over it (issue 21).
        let machine = self.machine_in(&rec, backend.state(&rec.vm_ref(&dir))?)?;
        let mut state = rec.backend_state.clone();
        let restored = backend.snapshot_restore(&machine, &mut state, name)?;
        rec.backend_state = state;
        if let Restored::Started(info) = &restored {
            rec.launch = Some(info.launch.clone());
            rec.notes = info.notes.clone();
        }
        rec.current_snapshot = Some(name.to_owned());
        record::save(&dir, &rec)?;
        let now = backend.state(&rec.vm_ref(&dir))?;
        events(Event::Step(match &restored {
            Restored::Running => format!("vm `{vm}` runs from snapshot `{name}` (memory and disk)"),
            Restored::DiskOnly => format!("vm `{vm}`'s disk is back at snapshot `{name}`; it stays stopped"),
            Restored::Started(_) => format!("vm `{vm}` started from snapshot `{name}` (memory and disk)"),
        }));
        Ok((restored, now))
    }
}

#[cfg(test)]
mod tests;
