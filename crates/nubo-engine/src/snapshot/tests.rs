//! Snapshot verbs on the FakeBackend: name validation, record/table reconciliation, the
//! current parent, refusals, and what a killed command leaves behind.

use nubo_backend::fake::FakeBackend;
use nubo_backend::{BackendSnapshot, Capabilities, Restored};
use nubo_core::{ErrorKind, VmState};

use super::*;
use crate::record::{self, SnapshotPhase};
use crate::tests::{engine_with, fake, quiet, spec, T};

fn snapshotting() -> T {
    let mut b = FakeBackend::new("qemu");
    b.caps.insert(nubo_backend::Capability::Snapshot);
    engine_with(b)
}

fn running(t: &T, name: &str) -> VmRecord {
    t.engine.create(&spec(t, name), &mut quiet()).unwrap().record
}

fn names(l: &SnapshotList) -> Vec<(String, SnapshotStatus)> {
    l.snapshots.iter().map(|s| (s.name.clone(), s.status)).collect()
}

#[test]
fn validate_name_good_names_accepted() {
    for n in ["before-upgrade", "a", "v1.2_rc-3", "2026-12-02", &"x".repeat(MAX_NAME)] {
        assert!(validate_name(n).is_ok(), "{n}");
    }
}

#[test]
fn validate_name_path_and_option_characters_refused() {
    for n in [
        "",
        "a/b",
        "..",
        ".hidden",
        "-x",
        "a b",
        "a\nb",
        "é",
        "1",
        "42",
        &"x".repeat(MAX_NAME + 1),
    ] {
        let err = validate_name(n).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{n:?}: {err}");
    }
}

#[test]
fn snapshot_create_running_vm_has_memory_and_is_current() {
    let t = snapshotting();
    running(&t, "web");

    let c = t
        .engine
        .snapshot_create("web", Some("before"), Some("clean boot"), &mut quiet())
        .unwrap();

    assert!(c.info.has_memory);
    assert!(c.frozen.is_some());
    let l = t.engine.snapshot_list("web").unwrap();
    assert_eq!(names(&l), vec![("before".to_owned(), SnapshotStatus::Ok)]);
    assert_eq!(l.current.as_deref(), Some("before"));
    assert_eq!(l.snapshots[0].description.as_deref(), Some("clean boot"));
}

#[test]
fn snapshot_create_stopped_vm_is_disk_only() {
    let t = snapshotting();
    let rec = running(&t, "web");
    t.fake.crash(&rec.uuid);

    let c = t
        .engine
        .snapshot_create("web", Some("cold"), None, &mut quiet())
        .unwrap();

    assert!(!c.info.has_memory);
    assert_eq!(c.frozen, None);
}

#[test]
fn snapshot_create_without_name_generates_unique_names() {
    let t = snapshotting();
    running(&t, "web");

    let a = t.engine.snapshot_create("web", None, None, &mut quiet()).unwrap();
    let b = t.engine.snapshot_create("web", None, None, &mut quiet()).unwrap();

    assert!(a.info.name.starts_with("snap-"), "{}", a.info.name);
    assert_ne!(a.info.name, b.info.name);
    validate_name(&b.info.name).unwrap();
}

#[test]
fn snapshot_create_existing_name_is_already_exists() {
    let t = snapshotting();
    running(&t, "web");
    t.engine.snapshot_create("web", Some("a"), None, &mut quiet()).unwrap();

    let err = t
        .engine
        .snapshot_create("web", Some("a"), None, &mut quiet())
        .unwrap_err();

    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
}

#[test]
fn snapshot_create_bad_name_refused_before_backend() {
    let t = snapshotting();
    running(&t, "web");

    let err = t
        .engine
        .snapshot_create("web", Some("../x"), None, &mut quiet())
        .unwrap_err();

    assert!(err.to_string().contains("../x"), "{err}");
    assert!(!t.fake.calls().iter().any(|c| c.starts_with("snapshot")));
}

#[test]
fn snapshot_verbs_backend_without_snapshots_unsupported_before_anything() {
    let t = fake();
    running(&t, "web");

    let err = t
        .engine
        .snapshot_create("web", Some("a"), None, &mut quiet())
        .unwrap_err();

    assert_eq!(err.kind(), ErrorKind::Unsupported);
    // The alternative comes from the registry: here no backend has snapshots.
    assert!(err.to_string().contains("use another backend"), "{err}");
    assert!(t.engine.snapshot_list("web").is_err());
    assert!(t.engine.load("web").unwrap().snapshots.is_empty());
}

