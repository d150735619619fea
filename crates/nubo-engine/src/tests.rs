//! Engine tests with the in-memory FakeBackend: plan, create, start, stop, rm, convergence,
//! refusal before any file exists, and a wave-1 record started through today's code. No
//! QEMU, no root, no network (ssh-keygen makes nubo's key once per test root).

use std::path::{Path, PathBuf};

use nubo_backend::fake::FakeBackend;
use nubo_backend::{Capabilities, Capability, Registry};
use nubo_core::{ByteSize, Roots, VmName, VmState};
use nubo_spec::{DiskSource, Field, Network, Payload, VmSpec};

use crate::record::Phase;
use crate::{Engine, EngineError, Event};

pub(crate) struct T {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) engine: Engine,
    pub(crate) disk: PathBuf,
    /// Shares its state with the one in the engine's registry.
    pub(crate) fake: FakeBackend,
}

pub(crate) fn engine_with(backend: FakeBackend) -> T {
    let dir = tempfile::tempdir().unwrap();
    let roots = Roots {
        root: dir.path().join("root"),
        run_dir: dir.path().join("run"),
    };
    let disk = dir.path().join("base.qcow2");
    nubo_disk::create_qcow2(&disk, 64 << 20).unwrap();
    let mut engine = Engine::new(roots, Registry::new(vec![Box::new(backend.clone())]), None);
    // A held lock is reported at once: the tests hold one on purpose.
    engine.lock_wait = std::time::Duration::from_millis(100);
    T {
        _dir: dir,
        engine,
        disk,
        fake: backend,
    }
}

pub(crate) fn fake() -> T {
    engine_with(FakeBackend::new("qemu"))
}

pub(crate) fn spec(t: &T, name: &str) -> VmSpec {
    let mut s = VmSpec::new(VmName::parse(name).unwrap(), DiskSource::Disk { path: t.disk.clone() });
    s.network = Network::Restricted;
    s.resources.memory = Some(ByteSize(256 << 20));
    s
}

pub(crate) fn quiet() -> impl FnMut(Event) {
    |_| {}
}

