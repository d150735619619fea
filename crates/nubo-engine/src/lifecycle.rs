//! start / stop / restart / rm / ls / wait. State comes from the backend (process and QMP),
//! never from the record: a VM whose VMM died is stopped, whatever the record last said.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nubo_backend::{Backend, ConsoleLog, ConsoleStream, Launch, Reach, StopMode};
use nubo_core::state::Verb;
use nubo_core::VmState;
use serde::Serialize;

use crate::guest_status::{Answer, GuestStatus};
use crate::readiness::{Outcome, Probes, Readiness, Step, WaitFor};
use crate::record::{self, Phase, VmRecord};
use crate::{Engine, EngineError, Event};

/// Where `vm inspect`'s launch description comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LaunchSource {
    /// Read from the backend just now (libvirt's domain XML).
    Backend,
    /// Recorded at the VM's last boot.
    Record,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LaunchView {
    pub launch: Option<Launch>,
    pub source: LaunchSource,
    /// Why the recorded description is shown although the backend has a fresher one.
    pub note: Option<String>,
}

/// One row of `nubo vm ls`. [`crate::VmStatus`] (from [`Engine::observe`]) is the full,
/// typed status a controller reads.
#[derive(Debug, Clone, Serialize)]
pub struct VmSummary {
    pub name: String,
    /// `creating` for an interrupted create; `unknown` when the record cannot be read.
    pub state: String,
    pub backend: String,
    pub image: Option<String>,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub ssh: Option<String>,
    /// Published ports, `127.0.0.1:8080->80/tcp`.
    pub ports: Vec<String>,
    pub created: String,
    pub uuid: String,
}

impl Engine {
    pub(crate) fn backend_of(&self, rec: &VmRecord) -> Result<&dyn Backend, EngineError> {
        Ok(self.registry.resolve(&rec.backend)?)
    }

    pub fn load(&self, name: &str) -> Result<VmRecord, EngineError> {
        nubo_core::name::validate_label(name)?;
        record::load(&self.roots.vm_dir(name))?.ok_or_else(|| EngineError::NotFound(name.to_owned()))
    }

    pub fn state(&self, rec: &VmRecord) -> Result<VmState, EngineError> {
        if rec.phase == Phase::Creating {
            return Ok(VmState::Creating);
        }
        let dir = self.roots.vm_dir(&rec.name);
        Ok(self.backend_of(rec)?.state(&rec.vm_ref(&dir))?)
    }

    pub(crate) fn created(&self, name: &str) -> Result<VmRecord, EngineError> {
        let rec = self.load(name)?;
        if rec.phase == Phase::Creating {
            return Err(EngineError::InvalidState {
                name: name.to_owned(),
                state: "not fully created".into(),
                fix: format!("run the same `nubo vm create {name} ...` again to finish it, or `nubo vm rm {name}`"),
            });
        }
        Ok(rec)
    }

    /// The lock of an existing VM: a command on a VM that does not exist is refused before
    /// it makes a lock file.
    pub(crate) fn lock_existing(
        &self,
        name: &str,
        op: &'static str,
    ) -> Result<(crate::lock::VmLock, VmRecord), EngineError> {
        self.created(name)?;
        let lock = self.lock(name, op)?;
        // Re-read under the lock: another command may have changed or removed it meanwhile.
        match self.created(name) {
            Ok(rec) => Ok((lock, rec)),
            Err(e) => {
                // Removed while this command waited: the wait re-made its lock file.
                if matches!(e, EngineError::NotFound(_)) {
                    lock.remove();
                }
                Err(e)
            }
        }
    }

    /// Starts a stopped VM with its existing seed (never rewritten). Starting a running VM is
    /// a no-op that says so.
    pub fn start(&self, name: &str, events: &mut dyn FnMut(Event)) -> Result<VmRecord, EngineError> {
        let (_lock, mut rec) = self.lock_existing(name, "start")?;
        let backend = self.backend_of(&rec)?;
        let dir = self.roots.vm_dir(name);
        let state = backend.state(&rec.vm_ref(&dir))?;
        if state.can(Verb::Start) {
            self.boot_locked(&mut rec, backend, events)?;
            record::save(&dir, &rec)?;
            events(Event::Step(format!("vm `{name}` started")));
        } else {
            events(Event::Step(format!("vm `{name}` is already {state}")));
        }
        Ok(rec)
    }