#[test]
fn snapshot_list_reports_untracked_missing_and_incomplete() {
    let t = snapshotting();
    let rec = running(&t, "web");
    t.engine
        .snapshot_create("web", Some("kept"), None, &mut quiet())
        .unwrap();
    t.engine
        .snapshot_create("web", Some("lost"), None, &mut quiet())
        .unwrap();
    // Deleted behind nubo's back; another made behind its back; a create killed midway.
    t.fake
        .snapshots
        .lock()
        .unwrap()
        .get_mut(&rec.uuid)
        .unwrap()
        .retain(|s| s.name != "lost");
    t.fake.add_snapshot(
        &rec.uuid,
        BackendSnapshot {
            name: "by-hand".into(),
            has_memory: false,
            vm_state_size: 0,
            created: None,
        },
    );
    let dir = t.engine.roots.vm_dir("web");
    let mut r = record::load(&dir).unwrap().unwrap();
    let mut half = r.snapshots[0].clone();
    half.name = "half".into();
    half.phase = SnapshotPhase::Creating;
    r.snapshots.push(half);
    record::save(&dir, &r).unwrap();

    let l = t.engine.snapshot_list("web").unwrap();

    assert_eq!(
        names(&l),
        vec![
            ("kept".to_owned(), SnapshotStatus::Ok),
            ("lost".to_owned(), SnapshotStatus::Missing),
            ("half".to_owned(), SnapshotStatus::Incomplete),
            ("by-hand".to_owned(), SnapshotStatus::Untracked),
        ]
    );
    assert!(l.snapshots[2].note.as_ref().unwrap().contains("snapshot rm web half"));
}

#[test]
fn snapshot_remove_incomplete_and_untracked_converges() {
    let t = snapshotting();
    let rec = running(&t, "web");
    t.fake.add_snapshot(
        &rec.uuid,
        BackendSnapshot {
            name: "by-hand".into(),
            has_memory: false,
            vm_state_size: 0,
            created: None,
        },
    );
    let dir = t.engine.roots.vm_dir("web");
    t.engine
        .snapshot_create("web", Some("half"), None, &mut quiet())
        .unwrap();
    let mut r = record::load(&dir).unwrap().unwrap();
    r.snapshots[0].phase = SnapshotPhase::Creating;
    record::save(&dir, &r).unwrap();

    t.engine
        .snapshot_remove("web", &["half".into(), "by-hand".into()], &mut quiet())
        .unwrap();

    assert!(t.engine.snapshot_list("web").unwrap().snapshots.is_empty());
    assert!(t.fake.table(&rec.uuid).is_empty());
}

#[test]
fn snapshot_restore_incomplete_refused_naming_rm() {
    let t = snapshotting();
    running(&t, "web");
    t.engine
        .snapshot_create("web", Some("half"), None, &mut quiet())
        .unwrap();
    let dir = t.engine.roots.vm_dir("web");
    let mut r = record::load(&dir).unwrap().unwrap();
    r.snapshots[0].phase = SnapshotPhase::Creating;
    record::save(&dir, &r).unwrap();

    let err = t.engine.snapshot_restore("web", "half", &mut quiet()).unwrap_err();

    assert!(err.to_string().contains("incomplete"), "{err}");
}

#[test]
fn snapshot_remove_unknown_name_removes_nothing() {
    let t = snapshotting();
    running(&t, "web");
    t.engine.snapshot_create("web", Some("a"), None, &mut quiet()).unwrap();

    let err = t
        .engine
        .snapshot_remove("web", &["a".into(), "nope".into()], &mut quiet())
        .unwrap_err();

    assert_eq!(err.kind(), ErrorKind::NotFound, "{err}");
    assert_eq!(t.engine.snapshot_list("web").unwrap().snapshots.len(), 1);
}

#[test]
fn snapshot_remove_current_parent_moves_current_to_its_parent() {
    let t = snapshotting();
    running(&t, "web");
    t.engine.snapshot_create("web", Some("a"), None, &mut quiet()).unwrap();
    t.engine.snapshot_create("web", Some("b"), None, &mut quiet()).unwrap();
    t.engine.snapshot_create("web", Some("c"), None, &mut quiet()).unwrap();

    t.engine
        .snapshot_remove("web", &["c".into(), "b".into()], &mut quiet())
        .unwrap();

    let l = t.engine.snapshot_list("web").unwrap();
    assert_eq!(l.current.as_deref(), Some("a"));
    assert_eq!(names(&l), vec![("a".to_owned(), SnapshotStatus::Ok)]);
}

#[test]
fn snapshot_restore_running_memory_snapshot_runs_and_becomes_current() {
    let t = snapshotting();
    running(&t, "web");
    t.engine.snapshot_create("web", Some("a"), None, &mut quiet()).unwrap();
    t.engine.snapshot_create("web", Some("b"), None, &mut quiet()).unwrap();

    let (r, state) = t.engine.snapshot_restore("web", "a", &mut quiet()).unwrap();

    assert_eq!((r, state), (Restored::Running, VmState::Running));
    assert_eq!(t.engine.snapshot_list("web").unwrap().current.as_deref(), Some("a"));
}