pub(crate) fn entries(p: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(p)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn create_new_vm_makes_files_and_runs() {
    let t = fake();

    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    assert!(!c.existed);
    assert_eq!(c.record.phase, Phase::Created);
    let dir = t.engine.roots.vm_dir("web");
    assert_eq!(entries(&dir), vec!["disk.qcow2", "seed.img", "vm.json"]);
    assert_eq!(t.engine.state(&c.record).unwrap(), VmState::Running);
    assert_eq!(t.fake.calls(), vec!["prepare web", "boot web"]);
}

#[test]
fn create_backend_assigned_uuid_is_the_vm_uuid_and_seed_instance_id() {
    let t = engine_with(FakeBackend::new("qemu").assigning("11111111-2222-3333-4444-555555555555"));

    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    assert_eq!(c.record.uuid, "11111111-2222-3333-4444-555555555555");
    assert_eq!(c.record.machine.uuid, c.record.uuid);
    assert_eq!(
        t.fake.calls(),
        vec![
            "define web",
            "store_disk web",
            "store_seed web",
            "prepare web",
            "boot web"
        ]
    );
    let seed = t.fake.stored_seed.lock().unwrap().clone().unwrap();
    let files = nubo_seed::read(&seed).unwrap();
    let meta = files.iter().find(|f| f.name == "meta-data").unwrap();
    let meta = String::from_utf8_lossy(&meta.data);
    assert!(
        meta.contains("instance-id: \"11111111-2222-3333-4444-555555555555\""),
        "{meta}"
    );
    assert!(meta.contains("local-hostname: web"), "{meta}");
    let dir = t.engine.roots.vm_dir("web");
    assert_eq!(entries(&dir), vec!["vm.json"]);
    assert_eq!(
        c.record.machine.seed.as_ref().unwrap().path,
        PathBuf::from("/pool/web-cidata.iso")
    );
}

#[test]
fn create_stopped_defines_and_boots_nothing_then_start_boots() {
    let t = fake();

    let c = t.engine.create_stopped(&spec(&t, "web"), &mut quiet()).unwrap();

    assert_eq!(c.record.phase, Phase::Created);
    assert_eq!(t.fake.calls(), vec!["prepare web"]);
    assert_eq!(t.engine.state(&c.record).unwrap(), VmState::Stopped);
    // Asked again, an existing stopped VM stays stopped.
    let again = t.engine.create_stopped(&spec(&t, "web"), &mut quiet()).unwrap();
    assert!(again.existed);
    assert_eq!(t.fake.calls(), vec!["prepare web"]);
    t.engine.start("web", &mut quiet()).unwrap();
    assert_eq!(t.fake.calls(), vec!["prepare web", "boot web"]);
}

#[test]
fn create_user_data_uuid_substituted_only_when_asked() {
    for asked in [false, true] {
        let mut t = engine_with(FakeBackend::new("qemu").assigning("11111111-2222-3333-4444-555555555555"));
        t.engine.user_data_uuid = asked;
        let mut s = spec(&t, "web");
        s.cloud_init.user_data = Some(Payload::new(b"#cloud-config\n# id ${vm.uuid}\n".to_vec()));

        let c = t.engine.create_stopped(&s, &mut quiet()).unwrap();

        let seed = t.fake.stored_seed.lock().unwrap().clone().unwrap();
        let files = nubo_seed::read(&seed).unwrap();
        let ud = files.iter().find(|f| f.name == "user-data").unwrap();
        let ud = String::from_utf8_lossy(&ud.data);
        let want = if asked {
            "# id 11111111-2222-3333-4444-555555555555"
        } else {
            "# id ${vm.uuid}"
        };
        assert!(ud.contains(want), "asked={asked}: {ud}");
        // The recorded seed inputs are the unrendered spec's: SeedCurrent compares like with like.
        assert_eq!(c.record.seed_inputs, Some(crate::observe::seed_inputs_digest(&s)));
    }
}

#[test]
fn create_backend_stored_disk_is_the_vms_disk_at_the_bases_size() {
    let t = engine_with(FakeBackend::new("qemu").assigning("11111111-2222-3333-4444-555555555555"));

    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    assert_eq!(
        c.record.machine.disk.overlay,
        t.engine.roots.root.join("pool/web.qcow2")
    );
    assert_eq!(*t.fake.stored_disk.lock().unwrap(), Some((64 << 20, t.disk.clone())));
}

#[test]
fn create_backend_stored_disk_takes_a_larger_disk_size() {
    let t = engine_with(FakeBackend::new("qemu").assigning("11111111-2222-3333-4444-555555555555"));
    let mut s = spec(&t, "web");
    s.resources.disk_size = Some(ByteSize(1 << 30));

    t.engine.create(&s, &mut quiet()).unwrap();

    assert_eq!(t.fake.stored_disk.lock().unwrap().as_ref().map(|d| d.0), Some(1 << 30));
}

#[test]
fn create_backend_stored_disk_then_failed_boot_is_destroyed() {
    let t = engine_with(FakeBackend::new("qemu").assigning("11111111-2222-3333-4444-555555555555"));
    *t.fake.fail_boot.lock().unwrap() = Some("no".into());

    let r = t.engine.create(&spec(&t, "web"), &mut quiet());

    assert!(r.is_err());
    let calls = t.fake.calls();
    assert_eq!(calls[1], "store_disk web");
    assert_eq!(calls.last().map(String::as_str), Some("destroy web"));
    assert!(!t.engine.roots.vm_dir("web").exists());
}

#[test]
fn create_vm_dir_0700_and_seed_0600() {
    use std::os::unix::fs::PermissionsExt;
    let t = fake();

    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    let dir = t.engine.roots.vm_dir("web");
    let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dir.clone()), 0o700);
    assert_eq!(mode(dir.join("seed.img")), 0o600);
}

#[test]
fn create_same_spec_twice_returns_existing() {
    let t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    let again = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    assert!(again.existed);
    assert_eq!(t.fake.calls(), vec!["prepare web", "boot web"]);
}

#[test]
fn create_same_spec_stopped_vm_is_started() {
    let t = fake();
    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    t.fake.crash(&c.record.uuid);

    let again = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    assert!(again.existed);
    assert_eq!(t.engine.state(&again.record).unwrap(), VmState::Running);
}

#[test]
fn create_different_spec_is_conflict_naming_field() {
    let t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    let mut other = spec(&t, "web");
    other.resources.vcpus = Some(2);

    let err = t.engine.create(&other, &mut quiet()).err().unwrap();

    assert!(matches!(err, EngineError::Conflict { .. }), "{err}");
    assert!(err.to_string().contains("vcpus"), "{err}");
}