    pub fn stop(
        &self,
        name: &str,
        force: bool,
        timeout: Duration,
        events: &mut dyn FnMut(Event),
    ) -> Result<(), EngineError> {
        let (_lock, rec) = self.lock_existing(name, "stop")?;
        let backend = self.backend_of(&rec)?;
        let dir = self.roots.vm_dir(name);
        let vm = rec.vm_ref(&dir);
        let state = backend.state(&vm)?;
        if !state.can(Verb::Stop) {
            events(Event::Step(format!("vm `{name}` is already stopped")));
            return Ok(());
        }
        // A paused guest cannot hear the ACPI power button: it runs again first.
        if state == VmState::Paused && !force {
            events(Event::Step(format!(
                "vm `{name}` is paused: resuming it so it can power off"
            )));
            backend.resume(&vm)?;
        }
        let mode = if force {
            StopMode::Force
        } else {
            StopMode::Graceful(timeout)
        };
        if !force {
            events(Event::Step(format!(
                "asking vm `{name}` to power off (ACPI); it is killed after {}",
                humantime::format_duration(timeout)
            )));
        }
        backend.stop(&vm, mode)?;
        events(Event::Step(format!("vm `{name}` stopped")));
        Ok(())
    }

    /// Pauses a running VM: its vCPUs stop, its memory and devices stay (QMP `stop`, libvirt
    /// suspend, Cloud Hypervisor `vm.pause`). Pausing a paused VM says so.
    pub fn pause(&self, name: &str, events: &mut dyn FnMut(Event)) -> Result<(), EngineError> {
        self.pause_or_resume(name, Verb::Pause, events)
    }

    /// Runs a paused VM again. Resuming a running VM says so.
    pub fn resume(&self, name: &str, events: &mut dyn FnMut(Event)) -> Result<(), EngineError> {
        self.pause_or_resume(name, Verb::Resume, events)
    }

    fn pause_or_resume(&self, name: &str, verb: Verb, events: &mut dyn FnMut(Event)) -> Result<(), EngineError> {
        let op = if verb == Verb::Pause { "pause" } else { "resume" };
        let (_lock, rec) = self.lock_existing(name, op)?;
        let backend = self.backend_of(&rec)?;
        let dir = self.roots.vm_dir(name);
        let vm = rec.vm_ref(&dir);
        let state = backend.state(&vm)?;
        let (want, done) = match verb {
            Verb::Pause => (VmState::Paused, "paused"),
            _ => (VmState::Running, "resumed"),
        };
        if state == want {
            events(Event::Step(format!("vm `{name}` is already {state}")));
            return Ok(());
        }
        if !state.can(verb) {
            return Err(EngineError::InvalidState {
                name: name.to_owned(),
                state: state.to_string(),
                fix: format!("start it first: `nubo vm start {name}`"),
            });
        }
        match verb {
            Verb::Pause => backend.pause(&vm)?,
            _ => backend.resume(&vm)?,
        }
        events(Event::Step(format!("vm `{name}` {done}")));
        Ok(())
    }

    pub fn restart(
        &self,
        name: &str,
        force: bool,
        timeout: Duration,
        events: &mut dyn FnMut(Event),
    ) -> Result<VmRecord, EngineError> {
        self.stop(name, force, timeout, events)?;
        self.start(name, events)
    }

    /// Removes the VM: VMM, overlay, seed, sockets, logs, record, lock. The base image is
    /// never touched. A VM that is already (half) gone is removed without complaint.
    pub fn remove(&self, name: &str, force: bool, events: &mut dyn FnMut(Event)) -> Result<bool, EngineError> {
        nubo_core::name::validate_label(name)?;
        let dir = self.roots.vm_dir(name);
        if !dir.exists() {
            return Ok(false);
        }
        let lock = self.lock(name, "rm")?;
        let rec = match record::load(&dir) {
            Ok(r) => r,
            Err(EngineError::Corrupt { .. }) if force => None,
            Err(e) => return Err(e),
        };
        let Some(rec) = rec else {
            let existed = dir.exists();
            if existed {
                fs::remove_dir_all(&dir).map_err(EngineError::io(name, format!("removing {}", dir.display())))?;
            }
            let _ = fs::remove_dir_all(self.roots.vm_run_dir(name));
            lock.remove();
            return Ok(existed);
        };
        let state = self.state(&rec)?;
        if state.is_active() && !force {
            return Err(EngineError::InvalidState {
                name: name.to_owned(),
                state: state.to_string(),
                fix: format!(
                    "stop it first (`nubo vm stop {name}`) or remove it at once with `nubo vm rm --force {name}`"
                ),
            });
        }
        self.teardown(&rec)?;
        lock.remove();
        events(Event::Step(format!("vm `{name}` removed")));
        Ok(true)
    }

