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

/// Forwarding, so [`wait`] can hand a borrowed `&mut dyn Probes` to a [`Readiness`].
impl<T: Probes + ?Sized> Probes for &mut T {
    fn vmm_alive(&mut self) -> bool {
        (**self).vmm_alive()
    }
    fn ssh_banner(&mut self) -> bool {
        (**self).ssh_banner()
    }
    fn cloud_init_status_over_ssh(&mut self) -> Option<Result<String, String>> {
        (**self).cloud_init_status_over_ssh()
    }
    fn leased(&mut self) -> bool {
        (**self).leased()
    }
    fn predicted_address(&mut self) -> Option<(String, AddressCheck)> {
        (**self).predicted_address()
    }
}

/// What the console lines seen so far say about cloud-init: fed line by line, by the wait
/// ([`Readiness`]) and by [`crate::observe`], so both read a console the same way.
#[derive(Debug, Clone, Default)]
pub struct ConsoleTrack {
    /// cloud-init's warning and error lines, in order.
    pub problems: Vec<String>,
    /// Some line mentions cloud-init (its closing line may still come).
    pub cloud_init_on_console: bool,
}

/// What one console line settles, by [`ConsoleTrack::feed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineVerdict {
    KernelBooting,
    /// cloud-init finished, read the seed and reported no problem.
    Finished(Finished),
    /// The guest will not get further: the failure, its evidence line, and whether cloud-init's
    /// closing line was seen (its errors are reported after it finished).
    Failed {
        failure: Failure,
        evidence: String,
        finished: bool,
    },
}

impl ConsoleTrack {
    pub fn feed(&mut self, line: &str) -> Option<LineVerdict> {
        match classify(line) {
            Some(ConsoleEvent::KernelBooting) => Some(LineVerdict::KernelBooting),
            Some(ConsoleEvent::CloudInitProblem(p)) => {
                self.problems.push(p);
                None
            }
            Some(ConsoleEvent::BootFailed(l)) => Some(LineVerdict::Failed {
                failure: Failure::BootFailed,
                evidence: l,
                finished: false,
            }),
            Some(ConsoleEvent::Finished(f)) => {
                if f.datasource == "DataSourceNone" || f.datasource == "None" {
                    return Some(LineVerdict::Failed {
                        failure: Failure::SeedNotRead {
                            datasource: f.datasource.clone(),
                        },
                        evidence: line.trim().to_owned(),
                        finished: false,
                    });
                }
                if let Some(first) = self.problems.first() {
                    return Some(LineVerdict::Failed {
                        failure: Failure::CloudInitErrors {
                            datasource: f.datasource.clone(),
                            problems: self.problems.clone(),
                        },
                        evidence: first.clone(),
                        finished: true,
                    });
                }
                Some(LineVerdict::Finished(f))
            }
            None => {
                if line.contains("cloud-init") || line.contains("Cloud-init") {
                    self.cloud_init_on_console = true;
                }
                None
            }
        }
    }
}

/// What [`Readiness::step`] answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A phase was reached (each once, in order), with the time since the wait's start.
    Phase(Phase, Duration),
    /// Nothing new: call `step` again after this long.
    PollAfter(Duration),
    /// The target is reached: the evidence.
    Done(Outcome),
    /// It never will be: why, with the last phase and the evidence line.
    Failed(ReadinessError),
}

/// Readiness as a state machine a caller polls: each [`Readiness::step`] looks once (the VMM,
/// the console lines appended since, the probes) and says what it found or how long to wait
/// before looking again. [`wait`] is its blocking loop (`vm create --wait`, `vm wait`, apply);
/// a daemon calls `step` from its own loop and never sleeps in the engine. Once `Done` or
/// `Failed`, every later step answers the same.
pub struct Readiness<P: Probes> {
    probes: P,
    console: PathBuf,
    target: WaitFor,
    timeout: Duration,
    start: Instant,
    deadline: Instant,
    follower: ConsoleFollower,
    track: ConsoleTrack,
    seen: Option<Phase>,
    last_ssh_check: Instant,
    /// A predicted address is checked beside the console: cloud-init's line alone does not
    /// prove the guest answers where nubo says it is.
    predicted: bool,
    finished: Option<Finished>,
    last_addr_check: Instant,
    /// Phases reached by the last look, not yet returned.
    pending: std::collections::VecDeque<(Phase, Duration)>,
    end: Option<Result<Outcome, ReadinessError>>,
    /// The last look found nothing final: the next step asks the caller to wait first.
    rest: bool,
}