#[test]
fn create_boot_failure_leaves_nothing() {
    let t = fake();
    *t.fake.fail_boot.lock().unwrap() = Some("no".into());

    let err = t.engine.create(&spec(&t, "web"), &mut quiet()).err().unwrap();

    assert!(err.to_string().contains("fake refused"), "{err}");
    assert!(!t.engine.roots.vm_dir("web").exists());
    assert_eq!(entries(&t.engine.roots.run_dir.join("locks")), Vec::<String>::new());
    assert!(t.fake.calls().contains(&"destroy web".to_owned()));
}

#[test]
fn create_interrupted_record_converges() {
    let t = fake();
    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    let dir = t.engine.roots.vm_dir("web");
    let mut rec = c.record.clone();
    rec.phase = Phase::Creating;
    crate::record::save(&dir, &rec).unwrap();

    let again = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    assert!(!again.existed);
    assert_ne!(again.record.uuid, c.record.uuid);
    assert_eq!(again.record.phase, Phase::Created);
}

#[test]
fn create_dir_without_record_converges() {
    let t = fake();
    let dir = t.engine.roots.vm_dir("web");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("disk.qcow2"), b"half").unwrap();

    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    assert_eq!(c.record.phase, Phase::Created);
}

#[test]
fn create_unsupported_capability_refused_before_any_file() {
    let no_efi = Capabilities::new(&[Capability::Bios, Capability::RestrictedNetwork], &[]);
    let t = engine_with(FakeBackend::new("qemu").with_caps(no_efi));
    let mut s = spec(&t, "web");
    s.firmware = nubo_spec::Firmware::Efi;

    let err = t.engine.create(&s, &mut quiet()).err().unwrap();

    assert!(err.to_string().contains("unsupported by the qemu backend"), "{err}");
    assert_eq!(entries(&t.engine.roots.root), Vec::<String>::new());
    assert!(t.fake.calls().is_empty());
}

#[test]
fn create_unknown_backend_option_refused_with_path() {
    let t = fake();
    let mut s = spec(&t, "web");
    s.overrides.insert(
        "qemu".into(),
        [("smp".to_owned(), "2".to_owned())].into_iter().collect(),
    );

    let err = t.engine.create(&s, &mut quiet()).err().unwrap();

    assert!(err.to_string().contains("spec.overrides.qemu.smp"), "{err}");
    assert!(!t.engine.roots.vm_dir("web").exists());
}

#[test]
fn create_memory_beyond_host_refused_before_any_file() {
    let t = fake();
    let mut s = spec(&t, "web");
    s.resources.memory = Some(ByteSize(8 << 50));

    let err = t.engine.create(&s, &mut quiet()).err().unwrap();

    match &err {
        EngineError::Spec(e) => assert!(e.has(Field::ResourcesMemory), "{err}"),
        other => panic!("{other}"),
    }
    assert!(!t.engine.roots.vm_dir("web").exists());
}

#[test]
fn create_disk_size_below_base_refused_before_any_file() {
    let t = fake();
    let mut s = spec(&t, "web");
    s.resources.disk_size = Some(ByteSize(1 << 20));

    let err = t.engine.create(&s, &mut quiet()).err().unwrap();

    assert!(err.to_string().contains("spec.resources.diskSize"), "{err}");
    assert_eq!(entries(&t.engine.roots.root), Vec::<String>::new());
}

#[test]
fn create_bad_user_data_refused_before_lock() {
    let t = fake();
    let mut s = spec(&t, "web");
    s.cloud_init.user_data = Some(Payload::new(b"#cloud-config\n: : :\n  - [\n".to_vec()));

    let err = t.engine.create(&s, &mut quiet()).err().unwrap();

    assert!(matches!(err, EngineError::Spec(_)), "{err}");
    assert!(!t.engine.roots.run_dir.join("locks").exists());
}

#[test]
fn plan_is_printable_and_writes_nothing() {
    let t = fake();

    let (plan, _) = t.engine.plan(&spec(&t, "web"), &mut quiet()).unwrap();

    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(json["backend"], "qemu");
    assert_eq!(json["memory_mib"], 256);
    assert!(!t.engine.roots.vms().exists());
}

