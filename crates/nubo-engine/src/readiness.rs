//! Readiness: "cloud-init has finished", proven from cloud-init's own closing line on the serial
//! console, not "the VMM started". The line classifier is pure; [`wait`] follows the console log.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nubo_backend::AddressCheck;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    VmmRunning,
    KernelBooting,
    /// The backend saw the guest's DHCP lease bearing the VM's name (libvirt).
    AddressLeased,
    SshReachable,
    CloudInitFinished,
}

impl Phase {
    pub fn label(self) -> &'static str {
        match self {
            Phase::VmmRunning => "VMM running",
            Phase::KernelBooting => "kernel booting",
            Phase::AddressLeased => "DHCP lease with the VM's hostname",
            Phase::SshReachable => "SSH reachable",
            Phase::CloudInitFinished => "cloud-init finished",
        }
    }
}

/// cloud-init's closing line, e.g. `Cloud-init v. 22.4.2 finished at Tue, 01 Dec 2026 20:00:00
/// +0000. Datasource DataSourceNoCloud [seed=/dev/vdb][dsmode=net].  Up 45.67 seconds`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finished {
    pub version: String,
    pub datasource: String,
    pub seed: Option<String>,
    pub uptime_seconds: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsoleEvent {
    KernelBooting,
    Finished(Finished),
    /// A cloud-init warning or error line (its module failed, its config did not validate).
    CloudInitProblem(String),
    /// The guest cannot get as far as cloud-init: a kernel panic, or the initramfs giving up on
    /// the root disk and dropping to its shell. Waiting on is pointless.
    BootFailed(String),
}

/// Console lines after which the guest never reaches cloud-init.
const BOOT_FAILURES: [&str; 2] = ["Kernel panic - not syncing", "Dropping to a shell!"];

/// Classifies one console line.
pub fn classify(line: &str) -> Option<ConsoleEvent> {
    let line = line.trim_end_matches(['\r', '\n']);
    if line.contains("Linux version ") {
        return Some(ConsoleEvent::KernelBooting);
    }
    if let Some(f) = parse_finished(line) {
        return Some(ConsoleEvent::Finished(f));
    }
    if BOOT_FAILURES.iter().any(|m| line.contains(m)) {
        return Some(ConsoleEvent::BootFailed(line.trim().to_owned()));
    }
    let problem = ["[WARNING]", "[ERROR]", "[CRITICAL]"].iter().any(|m| line.contains(m))
        && (line.contains(".py[") || line.contains("cloud-init"));
    let failed_unit = line.contains("Failed to start") && line.contains("cloud");
    (problem || failed_unit).then(|| ConsoleEvent::CloudInitProblem(line.trim().to_owned()))
}

fn parse_finished(line: &str) -> Option<Finished> {
    let start = line.find("Cloud-init v. ")?;
    let rest = &line[start + "Cloud-init v. ".len()..];
    let (version, rest) = rest.split_once(' ')?;
    if !rest.starts_with("finished at ") {
        return None;
    }
    let ds_at = rest.find("Datasource ")?;
    let ds = &rest[ds_at + "Datasource ".len()..];
    let name_end = ds.find([' ', '[', '.']).unwrap_or(ds.len());
    let datasource = ds[..name_end].to_owned();
    let seed = ds.find("[seed=").and_then(|i| {
        let s = &ds[i + "[seed=".len()..];
        s.find(']').map(|j| s[..j].to_owned())
    });
    let uptime_seconds = rest
        .find("Up ")
        .and_then(|i| rest[i + 3..].split_whitespace().next().map(str::to_owned));
    Some(Finished {
        version: version.to_owned(),
        datasource,
        seed,
        uptime_seconds,
    })
}

/// Why a guest that finished without reading the seed did so, for the error message.
/// How often the console log is read while waiting.
pub const POLL: Duration = Duration::from_millis(20);

/// How often a predicted address is looked at (two small /proc reads).
const ADDRESS_EVERY: Duration = Duration::from_millis(500);

