//! Internal qcow2 snapshots of the qemu backend.
//!
//! A running VM: QMP's job-based `snapshot-save` / `snapshot-load` / `snapshot-delete`, with
//! `devices` = the overlay's node (`disk0`, see [`super::render`]) and the VM state saved into
//! it too. The base (`base0`) is read-only and never named: snapshots live in the overlay only.
//! A stopped VM: `qemu-img snapshot` on the overlay opened with `"backing": null`, so the base
//! is not even opened. The table itself is read in-process by nubo-disk.
//!
//! The job runner is generic over the QMP transport, so it is tested against recorded replies.

use std::io::{BufRead, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::qmp::{Qmp, QmpError};
use crate::{BackendError, BackendSnapshot};

/// The overlay's block node: where snapshots and the VM state go.
pub const DISK_NODE: &str = "disk0";
/// Job ids nubo gives its snapshot jobs; a concluded one left by a killed nubo is dismissed.
pub const JOB_PREFIX: &str = "nubo-snapshot-";
/// Saving or loading memory runs at disk speed; a 1 GiB guest under load takes seconds, a
/// large one minutes. A job still running then is reported, not cancelled (QEMU finishes it).
pub const JOB_TIMEOUT: Duration = Duration::from_secs(600);
/// How often a running job is polled.
pub const JOB_POLL: Duration = Duration::from_millis(20);

/// The three snapshot jobs QEMU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    Save,
    Load,
    Delete,
}

impl JobKind {
    pub fn command(self) -> &'static str {
        match self {
            JobKind::Save => "snapshot-save",
            JobKind::Load => "snapshot-load",
            JobKind::Delete => "snapshot-delete",
        }
    }
}

/// The arguments of a snapshot job on the overlay: pure, golden-tested.
pub fn job_arguments(kind: JobKind, job_id: &str, tag: &str) -> Value {
    let mut a = json!({ "job-id": job_id, "tag": tag, "devices": [DISK_NODE] });
    if kind != JobKind::Delete {
        a["vmstate"] = DISK_NODE.into();
    }
    a
}

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error("QEMU's {command} job failed: {error}")]
    Failed { command: &'static str, error: String },
    #[error("QEMU's {command} job {id} disappeared before it concluded")]
    Vanished { command: &'static str, id: String },
    #[error("QEMU's {command} job {id} is still running after {}s (QEMU finishes it on its own)", .after.as_secs())]
    TimedOut {
        command: &'static str,
        id: String,
        after: Duration,
    },
}

/// What a concluded job took.
#[derive(Debug, Clone, PartialEq)]
pub struct JobDone {
    pub elapsed: Duration,
    /// How long the guest was stopped, from QEMU's own STOP and RESUME event timestamps;
    /// `None` when the guest was not running (no such pair).
    pub frozen: Option<Duration>,
}

/// Dismisses concluded snapshot jobs a killed nubo left behind and waits (bounded) for one
/// still running, so a new job never races an old one.
pub fn settle_stale_jobs<R: BufRead, W: Write>(
    q: &mut Qmp<R, W>,
    timeout: Duration,
    poll: Duration,
) -> Result<(), JobError> {
    let start = Instant::now();
    loop {
        let jobs = q.execute("query-jobs", None)?;
        let ours: Vec<&Value> = jobs
            .as_array()
            .into_iter()
            .flatten()
            .filter(|j| j["id"].as_str().is_some_and(|id| id.starts_with(JOB_PREFIX)))
            .collect();
        let mut running = None;
        let mut dismiss = Vec::new();
        for j in ours {
            let id = j["id"].as_str().unwrap_or_default().to_owned();
            if j["status"] == "concluded" {
                dismiss.push(id);
            } else {
                running = Some(id);
            }
        }
        for id in dismiss {
            q.execute("job-dismiss", Some(json!({ "id": id })))?;
        }
        let Some(id) = running else {
            return Ok(());
        };
        if start.elapsed() >= timeout {
            return Err(JobError::TimedOut {
                command: "snapshot",
                id,
                after: timeout,
            });
        }
        std::thread::sleep(poll);
    }
}

/// Starts a snapshot job and polls `query-jobs` until it concludes, then dismisses it.
pub fn run_job<R: BufRead, W: Write>(
    q: &mut Qmp<R, W>,
    kind: JobKind,
    job_id: &str,
    tag: &str,
    timeout: Duration,
    poll: Duration,
) -> Result<JobDone, JobError> {
    let command = kind.command();
    q.events.clear();
    let start = Instant::now();
    q.execute(command, Some(job_arguments(kind, job_id, tag)))?;
    loop {
        let jobs = q.execute("query-jobs", None)?;
        let job = jobs
            .as_array()
            .into_iter()
            .flatten()
            .find(|j| j["id"] == job_id)
            .cloned()
            .ok_or_else(|| JobError::Vanished {
                command,
                id: job_id.to_owned(),
            })?;
        if job["status"] == "concluded" {
            let elapsed = start.elapsed();
            q.execute("job-dismiss", Some(json!({ "id": job_id })))?;
            if let Some(error) = job.get("error").and_then(Value::as_str) {
                return Err(JobError::Failed {
                    command,
                    error: nubo_core::file::escape_control(error),
                });
            }
            return Ok(JobDone {
                elapsed,
                frozen: frozen(&q.events),
            });
        }
        if start.elapsed() >= timeout {
            return Err(JobError::TimedOut {
                command,
                id: job_id.to_owned(),
                after: timeout,
            });
        }
        std::thread::sleep(poll);
    }
}

/// From the first STOP to the RESUME after it, by QEMU's event timestamps.
pub fn frozen(events: &[Value]) -> Option<Duration> {
    let at = |e: &Value| {
        let t = e.get("timestamp")?;
        let s = t.get("seconds")?.as_u64()?;
        let us = t.get("microseconds")?.as_u64()?;
        Some(Duration::from_secs(s) + Duration::from_micros(us))
    };
    let stop_i = events.iter().position(|e| e["event"] == "STOP")?;
    let stop = at(&events[stop_i])?;
    let resume = events[stop_i..].iter().find(|e| e["event"] == "RESUME").and_then(at)?;
    resume.checked_sub(stop)
}

/// What `qemu-img snapshot` does to a stopped VM's overlay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImgAction {
    Create,
    Apply,
    Delete,
}

