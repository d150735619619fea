//! The Cloud Hypervisor backend: `cloud-hypervisor --api-socket` started as a daemonised child
//! (its own process group, pid recorded, stderr to the VM's `vmm.log`), then driven through its
//! REST API over that socket: `vm.create` with the whole VM as JSON, `vm.boot`, `vm.info` for
//! state, `vm.power-button` then `vm.shutdown`/`vm.delete`/`vmm.shutdown` to stop,
//! `vm.pause`/`vm.resume`, and `vm.snapshot`/`vm.restore` into `vms/<name>/snapshots/<snap>/`.
//!
//! Its one machine is a virtio-only microVM: direct kernel boot (ELF vmlinux through PVH, or
//! bzImage), or a cloud image through EDK2's `CLOUDHV.fd` ([`firmware`] has the search
//! order). No BIOS, no CD-ROM (the seed is a read-only virtio disk), no user-mode network (a
//! tap on nubo's bridge, the guest's address computed from its MAC: [`net`]).

pub mod firmware;
pub mod http;
pub mod net;
pub mod options;
pub mod render;
pub mod state;

use std::fs;
use std::io::Read;
use std::net::{SocketAddr, SocketAddrV4};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::Pid;
use nubo_core::VmState;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use self::firmware::Found;
use self::state::{snapshot_dir, ChState};
use crate::host::{check_socket_path, previous_log, probe_kvm, rotate_console, which, KvmStatus};
use crate::process::{self, Vmm};
use crate::qemu::mounts;
use crate::spec::{Boot, Firmware, MachineSpec, MountTransport, NetworkMode};
use crate::{
    AddressCheck, Backend, BackendError, BackendSnapshot, BootInfo, Capabilities, Capability, CheckStatus, ConsoleLog,
    ConsoleStream, GuestNetwork, HostCheck, Launch, Probe, Reach, Restored, SnapshotTaken, StopMode, VmRef,
};

pub const ID: &str = "cloud-hypervisor";
pub const BINARY: &str = "cloud-hypervisor";
/// Set in the VMM's environment: how nubo finds a VM's VMM in /proc even when `create` was
/// killed before the pid file was written (the command line names only the socket).
pub const UUID_ENV: &str = "NUBO_VM_UUID";
/// How long an ordinary API exchange may take before the VMM counts as unresponsive.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// Snapshot and restore copy guest memory: allow for gigabytes.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a freshly started VMM may take to listen on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest snapshot record nubo reads back.
const MAX_SNAPSHOT_META: u64 = 64 << 10;
const SNAPSHOT_META: &str = "nubo-snapshot.json";
const SNAPSHOT_DISK: &str = "disk.qcow2";

pub struct CloudHypervisorBackend {
    /// A name looked up on PATH, or a path.
    pub binary: String,
    /// `$NUBO_HYPERVISOR_FW` ([`crate::HostEnv::hypervisor_fw`]).
    pub firmware_env: Option<PathBuf>,
    pub sys_module: PathBuf,
    pub dev_kvm: PathBuf,
    /// Where the binary and `ip` are looked up.
    pub path: Option<std::ffi::OsString>,
}

impl Default for CloudHypervisorBackend {
    /// Over this process's environment, read now ([`CloudHypervisorBackend::with_host`]
    /// takes another).
    fn default() -> Self {
        CloudHypervisorBackend::with_host(crate::HostEnv::from_process())
    }
}

impl CloudHypervisorBackend {
    pub fn with_host(host: crate::HostEnv) -> Self {
        CloudHypervisorBackend {
            binary: BINARY.into(),
            firmware_env: host.hypervisor_fw,
            sys_module: "/sys/module".into(),
            dev_kvm: "/dev/kvm".into(),
            path: host.path,
        }
    }
}

/// What nubo records beside a snapshot's files.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct SnapshotMeta {
    name: String,
    has_memory: bool,
    created_unix: u64,
}