#[test]
fn stop_then_start_boots_again() {
    let t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    t.engine
        .stop("web", false, std::time::Duration::from_secs(1), &mut quiet())
        .unwrap();
    let stopped = t.engine.load("web").unwrap();
    let stopped_state = t.engine.state(&stopped).unwrap();
    let rec = t.engine.start("web", &mut quiet()).unwrap();

    assert_eq!(stopped_state, VmState::Stopped);
    assert_eq!(t.engine.state(&rec).unwrap(), VmState::Running);
    assert_eq!(rec.backend_state["boots"], 2);
}

#[test]
fn start_running_vm_is_noop() {
    let t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    t.engine.start("web", &mut quiet()).unwrap();

    assert_eq!(t.fake.calls(), vec!["prepare web", "boot web"]);
}

#[test]
fn start_missing_vm_not_found_and_no_lock_file() {
    let t = fake();

    let err = t.engine.start("ghost", &mut quiet()).err().unwrap();

    assert!(matches!(err, EngineError::NotFound(_)), "{err}");
    assert!(!t.engine.roots.run_dir.join("locks").join("ghost.lock").exists());
}

#[test]
fn rm_running_without_force_refused_then_forced() {
    let t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    let refused = t.engine.remove("web", false, &mut quiet()).err().unwrap();
    let removed = t.engine.remove("web", true, &mut quiet()).unwrap();

    assert!(matches!(refused, EngineError::InvalidState { .. }), "{refused}");
    assert!(removed);
    assert!(!t.engine.roots.vm_dir("web").exists());
    assert!(!t.engine.roots.run_dir.join("locks").join("web.lock").exists());
}

#[test]
fn rm_removes_the_run_directory_the_backend_did_not() {
    let t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    // What a VMM left in the run directory the engine gave it, its state not naming it (a
    // create interrupted before the backend's state was recorded).
    let run = t.engine.roots.vm_run_dir("web");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("api.sock"), b"").unwrap();

    assert!(t.engine.remove("web", true, &mut quiet()).unwrap());

    assert!(!run.exists(), "{} left behind", run.display());
}

#[test]
fn rm_absent_vm_is_success_and_makes_nothing() {
    let t = fake();

    let existed = t.engine.remove("ghost", false, &mut quiet()).unwrap();

    assert!(!existed);
    assert!(!t.engine.roots.run_dir.exists());
}

#[test]
fn corrupt_settings_error_names_fix() {
    let t = fake();
    std::fs::create_dir_all(&t.engine.roots.root).unwrap();
    std::fs::write(t.engine.roots.config_file(), b"{nope").unwrap();

    let err = t.engine.settings().err().unwrap().to_string();

    assert!(err.contains("settings") && err.contains("delete it"), "{err}");
    assert!(!err.contains("vm rm"), "{err}");
}

/// A record as wave 1 wrote it (schema 1): QEMU's runtime files in `machine.handle`.
fn wave1_record(vm_dir: &Path, run_dir: &Path, base: &Path) -> serde_json::Value {
    serde_json::json!({
        "name": "old",
        "uuid": "0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001",
        "backend": "qemu",
        "phase": "created",
        "created": "2026-11-20T10:00:00Z",
        "request": {
            "name": "old", "disk": base, "ssh_keys": [], "accel": "tcg", "restrict_network": true,
            "user_data_sha256": "a".repeat(64)
        },
        "machine": {
            "handle": {
                "name": "old", "uuid": "0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001",
                "run_dir": run_dir, "qmp_socket": run_dir.join("qmp.sock"),
                "serial_socket": run_dir.join("serial.sock"), "pid_file": run_dir.join("vmm.pid")
            },
            "uuid": "0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001",
            "vcpus": 1, "memory_mib": 512,
            "disk": vm_dir.join("disk.qcow2"), "disk_format": "qcow2",
            "seed": {"path": vm_dir.join("seed.img"), "format": "iso"},
            "boot": {"mode": "bios"},
            "machine": "pc", "accel": "tcg",
            "network": {"kind": "user", "ssh_forward": "127.0.0.1:40022", "restrict": true, "mac": "52:54:00:0b:9f:1c"},
            "console_log": vm_dir.join("console.log")
        },
        "ssh": {"port": 40022, "user": "debian", "nubo_key": true},
        "accel_reason": "TCG as requested",
        "argv": ["qemu-system-x86_64", "-uuid", "0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001"]
    })
}