/// The `qemu-img snapshot` command line for the overlay: pure, golden-tested. The overlay is
/// named as a `json:` object with explicit drivers and `"backing": null`, so qemu-img probes no
/// format and opens no backing file (the base is not even read); serde_json escapes the path,
/// so it cannot add options. The tag was validated by the engine.
pub fn qemu_img_argv(qemu_img: &str, action: ImgAction, overlay: &Path, tag: &str) -> Vec<String> {
    let flag = match action {
        ImgAction::Create => "-c",
        ImgAction::Apply => "-a",
        ImgAction::Delete => "-d",
    };
    let image = json!({
        "driver": "qcow2",
        "file": {"driver": "file", "filename": overlay},
        "backing": null,
    });
    vec![
        qemu_img.to_owned(),
        "snapshot".into(),
        flag.into(),
        tag.into(),
        "--".into(),
        format!("json:{image}"),
    ]
}

/// The snapshots the overlay's own table holds, read in-process.
pub fn table(vm: &str, overlay: &Path) -> Result<Vec<BackendSnapshot>, BackendError> {
    let what = || format!("the snapshot table of VM `{vm}` ({})", overlay.display());
    let file = nubo_core::file::open_regular(overlay, "vm overlay").map_err(|e| BackendError::Remote {
        what: what(),
        detail: e.to_string(),
    })?;
    let src = nubo_disk::source::FileSource::new(file).map_err(BackendError::io(what()))?;
    let entries = nubo_disk::read_snapshot_table(&src).map_err(|e| BackendError::Remote {
        what: what(),
        detail: format!("{e}: the overlay may be damaged; `qemu-img check` it"),
    })?;
    Ok(entries
        .into_iter()
        .map(|e| BackendSnapshot {
            name: e.name,
            has_memory: e.vm_state_size > 0,
            vm_state_size: e.vm_state_size,
            created: Some(rfc3339(e.date_sec)),
        })
        .collect())
}

