//! One `Engine` driven from 16 threads at once, as a daemon would: creates, starts, stops and
//! removals of shared and per-thread VM names, interleaved. Nothing may be lost, no VM may run
//! twice, and nothing may be left behind but what the surviving VMs own.

use std::path::Path;
use std::time::Duration;

use nubo_core::VmState;

use super::{fake, quiet, spec};
use crate::EngineError;

const THREADS: usize = 16;
const ROUNDS: usize = 6;
/// Names every thread works on, so commands on one VM really do race.
const SHARED: [&str; 3] = ["shared0", "shared1", "shared2"];

/// What a racing command may honestly answer: done, or the VM it wanted was removed (or not
/// yet fully created) by another thread meanwhile. Busy would mean the lock wait failed
/// (the wait here is long), anything else is a bug.
fn acceptable<T>(r: Result<T, EngineError>) {
    match r {
        Ok(_) | Err(EngineError::NotFound(_)) | Err(EngineError::InvalidState { .. }) => {}
        Err(e) => panic!("unexpected error under concurrency: {e}"),
    }
}

/// Every file under `dir`, relative.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn engine_sixteen_threads_interleaved_no_lost_record_no_double_vmm_no_stray_file() {
    let mut t = fake();
    t.engine.lock_wait = Duration::from_secs(60);
    let t = t;

    std::thread::scope(|s| {
        for i in 0..THREADS {
            let t = &t;
            s.spawn(move || {
                let own = format!("own{i}");
                for round in 0..ROUNDS {
                    let shared = SHARED[(i + round) % SHARED.len()];
                    match (i + round) % 4 {
                        0 => acceptable(t.engine.create(&spec(t, shared), &mut quiet())),
                        1 => acceptable(t.engine.start(shared, &mut quiet())),
                        2 => acceptable(t.engine.stop(shared, false, Duration::from_secs(1), &mut quiet())),
                        _ => acceptable(t.engine.remove(shared, true, &mut quiet())),
                    }
                    t.engine.create(&spec(t, &own), &mut quiet()).unwrap();
                    if round % 2 == 0 {
                        t.engine
                            .stop(&own, false, Duration::from_secs(1), &mut quiet())
                            .unwrap();
                        t.engine.start(&own, &mut quiet()).unwrap();
                    }
                    if round + 1 < ROUNDS {
                        assert!(t.engine.remove(&own, true, &mut quiet()).unwrap());
                    }
                }
            });
        }
    });

    // No lost record: every thread's last VM is there, whole and running.
    for i in 0..THREADS {
        let rec = t.engine.load(&format!("own{i}")).unwrap();
        assert_eq!(t.engine.state(&rec).unwrap(), VmState::Running, "own{i}");
    }
    // No double VMM: never two VMs of one name active at once.
    let most = t.fake.most_active.lock().unwrap().clone();
    assert!(most.len() > THREADS, "{most:?}");
    assert!(most.values().all(|&n| n == 1), "{most:?}");
    // The backend runs exactly the VMs that have records, one each.
    let listed: Vec<String> = t.engine.list().unwrap().into_iter().map(|s| s.name).collect();
    let running = t.fake.vms.lock().unwrap().values().filter(|s| s.is_active()).count();
    let running_recorded = listed
        .iter()
        .filter(|n| t.engine.state(&t.engine.load(n).unwrap()).unwrap().is_active())
        .count();
    assert_eq!(running, running_recorded);
    // No stray file: no temp file anywhere, every VM directory holds a record, and the only
    // lock files are those of VMs that exist (nubo's SSH key lock aside: it guards the key).
    let root = files(&t.engine.roots.root);
    assert!(root.iter().all(|f| !f.contains(".tmp")), "{root:#?}");
    for dir in super::entries(&t.engine.roots.root.join("vms")) {
        assert!(listed.contains(&dir), "vm directory {dir} without a record");
    }
    for lock in super::entries(&t.engine.roots.run_dir.join("locks")) {
        let name = lock.strip_suffix(".lock").unwrap_or(&lock);
        assert!(listed.iter().any(|n| n == name), "stray lock file {lock}");
    }
    let run = files(&t.engine.roots.run_dir);
    assert!(run.iter().all(|f| !f.contains(".tmp")), "{run:#?}");
}