#[test]
fn wave1_record_migrates_and_starts_through_new_seam() {
    let t = fake();
    let vm_dir = t.engine.roots.vm_dir("old");
    std::fs::create_dir_all(&vm_dir).unwrap();
    nubo_disk::create_overlay(&t.disk, nubo_disk::Format::Qcow2, &vm_dir.join("disk.qcow2"), None).unwrap();
    let v = wave1_record(&vm_dir, &t.engine.roots.vm_run_dir("old"), &t.disk);
    std::fs::write(vm_dir.join("vm.json"), serde_json::to_vec(&v).unwrap()).unwrap();

    let rec = t.engine.start("old", &mut quiet()).unwrap();

    assert_eq!(rec.schema, crate::record::SCHEMA);
    assert_eq!(rec.machine.disk.base, t.disk);
    assert_eq!(rec.machine.network, nubo_backend::NetworkMode::Restricted);
    assert_eq!(rec.machine.options.get("accel").map(String::as_str), Some("tcg"));
    assert_eq!(rec.ssh.user, "debian");
    let qemu = nubo_backend::qemu::state::QemuState::from_value("old", &rec.backend_state).unwrap();
    assert_eq!(qemu.ssh_port, Some(40022));
    assert_eq!(qemu.console_log, vm_dir.join("console.log"));
    assert_eq!(t.engine.state(&rec).unwrap(), VmState::Running);
    let saved = crate::record::load(&vm_dir).unwrap().unwrap();
    assert_eq!(saved.schema, crate::record::SCHEMA);
}

#[test]
fn compare_missing_same_different() {
    let t = fake();
    let s = spec(&t, "web");
    let missing = t.engine.compare(&s).unwrap();
    t.engine.create(&s, &mut quiet()).unwrap();
    let mut changed = s.clone();
    changed.resources.memory = Some(ByteSize(512 << 20));

    let (same, different) = (t.engine.compare(&s).unwrap(), t.engine.compare(&changed).unwrap());

    assert_eq!(missing, crate::apply::Observed::Missing);
    assert_eq!(same, crate::apply::Observed::Same);
    assert_eq!(
        different,
        crate::apply::Observed::Different(vec!["spec.resources.memory: 256M -> 512M".into()])
    );
}

/// Every path under `p` with its mode and content: two equal snapshots mean nothing changed.
fn snapshot(p: &Path) -> Vec<(PathBuf, u32, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut todo = vec![p.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&d) else { continue };
        let content = if m.is_file() {
            std::fs::read(&d).unwrap()
        } else {
            Vec::new()
        };
        out.push((d.clone(), m.permissions().mode(), content));
        if m.is_dir() {
            todo.extend(std::fs::read_dir(&d).unwrap().flatten().map(|e| e.path()));
        }
    }
    out.sort();
    out
}

#[test]
fn dry_run_compare_and_observe_leave_state_roots_byte_identical() {
    let t = fake();
    t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    let (root, run) = (t.engine.roots.root.clone(), t.engine.roots.run_dir.clone());
    let before = (snapshot(&root), snapshot(&run));
    let mut image = spec(&t, "db");
    image.source = DiskSource::Image {
        reference: "debian:12".into(),
    };

    t.engine.dry_run(&spec(&t, "api")).unwrap();
    let _ = t.engine.dry_run(&image);
    t.engine.compare(&spec(&t, "web")).unwrap();
    t.engine.observe("web").unwrap();
    t.engine.plan_apply(&spec(&t, "web"), false).unwrap();
    t.engine.check_references(&image).unwrap();

    assert_eq!((snapshot(&root), snapshot(&run)), before);
    assert!(!root.join("images").exists(), "a dry run made the image store");
}

/// QEMU's: a general VMM with a microvm machine, its guests reached through forwards.
fn micro_caps() -> Capabilities {
    Capabilities::new(
        &[
            Capability::DirectKernel,
            Capability::Microvm,
            Capability::PortForwards,
            Capability::RestrictedNetwork,
        ],
        &[],
    )
}

/// Cloud Hypervisor's: a VMM built for microVMs, its guests on a host bridge.
fn native_micro_caps() -> Capabilities {
    Capabilities::new(
        &[Capability::DirectKernel, Capability::Microvm, Capability::MicrovmNative],
        &[],
    )
}