pub const SEED_NOT_READ_CAUSES: &str =
    "likely causes: the seed's bus is invisible to the guest kernel (cloud kernels have no AHCI/SATA driver), \
the seed has no Joliet tree, or its volume label is not CIDATA; `nubo seed inspect` shows what the seed holds";

pub const BOOT_FAILED_CAUSES: &str =
    "the guest never reaches cloud-init: its kernel cannot see or mount the root disk (a disk or bus driver \
missing from, or not loaded by, the initramfs for this machine type; a wrong root=) or panicked; try `--machine pc`";

/// Reads a growing console log from an offset, line by line.
pub struct ConsoleFollower {
    path: PathBuf,
    offset: u64,
    partial: Vec<u8>,
}

impl ConsoleFollower {
    pub fn new(path: &Path, offset: u64) -> Self {
        ConsoleFollower {
            path: path.to_path_buf(),
            offset,
            partial: Vec::new(),
        }
    }

    /// Complete lines appended since the last call.
    pub fn poll(&mut self) -> Vec<String> {
        let Ok(mut f) = File::open(&self.path) else {
            return Vec::new();
        };
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len < self.offset {
            // Rotated underneath us: a new boot's log.
            self.offset = 0;
            self.partial.clear();
        }
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            return Vec::new();
        }
        self.offset += buf.len() as u64;
        self.partial.extend_from_slice(&buf);
        let mut lines = Vec::new();
        while let Some(i) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            lines.push(String::from_utf8_lossy(&line).into_owned());
        }
        lines
    }
}

/// What the waiter needs from the world, so the loop itself is testable.
pub trait Probes {
    fn vmm_alive(&mut self) -> bool;
    fn ssh_banner(&mut self) -> bool;
    /// `cloud-init status --wait --long` over SSH, for guests whose console says nothing.
    fn cloud_init_status_over_ssh(&mut self) -> Option<Result<String, String>>;
    /// The backend's own network signal (a DHCP lease bearing the VM's name), when it has one.
    fn leased(&mut self) -> bool {
        false
    }

    /// For a guest whose address was predicted rather than observed: the address and what the
    /// host sees of it now. `None` when the address is not predicted.
    fn predicted_address(&mut self) -> Option<(String, AddressCheck)> {
        None
    }
}

/// The answer `--wait` gives about a predicted address, besides cloud-init's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "outcome")]
pub enum AddressOutcome {
    /// The guest answered at it: the evidence (its SSH banner, or the host's neighbour entry).
    Up { address: String, evidence: String },
    /// The host cannot check it from here: why.
    Unverifiable { address: String, why: String },
}

/// What waiting does next about a predicted address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressStep {
    /// The address question is settled.
    Done(AddressOutcome),
    /// It cannot be settled: fail with this.
    Fail(Failure),
    /// Look again later.
    Wait,
}