impl<P: Probes> Readiness<P> {
    /// Starts following `console` from `offset` towards `target`; `start` is when the caller's
    /// command began (phases are reported relative to it), the timeout runs from now.
    pub fn new(console: &Path, offset: u64, target: WaitFor, timeout: Duration, start: Instant, mut probes: P) -> Self {
        let now = Instant::now();
        let predicted = probes.predicted_address().is_some();
        Readiness {
            probes,
            console: console.to_path_buf(),
            target,
            timeout,
            start,
            deadline: nubo_core::duration::deadline(now, timeout),
            follower: ConsoleFollower::new(console, offset),
            track: ConsoleTrack::default(),
            seen: None,
            last_ssh_check: now - Duration::from_secs(10),
            predicted,
            finished: None,
            last_addr_check: now,
            pending: std::collections::VecDeque::new(),
            end: None,
            rest: false,
        }
    }

    /// The last phase reached so far.
    pub fn phase(&self) -> Option<Phase> {
        self.seen
    }

    pub fn step(&mut self) -> Step {
        loop {
            if let Some((p, t)) = self.pending.pop_front() {
                return Step::Phase(p, t);
            }
            match &self.end {
                Some(Ok(o)) => return Step::Done(o.clone()),
                Some(Err(e)) => return Step::Failed(e.clone()),
                None => {}
            }
            if self.rest {
                self.rest = false;
                // Short, so a phase is reported within a few ms of the console line; a look
                // is one stat and a read of what was appended.
                return Step::PollAfter(POLL);
            }
            self.look();
        }
    }

    fn reach(&mut self, p: Phase) {
        if self.seen.is_none_or(|s| p > s) {
            // Phases reached out of order (SSH before the kernel line, say) are reported once.
            self.seen = Some(p);
            self.pending.push_back((p, self.start.elapsed()));
        }
    }

    fn fail(&mut self, failure: Failure, evidence: Option<String>) {
        self.end = Some(Err(ReadinessError {
            failure,
            last_phase: self.seen,
            evidence,
            console_log: self.console.clone(),
        }));
    }

    fn done(&mut self, outcome: Outcome) {
        self.end = Some(Ok(outcome));
    }

    /// One look at the world; sets `end` when it is settled, `rest` otherwise.
    fn look(&mut self) {
        if !self.probes.vmm_alive() {
            return self.fail(Failure::VmmExited, None);
        }
        self.reach(Phase::VmmRunning);
        for line in self.follower.poll() {
            match self.track.feed(&line) {
                Some(LineVerdict::KernelBooting) => self.reach(Phase::KernelBooting),
                Some(LineVerdict::Failed {
                    failure,
                    evidence,
                    finished,
                }) => {
                    if finished {
                        self.reach(Phase::CloudInitFinished);
                    }
                    return self.fail(failure, Some(evidence));
                }
                Some(LineVerdict::Finished(f)) => {
                    self.reach(Phase::CloudInitFinished);
                    if !self.predicted {
                        return self.done(Outcome {
                            reached: Phase::CloudInitFinished,
                            finished: Some(f),
                            status_over_ssh: None,
                            address: None,
                        });
                    }
                    // The address is settled below, now and then on every look.
                    self.finished = Some(f);
                    self.last_addr_check = Instant::now() - ADDRESS_EVERY;
                }
                None => {}
            }
        }
        let target = self.target;
        if self.last_ssh_check.elapsed() >= Duration::from_secs(2) {
            self.last_ssh_check = Instant::now();
            if self.seen < Some(Phase::AddressLeased) && self.probes.leased() {
                self.reach(Phase::AddressLeased);
            }
            if self.probes.ssh_banner() {
                self.reach(Phase::SshReachable);
                if target == WaitFor::Ssh && !self.predicted {
                    return self.done(Outcome {
                        reached: Phase::SshReachable,
                        finished: None,
                        status_over_ssh: None,
                        address: None,
                    });
                }
                if target == WaitFor::CloudInit
                    && !self.track.cloud_init_on_console
                    && self.seen < Some(Phase::CloudInitFinished)
                {
                    // The console is silent about cloud-init (console= elsewhere): ask the guest.
                    match self.probes.cloud_init_status_over_ssh() {
                        Some(Err(e)) => return self.fail(Failure::CloudInitFailed, Some(e)),
                        Some(Ok(text)) => {
                            self.reach(Phase::CloudInitFinished);
                            // The banner came from the guest's address: a predicted one is up.
                            let address = self.probes.predicted_address().map(|(a, _)| AddressOutcome::Up {
                                evidence: format!("SSH banner from {a}:22"),
                                address: a,
                            });
                            return self.done(Outcome {
                                reached: Phase::CloudInitFinished,
                                finished: None,
                                status_over_ssh: Some(text),
                                address,
                            });
                        }
                        None => {}
                    }
                }
            }
        }
        let timed_out = Instant::now() >= self.deadline;
        if self.predicted && (timed_out || self.last_addr_check.elapsed() >= ADDRESS_EVERY) {
            self.last_addr_check = Instant::now();
            if let Some((address, check)) = self.probes.predicted_address() {
                let banner = self.probes.ssh_banner();
                let finished = self.finished.is_some();
                match address_step(target, &address, &check, banner, finished, timed_out, self.timeout) {
                    AddressStep::Done(outcome) => {
                        let finished = self.finished.take();
                        return self.done(Outcome {
                            reached: if finished.is_some() {
                                Phase::CloudInitFinished
                            } else {
                                Phase::SshReachable
                            },
                            finished,
                            status_over_ssh: None,
                            address: Some(outcome),
                        });
                    }
                    AddressStep::Fail(failure) => return self.fail(failure, None),
                    AddressStep::Wait => {}
                }
            }
        }
        if timed_out {
            return self.fail(
                Failure::TimedOut {
                    after_secs: self.timeout.as_secs(),
                    target,
                },
                None,
            );
        }
        self.rest = true;
    }
}

