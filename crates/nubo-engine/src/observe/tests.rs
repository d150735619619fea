//! `Engine::observe` on the FakeBackend, with console logs written as a guest's would be.

use std::time::Duration;

use nubo_backend::fake::FakeBackend;
use nubo_core::ErrorKind;
use nubo_spec::Payload;

use super::*;
use crate::tests::{engine_with, fake, quiet, spec, T};

const KERNEL: &str = "[    0.000000] Linux version 6.1.0-27-cloud-amd64 (debian-kernel@lists.debian.org)\n";
const FINISHED: &str = "[   45.6] cloud-init[512]: Cloud-init v. 22.4.2 finished at Tue, 01 Dec 2026 20:00:00 +0000. Datasource DataSourceNoCloud [seed=/dev/vdb][dsmode=net].  Up 45.67 seconds\r\n";
const NO_SEED: &str =
    "Cloud-init v. 22.4.2 finished at Tue, 01 Dec 2026 20:00:00 +0000. Datasource DataSourceNone.  Up 9.00 seconds\n";

fn created(t: &T, name: &str) {
    t.engine.create(&spec(t, name), &mut quiet()).unwrap();
}

fn console(t: &T, name: &str, lines: &[&str]) {
    std::fs::write(t.engine.roots.vm_dir(name).join("console.log"), lines.concat()).unwrap();
}

fn status(s: &VmStatus, kind: ConditionType) -> (ConditionStatus, String) {
    let c = s.condition(kind).unwrap();
    (c.status, c.reason.clone())
}

fn edit_record(t: &T, name: &str, edit: impl FnOnce(&mut VmRecord)) {
    let dir = t.engine.roots.vm_dir(name);
    let mut rec = record::load(&dir).unwrap().unwrap();
    edit(&mut rec);
    record::save(&dir, &rec).unwrap();
}

#[test]
fn observe_booting_vm_provisioned_running_seed_current_cloud_init_not_yet() {
    let t = fake();
    created(&t, "web");
    console(&t, "web", &[KERNEL]);

    let s = t.engine.observe("web").unwrap();

    assert_eq!(s.phase, record::Phase::Created);
    assert_eq!(s.domain.state.as_deref(), Some("running"));
    assert_eq!(s.readiness.phase, Some(Phase::KernelBooting));
    assert_eq!(
        s.conditions.iter().map(|c| (c.kind, c.status)).collect::<Vec<_>>(),
        vec![
            (ConditionType::Provisioned, ConditionStatus::True),
            (ConditionType::Running, ConditionStatus::True),
            (ConditionType::CloudInitDone, ConditionStatus::False),
            (ConditionType::SeedCurrent, ConditionStatus::True),
        ]
    );
    assert_eq!(status(&s, ConditionType::CloudInitDone).1, "Booting");
}

#[test]
fn observe_console_finished_cloud_init_done_true_with_datasource() {
    let t = fake();
    created(&t, "web");
    console(&t, "web", &[KERNEL, FINISHED]);

    let s = t.engine.observe("web").unwrap();

    assert_eq!(s.readiness.phase, Some(Phase::CloudInitFinished));
    let c = s.condition(ConditionType::CloudInitDone).unwrap();
    assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::True, "Finished"));
    assert!(c.message.contains("DataSourceNoCloud [seed=/dev/vdb]"), "{}", c.message);
}

#[test]
fn observe_seed_not_read_cloud_init_done_false_with_evidence_line() {
    let t = fake();
    created(&t, "web");
    console(&t, "web", &[KERNEL, NO_SEED]);

    let s = t.engine.observe("web").unwrap();

    assert_eq!(s.readiness.evidence.as_deref(), Some(NO_SEED.trim()));
    assert!(matches!(s.readiness.failure, Some(Failure::SeedNotRead { .. })));
    let c = s.condition(ConditionType::CloudInitDone).unwrap();
    assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, "SeedNotRead"));
    assert!(
        c.message.contains("read no seed") && c.message.contains("Joliet"),
        "{}",
        c.message
    );
}

#[test]
fn observe_stopped_vm_running_false_cloud_init_unknown() {
    let t = fake();
    created(&t, "web");
    console(&t, "web", &[KERNEL, FINISHED]);
    t.engine
        .stop("web", true, Duration::from_secs(1), &mut quiet())
        .unwrap();

    let s = t.engine.observe("web").unwrap();

    assert_eq!(
        status(&s, ConditionType::Running),
        (ConditionStatus::False, "Stopped".to_owned())
    );
    assert_eq!(
        status(&s, ConditionType::CloudInitDone),
        (ConditionStatus::Unknown, "NotRunning".to_owned())
    );
    assert!(s
        .condition(ConditionType::Running)
        .unwrap()
        .message
        .contains("nubo vm start web"));
}