fn remote(what: impl Into<String>, detail: impl Into<String>) -> BackendError {
    BackendError::Remote {
        what: what.into(),
        detail: detail.into(),
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BackendError {
    BackendError::io(what)
}

impl CloudHypervisorBackend {
    /// The binary to run: a path as given, else found on PATH.
    pub fn binary_path(&self) -> Option<PathBuf> {
        if self.binary.contains('/') {
            let p = PathBuf::from(&self.binary);
            return p.is_file().then_some(p);
        }
        which(&self.binary, self.path.as_deref())
    }

    pub fn kvm(&self) -> KvmStatus {
        probe_kvm(&self.sys_module, &self.dev_kvm)
    }

    /// The firmware search (`--firmware PATH` is the spec's own, handled by the caller).
    pub fn find_firmware(&self) -> Option<Found> {
        firmware::find(self.firmware_env.as_deref(), |p| p.is_file())
    }

    /// The firmware file a firmware boot uses, or why there is none.
    fn resolve_firmware(&self, fw: &Firmware) -> Result<PathBuf, BackendError> {
        match fw {
            Firmware::Bios => Err(BackendError::unsupported(
                ID,
                "--firmware bios",
                "--firmware PATH to an EDK2 CLOUDHV.fd, or boot a kernel (Cloud Hypervisor has no BIOS boot)",
            )),
            Firmware::EfiCode(p) => {
                nubo_core::file::open_regular(p, "firmware")
                    .map_err(|e| BackendError::InvalidSpec(format!("{e}: give --firmware the path of an EDK2 CLOUDHV.fd")))?;
                Ok(p.clone())
            }
            Firmware::Efi => match self.find_firmware() {
                Some(Found::Env(p)) if !p.is_file() => Err(BackendError::InvalidSpec(format!(
                    "{} names {}, which is not a file: point it at an EDK2 CLOUDHV.fd, or unset it to search {}",
                    firmware::ENV,
                    p.display(),
                    firmware::DIRS.join(", ")
                ))),
                Some(f) => Ok(f.path().to_path_buf()),
                None => Err(BackendError::Unavailable {
                    backend: ID,
                    why: format!(
                        "no firmware found ({} or hypervisor-fw in {}): put an EDK2 CLOUDHV.fd there, set {}, give --firmware PATH, or boot a kernel",
                        firmware::NAMES[0],
                        firmware::DIRS.join(", "),
                        firmware::ENV
                    ),
                }),
            },
        }
    }

    /// One API exchange; a reply other than 2xx is an error carrying Cloud Hypervisor's own
    /// words and what to do.
    fn api(
        &self,
        name: &str,
        st: &ChState,
        method: &str,
        endpoint: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Vec<u8>, BackendError> {
        let what = || format!("Cloud Hypervisor API {} of VM `{name}`", st.api_socket.display());
        let mut s = UnixStream::connect(&st.api_socket).map_err(io(what()))?;
        s.set_read_timeout(Some(timeout)).map_err(io(what()))?;
        s.set_write_timeout(Some(timeout)).map_err(io(what()))?;
        let bytes = body.map(|b| serde_json::to_vec(b).expect("a json value serialises"));
        let r = http::exchange(&mut s, method, &format!("/api/v1/{endpoint}"), bytes.as_deref())
            .map_err(|e| remote(format!("{endpoint} on VM `{name}`"), e.to_string()))?;
        if (200..300).contains(&r.status) {
            return Ok(r.body);
        }
        Err(remote(
            format!("Cloud Hypervisor refused {endpoint} for VM `{name}`"),
            format!(
                "{}; {}",
                render::describe_error(r.status, &r.body),
                render::fix_for(endpoint, &st.vmm_log)
            ),
        ))
    }

    fn put(&self, name: &str, st: &ChState, endpoint: &str, body: Option<&Value>) -> Result<(), BackendError> {
        self.api(name, st, "PUT", endpoint, body, API_TIMEOUT).map(|_| ())
    }

    fn info(&self, name: &str, st: &ChState) -> Result<Vec<u8>, BackendError> {
        self.api(name, st, "GET", "vm.info", None, API_TIMEOUT)
    }

    /// Starts the VMM (not the VM) and waits for its API socket to answer.
    fn start_vmm(&self, name: &str, uuid: &str, st: &ChState) -> Result<(Pid, Vec<String>), BackendError> {
        let bin = self.binary_path().ok_or_else(|| BackendError::Unavailable {
            backend: ID,
            why: format!("`{}` is not on PATH: {}", self.binary, install_hint()),
        })?;
        make_run_dir(st)?;
        remove_runtime_files(st)?;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&st.vmm_log)
            .map_err(io(format!("opening the VMM log {}", st.vmm_log.display())))?;
        let argv = render::vmm_argv(&bin.display().to_string(), st);
        let child = Command::new(&argv[0])
            .args(&argv[1..])
            .env(UUID_ENV, uuid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group: a Ctrl-C meant for nubo does not reach the VM.
            .process_group(0)
            .spawn()
            .map_err(io(format!("starting {}", bin.display())))?;
        let pid = Pid::from_raw(child.id() as i32);
        nubo_core::atomic::write_atomic(&st.pid_file, format!("{pid}\n").as_bytes())
            .map_err(|e| remote(format!("writing {}", st.pid_file.display()), e.to_string()))?;
        let t0 = Instant::now();
        loop {
            if UnixStream::connect(&st.api_socket).is_ok() {
                return Ok((pid, argv));
            }
            if live_pid(&st.pid_file, uuid).is_none() || t0.elapsed() > START_TIMEOUT {
                let _ = kill_now(name, st, uuid);
                return Err(remote(
                    format!("Cloud Hypervisor for VM `{name}` did not start"),
                    format!(
                        "its API socket {} never answered; its log {} ends: {}",
                        st.api_socket.display(),
                        st.vmm_log.display(),
                        log_tail(&st.vmm_log)
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Asks the VMM to end the VM and itself, then makes sure it did.
    fn end_vmm(&self, name: &str, st: &ChState, uuid: &str) -> Result<(), BackendError> {
        if live_pid(&st.pid_file, uuid).is_some() {
            let _ = self.put(name, st, "vm.shutdown", None);
            let _ = self.put(name, st, "vm.delete", None);
            let _ = self.put(name, st, "vmm.shutdown", None);
            wait_gone(st, uuid, Duration::from_secs(5));
        }
        kill_now(name, st, uuid)
    }

    /// Removes what a VMM leaves behind: its tap, any virtiofsd still running (each exits when
    /// the VMM disconnects), the API socket and pid file.
    fn cleanup(&self, name: &str, st: &ChState) -> Result<(), BackendError> {
        if let Some(tap) = &st.tap {
            net::delete_tap(tap)?;
        }
        mounts::stop_found(name, &st.run_dir)?;
        remove_runtime_files(st)
    }

    /// Where virtiofsd is looked up: this backend's PATH.
    fn host(&self) -> crate::HostEnv {
        crate::HostEnv {
            path: self.path.clone(),
            hypervisor_fw: self.firmware_env.clone(),
        }
    }

    fn notes(&self, st: &ChState) -> Vec<String> {
        match (&st.tap, st.mac.as_deref().and_then(net::predicted_address)) {
            (Some(tap), Some(addr)) => vec![format!(
                "network: tap {tap} on bridge {} (no DHCP, no NAT): the guest's address {addr} is computed from its MAC {} and written into its seed",
                net::BRIDGE,
                st.mac.as_deref().unwrap_or_default()
            )],
            _ => vec!["network: none".into()],
        }
    }
}

fn install_hint() -> String {
    "no package registry ships Cloud Hypervisor: install a release binary as /usr/local/bin/cloud-hypervisor".into()
}

/// This VM's Cloud Hypervisor: the process whose environment carries `NUBO_VM_UUID=<uuid>` (the
/// command line names only the socket), so a pid reused after a crash is not mistaken for it
/// and a VMM whose `create` was killed before the pid file was written is still found.
fn vmm<'a>(name: &'a str, pid_file: &'a Path, uuid: &'a str) -> Vmm<'a> {
    Vmm {
        label: "Cloud Hypervisor",
        vm: name,
        pid_file,
        ours: Box::new(move |pid| process::process_env_has(pid, UUID_ENV, uuid)),
    }
}

/// The VMM of a VM, if alive and really this VM's.
pub fn live_pid(pid_file: &Path, uuid: &str) -> Option<Pid> {
    vmm("", pid_file, uuid).live_pid()
}

fn wait_gone(st: &ChState, uuid: &str, timeout: Duration) -> bool {
    vmm("", &st.pid_file, uuid).wait_gone(timeout)
}

fn kill_now(name: &str, st: &ChState, uuid: &str) -> Result<(), BackendError> {
    vmm(name, &st.pid_file, uuid).kill_now()
}

/// The VM's run directory (0700): the API socket, pid file and virtiofsd sockets live there.
fn make_run_dir(st: &ChState) -> Result<(), BackendError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&st.run_dir)
        .map_err(io(format!("creating {}", st.run_dir.display())))
}

fn remove_runtime_files(st: &ChState) -> Result<(), BackendError> {
    process::remove_files([&st.api_socket, &st.pid_file])
}

/// The last line of a log, bounded, for error messages.
fn log_tail(p: &Path) -> String {
    let bytes = nubo_core::file::read_bounded(p, "VMM log", 1 << 20).unwrap_or_default();
    tail_of(&String::from_utf8_lossy(&bytes))
}

/// The last message of a VMM log, for errors: its last unindented line with the indented lines
/// after it (Cloud Hypervisor writes its error chain as `Error: ...` then indented causes),
/// on one line and bounded. Pure.
fn tail_of(text: &str) -> String {
    const MAX: usize = 600;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let Some(start) = lines.iter().rposition(|l| !l.starts_with(' ')) else {
        return "(empty)".into();
    };
    let joined = lines[start..].iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ");
    let cut: String = joined.chars().take(MAX).collect();
    nubo_core::file::escape_control(&cut)
}

/// Copies `from` to `to` through a temp file and a rename, so `to` is never half-written.
fn copy_atomic(from: &Path, to: &Path) -> Result<(), BackendError> {
    let tmp = to.with_extension("tmp");
    fs::copy(from, &tmp).map_err(io(format!("copying {} to {}", from.display(), tmp.display())))?;
    fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("syncing {}", tmp.display())))?;
    fs::rename(&tmp, to).map_err(io(format!("renaming {} to {}", tmp.display(), to.display())))
}

fn dir_size(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|es| {
            es.flatten()
                .filter(|e| e.file_name() != SNAPSHOT_DISK)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn read_meta(dir: &Path) -> Option<SnapshotMeta> {
    let bytes = nubo_core::file::read_bounded(&dir.join(SNAPSHOT_META), "snapshot record", MAX_SNAPSHOT_META).ok()?;
    serde_json::from_slice(&bytes).ok()
}

impl Backend for CloudHypervisorBackend {
    fn id(&self) -> &'static str {
        ID
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["ch"]
    }

    fn auto_selectable(&self) -> bool {
        true
    }

    fn probe(&self) -> Probe {
        let Some(bin) = self.binary_path() else {
            return Probe::Missing {
                what: self.binary.clone(),
                package: install_hint(),
            };
        };
        match Command::new(&bin).arg("--version").stdin(Stdio::null()).output() {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                let version = text
                    .split_whitespace()
                    .nth(1)
                    .map(|v| v.trim_start_matches('v').to_owned())
                    .unwrap_or_else(|| text.trim().to_owned());
                let kvm = self.kvm();
                match kvm {
                    KvmStatus::Usable | KvmStatus::Pvm => Probe::Available { version },
                    other => Probe::Broken {
                        error: format!("Cloud Hypervisor needs KVM, but {}", other.describe()),
                    },
                }
            }
            Ok(o) => Probe::Broken {
                error: format!(
                    "`{} --version` failed: {}",
                    bin.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
            },
            Err(e) => Probe::Broken {
                error: format!("cannot run {}: {e}", bin.display()),
            },
        }
    }

    fn installed(&self) -> bool {
        self.binary_path().is_some()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            &[
                Capability::Snapshot,
                Capability::Pause,
                Capability::DirectKernel,
                Capability::Microvm,
                Capability::MicrovmNative,
            ],
            options::KEYS,
        )
        .with(Capability::Efi, self.find_firmware().is_some_and(|f| f.is_edk2()))
    }

    fn host_checks(&self) -> Vec<HostCheck> {
        host_checks(self)
    }

    fn check(&self, spec: &MachineSpec) -> Result<Vec<String>, BackendError> {
        options::parse(&spec.options)?;
        let st = ChState::layout(spec);
        check_socket_path(&st.api_socket)?;
        if !matches!(spec.disk.base_format.as_str(), "qcow2" | "raw") {
            return Err(BackendError::unsupported(
                ID,
                format!("a {} base image", spec.disk.base_format),
                "the qemu backend, or `nubo image convert` to qcow2",
            ));
        }
        if spec.mounts.iter().any(|m| m.transport != MountTransport::Virtiofs) {
            return Err(BackendError::unsupported(
                ID,
                "9p shared folders",
                "virtio-fs: install virtiofsd (scripts/install-deps.sh) and recreate the VM, or the qemu backend",
            ));
        }
        mounts::check(spec, &self.host(), ID)?;
        let mut notes = Vec::new();
        match &spec.boot {
            Boot::Firmware { firmware } => {
                let fw = self.resolve_firmware(firmware)?;
                notes.push(format!("firmware: {}", fw.display()));
            }
            Boot::Kernel { kernel, initrd, .. } => {
                let mut f = nubo_core::file::open_regular(kernel, "kernel")
                    .map_err(|e| BackendError::InvalidSpec(e.to_string()))?;
                let mut head = vec![0u8; firmware::KERNEL_HEAD];
                let mut n = 0;
                while n < head.len() {
                    match f.read(&mut head[n..]) {
                        Ok(0) => break,
                        Ok(k) => n += k,
                        Err(e) => return Err(io(format!("reading kernel {}", kernel.display()))(e)),
                    }
                }
                if firmware::kernel_format(&head[..n]).is_none() {
                    return Err(BackendError::InvalidSpec(format!(
                        "kernel {} is neither an ELF vmlinux (64-bit, with a PVH entry) nor a bzImage: Cloud Hypervisor loads only those; give a distro vmlinuz (a bzImage) or a vmlinux",
                        kernel.display()
                    )));
                }
                if let Some(i) = initrd {
                    nubo_core::file::open_regular(i, "initrd").map_err(|e| BackendError::InvalidSpec(e.to_string()))?;
                }
            }
        }
        match &spec.network {
            NetworkMode::None => {}
            NetworkMode::Forward => {
                if !net::can_admin_network() {
                    return Err(BackendError::Unavailable {
                        backend: ID,
                        why: format!(
                            "its network is a tap on bridge {}, and creating them needs CAP_NET_ADMIN, which this process lacks: run nubo as root (or with CAP_NET_ADMIN), or use the qemu backend (user-mode networking needs no privileges)",
                            net::BRIDGE
                        ),
                    });
                }
                if which("ip", self.path.as_deref()).is_none() {
                    return Err(BackendError::Unavailable {
                        backend: ID,
                        why: "`ip` is not on PATH: install the iproute2 package".into(),
                    });
                }
                notes.extend(self.notes(&st));
            }
            NetworkMode::Restricted => {
                return Err(BackendError::unsupported(
                    ID,
                    "--restrict-network",
                    "the qemu backend (user-mode networking with restrict=on), or `--network none` on cloud-hypervisor; Cloud Hypervisor's guests sit on a host bridge, and nubo does not isolate a bridge port from the host's own routing",
                ))
            }
            NetworkMode::Named(n) => {
                return Err(BackendError::unsupported(
                    ID,
                    format!("network `{n}`"),
                    "the libvirt backend for named networks",
                ))
            }
        }
        Ok(notes)
    }

    /// virtio-fs through virtiofsd (Cloud Hypervisor's `fs` devices); it has no 9p to fall back to.
    fn mount_transport(&self) -> Result<(MountTransport, Option<String>), BackendError> {
        match mounts::find_virtiofsd(&self.host()) {
            Some(_) => Ok((MountTransport::Virtiofs, None)),
            None => Err(mounts::virtiofsd_missing(ID)),
        }
    }

    fn prepare(&self, spec: &MachineSpec) -> Result<Value, BackendError> {
        let mut st = ChState::layout(spec);
        if let Boot::Firmware { firmware } = &spec.boot {
            st.firmware = Some(self.resolve_firmware(firmware)?);
        }
        Ok(st.to_value())
    }

    fn boot(&self, spec: &MachineSpec, state: &mut Value) -> Result<BootInfo, BackendError> {
        let st = ChState::from_value(&spec.name, state)?;
        check_socket_path(&st.api_socket)?;
        if live_pid(&st.pid_file, &spec.uuid).is_some() {
            return Err(BackendError::AlreadyRunning {
                name: spec.name.clone(),
            });
        }
        let spec = &inspected(spec, &spec.disk.overlay)?;
        let config = render::vm_config(spec, &st, st.firmware.as_deref())?;
        rotate_console(&st.console_log)
            .map_err(io(format!("rotating the console log {}", st.console_log.display())))?;
        // Before the VMM: `vm.create` connects to each folder's vhost-user socket.
        make_run_dir(&st)?;
        let file_servers = mounts::start(spec, &st.run_dir, &self.host(), ID)?;
        if let Some(tap) = &st.tap {
            net::create_tap(tap)?;
        }
        let started = self.start_vmm(&spec.name, &spec.uuid, &st).and_then(|(pid, argv)| {
            self.put(&spec.name, &st, "vm.create", Some(&config))?;
            self.put(&spec.name, &st, "vm.boot", None)?;
            Ok((pid, argv))
        });
        let (pid, argv) = match started {
            Ok(v) => v,
            Err(e) => {
                let _ = self.end_vmm(&spec.name, &st, &spec.uuid);
                let _ = self.cleanup(&spec.name, &st);
                return Err(e);
            }
        };
        file_servers.keep();
        *state = st.to_value();
        Ok(BootInfo {
            pid: Some(pid.as_raw() as u32),
            launch: Launch::Json(json!({"argv": argv, "vm.create": config})),
            notes: self.notes(&st),
        })
    }

    fn state(&self, vm: &VmRef) -> Result<VmState, BackendError> {
        let st = ChState::of(vm)?;
        if live_pid(&st.pid_file, vm.uuid).is_none() {
            return Ok(VmState::Stopped);
        }
        // A live VMM whose API does not answer is still running (busy or wedged);
        // `stop --force` deals with it.
        Ok(match self.info(vm.name, &st) {
            Ok(info) => render::parse_state(&info).unwrap_or(VmState::Running),
            Err(BackendError::Remote { detail, .. }) if detail.contains("VM is not created") => VmState::Stopped,
            Err(_) => VmState::Running,
        })
    }

    fn alive(&self, vm: &VmRef) -> bool {
        ChState::of(vm).is_ok_and(|st| live_pid(&st.pid_file, vm.uuid).is_some())
    }

    fn stop(&self, vm: &VmRef, mode: StopMode) -> Result<(), BackendError> {
        let st = ChState::of(vm)?;
        if let StopMode::Graceful(timeout) = mode {
            if live_pid(&st.pid_file, vm.uuid).is_some() && self.put(vm.name, &st, "vm.power-button", None).is_ok() {
                let t0 = Instant::now();
                while t0.elapsed() < timeout && self.state(vm).is_ok_and(|s| s.is_active()) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            self.end_vmm(vm.name, &st, vm.uuid)?;
        } else {
            kill_now(vm.name, &st, vm.uuid)?;
        }
        self.cleanup(vm.name, &st)
    }

    fn destroy(&self, vm: &VmRef) -> Result<(), BackendError> {
        match ChState::of(vm) {
            Ok(st) => {
                kill_now(vm.name, &st, vm.uuid)?;
                self.cleanup(vm.name, &st)?;
                match fs::remove_dir_all(&st.run_dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(BackendError::Io {
                        what: format!("removing {}", st.run_dir.display()),
                        source: e,
                    }),
                    _ => Ok(()),
                }
            }
            // An unreadable state still has a VMM to find, by the UUID in its environment.
            Err(_) => {
                let st = ChState {
                    run_dir: PathBuf::new(),
                    api_socket: PathBuf::new(),
                    pid_file: PathBuf::new(),
                    console_log: PathBuf::new(),
                    vmm_log: PathBuf::new(),
                    firmware: None,
                    tap: Some(net::tap_name(vm.uuid)),
                    mac: None,
                };
                kill_now(vm.name, &st, vm.uuid)?;
                if let Some(tap) = &st.tap {
                    let _ = net::delete_tap(tap);
                }
                Ok(())
            }
        }
    }

    fn reach(&self, vm: &VmRef) -> Result<Reach, BackendError> {
        let st = ChState::of(vm)?;
        let (Some(tap), Some(mac)) = (&st.tap, &st.mac) else {
            return Ok(Reach {
                ssh: None,
                guest_addresses: Vec::new(),
                network: "no network device".into(),
                predicted: false,
            });
        };
        let Some(addr) = net::predicted_address(mac) else {
            return Err(BackendError::BadState {
                name: vm.name.to_owned(),
                detail: format!("MAC {mac} is not one nubo gives"),
            });
        };
        let arp = nubo_core::file::read_bounded(Path::new("/proc/net/arp"), "ARP table", 1 << 20).unwrap_or_default();
        let seen = net::arp_confirms(&String::from_utf8_lossy(&arp), addr, mac);
        Ok(Reach {
            ssh: Some(SocketAddr::V4(SocketAddrV4::new(addr, 22))),
            guest_addresses: vec![addr.to_string()],
            predicted: true,
            network: format!(
                "tap {tap} on bridge {} with MAC {mac}; the address is {} (no DHCP: computed from the MAC and written into the seed)",
                net::BRIDGE,
                if seen {
                    "predicted and confirmed by the host's ARP table"
                } else {
                    "predicted, not yet seen in the host's ARP table"
                }
            ),
        })
    }

    fn check_address(&self, vm: &VmRef) -> Option<AddressCheck> {
        let st = ChState::of(vm).ok()?;
        let mac = st.mac.as_deref().filter(|_| st.tap.is_some())?;
        let addr = net::predicted_address(mac)?;
        let read = |p: &str, what: &str| {
            String::from_utf8_lossy(&nubo_core::file::read_bounded(Path::new(p), what, 1 << 20).unwrap_or_default())
                .into_owned()
        };
        Some(net::address_check(
            &read("/proc/net/route", "routing table"),
            &read("/proc/net/arp", "ARP table"),
            addr,
            mac,
        ))
    }

    fn console(&self, vm: &VmRef) -> ConsoleLog {
        let current = ChState::of(vm)
            .map(|s| s.console_log)
            .unwrap_or_else(|_| vm.vm_dir.join("console.log"));
        ConsoleLog {
            previous: Some(previous_log(&current)),
            current,
        }
    }

    fn attach_console(&self, vm: &VmRef) -> Result<Box<dyn ConsoleStream>, BackendError> {
        let st = ChState::of(vm)?;
        let info = self.info(vm.name, &st)?;
        let pty = render::console_pty(&info).ok_or_else(|| {
            remote(
                format!("VM `{}`", vm.name),
                "its virtio console is not a pty: recreate the VM with this nubo",
            )
        })?;
        if !pty.starts_with("/dev/pts/") {
            return Err(remote(
                format!("VM `{}`", vm.name),
                format!("the VMM names {pty:?} as its console, which is not a pty"),
            ));
        }
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::libc::O_NOCTTY)
            .open(&pty)
            .map_err(io(format!("opening the console pty {pty}")))?;
        if let Ok(mut t) = nix::sys::termios::tcgetattr(&f) {
            nix::sys::termios::cfmakeraw(&mut t);
            let _ = nix::sys::termios::tcsetattr(&f, nix::sys::termios::SetArg::TCSANOW, &t);
        }
        Ok(Box::new(PtyConsole(f)))
    }

    fn pause(&self, vm: &VmRef) -> Result<(), BackendError> {
        let st = ChState::of(vm)?;
        self.put(vm.name, &st, "vm.pause", None)
    }

    fn resume(&self, vm: &VmRef) -> Result<(), BackendError> {
        let st = ChState::of(vm)?;
        self.put(vm.name, &st, "vm.resume", None)
    }

    fn snapshot_create(&self, vm: &VmRef, spec: &MachineSpec, name: &str) -> Result<SnapshotTaken, BackendError> {
        let st = ChState::of(vm)?;
        let dir = snapshot_dir(vm.vm_dir, name);
        if dir.exists() {
            return Err(BackendError::InvalidSpec(format!(
                "snapshot `{name}` of vm `{}` already exists ({}): delete it first or choose another name",
                vm.name,
                dir.display()
            )));
        }
        let tmp = dir.with_file_name(format!(".tmp-{name}"));
        let _ = fs::remove_dir_all(&tmp);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&tmp)
            .map_err(io(format!("creating {}", tmp.display())))?;
        let state = self.state(vm)?;
        let live = matches!(state, VmState::Running | VmState::Paused);
        let t0 = Instant::now();
        let taken = (|| {
            if state == VmState::Running {
                self.put(vm.name, &st, "vm.pause", None)?;
            }
            let r = (|| {
                if live {
                    self.api(
                        vm.name,
                        &st,
                        "PUT",
                        "vm.snapshot",
                        Some(&render::snapshot_body(&tmp)),
                        SNAPSHOT_TIMEOUT,
                    )?;
                }
                // The disk is copied while the guest is paused, so memory and disk agree.
                copy_atomic(&spec.disk.overlay, &tmp.join(SNAPSHOT_DISK))
            })();
            if state == VmState::Running {
                // The guest runs on whatever happened to the snapshot.
                let resumed = self.put(vm.name, &st, "vm.resume", None);
                r?;
                resumed?;
            } else {
                r?;
            }
            Ok::<_, BackendError>(())
        })();
        let frozen = live.then(|| t0.elapsed());
        if let Err(e) = taken {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        let created_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let meta = SnapshotMeta {
            name: name.to_owned(),
            has_memory: live,
            created_unix,
        };
        let done = nubo_core::atomic::write_atomic(
            &tmp.join(SNAPSHOT_META),
            &serde_json::to_vec_pretty(&meta).expect("a plain struct serialises"),
        )
        .map_err(|e| remote(format!("writing the record of snapshot `{name}`"), e.to_string()))
        .and_then(|()| fs::rename(&tmp, &dir).map_err(io(format!("renaming {} to {}", tmp.display(), dir.display()))));
        if let Err(e) = done {
            let _ = fs::remove_dir_all(&tmp);
            return Err(e);
        }
        Ok(SnapshotTaken {
            snapshot: BackendSnapshot {
                name: name.to_owned(),
                has_memory: live,
                vm_state_size: if live { dir_size(&dir) } else { 0 },
                created: None,
            },
            frozen,
        })
    }

    /// Its snapshots are directories under the VM's.
    fn snapshot_delete_by_hand(&self, _vm: &VmRef, spec: &MachineSpec, name: &str) -> Option<crate::ByHand> {
        Some(crate::ByHand {
            argv: vec![
                "rm".into(),
                "-r".into(),
                "--".into(),
                spec.vm_dir.join("snapshots").join(name).to_string_lossy().into_owned(),
            ],
            while_stopped: false,
        })
    }

    fn snapshot_list(&self, vm: &VmRef, _spec: &MachineSpec) -> Result<Vec<BackendSnapshot>, BackendError> {
        let root = vm.vm_dir.join("snapshots");
        let entries = match fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(format!("listing {}", root.display()))(e)),
        };
        let mut out = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let dir = e.path();
            let has_memory = read_meta(&dir).map_or_else(|| dir.join("state.json").is_file(), |m| m.has_memory);
            out.push(BackendSnapshot {
                vm_state_size: if has_memory { dir_size(&dir) } else { 0 },
                name,
                has_memory,
                created: None,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn snapshot_delete(&self, vm: &VmRef, _spec: &MachineSpec, name: &str) -> Result<(), BackendError> {
        let dir = snapshot_dir(vm.vm_dir, name);
        match fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(format!("removing {}", dir.display()))(e)),
            _ => Ok(()),
        }
    }

    fn snapshot_restore(&self, spec: &MachineSpec, state: &mut Value, name: &str) -> Result<Restored, BackendError> {
        let st = ChState::from_value(&spec.name, state)?;
        let dir = snapshot_dir(&spec.vm_dir, name);
        let disk = dir.join(SNAPSHOT_DISK);
        if !disk.is_file() {
            return Err(BackendError::InvalidSpec(format!(
                "snapshot `{name}` of vm `{}` does not exist ({} is missing): list them with `nubo vm snapshot ls {}`",
                spec.name,
                disk.display(),
                spec.name
            )));
        }
        // The copy that replaces the overlay, and the base under it, are proven before either
        // reaches Cloud Hypervisor (the snapshot's config turns `backing_files` on).
        inspected(spec, &disk)?;
        let has_memory = read_meta(&dir).is_some_and(|m| m.has_memory);
        let was_running = live_pid(&st.pid_file, &spec.uuid).is_some();
        // The VM's present state is discarded: the snapshot replaces memory and disk.
        if was_running {
            kill_now(&spec.name, &st, &spec.uuid)?;
            self.cleanup(&spec.name, &st)?;
        }
        copy_atomic(&disk, &spec.disk.overlay)?;
        if !has_memory {
            return Ok(Restored::DiskOnly);
        }
        make_run_dir(&st)?;
        let file_servers = mounts::start(spec, &st.run_dir, &self.host(), ID)?;
        if let Some(tap) = &st.tap {
            net::create_tap(tap)?;
        }
        let restored = self.start_vmm(&spec.name, &spec.uuid, &st).and_then(|(pid, argv)| {
            self.api(
                &spec.name,
                &st,
                "PUT",
                "vm.restore",
                Some(&render::restore_body(&dir)),
                SNAPSHOT_TIMEOUT,
            )?;
            self.put(&spec.name, &st, "vm.resume", None)?;
            Ok((pid, argv))
        });
        let (pid, argv) = match restored {
            Ok(v) => v,
            Err(e) => {
                let _ = self.end_vmm(&spec.name, &st, &spec.uuid);
                let _ = self.cleanup(&spec.name, &st);
                return Err(e);
            }
        };
        file_servers.keep();
        *state = st.to_value();
        if was_running {
            return Ok(Restored::Running);
        }
        Ok(Restored::Started(BootInfo {
            pid: Some(pid.as_raw() as u32),
            launch: Launch::Json(json!({"argv": argv, "vm.restore": render::restore_body(&dir)})),
            notes: self.notes(&st),
        }))
    }

    fn guest_network(&self, spec: &MachineSpec) -> Option<GuestNetwork> {
        if !matches!(spec.network, NetworkMode::Forward) {
            return None;
        }
        let mac = net::mac_for(&spec.uuid);
        let addr = net::predicted_address(&mac)?;
        Some(GuestNetwork {
            mac,
            address: format!("{addr}/{}", net::PREFIX),
            gateway: net::GATEWAY.to_string(),
        })
    }
}

/// The virtio console's pty (`vm console`).
pub struct PtyConsole(pub fs::File);

impl std::io::Read for PtyConsole {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl std::io::Write for PtyConsole {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::Write::write(&mut self.0, buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::Write::flush(&mut self.0)
    }
}

impl ConsoleStream for PtyConsole {
    fn try_clone_reader(&self) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        Ok(Box::new(self.0.try_clone()?))
    }
    fn shutdown(&self) {}
}

/// What Cloud Hypervisor needs from the host, for `nubo doctor`.
fn host_checks(b: &CloudHypervisorBackend) -> Vec<HostCheck> {
    let mut out = Vec::new();
    let check = |name: &str, ok: bool, detail: String, fix: Option<String>, blocks: Option<&str>| HostCheck {
        name: name.into(),
        status: if ok { CheckStatus::Ok } else { CheckStatus::Broken },
        detail,
        fix: (!ok).then_some(fix).flatten(),
        blocks: (!ok).then(|| blocks.map(str::to_owned)).flatten(),
    };
    out.push(match b.probe() {
        Probe::Available { version } => check(
            "backend cloud-hypervisor",
            true,
            format!("{} {version}", b.binary),
            None,
            None,
        ),
        Probe::Missing { what, package } => check(
            "backend cloud-hypervisor",
            false,
            format!("{what} is not on PATH"),
            Some(package),
            None,
        ),
        Probe::Broken { error } => check(
            "backend cloud-hypervisor",
            false,
            error,
            Some("install a working Cloud Hypervisor".into()),
            None,
        ),
    });
    let kvm = b.kvm();
    out.push(HostCheck {
        name: "cloud-hypervisor kvm".into(),
        status: match kvm {
            KvmStatus::Usable => CheckStatus::Ok,
            KvmStatus::Pvm => CheckStatus::Warn,
            _ => CheckStatus::Broken,
        },
        detail: match kvm {
            KvmStatus::Pvm => "/dev/kvm is PVM (kvm_pvm): Cloud Hypervisor runs on it, but stock distro kernels hang and snapshots fail (no KVM_GET_NESTED_STATE)".into(),
            ref other => other.describe(),
        },
        fix: (kvm != KvmStatus::Usable).then(|| "run on a host with hardware KVM for cloud images and snapshots".into()),
        blocks: match kvm {
            KvmStatus::Usable => None,
            KvmStatus::Pvm => Some("cloud-init guests and snapshots on cloud-hypervisor".into()),
            _ => Some("the cloud-hypervisor backend".into()),
        },
    });
    let fw = b.find_firmware();
    out.push(check(
        "cloud-hypervisor firmware",
        fw.as_ref().is_some_and(|f| f.path().is_file()),
        fw.as_ref().map_or_else(
            || {
                format!(
                    "no {} or hypervisor-fw in {}",
                    firmware::NAMES[0],
                    firmware::DIRS.join(", ")
                )
            },
            |f| f.path().display().to_string(),
        ),
        Some(format!(
            "put an EDK2 CLOUDHV.fd in {} or set {}",
            firmware::DIRS[0],
            firmware::ENV
        )),
        Some("cloud-hypervisor firmware boots (cloud images without a recorded kernel)"),
    ));
    let admin = net::can_admin_network();
    out.push(check(
        "cloud-hypervisor network",
        admin,
        if admin {
            format!("CAP_NET_ADMIN: taps on bridge {} can be made", net::BRIDGE)
        } else {
            "no CAP_NET_ADMIN: taps and the bridge cannot be made".into()
        },
        Some("run nubo as root (or with CAP_NET_ADMIN)".into()),
        Some("networked cloud-hypervisor VMs"),
    ));
    out
}

/// `spec` with its disk chain proven just now, `overlay` standing for the VM's overlay: Cloud
/// Hypervisor opens the overlay's backing file itself (and what that names in turn), so it
/// never gets a chain nubo has not inspected, whatever the engine checked before (issue 21).
fn inspected(spec: &MachineSpec, overlay: &Path) -> Result<MachineSpec, BackendError> {
    let chain = crate::chain::verify(&spec.disk, overlay).map_err(|e| {
        BackendError::InvalidSpec(format!(
            "vm `{}` was not started: {e}: Cloud Hypervisor only gets a disk chain nubo has just inspected",
            spec.name
        ))
    })?;
    Ok(MachineSpec {
        disk: crate::chain::inspected(&spec.disk, &chain),
        ..spec.clone()
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::spec::{Disk, MachineKind};

    fn backend(dir: &Path) -> CloudHypervisorBackend {
        CloudHypervisorBackend {
            binary: dir.join("no-such-cloud-hypervisor").display().to_string(),
            firmware_env: None,
            sys_module: dir.to_path_buf(),
            dev_kvm: dir.join("kvm"),
            path: None,
        }
    }

    fn spec(dir: &Path, boot: Boot, network: NetworkMode) -> MachineSpec {
        MachineSpec {
            name: "micro".into(),
            uuid: "5e1b9f7c-1d2e-4f00-8a9b-0123456789ab".into(),
            vm_dir: dir.join("vms/micro"),
            run_dir: dir.join("run/micro"),
            vcpus: 1,
            memory_mib: 64,
            disk: Disk {
                overlay: dir.join("vms/micro/disk.qcow2"),
                base: dir.join("base.raw"),
                base_format: "raw".into(),
                ..Default::default()
            },
            seed: None,
            boot,
            machine: MachineKind::Microvm,
            network,
            ports: Vec::new(),
            options: BTreeMap::new(),
            mounts: Vec::new(),
        }
    }

    fn kernel_file(dir: &Path, bytes: &[u8]) -> Boot {
        let k = dir.join("vmlinux");
        fs::write(&k, bytes).unwrap();
        Boot::Kernel {
            kernel: k,
            initrd: None,
            cmdline: "quiet".into(),
        }
    }

    #[test]
    fn check_bios_is_refused_with_the_fix() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(
            d.path(),
            Boot::Firmware {
                firmware: Firmware::Bios,
            },
            NetworkMode::None,
        );

        let err = backend(d.path()).check(&s).unwrap_err().to_string();

        assert!(err.contains("no BIOS boot") && err.contains("CLOUDHV.fd"), "{err}");
    }

    #[test]
    fn check_firmware_path_missing_names_it() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(
            d.path(),
            Boot::Firmware {
                firmware: Firmware::EfiCode(d.path().join("nope.fd")),
            },
            NetworkMode::None,
        );

        let err = backend(d.path()).check(&s).unwrap_err().to_string();

        assert!(err.contains("nope.fd"), "{err}");
    }

    #[test]
    fn check_env_firmware_not_a_file_names_the_variable() {
        let d = tempfile::tempdir().unwrap();
        let mut b = backend(d.path());
        b.firmware_env = Some(d.path().join("missing.fd"));
        let s = spec(
            d.path(),
            Boot::Firmware {
                firmware: Firmware::Efi,
            },
            NetworkMode::None,
        );

        let err = b.check(&s).unwrap_err().to_string();

        assert!(
            err.contains("NUBO_HYPERVISOR_FW") && err.contains("missing.fd"),
            "{err}"
        );
    }

    #[test]
    fn check_kernel_not_elf_or_bzimage_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(d.path(), kernel_file(d.path(), b"#!/bin/sh\n"), NetworkMode::None);

        let err = backend(d.path()).check(&s).unwrap_err().to_string();

        assert!(
            err.contains("neither an ELF vmlinux") && err.contains("vmlinux"),
            "{err}"
        );
    }

    #[test]
    fn check_elf_kernel_without_network_is_accepted() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(
            d.path(),
            kernel_file(d.path(), b"\x7fELF\x02\x01\x01\x00"),
            NetworkMode::None,
        );

        assert!(backend(d.path()).check(&s).is_ok());
    }

    #[test]
    fn check_socket_path_too_long_is_refused_naming_run_dir() {
        let d = tempfile::tempdir().unwrap();
        let mut s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::None);
        s.run_dir = PathBuf::from(format!("/run/{}", "r".repeat(110)));

        let err = backend(d.path()).check(&s).unwrap_err().to_string();

        assert!(err.contains("ch.sock") && err.contains("NUBO_RUN_DIR"), "{err}");
    }

    #[test]
    fn check_restricted_network_is_unsupported_naming_qemu() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::Restricted);

        let err = backend(d.path()).check(&s).unwrap_err();

        assert_eq!(err.kind(), nubo_core::ErrorKind::Unsupported);
        assert!(err.to_string().contains("qemu"), "{err}");
    }

    #[test]
    fn check_vmdk_base_is_unsupported() {
        let d = tempfile::tempdir().unwrap();
        let mut s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::None);
        s.disk.base_format = "vmdk".into();

        assert!(backend(d.path()).check(&s).is_err());
    }

    #[test]
    fn check_unknown_option_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let mut s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::None);
        s.options.insert("machine".into(), "q35".into());

        assert!(backend(d.path()).check(&s).is_err());
    }

    #[test]
    fn guest_network_forward_matches_the_tap_mac() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::Forward);

        let g = backend(d.path()).guest_network(&s).unwrap();

        assert_eq!(Some(g.mac.clone()), ChState::layout(&s).mac);
        assert_eq!(g.address, "10.237.137.173/16");
        assert_eq!(g.gateway, "10.237.0.1");
    }

    #[test]
    fn guest_network_none_is_none() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::None);

        assert_eq!(backend(d.path()).guest_network(&s), None);
    }

    #[test]
    fn tail_of_keeps_the_error_chain() {
        let log = "cloud-hypervisor: 1.2ms: <vmm> INFO\nError: Cloud Hypervisor exited with the following chain of errors:\n  0: Error binding to UNIX socket\n  1: Address in use\n\n";

        assert_eq!(
            tail_of(log),
            "Error: Cloud Hypervisor exited with the following chain of errors: 0: Error binding to UNIX socket 1: Address in use"
        );
        assert_eq!(tail_of(""), "(empty)");
    }

    #[test]
    fn probe_missing_binary_says_how_to_install() {
        let d = tempfile::tempdir().unwrap();

        let p = backend(d.path()).probe();

        assert!(
            matches!(p, Probe::Missing { ref package, .. } if package.contains("/usr/local/bin")),
            "{p:?}"
        );
    }

    #[test]
    fn state_without_vmm_is_stopped() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::None);
        let v = ChState::layout(&s).to_value();
        let vm = VmRef {
            name: "micro",
            uuid: &s.uuid,
            vm_dir: &s.vm_dir,
            state: &v,
        };

        assert_eq!(backend(d.path()).state(&vm).unwrap(), VmState::Stopped);
    }

    #[test]
    fn snapshot_list_and_delete_on_missing_dir_converge() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::None);
        let v = ChState::layout(&s).to_value();
        let vm = VmRef {
            name: "micro",
            uuid: &s.uuid,
            vm_dir: &s.vm_dir,
            state: &v,
        };
        let b = backend(d.path());

        assert_eq!(b.snapshot_list(&vm, &s).unwrap(), vec![]);
        assert!(b.snapshot_delete(&vm, &s, "gone").is_ok());
    }

    #[test]
    fn snapshot_of_stopped_vm_is_disk_only_and_restores() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::None);
        let before = chain(&s, None);
        let mut v = ChState::layout(&s).to_value();
        let b = backend(d.path());
        let vm = VmRef {
            name: "micro",
            uuid: &s.uuid,
            vm_dir: &s.vm_dir,
            state: &v.clone(),
        };

        let taken = b.snapshot_create(&vm, &s, "s1").unwrap();
        fs::remove_file(&s.disk.overlay).unwrap();
        chain(&s, Some(8192));
        let listed = b.snapshot_list(&vm, &s).unwrap();
        let restored = b.snapshot_restore(&s, &mut v, "s1").unwrap();

        assert!(!taken.snapshot.has_memory && taken.frozen.is_none());
        assert_eq!(listed.len(), 1);
        assert_eq!(restored, Restored::DiskOnly);
        assert_eq!(fs::read(&s.disk.overlay).unwrap(), before);
    }

    /// The VM's chain as create makes it: a 4 KiB raw base and the overlay (of `size`) over
    /// it; the overlay's bytes.
    fn chain(s: &MachineSpec, size: Option<u64>) -> Vec<u8> {
        fs::create_dir_all(&s.vm_dir).unwrap();
        if !s.disk.base.exists() {
            fs::write(&s.disk.base, vec![1u8; 4096]).unwrap();
        }
        nubo_disk::create_overlay(&s.disk.base, nubo_disk::Format::Raw, &s.disk.overlay, size).unwrap();
        fs::read(&s.disk.overlay).unwrap()
    }

    /// Regression (issue 21): a restore handed Cloud Hypervisor whatever chain the snapshot's
    /// copy and the base were by then. A base replaced by a qcow2 naming a host file is refused
    /// before the overlay is touched.
    #[test]
    fn snapshot_restore_over_replaced_base_is_refused_leaving_overlay() {
        let d = tempfile::tempdir().unwrap();
        let s = spec(d.path(), kernel_file(d.path(), b"\x7fELF\x02"), NetworkMode::None);
        chain(&s, None);
        let mut v = ChState::layout(&s).to_value();
        let b = backend(d.path());
        let vm = VmRef {
            name: "micro",
            uuid: &s.uuid,
            vm_dir: &s.vm_dir,
            state: &v.clone(),
        };
        b.snapshot_create(&vm, &s, "s1").unwrap();
        fs::write(&s.disk.overlay, b"now").unwrap();
        let host_file = d.path().join("host-secret");
        fs::write(&host_file, b"secret").unwrap();
        let evil = d.path().join("evil.qcow2");
        let layout = nubo_disk::layout::layout(
            1 << 20,
            Some(nubo_disk::layout::BackingRef {
                name: host_file.to_str().unwrap(),
                driver: "raw",
            }),
        )
        .unwrap();
        let mut bytes = vec![0u8; layout.len as usize];
        for (at, data) in &layout.writes {
            bytes[*at as usize..*at as usize + data.len()].copy_from_slice(data);
        }
        fs::write(&evil, bytes).unwrap();
        fs::rename(&evil, &s.disk.base).unwrap();

        let err = b.snapshot_restore(&s, &mut v, "s1").unwrap_err().to_string();

        assert!(err.contains("base.raw") && err.contains("host-secret"), "{err}");
        assert_eq!(fs::read(&s.disk.overlay).unwrap(), b"now");
    }
}
