//! Regression (issue 21): `vm start` trusted whatever the disk chain was by then. On the
//! FakeBackend: a changed chain is refused before the backend is called, an unchanged one is
//! handed over resolved and marked inspected.

use std::fs;
use std::path::Path;

use nubo_backend::fake::FakeBackend;
use nubo_core::ErrorKind;

use crate::tests::{engine_with, fake, quiet, spec, T};
use crate::EngineError;

/// `path` replaced by a qcow2 whose backing file is `target` (a host file).
fn backed_by(path: &Path, target: &Path) {
    let layout = nubo_disk::layout::layout(
        64 << 20,
        Some(nubo_disk::layout::BackingRef {
            name: target.to_str().unwrap(),
            driver: "raw",
        }),
    )
    .unwrap();
    let mut bytes = vec![0u8; layout.len as usize];
    for (at, data) in &layout.writes {
        bytes[*at as usize..*at as usize + data.len()].copy_from_slice(data);
    }
    fs::write(path, bytes).unwrap();
}

/// A created, then stopped VM `web`, and a host file beside the base.
fn stopped(t: &T) -> std::path::PathBuf {
    t.engine.create(&spec(t, "web"), &mut quiet()).unwrap();
    t.engine
        .stop("web", true, std::time::Duration::from_secs(1), &mut quiet())
        .unwrap();
    let secret = t.disk.with_file_name("host-secret");
    fs::write(&secret, b"secret").unwrap();
    secret
}

fn boots(t: &T) -> usize {
    t.fake.calls().iter().filter(|c| c.starts_with("boot ")).count()
}

#[test]
fn start_base_replaced_by_backed_qcow2_is_refused_before_the_backend() {
    let t = fake();
    let secret = stopped(&t);
    backed_by(&t.disk, &secret);

    let err = t.engine.start("web", &mut quiet()).unwrap_err();

    assert!(matches!(err, EngineError::DiskChain { .. }), "{err}");
    assert_eq!(err.kind(), ErrorKind::Integrity);
    let msg = err.to_string();
    assert!(msg.contains("base.qcow2") && msg.contains("host-secret"), "{msg}");
    assert!(msg.contains("nubo vm rm web"), "{msg}");
    assert_eq!(boots(&t), 1);
}

#[test]
fn restart_base_replaced_is_refused_and_leaves_vm_stopped() {
    let t = fake();
    let secret = stopped(&t);
    backed_by(&t.disk, &secret);

    let err = t
        .engine
        .restart("web", true, std::time::Duration::from_secs(1), &mut quiet())
        .unwrap_err();

    assert!(matches!(err, EngineError::DiskChain { .. }), "{err}");
    let rec = t.engine.load("web").unwrap();
    assert_eq!(t.engine.state(&rec).unwrap(), nubo_core::VmState::Stopped);
}

#[test]
fn start_unchanged_chain_hands_backend_inspected_resolved_base() {
    let t = fake();
    stopped(&t);

    t.engine.start("web", &mut quiet()).unwrap();

    let handed = t.fake.handed.lock().unwrap().clone();
    let last = handed.last().unwrap();
    assert!(last.chain_inspected);
    assert_eq!(last.base, fs::canonicalize(&t.disk).unwrap());
    assert_eq!(last.base_size, Some(64 << 20));
}

#[test]
fn create_records_base_size_and_never_records_inspected() {
    let t = fake();

    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    let on_disk = crate::record::load(&t.engine.roots.vm_dir("web")).unwrap().unwrap();
    assert_eq!(c.record.machine.disk.base_size, Some(64 << 20));
    assert_eq!(on_disk.machine.disk.base_size, Some(64 << 20));
    assert!(!on_disk.machine.disk.chain_inspected);
}

#[test]
fn start_base_resized_is_refused() {
    let t = fake();
    stopped(&t);
    fs::remove_file(&t.disk).unwrap();
    nubo_disk::create_qcow2(&t.disk, 128 << 20).unwrap();

    let err = t.engine.start("web", &mut quiet()).unwrap_err();

    assert!(err.to_string().contains("was 67108864 bytes"), "{err}");
    assert_eq!(boots(&t), 1);
}

#[test]
fn start_record_without_base_size_still_boots() {
    let t = fake();
    stopped(&t);
    let dir = t.engine.roots.vm_dir("web");
    let mut rec = crate::record::load(&dir).unwrap().unwrap();
    rec.machine.disk.base_size = None;
    crate::record::save(&dir, &rec).unwrap();

    let started = t.engine.start("web", &mut quiet());

    assert!(started.is_ok(), "{started:?}");
}

#[test]
fn backend_stored_overlay_rebased_is_refused() {
    let t = engine_with(FakeBackend::new("qemu").assigning("11111111-2222-3333-4444-555555555555"));
    let secret = stopped(&t);
    let rec = t.engine.load("web").unwrap();
    backed_by(&rec.machine.disk.overlay, &secret);

    let err = t.engine.start("web", &mut quiet()).unwrap_err();

    assert!(err.to_string().contains("is not the one nubo made"), "{err}");
    assert_eq!(boots(&t), 1);
}

#[test]
fn snapshot_restore_of_stopped_vm_over_replaced_base_is_refused_before_the_backend() {
    let mut b = FakeBackend::new("qemu");
    b.caps.insert(nubo_backend::Capability::Snapshot);
    let t = engine_with(b);
    let secret = stopped(&t);
    t.engine.snapshot_create("web", Some("s1"), None, &mut quiet()).unwrap();
    backed_by(&t.disk, &secret);

    let err = t.engine.snapshot_restore("web", "s1", &mut quiet()).unwrap_err();

    assert!(matches!(err, EngineError::DiskChain { .. }), "{err}");
    assert!(!t.fake.calls().iter().any(|c| c.starts_with("snapshot-restore")));
}

#[test]
fn snapshot_create_of_stopped_vm_over_replaced_base_is_refused() {
    let mut b = FakeBackend::new("qemu");
    b.caps.insert(nubo_backend::Capability::Snapshot);
    let t = engine_with(b);
    let secret = stopped(&t);
    backed_by(&t.disk, &secret);

    let err = t
        .engine
        .snapshot_create("web", Some("s1"), None, &mut quiet())
        .unwrap_err();

    assert!(matches!(err, EngineError::DiskChain { .. }), "{err}");
    assert!(t.engine.load("web").unwrap().snapshots.is_empty());
}