#[test]
fn observe_against_changed_user_data_seed_current_false_naming_field() {
    let t = fake();
    created(&t, "web");
    let mut desired = spec(&t, "web");
    desired.cloud_init.user_data = Some(Payload::new(b"#cloud-config\npackages: [nginx]\n".to_vec()));

    let s = t.engine.observe_against(&desired).unwrap();

    let c = s.condition(ConditionType::SeedCurrent).unwrap();
    assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, "InputsChanged"));
    assert!(c.message.contains("spec.cloudInit.userData"), "{}", c.message);
}

#[test]
fn observe_against_changed_memory_seed_still_current() {
    let t = fake();
    created(&t, "web");
    let mut desired = spec(&t, "web");
    desired.resources.memory = Some(nubo_core::ByteSize(512 << 20));

    let s = t.engine.observe_against(&desired).unwrap();

    assert_eq!(
        status(&s, ConditionType::SeedCurrent),
        (ConditionStatus::True, "InputsUnchanged".to_owned())
    );
}

#[test]
fn observe_record_without_seed_inputs_seed_current_unknown() {
    let t = fake();
    created(&t, "web");
    edit_record(&t, "web", |r| r.seed_inputs = None);

    let s = t.engine.observe("web").unwrap();

    assert_eq!(
        status(&s, ConditionType::SeedCurrent),
        (ConditionStatus::Unknown, "NotRecorded".to_owned())
    );
}

#[test]
fn observe_interrupted_create_provisioned_false_with_fix() {
    let t = fake();
    created(&t, "web");
    edit_record(&t, "web", |r| r.phase = record::Phase::Creating);

    let s = t.engine.observe("web").unwrap();

    let c = s.condition(ConditionType::Provisioned).unwrap();
    assert_eq!((c.status, c.reason.as_str()), (ConditionStatus::False, "Creating"));
    assert!(c.message.contains("nubo vm rm web"), "{}", c.message);
    assert_eq!(
        status(&s, ConditionType::Running),
        (ConditionStatus::False, "NotProvisioned".to_owned())
    );
}

#[test]
fn observe_missing_vm_not_found() {
    let t = fake();

    let err = t.engine.observe("ghost").unwrap_err();

    assert_eq!(err.kind(), ErrorKind::NotFound);
}

#[test]
fn observe_hostile_name_refused_before_any_read() {
    let t = fake();

    let err = t.engine.observe("../etc").unwrap_err();

    assert_eq!(err.kind(), ErrorKind::InvalidInput);
}

#[test]
fn observe_snapshots_summary_counts_oldest_first() {
    let mut b = FakeBackend::new("qemu");
    b.caps.insert(nubo_backend::Capability::Snapshot);
    let t = engine_with(b);
    created(&t, "web");
    t.engine
        .snapshot_create("web", Some("one"), None, &mut quiet())
        .unwrap();
    t.engine
        .snapshot_create("web", Some("two"), None, &mut quiet())
        .unwrap();

    let s = t.engine.observe("web").unwrap();

    assert_eq!(s.snapshots.count, 2);
    assert_eq!(s.snapshots.names, vec!["one", "two"]);
    assert_eq!(s.snapshots.latest.as_deref(), Some("two"));
    assert_eq!(s.snapshots.current.as_deref(), Some("two"));
}

#[test]
fn observe_json_camel_case_conditions_in_kubernetes_shape() {
    let t = fake();
    created(&t, "web");

    let v = serde_json::to_value(t.engine.observe("web").unwrap()).unwrap();

    assert_eq!(v["conditions"][0]["type"], "Provisioned");
    assert_eq!(v["conditions"][0]["status"], "True");
    assert_eq!(v["conditions"][0]["reason"], "Created");
    assert!(v["readiness"]["consoleLog"].is_string(), "{v}");
    assert!(v["addresses"]["ports"].is_array(), "{v}");
}

#[test]
fn console_view_errors_after_finished_fail_with_first_problem_as_evidence() {
    let warning = "2026 - cc_runcmd.py[WARNING]: Failed to run module runcmd\n";

    let v = console_view([KERNEL, warning, FINISHED], true, Path::new("/x/console.log"));

    assert_eq!(v.phase, Some(Phase::CloudInitFinished));
    assert!(matches!(v.failure, Some(Failure::CloudInitErrors { .. })));
    assert_eq!(v.evidence.as_deref(), Some(warning.trim()));
}