/// Follows the console and probes until `target` is reached, calling `on_phase` once per phase
/// as it happens with the time since `start`: the blocking loop over [`Readiness::step`].
/// Errors name the last phase seen and the log.
pub fn wait(
    console: &Path,
    offset: u64,
    target: WaitFor,
    timeout: Duration,
    start: Instant,
    probes: &mut dyn Probes,
    on_phase: &mut dyn FnMut(Phase, Duration),
) -> Result<Outcome, ReadinessError> {
    drive(
        Readiness::new(console, offset, target, timeout, start, probes),
        on_phase,
    )
}

/// Steps `r` to its end, sleeping where it says and reporting each phase.
pub fn drive<P: Probes>(
    mut r: Readiness<P>,
    on_phase: &mut dyn FnMut(Phase, Duration),
) -> Result<Outcome, ReadinessError> {
    loop {
        match r.step() {
            Step::Phase(p, t) => on_phase(p, t),
            Step::PollAfter(d) => std::thread::sleep(d),
            Step::Done(o) => return Ok(o),
            Step::Failed(e) => return Err(e),
        }
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

    fn stepper(log: &Path, alive: bool) -> Readiness<Fake> {
        let probes = Fake { alive, ssh: false };
        Readiness::new(
            log,
            0,
            WaitFor::CloudInit,
            Duration::from_secs(30),
            Instant::now(),
            probes,
        )
    }

    #[test]
    fn readiness_step_each_phase_once_then_done_and_stays_done() {
        let log = log_with(&["[ 0.0] Linux version 6.1\n", FINISHED]);
        let mut r = stepper(log.path(), true);

        let steps: Vec<Step> = (0..5).map(|_| r.step()).collect();

        let phases: Vec<Phase> = steps[..3]
            .iter()
            .map(|s| match s {
                Step::Phase(p, _) => *p,
                other => panic!("not a phase: {other:?}"),
            })
            .collect();
        assert_eq!(
            phases,
            vec![Phase::VmmRunning, Phase::KernelBooting, Phase::CloudInitFinished]
        );
        assert!(matches!(&steps[3], Step::Done(o) if o.reached == Phase::CloudInitFinished));
        assert_eq!(steps[3], steps[4]);
    }

    #[test]
    fn readiness_step_nothing_new_asks_to_poll_without_sleeping() {
        let log = log_with(&[]);
        let mut r = stepper(log.path(), true);
        let t = Instant::now();

        let (first, second) = (r.step(), r.step());

        assert!(matches!(first, Step::Phase(Phase::VmmRunning, _)), "{first:?}");
        assert_eq!(second, Step::PollAfter(POLL));
        assert!(t.elapsed() < POLL, "step slept: {:?}", t.elapsed());
        assert_eq!(r.phase(), Some(Phase::VmmRunning));
    }

    #[test]
    fn readiness_step_line_appended_between_steps_is_next_phase() {
        let mut log = log_with(&[]);
        let mut r = stepper(log.path(), true);
        r.step();
        r.step();

        log.write_all(b"Linux version 6.1\n").unwrap();

        assert!(matches!(r.step(), Step::Phase(Phase::KernelBooting, _)));
    }

    #[test]
    fn readiness_step_vmm_gone_fails_and_stays_failed() {
        let log = log_with(&[]);
        let mut r = stepper(log.path(), false);

        let (first, second) = (r.step(), r.step());

        assert!(
            matches!(&first, Step::Failed(e) if e.failure == Failure::VmmExited),
            "{first:?}"
        );
        assert_eq!(first, second);
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