/// The decision about a predicted address, from what is known now. Pure. `banner` is an SSH
/// banner read from the address; `finished` says cloud-init's closing line was seen (waiting
/// for cloud-init settles the address only after it); `timed_out` is the last look.
///
/// The three honest outcomes: up (banner, or a neighbour entry when waiting for cloud-init);
/// cannot be checked from here (said at once when waiting for SSH, which then cannot be proven;
/// a note beside cloud-init's proof otherwise); running but never answered (at the timeout).
pub fn address_step(
    target: WaitFor,
    address: &str,
    check: &AddressCheck,
    banner: bool,
    finished: bool,
    timed_out: bool,
    timeout: Duration,
) -> AddressStep {
    let settled = target == WaitFor::Ssh || finished;
    let up = |evidence: String| {
        AddressStep::Done(AddressOutcome::Up {
            address: address.to_owned(),
            evidence,
        })
    };
    if banner && settled {
        return up(format!("SSH banner from {address}:22"));
    }
    match check {
        AddressCheck::Seen(e) if finished && target == WaitFor::CloudInit => up(e.clone()),
        AddressCheck::Unverifiable(why) if target == WaitFor::Ssh => AddressStep::Fail(Failure::AddressUnverifiable {
            address: address.to_owned(),
            why: why.clone(),
        }),
        AddressCheck::Unverifiable(why) if finished => AddressStep::Done(AddressOutcome::Unverifiable {
            address: address.to_owned(),
            why: why.clone(),
        }),
        AddressCheck::NotSeen if timed_out && settled => AddressStep::Fail(Failure::AddressNeverAnswered {
            address: address.to_owned(),
            after_secs: timeout.as_secs(),
        }),
        _ => AddressStep::Wait,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitFor {
    Ssh,
    CloudInit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub reached: Phase,
    pub finished: Option<Finished>,
    /// From SSH, when the console never showed cloud-init.
    pub status_over_ssh: Option<String>,
    /// What became of a predicted address (`None` when the address is observed, or absent).
    pub address: Option<AddressOutcome>,
}

/// Why waiting failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "cause")]
pub enum Failure {
    /// The VMM process went away while waiting.
    VmmExited,
    /// A kernel panic or the initramfs shell: the guest never reaches cloud-init.
    BootFailed,
    /// cloud-init finished without reading the seed (`DataSourceNone`).
    SeedNotRead {
        datasource: String,
    },
    /// cloud-init finished, with warnings or errors from its modules.
    CloudInitErrors {
        datasource: String,
        problems: Vec<String>,
    },
    /// `cloud-init status` over SSH reported failure.
    CloudInitFailed,
    TimedOut {
        after_secs: u64,
        target: WaitFor,
    },
    /// The guest's predicted address cannot be checked from here, so SSH cannot be proven.
    AddressUnverifiable {
        address: String,
        why: String,
    },
    /// The VM runs, but nothing answered at its predicted address within the timeout.
    AddressNeverAnswered {
        address: String,
        after_secs: u64,
    },
}

/// A failed wait: the cause, the last phase reached, the evidence line, the console log.
/// `--wait`, `apply` and (later) a controller's status conditions all read this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct ReadinessError {
    pub failure: Failure,
    pub last_phase: Option<Phase>,
    /// The console line (or SSH output) that proves the failure.
    pub evidence: Option<String>,
    pub console_log: PathBuf,
}

impl std::fmt::Display for ReadinessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let last = self.last_phase.map_or("none", Phase::label);
        let log = self.console_log.display();
        let ev = self
            .evidence
            .as_deref()
            .map(nubo_core::file::escape_control)
            .unwrap_or_default();
        match &self.failure {
            Failure::VmmExited => write!(
                f,
                "the VM's VMM exited while waiting (last phase: {last}); see the console log {log}"
            ),
            Failure::BootFailed => write!(
                f,
                "the guest failed to boot (last phase: {last}): `{ev}`; {BOOT_FAILED_CAUSES}; console log {log}"
            ),
            Failure::SeedNotRead { datasource } => write!(
                f,
                "cloud-init finished but read no seed (Datasource {datasource}): {SEED_NOT_READ_CAUSES}; console log {log}"
            ),
            Failure::CloudInitErrors { datasource, problems } => write!(
                f,
                "cloud-init finished with errors (Datasource {datasource}):\n  {}\nconsole log {log}",
                problems
                    .iter()
                    .map(|p| nubo_core::file::escape_control(p))
                    .collect::<Vec<_>>()
                    .join("\n  ")
            ),
            Failure::CloudInitFailed => write!(f, "cloud-init reported failure over SSH: {ev}"),
            Failure::TimedOut { after_secs, target } => write!(
                f,
                "timed out after {} waiting for {} (last phase seen: {last}); see the console log {log}",
                humantime::format_duration(Duration::from_secs(*after_secs)),
                match target {
                    WaitFor::Ssh => "SSH",
                    WaitFor::CloudInit => "cloud-init to finish",
                },
            ),
            Failure::AddressUnverifiable { address, why } => write!(
                f,
                "the VM is running (last phase: {last}), but its predicted address {address} cannot be checked from here: {why}; console log {log}"
            ),
            Failure::AddressNeverAnswered { address, after_secs } => write!(
                f,
                "the VM is running (last phase: {last}), but nothing answered at its predicted address {address} within {} (no SSH banner, no neighbour entry on the bridge): check the guest's network-config in its seed and its console log {log}",
                humantime::format_duration(Duration::from_secs(*after_secs)),
            ),
        }
    }
}