#[test]
fn console_view_silent_console_of_live_vmm_is_vmm_running() {
    let v = console_view(std::iter::empty(), true, Path::new("/x/console.log"));

    assert_eq!((v.phase, v.failure), (Some(Phase::VmmRunning), None));
}

#[test]
fn read_console_fifo_is_not_read_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("console.log");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();

    let v = read_console(&fifo, false);

    assert_eq!((v.phase, v.finished), (None, None));
    assert!(v.console_error.is_some_and(|e| e.contains("console log")));
}

#[test]
fn read_console_missing_log_is_no_error() {
    let dir = tempfile::tempdir().unwrap();

    let v = read_console(&dir.path().join("console.log"), true);

    assert_eq!((v.phase, v.console_error), (Some(Phase::VmmRunning), None));
}

#[test]
fn observe_unreadable_console_cloud_init_done_unknown() {
    let t = fake();
    created(&t, "web");
    std::fs::create_dir(t.engine.roots.vm_dir("web").join("console.log")).unwrap();

    let s = t.engine.observe("web").unwrap();

    assert_eq!(
        status(&s, ConditionType::CloudInitDone),
        (ConditionStatus::Unknown, "ConsoleUnreadable".to_owned())
    );
}

#[test]
fn seed_inputs_digest_changes_with_ssh_key_not_with_vcpus() {
    let t = fake();
    let base = spec(&t, "web");
    let mut keyed = base.clone();
    keyed.cloud_init.ssh_keys.push("ssh-ed25519 AAAA user@host".into());
    let mut bigger = base.clone();
    bigger.resources.vcpus = Some(4);

    let (b, k, v) = (
        seed_inputs_digest(&base),
        seed_inputs_digest(&keyed),
        seed_inputs_digest(&bigger),
    );

    assert_ne!(b, k);
    assert_eq!(b, v);
    assert!(b.starts_with("sha256:") && b.len() == 7 + 64, "{b}");
}

// Engine::readiness: the state machine over a real record and the fake backend.

fn steps_to_end(t: &T, name: &str) -> (Vec<Phase>, crate::readiness::Step) {
    use crate::readiness::{Step, WaitFor};
    let mut r = t
        .engine
        .readiness(
            name,
            WaitFor::CloudInit,
            Duration::from_secs(5),
            std::time::Instant::now(),
        )
        .unwrap();
    let mut phases = Vec::new();
    loop {
        match r.step() {
            Step::Phase(p, _) => phases.push(p),
            Step::PollAfter(d) => std::thread::sleep(d),
            end => return (phases, end),
        }
    }
}

#[test]
fn engine_readiness_finished_console_steps_to_done() {
    let t = fake();
    created(&t, "web");
    console(&t, "web", &[KERNEL, FINISHED]);

    let (phases, end) = steps_to_end(&t, "web");

    assert_eq!(
        phases,
        vec![Phase::VmmRunning, Phase::KernelBooting, Phase::CloudInitFinished]
    );
    assert!(
        matches!(&end, crate::readiness::Step::Done(o) if o.finished.as_ref().is_some_and(|f| f.datasource == "DataSourceNoCloud")),
        "{end:?}"
    );
}

#[test]
fn engine_readiness_crashed_vmm_steps_to_failed_with_fix() {
    let t = fake();
    created(&t, "web");
    let uuid = t.engine.load("web").unwrap().uuid;
    let mut r = t
        .engine
        .readiness(
            "web",
            crate::readiness::WaitFor::CloudInit,
            Duration::from_secs(5),
            std::time::Instant::now(),
        )
        .unwrap();

    t.fake.crash(&uuid);
    let step = r.step();

    let crate::readiness::Step::Failed(e) = step else {
        panic!("not failed: {step:?}")
    };
    assert_eq!(e.failure, Failure::VmmExited);
    assert!(e.fix().is_some_and(|f| f.contains("console.log")));
}

#[test]
fn engine_readiness_stopped_vm_refused_with_fix() {
    let t = fake();
    created(&t, "web");
    t.engine
        .stop("web", true, Duration::from_secs(1), &mut quiet())
        .unwrap();

    let err = t
        .engine
        .readiness(
            "web",
            crate::readiness::WaitFor::CloudInit,
            Duration::from_secs(5),
            std::time::Instant::now(),
        )
        .err()
        .unwrap();

    assert_eq!(err.fix().as_deref(), Some("start it first: `nubo vm start web`"));
}

#[test]
fn engine_readiness_state_machine_is_send() {
    fn send<S: Send>() {}

    send::<crate::readiness::Readiness<crate::lifecycle::VmProbes<'static>>>();
}
