//! One `Engine` driven from 4 threads on the qemu backend, as a daemon would: two threads per
//! VM name create, stop and start it at once, while a watcher samples the host's processes.
//! Never two VMMs for one name, nothing left behind after `rm`. The disk is a blank raw file:
//! QEMU runs (SeaBIOS finds nothing to boot and idles), no OS boots, so the test stays cheap.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use nubo_backend::qemu::QemuBackend;
use nubo_backend::{HostEnv, Registry};
use nubo_core::{ByteSize, Roots, VmName};
use nubo_engine::{Engine, EngineError};
use nubo_live::{LiveTest, TestResult, TestRoot};
use nubo_spec::{DiskSource, Network, VmSpec};

const NAMES: [&str; 2] = ["cc-a", "cc-b"];
const THREADS: usize = 4;
const ROUNDS: usize = 2;
/// The whole run's bound: four QEMUs under TCG start in a few seconds each.
const BUDGET: Duration = Duration::from_secs(120);

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "engine_four_threads_qemu_one_vmm_per_name",
        &["qemu"],
        || nubo_live::timed("engine_four_threads_qemu", four_threads),
    )])
}

/// VMMs of VM `name` under this test's run directory (other tests' VMs may share the name,
/// never the run directory). QEMU starts with `-daemonize`: it forks, the child forks the VMM
/// and exits, and the first process (a child of this one, the engine's) waits until the VMM is
/// ready. Only the detached processes are VMMs; the launcher still attached to us, and an
/// intermediate child whose parent is one of them, are one VMM being started.
fn vmms(run_dir: &Path, name: &str) -> usize {
    let marker = format!("{name},process=nubo-{name}");
    let run = run_dir.display().to_string();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let matching: HashMap<u32, u32> = procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<String> = c
                .split(|&b| b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            args.contains(&marker) && args.iter().any(|a| a.contains(&run))
        })
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    let launcher = std::process::id();
    matching
        .values()
        .filter(|&&ppid| ppid != launcher && !matching.contains_key(&ppid))
        .count()
}

/// The parent pid, from `/proc/PID/stat` (after the command name, which may hold spaces).
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Removes every VM of the test, whatever happened (rm --force kills the VMM).
struct Cleanup(Arc<Engine>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        for n in NAMES {
            let _ = self.0.remove(n, true, &mut |_| {});
        }
    }
}

fn spec(name: &str, disk: &Path) -> VmSpec {
    let mut s = VmSpec::new(
        VmName::parse(name).expect("a valid name"),
        DiskSource::Disk {
            path: disk.to_path_buf(),
        },
    );
    // User-mode networking, restrict=on: nothing leaves the host.
    s.network = Network::Restricted;
    s.resources.memory = Some(ByteSize(128 << 20));
    s
}

/// What a racing command may answer: done, or the other thread's create of the same VM was
/// not finished yet.
fn acceptable<T>(what: &str, r: Result<T, EngineError>) -> TestResult {
    match r {
        Ok(_) | Err(EngineError::InvalidState { .. }) => Ok(()),
        Err(e) => Err(format!("{what}: {e}")),
    }
}

fn four_threads() -> TestResult {
    let root = TestRoot::new()?;
    let run_dir = root.run_dir().to_path_buf();
    let disk = root.root().join("blank.raw");
    std::fs::write(&disk, vec![0u8; 1 << 20]).map_err(|e| format!("writing {}: {e}", disk.display()))?;
    let engine = Arc::new(Engine::new(
        Roots {
            root: root.root().to_path_buf(),
            run_dir: run_dir.clone(),
        },
        Registry::new(vec![Box::new(QemuBackend::with_host(HostEnv::from_process()))]),
        None,
    ));
    let _cleanup = Cleanup(engine.clone());

    // The watcher: the most VMMs of each name seen at once while the threads work.
    let done = Arc::new(AtomicBool::new(false));
    let most: Arc<Mutex<HashMap<&str, usize>>> = Arc::default();
    let watcher = {
        let (done, most, run_dir) = (done.clone(), most.clone(), run_dir.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::SeqCst) {
                for n in NAMES {
                    let seen = vmms(&run_dir, n);
                    let mut m = most.lock().expect("not poisoned");
                    let e = m.entry(n).or_insert(0);
                    *e = (*e).max(seen);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let (tx, rx) = mpsc::channel();
    for i in 0..THREADS {
        let (engine, tx, disk) = (engine.clone(), tx.clone(), disk.clone());
        std::thread::spawn(move || {
            let name = NAMES[i % NAMES.len()];
            let r = (|| -> TestResult {
                for _ in 0..ROUNDS {
                    acceptable("create", engine.create(&spec(name, &disk), &mut |_| {}))?;
                    acceptable("stop", engine.stop(name, true, Duration::from_secs(5), &mut |_| {}))?;
                    acceptable("start", engine.start(name, &mut |_| {}))?;
                }
                Ok(())
            })();
            let _ = tx.send((name, r));
        });
    }
    drop(tx);
    let deadline = Instant::now() + BUDGET;
    let mut failures = Vec::new();
    for _ in 0..THREADS {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((name, Err(e))) => failures.push(format!("vm `{name}`: {e}")),
            Ok((_, Ok(()))) => {}
            Err(_) => {
                failures.push(format!("the threads did not finish within {}s", BUDGET.as_secs()));
                break;
            }
        }
    }
    done.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    if !failures.is_empty() {
        return Err(failures.join("; "));
    }
    let most = most.lock().expect("not poisoned").clone();
    if most.values().any(|&n| n > 1) {
        return Err(format!("two VMMs of one name ran at once: {most:?}"));
    }

    // Each VM is whole: recorded, running, one VMM; then rm leaves nothing.
    for n in NAMES {
        engine.start(n, &mut |_| {}).map_err(|e| format!("start {n}: {e}"))?;
        let count = vmms(&run_dir, n);
        if count != 1 {
            return Err(format!("vm `{n}` runs {count} VMMs after start, not 1"));
        }
        if !engine
            .remove(n, true, &mut |_| {})
            .map_err(|e| format!("rm {n}: {e}"))?
        {
            return Err(format!("rm {n} found no VM"));
        }
        let count = vmms(&run_dir, n);
        if count != 0 {
            return Err(format!("vm `{n}` still runs {count} VMMs after rm"));
        }
    }
    let left: Vec<PathBuf> = [root.root().join("vms"), run_dir.clone()]
        .iter()
        .flat_map(|d| walk(d))
        .filter(|p| !p.is_dir())
        .collect();
    if !left.is_empty() {
        return Err(format!("files left after rm: {left:?}"));
    }
    Ok(())
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out
}