/// Follows the console and probes until `target` is reached, calling `on_phase` once per phase
/// as it happens with the time since `start`. Errors name the last phase seen and the log.
pub fn wait(
    console: &Path,
    offset: u64,
    target: WaitFor,
    timeout: Duration,
    start: Instant,
    probes: &mut dyn Probes,
    on_phase: &mut dyn FnMut(Phase, Duration),
) -> Result<Outcome, ReadinessError> {
    let fail = |failure: Failure, last_phase: Option<Phase>, evidence: Option<String>| ReadinessError {
        failure,
        last_phase,
        evidence,
        console_log: console.to_path_buf(),
    };
    let mut follower = ConsoleFollower::new(console, offset);
    let mut seen: Option<Phase> = None;
    let mut problems: Vec<String> = Vec::new();
    let mut cloud_init_on_console = false;
    let mut last_ssh_check = Instant::now() - Duration::from_secs(10);
    let mut reach = |p: Phase, seen: &mut Option<Phase>| {
        if seen.is_none_or(|s| p > s) {
            // Phases reached out of order (SSH before the kernel line, say) are reported once.
            *seen = Some(p);
            on_phase(p, start.elapsed());
        }
    };
    let deadline = nubo_core::duration::deadline(Instant::now(), timeout);
    // A predicted address is checked beside the console: cloud-init's line alone does not
    // prove the guest answers where nubo says it is.
    let predicted = probes.predicted_address().is_some();
    let mut finished: Option<Finished> = None;
    let mut last_addr_check = Instant::now();
    loop {
        if !probes.vmm_alive() {
            return Err(fail(Failure::VmmExited, seen, None));
        }
        reach(Phase::VmmRunning, &mut seen);
        for line in follower.poll() {
            match classify(&line) {
                Some(ConsoleEvent::KernelBooting) => reach(Phase::KernelBooting, &mut seen),
                Some(ConsoleEvent::CloudInitProblem(p)) => problems.push(p),
                Some(ConsoleEvent::BootFailed(l)) => {
                    return Err(fail(Failure::BootFailed, seen, Some(l)));
                }
                Some(ConsoleEvent::Finished(f)) => {
                    if f.datasource == "DataSourceNone" || f.datasource == "None" {
                        return Err(fail(
                            Failure::SeedNotRead {
                                datasource: f.datasource.clone(),
                            },
                            seen,
                            Some(line.trim().to_owned()),
                        ));
                    }
                    reach(Phase::CloudInitFinished, &mut seen);
                    if !problems.is_empty() {
                        return Err(fail(
                            Failure::CloudInitErrors {
                                datasource: f.datasource.clone(),
                                problems: problems.clone(),
                            },
                            seen,
                            problems.first().cloned(),
                        ));
                    }
                    if !predicted {
                        return Ok(Outcome {
                            reached: Phase::CloudInitFinished,
                            finished: Some(f),
                            status_over_ssh: None,
                            address: None,
                        });
                    }
                    // The address is settled below, now and then on every look.
                    finished = Some(f);
                    last_addr_check = Instant::now() - ADDRESS_EVERY;
                }
                None => {
                    if line.contains("cloud-init") || line.contains("Cloud-init") {
                        cloud_init_on_console = true;
                    }
                }
            }
        }
        if last_ssh_check.elapsed() >= Duration::from_secs(2) {
            last_ssh_check = Instant::now();
            if seen < Some(Phase::AddressLeased) && probes.leased() {
                reach(Phase::AddressLeased, &mut seen);
            }
            if probes.ssh_banner() {
                reach(Phase::SshReachable, &mut seen);
                if target == WaitFor::Ssh && !predicted {
                    return Ok(Outcome {
                        reached: Phase::SshReachable,
                        finished: None,
                        status_over_ssh: None,
                        address: None,
                    });
                }
                if target == WaitFor::CloudInit && !cloud_init_on_console && seen < Some(Phase::CloudInitFinished) {
                    // The console is silent about cloud-init (console= elsewhere): ask the guest.
                    if let Some(r) = probes.cloud_init_status_over_ssh() {
                        let text = r.map_err(|e| fail(Failure::CloudInitFailed, seen, Some(e)))?;
                        reach(Phase::CloudInitFinished, &mut seen);
                        // The banner came from the guest's address: a predicted one is up.
                        let address = probes.predicted_address().map(|(a, _)| AddressOutcome::Up {
                            evidence: format!("SSH banner from {a}:22"),
                            address: a,
                        });
                        return Ok(Outcome {
                            reached: Phase::CloudInitFinished,
                            finished: None,
                            status_over_ssh: Some(text),
                            address,
                        });
                    }
                }
            }
        }
        let timed_out = Instant::now() >= deadline;
        if predicted && (timed_out || last_addr_check.elapsed() >= ADDRESS_EVERY) {
            last_addr_check = Instant::now();
            if let Some((address, check)) = probes.predicted_address() {
                let banner = probes.ssh_banner();
                let step = address_step(target, &address, &check, banner, finished.is_some(), timed_out, timeout);
                match step {
                    AddressStep::Done(outcome) => {
                        return Ok(Outcome {
                            reached: if finished.is_some() {
                                Phase::CloudInitFinished
                            } else {
                                Phase::SshReachable
                            },
                            finished: finished.take(),
                            status_over_ssh: None,
                            address: Some(outcome),
                        })
                    }
                    AddressStep::Fail(failure) => return Err(fail(failure, seen, None)),
                    AddressStep::Wait => {}
                }
            }
        }
        if timed_out {
            return Err(fail(
                Failure::TimedOut {
                    after_secs: timeout.as_secs(),
                    target,
                },
                seen,
                None,
            ));
        }
        // Short, so a phase is reported within a few ms of the console line; a poll is one
        // stat and a read of what was appended.
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    const FINISHED: &str = "[   45.6] cloud-init[512]: Cloud-init v. 22.4.2 finished at Tue, 01 Dec 2026 20:00:00 +0000. Datasource DataSourceNoCloud [seed=/dev/vdb][dsmode=net].  Up 45.67 seconds\r\n";

    #[test]
    fn classify_finished_nocloud_extracts_seed() {
        let ev = classify(FINISHED);

        assert_eq!(
            ev,
            Some(ConsoleEvent::Finished(Finished {
                version: "22.4.2".into(),
                datasource: "DataSourceNoCloud".into(),
                seed: Some("/dev/vdb".into()),
                uptime_seconds: Some("45.67".into()),
            }))
        );
    }

    #[test]
    fn classify_finished_none_has_no_seed() {
        let line = "Cloud-init v. 22.4.2 finished at Tue, 01 Dec 2026 20:00:00 +0000. Datasource DataSourceNone.  Up 9.00 seconds";

        let Some(ConsoleEvent::Finished(f)) = classify(line) else {
            panic!("not finished")
        };

        assert_eq!((f.datasource.as_str(), f.seed), ("DataSourceNone", None));
    }

    #[test]
    fn classify_running_line_is_not_finished() {
        assert_eq!(classify("Cloud-init v. 22.4.2 running 'modules:final' at Tue"), None);
    }

    #[test]
    fn classify_kernel_banner() {
        assert_eq!(
            classify("[    0.000000] Linux version 6.1.0-27-cloud-amd64 (debian-kernel@...)"),
            Some(ConsoleEvent::KernelBooting)
        );
    }

    #[test]
    fn classify_module_warning_is_problem() {
        let line = "2026-12-01 20:00:01,000 - cc_runcmd.py[WARNING]: Failed to run module runcmd";

        assert!(matches!(classify(line), Some(ConsoleEvent::CloudInitProblem(_))));
    }

    struct Fake {
        alive: bool,
        ssh: bool,
    }

    impl Probes for Fake {
        fn vmm_alive(&mut self) -> bool {
            self.alive
        }
        fn ssh_banner(&mut self) -> bool {
            self.ssh
        }
        fn cloud_init_status_over_ssh(&mut self) -> Option<Result<String, String>> {
            None
        }
    }

    /// A guest at a predicted address, which the host sees as `check`.
    struct Predicted {
        ssh: bool,
        check: AddressCheck,
    }

    impl Probes for Predicted {
        fn vmm_alive(&mut self) -> bool {
            true
        }
        fn ssh_banner(&mut self) -> bool {
            self.ssh
        }
        fn cloud_init_status_over_ssh(&mut self) -> Option<Result<String, String>> {
            None
        }
        fn predicted_address(&mut self) -> Option<(String, AddressCheck)> {
            Some(("10.237.0.9".into(), self.check.clone()))
        }
    }

    const T: Duration = Duration::from_secs(60);
    const ADDR: &str = "10.237.0.9";

    /// What waiting knows besides the host's check: an SSH banner from the address, cloud-init's
    /// closing line, whether this is the last look.
    #[derive(Clone, Copy)]
    struct Known {
        banner: bool,
        finished: bool,
        timed_out: bool,
    }

    const EARLY: Known = Known {
        banner: false,
        finished: false,
        timed_out: false,
    };
    const BANNER: Known = Known { banner: true, ..EARLY };
    const DONE: Known = Known {
        finished: true,
        ..EARLY
    };
    const LAST: Known = Known {
        timed_out: true,
        ..EARLY
    };

    fn up(evidence: &str) -> AddressOutcome {
        AddressOutcome::Up {
            address: ADDR.into(),
            evidence: evidence.into(),
        }
    }

    #[test]
    fn address_step_each_case_decides_as_named() {
        use AddressStep::{Done, Fail, Wait};
        use WaitFor::{CloudInit, Ssh};
        let seen = || AddressCheck::Seen("neighbour entry".into());
        let unverifiable = || AddressCheck::Unverifiable("no route".into());
        let cannot_check = Failure::AddressUnverifiable {
            address: ADDR.into(),
            why: "no route".into(),
        };
        let note = AddressOutcome::Unverifiable {
            address: ADDR.into(),
            why: "no route".into(),
        };
        let never = Failure::AddressNeverAnswered {
            address: ADDR.into(),
            after_secs: 60,
        };
        let cases = [
            (
                "a banner is up for ssh",
                Ssh,
                AddressCheck::NotSeen,
                BANNER,
                Done(up("SSH banner from 10.237.0.9:22")),
            ),
            (
                "a neighbour entry before cloud-init finished waits",
                CloudInit,
                seen(),
                EARLY,
                Wait,
            ),
            (
                "a neighbour entry after cloud-init finished is up",
                CloudInit,
                seen(),
                DONE,
                Done(up("neighbour entry")),
            ),
            ("a neighbour entry does not prove ssh", Ssh, seen(), EARLY, Wait),
            (
                "unverifiable fails ssh at once",
                Ssh,
                unverifiable(),
                EARLY,
                Fail(cannot_check),
            ),
            (
                "unverifiable waits for cloud-init",
                CloudInit,
                unverifiable(),
                EARLY,
                Wait,
            ),
            (
                "unverifiable is a note beside cloud-init finished",
                CloudInit,
                unverifiable(),
                DONE,
                Done(note),
            ),
            (
                "not seen waits before the timeout",
                Ssh,
                AddressCheck::NotSeen,
                EARLY,
                Wait,
            ),
            (
                "not seen fails ssh at the timeout",
                Ssh,
                AddressCheck::NotSeen,
                LAST,
                Fail(never),
            ),
            (
                "a cloud-init timeout stays a cloud-init timeout",
                CloudInit,
                AddressCheck::NotSeen,
                LAST,
                Wait,
            ),
        ];

        for (name, target, check, k, expected) in cases {
            let step = address_step(target, ADDR, &check, k.banner, k.finished, k.timed_out, T);

            assert_eq!(step, expected, "{name}");
        }
    }

    /// What [`wait`] on a predicted address must end with.
    enum Ends {
        Up {
            reached: Phase,
            cloud_init_seen: bool,
            address: AddressOutcome,
        },
        Fails {
            failure: Failure,
            last_phase: Option<Phase>,
            says: &'static str,
        },
    }

    #[test]
    fn wait_predicted_each_case_ends_as_named() {
        use WaitFor::{CloudInit, Ssh};
        let check = |c: AddressCheck| Predicted { ssh: false, check: c };
        let cases = [
            (
                "cloud-init finished and the address seen is up",
                &[FINISHED][..],
                CloudInit,
                Duration::from_secs(5),
                check(AddressCheck::Seen("neighbour entry".into())),
                Ends::Up {
                    reached: Phase::CloudInitFinished,
                    cloud_init_seen: true,
                    address: up("neighbour entry"),
                },
            ),
            (
                "cloud-init finished but the address unverifiable says why",
                &[FINISHED][..],
                CloudInit,
                Duration::from_secs(5),
                check(AddressCheck::Unverifiable("no route to 10.237.0.9".into())),
                Ends::Up {
                    reached: Phase::CloudInitFinished,
                    cloud_init_seen: true,
                    address: AddressOutcome::Unverifiable {
                        address: ADDR.into(),
                        why: "no route to 10.237.0.9".into(),
                    },
                },
            ),
            (
                "cloud-init finished but the address never answered fails naming it",
                &[FINISHED][..],
                CloudInit,
                Duration::from_millis(600),
                check(AddressCheck::NotSeen),
                Ends::Fails {
                    // The timeout in whole seconds.
                    failure: Failure::AddressNeverAnswered {
                        address: ADDR.into(),
                        after_secs: 0,
                    },
                    last_phase: Some(Phase::CloudInitFinished),
                    says: "nothing answered at its predicted address 10.237.0.9",
                },
            ),
            (
                "an ssh banner is up without asking cloud-init",
                &[][..],
                Ssh,
                Duration::from_secs(10),
                Predicted {
                    ssh: true,
                    check: AddressCheck::NotSeen,
                },
                Ends::Up {
                    reached: Phase::SshReachable,
                    cloud_init_seen: false,
                    address: up("SSH banner from 10.237.0.9:22"),
                },
            ),
            (
                "ssh to an unverifiable address fails before the timeout",
                &[][..],
                Ssh,
                Duration::from_secs(30),
                check(AddressCheck::Unverifiable("no route".into())),
                Ends::Fails {
                    failure: Failure::AddressUnverifiable {
                        address: ADDR.into(),
                        why: "no route".into(),
                    },
                    last_phase: Some(Phase::VmmRunning),
                    says: "cannot be checked from here: no route",
                },
            ),
        ];

        for (name, lines, target, timeout, mut probes, ends) in cases {
            let log = log_with(lines);
            let t = Instant::now();

            let got = wait(log.path(), 0, target, timeout, t, &mut probes, &mut |_, _| {});

            assert!(t.elapsed() < Duration::from_secs(5), "{name}: took {:?}", t.elapsed());
            match (got, ends) {
                (
                    Ok(out),
                    Ends::Up {
                        reached,
                        cloud_init_seen,
                        address,
                    },
                ) => {
                    assert_eq!(out.reached, reached, "{name}");
                    assert_eq!(out.finished.is_some(), cloud_init_seen, "{name}");
                    assert_eq!(out.address, Some(address), "{name}");
                }
                (
                    Err(err),
                    Ends::Fails {
                        failure,
                        last_phase,
                        says,
                    },
                ) => {
                    assert_eq!(err.failure, failure, "{name}");
                    assert_eq!(err.last_phase, last_phase, "{name}");
                    assert!(err.to_string().contains(says), "{name}: {err}");
                }
                (got, _) => panic!("{name}: ended the other way: {got:?}"),
            }
        }
    }

    /// [`wait`] from the start of `log`, ignoring phase reports.
    fn wait_on(log: &Path, target: WaitFor, timeout: Duration, mut probes: Fake) -> Result<Outcome, String> {
        wait(log, 0, target, timeout, Instant::now(), &mut probes, &mut |_, _| {}).map_err(|e| e.to_string())
    }

    fn log_with(lines: &[&str]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        for l in lines {
            f.write_all(l.as_bytes()).unwrap();
        }
        f
    }

    #[test]
    fn wait_reports_phases_in_order_and_finishes() {
        let log = log_with(&["[ 0.0] Linux version 6.1\n", FINISHED]);
        let mut phases = Vec::new();

        let out = wait(
            log.path(),
            0,
            WaitFor::CloudInit,
            Duration::from_secs(5),
            Instant::now(),
            &mut Fake {
                alive: true,
                ssh: false,
            },
            &mut |p, _| phases.push(p),
        )
        .unwrap();

        assert_eq!(out.reached, Phase::CloudInitFinished);
        assert_eq!(
            phases,
            vec![Phase::VmmRunning, Phase::KernelBooting, Phase::CloudInitFinished]
        );
    }

    #[test]
    fn wait_each_failure_ends_at_once_saying_why() {
        let cases: [(&str, &[&str], bool, &[&str]); 4] = [
            (
                "DataSourceNone is a failure with its causes",
                &["Cloud-init v. 22.4.2 finished at X. Datasource DataSourceNone.  Up 9.00 seconds\n"],
                true,
                &["read no seed", "Joliet"],
            ),
            (
                "finished with a warning is a failure listing it",
                &["2026 - cc_runcmd.py[WARNING]: Failed to run module runcmd\n", FINISHED],
                true,
                &["finished with errors", "cc_runcmd"],
            ),
            (
                "a kernel panic fails naming its line and the phase",
                &[
                    "Linux version 6.1.0\n",
                    "Kernel panic - not syncing: VFS: Unable to mount root fs\n",
                ],
                true,
                &[
                    "failed to boot",
                    "Unable to mount root fs",
                    "last phase: kernel booting",
                ],
            ),
            ("the VMM's exit is a failure", &[], false, &["VMM exited"]),
        ];

        for (name, lines, alive, says) in cases {
            let log = log_with(lines);
            let t = Instant::now();

            let got = wait_on(
                log.path(),
                WaitFor::CloudInit,
                Duration::from_secs(30),
                Fake { alive, ssh: false },
            );

            let err = got.expect_err(name);
            assert!(says.iter().all(|w| err.contains(w)), "{name}: {err}");
            assert!(t.elapsed() < Duration::from_secs(5), "{name}: took {:?}", t.elapsed());
        }
    }

    #[test]
    fn wait_timeout_names_last_phase_and_log() {
        let log = log_with(&["Linux version 6.1\n"]);

        let err = wait_on(
            log.path(),
            WaitFor::CloudInit,
            Duration::from_millis(300),
            Fake {
                alive: true,
                ssh: false,
            },
        )
        .unwrap_err();

        assert!(
            err.contains("last phase seen: kernel booting") && err.contains(&log.path().display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn classify_initramfs_shell_is_boot_failure() {
        let line = "ALERT!  UUID=9eb4 does not exist.  Dropping to a shell!";

        assert_eq!(classify(line), Some(ConsoleEvent::BootFailed(line.to_owned())));
    }

    #[test]
    fn wait_for_ssh_stops_at_banner() {
        let log = log_with(&[]);

        let out = wait(
            log.path(),
            0,
            WaitFor::Ssh,
            Duration::from_secs(5),
            Instant::now(),
            &mut Fake { alive: true, ssh: true },
            &mut |_, _| {},
        )
        .unwrap();

        assert_eq!(out.reached, Phase::SshReachable);
    }

    #[test]
    fn follower_skips_text_before_offset_and_keeps_partial_lines() {
        let mut log = log_with(&["old boot\n", "new "]);
        let mut f = ConsoleFollower::new(log.path(), 9);

        let first = f.poll();
        log.write_all(b"line\n").unwrap();
        let second = f.poll();

        assert_eq!((first, second), (Vec::<String>::new(), vec!["new line\n".to_owned()]));
    }
}