fn microvm_spec(t: &T) -> VmSpec {
    let mut s = spec(t, "micro");
    s.network = Network::Forward;
    s.machine = nubo_spec::Machine::Microvm;
    s.boot = Some(nubo_spec::KernelBoot {
        kernel: t.disk.clone(),
        initrd: None,
        cmdline: Some("console=ttyS0".into()),
    });
    s
}

/// The test root's qemu beside a cloud-hypervisor (alias `ch`), both able to boot a microVM:
/// the engine the selection tests plan with.
fn qemu_and_cloud_hypervisor() -> (T, Engine) {
    let t = engine_with(FakeBackend::new("qemu").with_caps(micro_caps()));
    let ch = FakeBackend::new("cloud-hypervisor")
        .with_aliases(&["ch"])
        .with_caps(native_micro_caps());
    let engine = Engine::new(
        t.engine.roots.clone(),
        Registry::new(vec![Box::new(t.fake.clone()), Box::new(ch)]),
        None,
    );
    (t, engine)
}

#[test]
fn plan_microvm_workload_picks_cloud_hypervisor() {
    let (t, engine) = qemu_and_cloud_hypervisor();

    let plan = engine.dry_run(&microvm_spec(&t)).unwrap();

    assert_eq!(plan.backend, "cloud-hypervisor");
}

#[test]
fn plan_kernel_boot_on_default_machine_keeps_qemu() {
    let t = engine_with(FakeBackend::new("qemu").with_caps(micro_caps()));
    let ch = FakeBackend::new("cloud-hypervisor").with_caps(native_micro_caps());
    let engine = Engine::new(
        t.engine.roots.clone(),
        Registry::new(vec![Box::new(t.fake.clone()), Box::new(ch)]),
        None,
    );
    let mut s = microvm_spec(&t);
    s.machine = nubo_spec::Machine::Default;

    let plan = engine.dry_run(&s).unwrap();

    assert_eq!(plan.backend, "qemu");
}

#[test]
fn plan_microvm_restricted_network_passes_cloud_hypervisor_over_for_qemu() {
    let (t, engine) = qemu_and_cloud_hypervisor();
    let mut s = microvm_spec(&t);
    s.network = Network::Restricted;

    let plan = engine.dry_run(&s).unwrap();

    assert_eq!(plan.backend, "qemu");
    assert_eq!(plan.backend_source, nubo_backend::Source::Heuristic);
}

#[test]
fn plan_microvm_network_none_picks_cloud_hypervisor_without_a_network() {
    let (t, engine) = qemu_and_cloud_hypervisor();
    let mut s = microvm_spec(&t);
    s.network = Network::None;

    let plan = engine.dry_run(&s).unwrap();

    assert_eq!(plan.backend, "cloud-hypervisor");
    assert_eq!(plan.network, nubo_backend::NetworkMode::None);
}

#[test]
fn launch_without_a_fresher_one_is_the_recorded() {
    let t = fake();
    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

    let v = t.engine.launch(&c.record).unwrap();

    assert_eq!(
        (v.launch, v.source, v.note),
        (c.record.launch.clone(), crate::LaunchSource::Record, None)
    );
}

#[test]
fn launch_fresh_from_the_backend_replaces_the_recorded() {
    let t = fake();
    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    *t.fake.launch_now.lock().unwrap() = Some(Ok("<domain id='7'/>".into()));

    let v = t.engine.launch(&c.record).unwrap();

    assert_eq!(v.launch, Some(nubo_backend::Launch::Xml("<domain id='7'/>".into())));
    assert_eq!((v.source, v.note), (crate::LaunchSource::Backend, None));
}

#[test]
fn launch_backend_unreachable_is_the_recorded_with_a_note() {
    let t = fake();
    let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
    *t.fake.launch_now.lock().unwrap() = Some(Err("connection refused".into()));

    let v = t.engine.launch(&c.record).unwrap();

    assert_eq!(
        (v.launch, v.source),
        (c.record.launch.clone(), crate::LaunchSource::Record)
    );
    let note = v.note.unwrap();
    assert!(
        note.contains("connection refused") && note.contains("recorded at its last boot"),
        "{note}"
    );
}

mod cancel;
mod concurrency;