/// Seconds since the epoch as RFC 3339 UTC (`2026-12-02T06:53:01Z`).
pub fn rfc3339(secs: u32) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(u64::from(secs)))
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    const GREETING: &str =
        r#"{"QMP": {"version": {"qemu": {"micro": 2, "minor": 0, "major": 10}}, "capabilities": []}}"#;

    /// A client whose peer answers with `replies` (one JSON message a line) after the handshake.
    fn client(replies: &[&str]) -> Qmp<Cursor<Vec<u8>>, Vec<u8>> {
        let input = format!("{GREETING}\n{{\"return\": {{}}}}\n{}\n", replies.join("\n"));
        Qmp::handshake(Cursor::new(input.into_bytes()), Vec::new()).unwrap()
    }

    fn sent(q: &Qmp<Cursor<Vec<u8>>, Vec<u8>>) -> Vec<Value> {
        let w = q.writer_bytes();
        String::from_utf8_lossy(w)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    // Recorded from QEMU 10.0 (snapshot-save of a running 1 GiB guest), timestamps kept.
    const SAVE_REPLIES: &[&str] = &[
        r#"{"return": {}}"#,
        r#"{"timestamp": {"seconds": 1764660000, "microseconds": 100000}, "event": "JOB_STATUS_CHANGE", "data": {"status": "created", "id": "nubo-snapshot-7"}}"#,
        r#"{"timestamp": {"seconds": 1764660000, "microseconds": 100200}, "event": "JOB_STATUS_CHANGE", "data": {"status": "running", "id": "nubo-snapshot-7"}}"#,
        r#"{"return": [{"current-progress": 0, "status": "running", "total-progress": 1, "type": "snapshot-save", "id": "nubo-snapshot-7"}]}"#,
        r#"{"timestamp": {"seconds": 1764660000, "microseconds": 150000}, "event": "STOP"}"#,
        r#"{"timestamp": {"seconds": 1764660001, "microseconds": 900000}, "event": "RESUME"}"#,
        r#"{"timestamp": {"seconds": 1764660001, "microseconds": 900100}, "event": "JOB_STATUS_CHANGE", "data": {"status": "concluded", "id": "nubo-snapshot-7"}}"#,
        r#"{"return": [{"current-progress": 1, "status": "concluded", "total-progress": 1, "type": "snapshot-save", "id": "nubo-snapshot-7"}]}"#,
        r#"{"return": {}}"#,
    ];

    #[test]
    fn run_job_save_concludes_with_freeze_from_events() {
        let mut q = client(SAVE_REPLIES);

        let done = run_job(
            &mut q,
            JobKind::Save,
            "nubo-snapshot-7",
            "before",
            JOB_TIMEOUT,
            Duration::ZERO,
        )
        .unwrap();

        assert_eq!(done.frozen, Some(Duration::from_millis(1750)));
        let cmds = sent(&q);
        assert_eq!(cmds[1]["execute"], "snapshot-save");
        assert_eq!(
            cmds[1]["arguments"],
            json!({"job-id": "nubo-snapshot-7", "tag": "before", "vmstate": "disk0", "devices": ["disk0"]})
        );
        assert_eq!(
            cmds.last().unwrap(),
            &json!({"execute": "job-dismiss", "arguments": {"id": "nubo-snapshot-7"}})
        );
    }

    #[test]
    fn run_job_concluded_with_error_is_failed_and_dismissed() {
        let mut q = client(&[
            r#"{"return": {}}"#,
            r#"{"return": [{"current-progress": 1, "status": "concluded", "total-progress": 1, "type": "snapshot-load", "id": "nubo-snapshot-8", "error": "Snapshot 'x' does not exist in one or more devices"}]}"#,
            r#"{"return": {}}"#,
        ]);

        let err = run_job(
            &mut q,
            JobKind::Load,
            "nubo-snapshot-8",
            "x",
            JOB_TIMEOUT,
            Duration::ZERO,
        )
        .unwrap_err();

        assert!(err.to_string().contains("does not exist"), "{err}");
        assert_eq!(sent(&q).last().unwrap()["execute"], "job-dismiss");
    }

    #[test]
    fn run_job_refused_command_is_qmp_error() {
        let mut q = client(&[
            r#"{"error": {"class": "GenericError", "desc": "Device 'disk0' is writable but does not support snapshots"}}"#,
        ]);

        let err = run_job(
            &mut q,
            JobKind::Save,
            "nubo-snapshot-9",
            "x",
            JOB_TIMEOUT,
            Duration::ZERO,
        )
        .unwrap_err();

        assert!(matches!(err, JobError::Qmp(QmpError::Command { .. })), "{err}");
    }

    #[test]
    fn run_job_missing_from_query_jobs_is_vanished() {
        let mut q = client(&[r#"{"return": {}}"#, r#"{"return": []}"#]);

        let err = run_job(
            &mut q,
            JobKind::Delete,
            "nubo-snapshot-1",
            "x",
            JOB_TIMEOUT,
            Duration::ZERO,
        )
        .unwrap_err();

        assert!(matches!(err, JobError::Vanished { .. }), "{err}");
    }

    #[test]
    fn run_job_still_running_at_deadline_is_timed_out() {
        let running = r#"{"return": [{"current-progress": 0, "status": "running", "total-progress": 1, "type": "snapshot-save", "id": "nubo-snapshot-2"}]}"#;
        let mut q = client(&[r#"{"return": {}}"#, running, running, running]);

        let err = run_job(
            &mut q,
            JobKind::Save,
            "nubo-snapshot-2",
            "x",
            Duration::ZERO,
            Duration::ZERO,
        )
        .unwrap_err();

        assert!(matches!(err, JobError::TimedOut { .. }), "{err}");
    }

    #[test]
    fn run_job_peer_closed_midway_is_closed() {
        let mut q = client(&[r#"{"return": {}}"#]);

        let err = run_job(
            &mut q,
            JobKind::Save,
            "nubo-snapshot-3",
            "x",
            JOB_TIMEOUT,
            Duration::ZERO,
        )
        .unwrap_err();

        assert!(matches!(err, JobError::Qmp(QmpError::Closed)), "{err}");
    }

    #[test]
    fn settle_stale_jobs_dismisses_concluded_leaves_others() {
        let mut q = client(&[
            r#"{"return": [{"status": "concluded", "id": "nubo-snapshot-41", "type": "snapshot-save"}, {"status": "running", "id": "backup-1", "type": "backup"}]}"#,
            r#"{"return": {}}"#,
        ]);

        settle_stale_jobs(&mut q, JOB_TIMEOUT, Duration::ZERO).unwrap();

        let cmds = sent(&q);
        assert_eq!(cmds.len(), 3);
        assert_eq!(
            cmds[2],
            json!({"execute": "job-dismiss", "arguments": {"id": "nubo-snapshot-41"}})
        );
    }

    #[test]
    fn settle_stale_jobs_waits_for_running_one() {
        let mut q = client(&[
            r#"{"return": [{"status": "running", "id": "nubo-snapshot-41", "type": "snapshot-save"}]}"#,
            r#"{"return": [{"status": "concluded", "id": "nubo-snapshot-41", "type": "snapshot-save"}]}"#,
            r#"{"return": {}}"#,
        ]);

        settle_stale_jobs(&mut q, JOB_TIMEOUT, Duration::ZERO).unwrap();

        assert_eq!(sent(&q).len(), 4);
    }

    #[test]
    fn job_arguments_delete_has_no_vmstate() {
        assert_eq!(
            job_arguments(JobKind::Delete, "nubo-snapshot-1", "a"),
            json!({"job-id": "nubo-snapshot-1", "tag": "a", "devices": ["disk0"]})
        );
    }

    #[test]
    fn frozen_without_resume_is_none() {
        let ev = [json!({"event": "STOP", "timestamp": {"seconds": 1, "microseconds": 0}})];

        assert_eq!(frozen(&ev), None);
    }

    #[test]
    fn qemu_img_argv_golden() {
        let a = qemu_img_argv("qemu-img", ImgAction::Apply, Path::new("/v/a\",b/disk.qcow2"), "snap-1");

        assert_eq!(
            a.join(" "),
            r#"qemu-img snapshot -a snap-1 -- json:{"backing":null,"driver":"qcow2","file":{"driver":"file","filename":"/v/a\",b/disk.qcow2"}}"#
        );
    }

    #[test]
    fn rfc3339_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_764_658_381), "2025-12-02T06:53:01Z");
    }
}