    /// Kills the VMM and deletes the VM's directory and runtime files.
    pub(crate) fn teardown(&self, rec: &VmRecord) -> Result<(), EngineError> {
        let dir = self.roots.vm_dir(&rec.name);
        self.backend_of(rec)?.destroy(&rec.vm_ref(&dir))?;
        // The run directory is the engine's choice (`MachineSpec::run_dir`); a backend removes
        // it with the state that names it, but a create interrupted before the backend's state
        // was recorded leaves it to the engine.
        let run = self.roots.vm_run_dir(&rec.name);
        if let Err(e) = fs::remove_dir_all(&run) {
            if e.kind() != io::ErrorKind::NotFound {
                return Err(EngineError::Io {
                    name: rec.name.clone(),
                    what: format!("removing {}", run.display()),
                    source: e,
                });
            }
        }
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(EngineError::Io {
                name: rec.name.clone(),
                what: format!("removing {}", dir.display()),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// The VM's launch description for `vm inspect`: read from the backend now when it has a
    /// fresher one than the record (libvirt's domain XML), else the one recorded at the last
    /// boot; when the backend cannot answer, the recorded one with a note saying why.
    pub fn launch(&self, rec: &VmRecord) -> Result<LaunchView, EngineError> {
        let dir = self.roots.vm_dir(&rec.name);
        let recorded = |note| LaunchView {
            launch: rec.launch.clone(),
            source: LaunchSource::Record,
            note,
        };
        Ok(match self.backend_of(rec)?.launch_now(&rec.vm_ref(&dir)) {
            None => recorded(None),
            Some(Ok(launch)) => LaunchView {
                launch: Some(launch),
                source: LaunchSource::Backend,
                note: None,
            },
            Some(Err(e)) => recorded(Some(format!(
                "the {} backend could not describe vm `{}` now ({e}): showing the launch description recorded at its last boot",
                rec.backend, rec.name
            ))),
        })
    }

    /// Where SSH reaches the VM, from its backend.
    pub fn reach(&self, rec: &VmRecord) -> Result<Reach, EngineError> {
        let dir = self.roots.vm_dir(&rec.name);
        Ok(self.backend_of(rec)?.reach(&rec.vm_ref(&dir))?)
    }

    /// The console log of the VM, from its backend.
    pub fn console_log(&self, rec: &VmRecord) -> Result<ConsoleLog, EngineError> {
        let dir = self.roots.vm_dir(&rec.name);
        Ok(self.backend_of(rec)?.console(&rec.vm_ref(&dir)))
    }

    /// Attaches to the running VM's console.
    pub fn attach_console(&self, name: &str) -> Result<Box<dyn ConsoleStream>, EngineError> {
        let rec = self.created(name)?;
        if self.state(&rec)? == VmState::Stopped {
            return Err(EngineError::InvalidState {
                name: name.to_owned(),
                state: "stopped".into(),
                fix: format!("start it (`nubo vm start {name}`), or read its last boot with `nubo vm logs {name}`"),
            });
        }
        let dir = self.roots.vm_dir(name);
        let backend = self.backend_of(&rec)?;
        let stream = backend.attach_console(&rec.vm_ref(&dir))?;
        if self.console_is_remote(&rec) {
            let log = backend.console(&rec.vm_ref(&dir)).current;
            return Ok(Box::new(crate::console_record::Tee::new(stream, &log)));
        }
        Ok(stream)
    }

    pub fn list(&self) -> Result<Vec<VmSummary>, EngineError> {
        let mut out = Vec::new();
        for name in record::names(&self.roots.vms())? {
            let dir = self.roots.vm_dir(&name);
            let status = match record::load(&dir) {
                Ok(Some(rec)) => {
                    let state = self
                        .state(&rec)
                        .map_or_else(|_| "unknown".to_owned(), |s| s.to_string());
                    let ssh = self
                        .reach(&rec)
                        .ok()
                        .and_then(|r| r.ssh)
                        .map(|a| format!("{}@{a}", rec.ssh.user));
                    VmSummary {
                        state,
                        backend: rec.backend.clone(),
                        image: rec.image.as_ref().map(|i| i.reference.clone()),
                        vcpus: rec.machine.vcpus,
                        memory_mib: rec.machine.memory_mib,
                        ssh,
                        ports: rec.machine.ports.iter().map(nubo_backend::ports::shown).collect(),
                        created: rec.created.clone(),
                        uuid: rec.uuid.clone(),
                        name,
                    }
                }
                _ => VmSummary {
                    name,
                    state: "unknown".into(),
                    backend: String::new(),
                    image: None,
                    vcpus: 0,
                    memory_mib: 0,
                    ssh: None,
                    ports: Vec::new(),
                    created: String::new(),
                    uuid: String::new(),
                },
            };
            out.push(status);
        }
        Ok(out)
    }

    /// Waits for the running VM to reach `target`, reporting each phase as it happens: the
    /// blocking loop over [`Engine::readiness`]'s steps.
    pub fn wait(
        &self,
        name: &str,
        target: WaitFor,
        timeout: Duration,
        start: Instant,
        events: &mut dyn FnMut(Event),
    ) -> Result<Outcome, EngineError> {
        let mut r = self.readiness(name, target, timeout, start)?;
        let what = format!("waiting for vm `{name}` to be ready (the VM itself is left as it is)");
        loop {
            match r.step() {
                Step::Phase(p, t) => events(Event::Phase(p, t)),
                Step::PollAfter(d) => self.sleep(d, &what)?,
                Step::Done(o) => return Ok(o),
                Step::Failed(e) => return Err(e.into()),
            }
        }
    }

    /// Readiness of the running VM as a state machine its caller polls
    /// ([`readiness::Readiness::step`]): a daemon steps it from its own loop; [`Engine::wait`]
    /// sleeps between steps. The timeout runs from now; phases are timed from `start`.
    pub fn readiness(
        &self,
        name: &str,
        target: WaitFor,
        timeout: Duration,
        start: Instant,
    ) -> Result<Readiness<VmProbes<'_>>, EngineError> {
        let rec = self.created(name)?;
        let backend = self.backend_of(&rec)?;
        let dir = self.roots.vm_dir(name);
        if backend.state(&rec.vm_ref(&dir))? == VmState::Stopped {
            return Err(EngineError::InvalidState {
                name: name.to_owned(),
                state: "stopped".into(),
                fix: format!("start it first: `nubo vm start {name}`"),
            });
        }
        let console = backend.console(&rec.vm_ref(&dir)).current;
        let reach = backend.reach(&rec.vm_ref(&dir))?;
        // A remote domain's console reaches this host only through its stream: recorded into
        // the console log while readiness follows it.
        let recorder = crate::console_record::recorder_for(backend, &rec.vm_ref(&dir));
        let probes = VmProbes {
            recorder,
            alive_at: None,
            ssh: None,
            status: None,
            ssh_addr: reach.ssh,
            predicted: reach
                .predicted
                .then(|| reach.guest_addresses.first().cloned())
                .flatten(),
            engine: self,
            rec,
            dir,
            backend,
        };
        Ok(Readiness::new(&console, 0, target, timeout, start, probes))
    }

    /// The `ssh` command line that reaches the VM.
    pub fn ssh_argv(&self, name: &str, command: &[String]) -> Result<Vec<String>, EngineError> {
        self.ssh_argv_via(name, command, None)
    }

    /// [`Engine::ssh_argv`] through the jump host `jump` (`ssh -J`), for a guest only that
    /// host reaches (a VM on a remote libvirt host's network). Only the guest is authenticated
    /// with nubo's key and pinned host key; the jump host with the user's own SSH setup.
    pub fn ssh_argv_via(
        &self,
        name: &str,
        command: &[String],
        jump: Option<&crate::ssh_jump::JumpHost>,
    ) -> Result<Vec<String>, EngineError> {
        let rec = self.created(name)?;
        let reach = self.reach(&rec)?;
        let addr = reach.ssh.ok_or_else(|| EngineError::InvalidState {
            name: name.to_owned(),
            state: format!("without an SSH endpoint from this host ({})", reach.network),
            fix: "recreate it with networking (on a remote libvirt host: --network NAME, then `nubo vm ssh --jump USER@HOST`) to use `nubo vm ssh`".into(),
        })?;
        let (key, _) = self.nubo_key()?;
        let known_hosts = self.roots.vm_dir(name).join("known_hosts");
        let mut argv = crate::ssh::argv(&key, &known_hosts, &rec.uuid, &rec.ssh.user, addr, command)?;
        if let Some(j) = jump {
            // Before every `-o`: ssh refuses -J after a ProxyCommand, and ignores the
            // ProxyCommand=none nubo sets once -J is given.
            argv.splice(1..1, ["-J".to_owned(), j.to_string()]);
        }
        Ok(argv)
    }
}

/// What [`Engine::readiness`] probes a VM with: its backend (VMM alive, DHCP lease, predicted
/// address), the SSH banner and, for a console silent about cloud-init, `cloud-init status`
/// over SSH. `Send`, so a daemon can step a VM's readiness on a blocking-task thread.
pub struct VmProbes<'a> {
    engine: &'a Engine,
    rec: VmRecord,
    dir: PathBuf,
    backend: &'a dyn Backend,
    ssh_addr: Option<std::net::SocketAddr>,
    /// The guest's address, when the backend predicted it rather than observed it.
    predicted: Option<String>,
    ssh: Option<SshWatcher>,
    /// `cloud-init status --wait` over SSH, while it runs.
    status: Option<GuestStatus>,
    /// Records the console stream into the log readiness reads, when no VMM writes it here.
    recorder: Option<crate::console_record::ConsoleRecorder>,
    /// When the VMM was last seen alive.
    alive_at: Option<Instant>,
}

/// How often readiness asks a remote host whether the domain still runs.
const REMOTE_ALIVE_EVERY: Duration = Duration::from_secs(1);

/// Probes the SSH banner on its own thread: a probe can block for its whole timeout (user-mode
/// networking accepts the connection before the guest answers), and the console must still be
/// read every [`readiness::POLL`].
struct SshWatcher {
    up: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl SshWatcher {
    fn start(addr: std::net::SocketAddr) -> SshWatcher {
        let (up, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (u, st) = (up.clone(), stop.clone());
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                if crate::ssh::banner(addr, Duration::from_secs(2)) {
                    u.store(true, Ordering::Relaxed);
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        SshWatcher { up, stop }
    }
}

impl Drop for SshWatcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Probes for VmProbes<'_> {
    fn vmm_alive(&mut self) -> bool {
        let Some(r) = self.recorder.as_mut() else {
            return self.backend.alive(&self.rec.vm_ref(&self.dir));
        };
        r.keep_with(self.backend, &self.rec.vm_ref(&self.dir));
        // A remote host is asked once a second, not on every look (each is a connection).
        if self.alive_at.is_some_and(|t| t.elapsed() < REMOTE_ALIVE_EVERY) {
            return true;
        }
        self.alive_at = Some(Instant::now());
        // A host that does not answer now (libvirtd restarting) says nothing of the domain:
        // readiness waits on, bounded by its timeout; only a domain seen stopped ends it.
        match self.backend.state(&self.rec.vm_ref(&self.dir)) {
            Ok(s) => s.is_active(),
            Err(_) => true,
        }
    }

    fn ssh_banner(&mut self) -> bool {
        // A backend whose address comes from DHCP knows it only once the guest has a lease.
        if self.ssh_addr.is_none() {
            self.ssh_addr = self.backend.reach(&self.rec.vm_ref(&self.dir)).ok().and_then(|r| r.ssh);
        }
        let Some(addr) = self.ssh_addr else {
            return false;
        };
        self.ssh
            .get_or_insert_with(|| SshWatcher::start(addr))
            .up
            .load(Ordering::Relaxed)
    }

    fn leased(&mut self) -> bool {
        self.backend
            .lease_hostname(&self.rec.vm_ref(&self.dir))
            .is_some_and(|h| h == self.rec.machine.name)
    }

    fn predicted_address(&mut self) -> Option<(String, nubo_backend::AddressCheck)> {
        let address = self.predicted.clone()?;
        let check = self.backend.check_address(&self.rec.vm_ref(&self.dir))?;
        Some((address, check))
    }

    fn cloud_init_status_over_ssh(&mut self) -> Option<Result<String, String>> {
        if !self.rec.ssh.nubo_key {
            return None;
        }
        // Started once and looked at on every call: the command waits for cloud-init, and a
        // readiness step must not (see `guest_status`).
        if self.status.is_none() {
            let cmd = [
                "sudo".to_owned(),
                "cloud-init".into(),
                "status".into(),
                "--wait".into(),
                "--long".into(),
            ];
            let argv = self.engine.ssh_argv(&self.rec.name, &cmd).ok()?;
            self.status = Some(GuestStatus::start(&argv)?);
        }
        match self.status.as_mut()?.poll() {
            Answer::Pending => None,
            Answer::Retry => {
                // Not accepting nubo's key yet: a new ssh on a later look.
                self.status = None;
                None
            }
            Answer::Done(r) => Some(r),
        }
    }
}