#[test]
fn snapshot_restore_memory_snapshot_onto_stopped_vm_starts_it() {
    let t = snapshotting();
    let rec = running(&t, "web");
    t.engine.snapshot_create("web", Some("a"), None, &mut quiet()).unwrap();
    t.fake.crash(&rec.uuid);

    let (r, state) = t.engine.snapshot_restore("web", "a", &mut quiet()).unwrap();

    assert!(matches!(r, Restored::Started(_)), "{r:?}");
    assert_eq!(state, VmState::Running);
    assert!(t.engine.load("web").unwrap().launch.is_some());
}

#[test]
fn snapshot_restore_disk_snapshot_of_stopped_vm_stays_stopped() {
    let t = snapshotting();
    let rec = running(&t, "web");
    t.fake.crash(&rec.uuid);
    t.engine
        .snapshot_create("web", Some("cold"), None, &mut quiet())
        .unwrap();

    let (r, state) = t.engine.snapshot_restore("web", "cold", &mut quiet()).unwrap();

    assert_eq!((r, state), (Restored::DiskOnly, VmState::Stopped));
}

#[test]
fn snapshot_restore_other_machine_refused_with_both_sizes() {
    let t = snapshotting();
    running(&t, "web");
    t.engine.snapshot_create("web", Some("a"), None, &mut quiet()).unwrap();
    let dir = t.engine.roots.vm_dir("web");
    let mut r = record::load(&dir).unwrap().unwrap();
    r.machine.memory_mib *= 2;
    record::save(&dir, &r).unwrap();

    let err = t.engine.snapshot_restore("web", "a", &mut quiet()).unwrap_err();

    let msg = err.to_string();
    assert!(msg.contains("256 MiB") && msg.contains("512 MiB"), "{msg}");
    assert!(!t.fake.calls().iter().any(|c| c.starts_with("snapshot-restore")));
}

#[test]
fn snapshot_restore_untracked_refused() {
    let t = snapshotting();
    let rec = running(&t, "web");
    t.fake.add_snapshot(
        &rec.uuid,
        BackendSnapshot {
            name: "by-hand".into(),
            has_memory: true,
            vm_state_size: 1,
            created: None,
        },
    );

    let err = t.engine.snapshot_restore("web", "by-hand", &mut quiet()).unwrap_err();

    assert!(err.to_string().contains("untracked"), "{err}");
}

#[test]
fn snapshot_create_while_locked_is_busy() {
    let t = snapshotting();
    running(&t, "web");
    let _held = t.engine.lock("web", "start").unwrap();

    let err = t
        .engine
        .snapshot_create("web", Some("a"), None, &mut quiet())
        .unwrap_err();

    assert!(matches!(err, EngineError::Busy { .. }), "{err}");
}

#[test]
fn remove_vm_with_snapshots_leaves_nothing() {
    let t = snapshotting();
    running(&t, "web");
    t.engine.snapshot_create("web", Some("a"), None, &mut quiet()).unwrap();

    t.engine.remove("web", true, &mut quiet()).unwrap();

    assert!(!t.engine.roots.vm_dir("web").exists());
}

#[test]
fn record_without_snapshot_fields_loads() {
    let t = snapshotting();
    running(&t, "web");
    let path = record::record_path(&t.engine.roots.vm_dir("web"));
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();

    let rec = record::parse(&path, &serde_json::to_vec(&v).unwrap()).unwrap();

    assert!(v.get("snapshots").is_none());
    assert!(rec.snapshots.is_empty() && rec.current_snapshot.is_none());
}

#[test]
fn capabilities_fake_default_has_no_snapshots() {
    assert!(!Capabilities::default().has(nubo_backend::Capability::Snapshot));
}

/// Issue 21: `snapshot ls` told the user to `nubo vm snapshot rm` an untracked snapshot whose
/// name `rm` refuses; it names the backend's own command, the name shell-quoted and escaped.
#[test]
fn snapshot_list_untracked_name_rm_refuses_suggests_backend_command_escaped() {
    let t = snapshotting();
    let rec = running(&t, "web");
    for name in ["bad\nname\u{1b}[31m", "-x 'y'"] {
        t.fake.add_snapshot(
            &rec.uuid,
            BackendSnapshot {
                name: name.into(),
                has_memory: false,
                vm_state_size: 0,
                created: None,
            },
        );
    }

    let l = t.engine.snapshot_list("web").unwrap();

    let notes: Vec<&str> = l.snapshots.iter().filter_map(|s| s.note.as_deref()).collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    for n in &notes {
        assert!(!n.contains("snapshot rm web"), "{n}");
        assert!(n.contains("qemu-img snapshot -d "), "{n}");
        assert!(!n.chars().any(char::is_control), "{n:?}");
    }
    assert!(notes[0].contains(r"$'bad\nname\x1b[31m'"), "{}", notes[0]);
    assert!(notes[1].contains(r"'-x '\''y'\'''"), "{}", notes[1]);
}

#[test]
fn shell_quote_plain_bare_and_control_as_ansi_c() {
    assert_eq!(shell_quote("snap-1"), "snap-1");
    assert_eq!(shell_quote("a b"), "'a b'");
    assert_eq!(shell_quote("a\u{202e}b\\"), r"$'a\u202eb\\'");
}
