//! The daemonless QEMU backend: QEMU started with `-daemonize` and driven over QMP.
//!
//! It owns every QEMU detail the engine used to know: the runtime files in the VM's run
//! directory ([`state::QemuState`]), the AF_UNIX path limit, OVMF lookup and the VM's copy of
//! the variable store, user-mode networking with SSH forwarded from a free port on 127.0.0.1
//! (re-picked when another program took it), the serial console QEMU logs to a file, and the
//! accelerator policy.

pub mod mounts;
pub mod options;
pub mod probe;
pub mod qmp;
pub mod render;
pub mod snapshot;
pub mod state;

use std::fs;
use std::io::BufReader;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::unistd::Pid;
use nubo_core::VmState;

use self::options::{Accel, Machine};
use self::state::QemuState;
use crate::host::{check_socket_path, free_port, port_free, previous_log, rotate_console, KvmStatus};
use crate::process::{self, Vmm};
use crate::spec::{Boot, Firmware, MachineSpec, NetworkMode};
use crate::{
    Backend, BackendError, BackendSnapshot, BootInfo, Capabilities, Capability, CheckStatus, ConsoleLog, ConsoleStream,
    HostCheck, Launch, Probe, Reach, Restored, SharedDir, SnapshotTaken, StopMode, VmRef,
};

pub const BINARY: &str = "qemu-system-x86_64";
/// Snapshots of a stopped VM's overlay.
pub const QEMU_IMG: &str = "qemu-img";
/// How long a QMP exchange may take before the VMM counts as unresponsive.
/// How long freezing a disk layer may take: the build's own bound before this move.
const FREEZE_TIMEOUT: Duration = Duration::from_secs(120);
const QMP_TIMEOUT: Duration = Duration::from_secs(5);
/// What QEMU says when the SSH forward's port was taken between nubo's check and its bind.
const HOSTFWD_FAILED: &str = "host forwarding rule";
/// Boot attempts when the forwarded port is taken by another program in the meantime.
const PORT_ATTEMPTS: u32 = 3;
/// User-mode networking always gives the guest this address.
pub const USER_NET_GUEST_ADDR: &str = "10.0.2.15";

pub struct QemuBackend {
    pub binary: String,
    pub qemu_img: String,
    /// Where to look for `kvm_pvm` and `/dev/kvm` (overridable for tests).
    pub sys_module: PathBuf,
    pub dev_kvm: PathBuf,
    /// Where the binary and virtiofsd are looked up.
    pub host: crate::HostEnv,
}

impl Default for QemuBackend {
    /// Over this process's environment, read now ([`QemuBackend::with_host`] takes another).
    fn default() -> Self {
        QemuBackend::with_host(crate::HostEnv::from_process())
    }
}

impl QemuBackend {
    pub fn with_host(host: crate::HostEnv) -> Self {
        QemuBackend {
            binary: BINARY.into(),
            qemu_img: QEMU_IMG.into(),
            sys_module: "/sys/module".into(),
            dev_kvm: "/dev/kvm".into(),
            host,
        }
    }

    pub fn kvm(&self) -> KvmStatus {
        crate::host::probe_kvm(&self.sys_module, &self.dev_kvm)
    }

    fn qmp(&self, name: &str, st: &QemuState) -> Result<qmp::Qmp<BufReader<UnixStream>, UnixStream>, BackendError> {
        self.qmp_with(name, st, QMP_TIMEOUT)
    }

    /// A QMP connection whose replies may take up to `timeout` (snapshot jobs run in QEMU's
    /// main loop, which answers nothing until the VM state is written).
    fn qmp_with(
        &self,
        name: &str,
        st: &QemuState,
        timeout: Duration,
    ) -> Result<qmp::Qmp<BufReader<UnixStream>, UnixStream>, BackendError> {
        let what = || format!("QMP socket {} of VM `{name}`", st.qmp_socket.display());
        let s = UnixStream::connect(&st.qmp_socket).map_err(BackendError::io(what()))?;
        s.set_read_timeout(Some(timeout)).map_err(BackendError::io(what()))?;
        s.set_write_timeout(Some(QMP_TIMEOUT))
            .map_err(BackendError::io(what()))?;
        let r = s.try_clone().map_err(BackendError::io(what()))?;
        qmp::Qmp::handshake(BufReader::new(r), s).map_err(|e| BackendError::Remote {
            what: what(),
            detail: e.to_string(),
        })
    }

    fn command(&self, vm: &VmRef, cmd: &str) -> Result<(), BackendError> {
        self.qmp_execute(vm, &QemuState::of(vm)?, cmd, None).map(drop)
    }

    /// Starts QEMU; with `paused` it starts with `-S` (no guest code runs until `cont`), for a
    /// restore of a memory snapshot onto a stopped VM.
    fn boot_with(
        &self,
        spec: &MachineSpec,
        state: &mut serde_json::Value,
        paused: bool,
    ) -> Result<BootInfo, BackendError> {
        let mut st = QemuState::from_value(&spec.name, state)?;
        for p in st.sockets() {
            check_socket_path(p)?;
        }
        if live_pid(&st.pid_file, &spec.uuid).is_some() {
            return Err(BackendError::AlreadyRunning {
                name: spec.name.clone(),
            });
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&st.run_dir)
            .map_err(BackendError::io(format!("creating {}", st.run_dir.display())))?;
        remove_runtime_files(&st)?;
        rotate_console(&st.console_log).map_err(BackendError::io(format!(
            "rotating the console log {}",
            st.console_log.display()
        )))?;
        let o = options::parse(spec.machine, &spec.options)?;
        let (accel, accel_reason) = probe::resolve_accel(o.accel, &self.kvm())?;
        let opts = options::QemuOptions { accel, ..o };
        let tsc_khz = (opts.machine == Machine::Microvm && accel == Accel::Tcg)
            .then(probe::host_tsc_khz)
            .flatten();
        let networked = spec.network != NetworkMode::None;
        let file_servers = mounts::start(spec, &st.run_dir, &self.host, "qemu")?;
        for attempt in 1..=PORT_ATTEMPTS {
            // A published port someone else took since the VM last ran is named, not retried.
            crate::ports::check_free(&spec.ports)?;
            if networked && st.ssh_port.is_none_or(|p| !port_free(p)) {
                st.ssh_port = Some(free_port()?);
            }
            let mut argv = render::argv(&self.binary, spec, &st, opts, tsc_khz)?;
            if paused {
                argv.push(render::START_PAUSED.into());
            }
            match self.launch(&argv, spec, &st)? {
                Some(pid) => {
                    file_servers.keep();
                    *state = st.to_value();
                    return Ok(BootInfo {
                        pid: Some(pid.as_raw() as u32),
                        launch: Launch::Argv(argv),
                        notes: vec![format!("accelerator: {accel_reason}")],
                    });
                }
                // Another program took the port between our check and QEMU's bind.
                None if attempt < PORT_ATTEMPTS => st.ssh_port = None,
                None => {}
            }
        }
        Err(BackendError::PortInUse {
            port: st.ssh_port.unwrap_or_default(),
            fix: format!("{PORT_ATTEMPTS} free ports were taken before QEMU could bind them; retry the command"),
        })
    }

    /// Runs a snapshot job on the running VM's overlay, after settling any a killed nubo left.
    fn snapshot_job(
        &self,
        name: &str,
        st: &QemuState,
        kind: snapshot::JobKind,
        tag: &str,
    ) -> Result<(snapshot::JobDone, qmp::Qmp<BufReader<UnixStream>, UnixStream>), BackendError> {
        let remote = |e: snapshot::JobError| BackendError::Remote {
            what: format!("snapshot `{tag}` of VM `{name}`"),
            detail: e.to_string(),
        };
        let mut q = self.qmp_with(name, st, snapshot::JOB_TIMEOUT)?;
        snapshot::settle_stale_jobs(&mut q, snapshot::JOB_TIMEOUT, snapshot::JOB_POLL).map_err(remote)?;
        let id = format!("{}{}", snapshot::JOB_PREFIX, std::process::id());
        let done =
            snapshot::run_job(&mut q, kind, &id, tag, snapshot::JOB_TIMEOUT, snapshot::JOB_POLL).map_err(remote)?;
        Ok((done, q))
    }

    /// `qemu-img snapshot` on a stopped VM's overlay.
    fn snapshot_img(&self, spec: &MachineSpec, action: snapshot::ImgAction, tag: &str) -> Result<(), BackendError> {
        let argv = snapshot::qemu_img_argv(&self.qemu_img, action, &spec.disk.overlay, tag);
        let out = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => BackendError::Unavailable {
                    backend: "qemu",
                    why: format!("`{}` is not installed: install the qemu-utils package", self.qemu_img),
                },
                _ => BackendError::Io {
                    what: format!("running {}", self.qemu_img),
                    source: e,
                },
            })?;
        if !out.status.success() {
            return Err(BackendError::Remote {
                what: format!("snapshot `{tag}` of VM `{}` ({})", spec.name, argv[1..].join(" ")),
                detail: nubo_core::file::escape_control(String::from_utf8_lossy(&out.stderr).trim()),
            });
        }
        Ok(())
    }

    /// Loads memory snapshot `tag` into the VM QEMU just started with -S, then runs it.
    fn load_into_fresh(&self, spec: &MachineSpec, st: &QemuState, tag: &str) -> Result<(), BackendError> {
        let (_, mut q) = self.snapshot_job(&spec.name, st, snapshot::JobKind::Load, tag)?;
        q.execute("cont", None).map_err(|e| BackendError::Remote {
            what: format!("resuming VM `{}` after restoring snapshot `{tag}`", spec.name),
            detail: e.to_string(),
        })?;
        Ok(())
    }

    /// Runs QEMU once; `Ok(None)` when the SSH forward's port was taken meanwhile.
    fn launch(&self, argv: &[String], spec: &MachineSpec, st: &QemuState) -> Result<Option<Pid>, BackendError> {
        let out = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => BackendError::Unavailable {
                    backend: "qemu",
                    why: format!(
                        "`{}` is not installed: install the qemu-system-x86 package",
                        self.binary
                    ),
                },
                _ => BackendError::Io {
                    what: format!("starting {}", self.binary),
                    source: e,
                },
            })?;
        if !out.status.success() {
            let _ = remove_runtime_files(st);
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
            if stderr.contains(HOSTFWD_FAILED) {
                return Ok(None);
            }
            return Err(BackendError::Remote {
                what: format!("QEMU refused to start VM `{}`", spec.name),
                detail: nubo_core::file::escape_control(&stderr),
            });
        }
        live_pid(&st.pid_file, &spec.uuid)
            .map(Some)
            .ok_or_else(|| BackendError::Remote {
                what: format!("VM `{}`", spec.name),
                detail: format!("QEMU exited right after starting; see {}", st.console_log.display()),
            })
    }
}

/// This VM's QEMU: the process whose command line carries `-uuid <uuid>` (so a pid reused by
/// another process after a crash is not mistaken for it, and a QEMU whose `nubo vm create` was
/// killed before QEMU wrote its pid file is still found).
fn vmm<'a>(name: &'a str, pid_file: &'a Path, uuid: &'a str) -> Vmm<'a> {
    Vmm {
        label: "QEMU",
        vm: name,
        pid_file,
        ours: Box::new(move |pid| process::cmdline_has_pair(pid, "-uuid", uuid)),
    }
}

/// The VMM process of a VM, if it is alive and really this VM's.
pub fn live_pid(pid_file: &Path, uuid: &str) -> Option<Pid> {
    vmm("", pid_file, uuid).live_pid()
}

fn wait_gone(st: &QemuState, uuid: &str, timeout: Duration) -> bool {
    vmm("", &st.pid_file, uuid).wait_gone(timeout)
}

fn kill_now(name: &str, st: &QemuState, uuid: &str) -> Result<(), BackendError> {
    vmm(name, &st.pid_file, uuid).kill_now()
}

fn remove_runtime_files(st: &QemuState) -> Result<(), BackendError> {
    process::remove_files([&st.qmp_socket, &st.serial_socket, &st.pid_file])
}

impl Backend for QemuBackend {
    fn id(&self) -> &'static str {
        "qemu"
    }

    fn auto_selectable(&self) -> bool {
        true
    }

    fn probe(&self) -> Probe {
        let Some(bin) = self.host.which(&self.binary) else {
            return Probe::Missing {
                what: self.binary.clone(),
                package: "qemu-system-x86".into(),
            };
        };
        match Command::new(&bin).arg("--version").stdin(Stdio::null()).output() {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                Probe::Available {
                    version: crate::host::parse_version(&text).unwrap_or_else(|| text.trim().to_owned()),
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
        self.host.which(&self.binary).is_some()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            &[
                Capability::Snapshot,
                Capability::Pause,
                Capability::DirectKernel,
                Capability::Bios,
                Capability::Microvm,
                Capability::PortForwards,
                Capability::RestrictedNetwork,
                Capability::FreezeDiskLayer,
            ],
            options::KEYS,
        )
        .with(Capability::Efi, probe::find_ovmf().is_some())
    }

    fn host_checks(&self) -> Vec<HostCheck> {
        host_checks(self)
    }

    fn check(&self, spec: &MachineSpec) -> Result<Vec<String>, BackendError> {
        let o = options::parse(spec.machine, &spec.options)?;
        let st = QemuState::layout(spec);
        for p in st.sockets() {
            check_socket_path(p)?;
        }
        match &spec.boot {
            Boot::Firmware { .. } if o.machine == Machine::Microvm => {
                return Err(BackendError::InvalidSpec(
                    "the microvm machine has no firmware and boots only a kernel: give --kernel (or use an image that records one)".into(),
                ))
            }
            Boot::Firmware {
                firmware: Firmware::Efi | Firmware::EfiCode(_),
            } if probe::find_ovmf().is_none() => return Err(render::ovmf_missing()),
            Boot::Firmware {
                firmware: Firmware::Bios,
            } if !Path::new(probe::SEABIOS).is_file() => {
                return Err(BackendError::Unavailable {
                    backend: "qemu",
                    why: format!("BIOS boot needs SeaBIOS ({}): install the seabios package, or boot the image's kernel directly", probe::SEABIOS),
                })
            }
            _ => {}
        }
        if let NetworkMode::Named(n) = &spec.network {
            return Err(BackendError::unsupported(
                "qemu",
                format!("network `{n}`"),
                "the libvirt backend for named networks, or network forward|restricted",
            ));
        }
        if o.accel == Accel::Kvm {
            probe::resolve_accel(Accel::Kvm, &self.kvm())?;
        }
        mounts::check(spec, &self.host, "qemu")?;
        Ok(Vec::new())
    }

    fn mount_transport(&self) -> Result<(crate::MountTransport, Option<String>), BackendError> {
        Ok(mounts::transport(&self.host))
    }

    /// Hot-plug where QEMU can: a virtio-fs folder on a pc machine (q35's root bus and microvm
    /// take no hot-plugged device; 9p's `-fsdev` has no QMP equivalent).
    fn check_hot_plug(&self, machine: &MachineSpec, dir: &SharedDir) -> Result<(), BackendError> {
        let verb = |why: &str| {
            format!(
                "adding or removing shared folder {} on running VM `{}` ({why})",
                dir.guest.display(),
                machine.name
            )
        };
        let o = options::parse(machine.machine, &machine.options)?;
        if o.machine != Machine::Pc || machine.machine != crate::MachineKind::Default {
            return Err(BackendError::unsupported(
                "qemu",
                verb("its machine takes no hot-plugged device: only pc does"),
                format!(
                    "`nubo vm rm {0}` and `nubo vm create {0} --mount ...` with the folders wanted",
                    machine.name
                ),
            ));
        }
        if dir.transport != crate::MountTransport::Virtiofs {
            return Err(BackendError::unsupported(
                "qemu",
                verb("a 9p folder cannot be plugged into or out of a running QEMU"),
                format!(
                    "virtio-fs (install virtiofsd: scripts/install-deps.sh), or `nubo vm rm {0}` and `nubo vm create {0} --mount ...` with the folders wanted",
                    machine.name
                ),
            ));
        }
        Ok(())
    }

    /// Hot-plug over QMP: the folder's virtiofsd, then a vhost-user chardev and a
    /// `vhost-user-fs-pci` device on the pc machine's root bus (ACPI PCI hot-plug), on memory
    /// shared from boot (`mem0`, there when the VM booted with a virtio-fs folder). A device
    /// of this slot left by an interrupted earlier attempt is unplugged first; a failure on
    /// the way undoes what was done.
    fn mount_running(&self, vm: &VmRef, machine: &MachineSpec, dir: &SharedDir) -> Result<(), BackendError> {
        self.check_hot_plug(machine, dir)?;
        let st = QemuState::of(vm)?;
        let memdevs = self.qmp_execute(vm, &st, "query-memdev", None)?;
        let shared = memdevs
            .as_array()
            .is_some_and(|a| a.iter().any(|m| m["id"] == "mem0" && m["share"] == true));
        if !shared {
            return Err(crate::memory_not_shared("qemu", vm.name, dir));
        }
        let index = dir.slot(machine.mounts.len());
        self.unplug(vm, &st, index, dir)?;
        mounts::start_hot(vm.name, &st.run_dir, index, dir, &self.host)?;
        let [(chardev, chardev_args), (device, device_args)] = mounts::plug_commands(&st.run_dir, index, dir);
        let plugged = self.qmp_execute(vm, &st, chardev, Some(chardev_args)).and_then(|_| {
            self.qmp_execute(vm, &st, device, Some(device_args)).inspect_err(|_| {
                let _ = self.qmp_execute(
                    vm,
                    &st,
                    "chardev-remove",
                    Some(serde_json::json!({"id": mounts::chardev_id(index)})),
                );
            })
        });
        if let Err(e) = plugged {
            let _ = mounts::stop_indices(vm.name, &st.run_dir, [index]);
            return Err(e);
        }
        Ok(())
    }

    fn unmount_running(&self, vm: &VmRef, machine: &MachineSpec, dir: &SharedDir) -> Result<(), BackendError> {
        self.check_hot_plug(machine, dir)?;
        let st = QemuState::of(vm)?;
        let index = crate::spec::slots(&machine.mounts)
            .find(|(_, m)| *m == dir)
            .map_or_else(|| dir.slot(machine.mounts.len()), |(i, _)| i);
        self.unplug(vm, &st, index, dir)
    }

    fn prepare(&self, spec: &MachineSpec) -> Result<serde_json::Value, BackendError> {
        let mut st = QemuState::layout(spec);
        if let Boot::Firmware {
            firmware: Firmware::Efi | Firmware::EfiCode(_),
        } = &spec.boot
        {
            let o = probe::find_ovmf().ok_or_else(render::ovmf_missing)?;
            let vars = spec.vm_dir.join("efivars.fd");
            fs::copy(&o.vars, &vars).map_err(BackendError::io(format!(
                "copying the UEFI variable store {} to {}",
                o.vars.display(),
                vars.display()
            )))?;
            st.efi_vars = Some(vars);
        }
        Ok(st.to_value())
    }

    fn boot(&self, spec: &MachineSpec, state: &mut serde_json::Value) -> Result<BootInfo, BackendError> {
        self.boot_with(spec, state, false)
    }

    fn state(&self, vm: &VmRef) -> Result<VmState, BackendError> {
        let st = QemuState::of(vm)?;
        if live_pid(&st.pid_file, vm.uuid).is_none() {
            return Ok(VmState::Stopped);
        }
        // A live process whose QMP does not answer is still a running VMM (busy, or wedged);
        // `stop --force` deals with it. `prelaunch` is a VM started with -S whose restore was
        // interrupted, `restore-vm` one being restored: neither runs guest code.
        let status = self.qmp(vm.name, &st).and_then(|mut q| {
            q.status().map_err(|e| BackendError::Remote {
                what: vm.name.to_owned(),
                detail: e.to_string(),
            })
        });
        Ok(match status.as_deref() {
            Ok("paused") | Ok("suspended") | Ok("prelaunch") | Ok("restore-vm") => VmState::Paused,
            _ => VmState::Running,
        })
    }

    fn alive(&self, vm: &VmRef) -> bool {
        QemuState::of(vm).is_ok_and(|st| live_pid(&st.pid_file, vm.uuid).is_some())
    }

    fn stop(&self, vm: &VmRef, mode: StopMode) -> Result<(), BackendError> {
        let st = QemuState::of(vm)?;
        if let StopMode::Graceful(timeout) = mode {
            if live_pid(&st.pid_file, vm.uuid).is_some()
                && self.command(vm, "system_powerdown").is_ok()
                && wait_gone(&st, vm.uuid, timeout)
            {
                mounts::stop_found(vm.name, &st.run_dir)?;
                return remove_runtime_files(&st);
            }
        }
        kill_now(vm.name, &st, vm.uuid)?;
        mounts::stop_found(vm.name, &st.run_dir)?;
        remove_runtime_files(&st)
    }

    fn destroy(&self, vm: &VmRef) -> Result<(), BackendError> {
        // A record whose state is unreadable still has a VMM to find: by its -uuid.
        let st = QemuState::of(vm).unwrap_or_else(|_| QemuState {
            run_dir: PathBuf::new(),
            qmp_socket: PathBuf::new(),
            serial_socket: PathBuf::new(),
            pid_file: PathBuf::new(),
            console_log: PathBuf::new(),
            efi_vars: None,
            ssh_port: None,
        });
        kill_now(vm.name, &st, vm.uuid)?;
        if st.run_dir.as_os_str().is_empty() {
            return Ok(());
        }
        mounts::stop_found(vm.name, &st.run_dir)?;
        match fs::remove_dir_all(&st.run_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(BackendError::Io {
                what: format!("removing {}", st.run_dir.display()),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    fn reach(&self, vm: &VmRef) -> Result<Reach, BackendError> {
        let st = QemuState::of(vm)?;
        Ok(Reach {
            ssh: st.ssh_port.map(|p| SocketAddr::from((Ipv4Addr::LOCALHOST, p))),
            guest_addresses: if st.ssh_port.is_some() {
                vec![USER_NET_GUEST_ADDR.to_owned()]
            } else {
                Vec::new()
            },
            network: "QEMU user-mode networking: the guest is reached through forwards on 127.0.0.1".into(),
            predicted: false,
        })
    }

    fn console(&self, vm: &VmRef) -> ConsoleLog {
        let current = QemuState::of(vm)
            .map(|s| s.console_log)
            .unwrap_or_else(|_| vm.vm_dir.join("console.log"));
        ConsoleLog {
            previous: Some(previous_log(&current)),
            current,
        }
    }

    fn attach_console(&self, vm: &VmRef) -> Result<Box<dyn ConsoleStream>, BackendError> {
        let st = QemuState::of(vm)?;
        let s = UnixStream::connect(&st.serial_socket).map_err(BackendError::io(format!(
            "connecting to the serial console {}",
            st.serial_socket.display()
        )))?;
        Ok(Box::new(SocketConsole(s)))
    }

    fn pause(&self, vm: &VmRef) -> Result<(), BackendError> {
        self.command(vm, "stop")
    }

    fn snapshot_create(&self, vm: &VmRef, spec: &MachineSpec, name: &str) -> Result<SnapshotTaken, BackendError> {
        let st = QemuState::of(vm)?;
        let frozen = if live_pid(&st.pid_file, vm.uuid).is_some() {
            let (done, _) = self.snapshot_job(vm.name, &st, snapshot::JobKind::Save, name)?;
            // No STOP/RESUME pair: the guest was paused already; the job's length bounds it.
            Some(done.frozen.unwrap_or(done.elapsed))
        } else {
            self.snapshot_img(spec, snapshot::ImgAction::Create, name)?;
            None
        };
        let snapshot = snapshot::table(vm.name, &spec.disk.overlay)?
            .into_iter()
            .rev()
            .find(|s| s.name == name)
            .ok_or_else(|| BackendError::Remote {
                what: format!("snapshot `{name}` of VM `{}`", vm.name),
                detail: "QEMU reported success but the overlay's snapshot table does not hold it".into(),
            })?;
        Ok(SnapshotTaken { snapshot, frozen })
    }

    /// Its snapshots live in the qcow2 overlay's table.
    fn snapshot_delete_by_hand(&self, _vm: &VmRef, spec: &MachineSpec, name: &str) -> Option<crate::ByHand> {
        Some(crate::ByHand::qcow2_snapshot_delete(spec, name))
    }

    fn snapshot_list(&self, _vm: &VmRef, spec: &MachineSpec) -> Result<Vec<BackendSnapshot>, BackendError> {
        snapshot::table(&spec.name, &spec.disk.overlay)
    }

    fn snapshot_delete(&self, vm: &VmRef, spec: &MachineSpec, name: &str) -> Result<(), BackendError> {
        let st = QemuState::of(vm)?;
        let live = live_pid(&st.pid_file, vm.uuid).is_some();
        if live {
            // A save a killed nubo started may still be running: the table is only truthful
            // once it concluded (settled again, harmlessly, by the delete job itself).
            let mut q = self.qmp_with(vm.name, &st, snapshot::JOB_TIMEOUT)?;
            snapshot::settle_stale_jobs(&mut q, snapshot::JOB_TIMEOUT, snapshot::JOB_POLL).map_err(|e| {
                BackendError::Remote {
                    what: format!("snapshot `{name}` of VM `{}`", vm.name),
                    detail: e.to_string(),
                }
            })?;
        }
        if !snapshot::table(vm.name, &spec.disk.overlay)?
            .iter()
            .any(|s| s.name == name)
        {
            return Ok(());
        }
        if live {
            self.snapshot_job(vm.name, &st, snapshot::JobKind::Delete, name)
                .map(|_| ())
        } else {
            self.snapshot_img(spec, snapshot::ImgAction::Delete, name)
        }
    }

    fn snapshot_restore(
        &self,
        spec: &MachineSpec,
        state: &mut serde_json::Value,
        name: &str,
    ) -> Result<Restored, BackendError> {
        let st = QemuState::from_value(&spec.name, state)?;
        let snap = snapshot::table(&spec.name, &spec.disk.overlay)?
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| {
                BackendError::InvalidSpec(format!(
                    "snapshot `{name}` is not in the overlay of VM `{}`: `nubo vm snapshot ls {}` lists what it holds",
                    spec.name, spec.name
                ))
            })?;
        if live_pid(&st.pid_file, &spec.uuid).is_some() {
            if !snap.has_memory {
                return Err(BackendError::InvalidSpec(format!(
                    "snapshot `{name}` of VM `{0}` holds no memory (it was taken while the VM was stopped), so it cannot replace a running guest: stop the VM (`nubo vm stop {0}`) and restore it again to revert the disk",
                    spec.name
                )));
            }
            let before = self.qmp(&spec.name, &st)?.status().map_err(|e| BackendError::Remote {
                what: format!("VM `{}`", spec.name),
                detail: e.to_string(),
            })?;
            let (_, mut q) = self.snapshot_job(&spec.name, &st, snapshot::JobKind::Load, name)?;
            // QEMU restarts a guest that was running; one a killed restore left in prelaunch
            // was meant to run too. A guest the user paused stays paused.
            let run = matches!(before.as_str(), "running" | "prelaunch");
            let remote = |e: qmp::QmpError| BackendError::Remote {
                what: format!("resuming VM `{}` after restoring snapshot `{name}`", spec.name),
                detail: e.to_string(),
            };
            if run && q.status().map_err(remote)? != "running" {
                q.execute("cont", None).map_err(remote)?;
            }
            return Ok(Restored::Running);
        }
        if !snap.has_memory {
            self.snapshot_img(spec, snapshot::ImgAction::Apply, name)?;
            return Ok(Restored::DiskOnly);
        }
        let info = self.boot_with(spec, state, true)?;
        let st = QemuState::from_value(&spec.name, state)?;
        if let Err(e) = self.load_into_fresh(spec, &st, name) {
            // Nothing ran: leave the VM stopped, as it was.
            let _ = kill_now(&spec.name, &st, &spec.uuid);
            let _ = remove_runtime_files(&st);
            return Err(e);
        }
        Ok(Restored::Started(info))
    }

    fn resume(&self, vm: &VmRef) -> Result<(), BackendError> {
        self.command(vm, "cont")
    }

    /// `blockdev-snapshot-sync` over the active node: `disk0` (the OS disk's, from
    /// [`render`]) at first, then `step-N` for the N-th frozen layer.
    fn freeze_disk_layer(&self, vm: &VmRef, frozen: usize, new_top: &Path) -> Result<(), BackendError> {
        let st = QemuState::of(vm)?;
        // Writing the new top's header and reopening the chain waits for in-flight I/O.
        let mut q = self.qmp_with(vm.name, &st, FREEZE_TIMEOUT)?;
        let node = if frozen == 0 {
            "disk0".to_owned()
        } else {
            format!("step-{frozen}")
        };
        q.execute(
            "blockdev-snapshot-sync",
            Some(serde_json::json!({
                "node-name": node,
                "snapshot-file": new_top.display().to_string(),
                "snapshot-node-name": format!("step-{}", frozen + 1),
                "format": "qcow2",
            })),
        )
        .map(|_| ())
        .map_err(|e| BackendError::Remote {
            what: format!("freezing the disk layer of VM `{}` into {}", vm.name, new_top.display()),
            detail: e.to_string(),
        })
    }
}

impl QemuBackend {
    /// One QMP command on a fresh connection; its error names the VM.
    fn qmp_execute(
        &self,
        vm: &VmRef,
        st: &QemuState,
        command: &str,
        arguments: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, BackendError> {
        self.qmp(vm.name, st)?
            .execute(command, arguments)
            .map_err(|e| BackendError::Remote {
                what: format!("VM `{}`", vm.name),
                detail: e.to_string(),
            })
    }

    /// Unplugs the shared folder in slot `index` from running VM `vm`: `device_del`, which the
    /// guest acknowledges (ACPI eject) once nothing uses the device, then the chardev and the
    /// virtiofsd. What is already gone is skipped, so it converges after an interruption.
    fn unplug(&self, vm: &VmRef, st: &QemuState, index: usize, dir: &SharedDir) -> Result<(), BackendError> {
        let id = mounts::device_id(index);
        let present = || -> Result<bool, BackendError> {
            let devs = self.qmp_execute(
                vm,
                st,
                "qom-list",
                Some(serde_json::json!({"path": "/machine/peripheral"})),
            )?;
            Ok(devs
                .as_array()
                .is_some_and(|a| a.iter().any(|d| d["name"] == id.as_str())))
        };
        if present()? {
            self.qmp_execute(vm, st, "device_del", Some(serde_json::json!({"id": id})))?;
            crate::wait_unplugged(format!("VM `{}`", vm.name), dir, present)?;
        }
        let removed = self.qmp(vm.name, st)?.execute(
            "chardev-remove",
            Some(serde_json::json!({"id": mounts::chardev_id(index)})),
        );
        match removed {
            Ok(_) => {}
            // Gone already: an earlier unplug got this far.
            Err(qmp::QmpError::Command { desc, .. }) if desc.contains("not found") => {}
            Err(e) => {
                return Err(BackendError::Remote {
                    what: format!("VM `{}`", vm.name),
                    detail: e.to_string(),
                })
            }
        }
        mounts::stop_indices(vm.name, &st.run_dir, [index])
    }
}

/// A console on a Unix socket (QEMU's serial chardev).
pub struct SocketConsole(pub UnixStream);

impl std::io::Read for SocketConsole {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl std::io::Write for SocketConsole {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

impl ConsoleStream for SocketConsole {
    fn try_clone_reader(&self) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        Ok(Box::new(self.0.try_clone()?))
    }
    fn shutdown(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// What QEMU needs from the host, for `nubo doctor`: the binary, KVM and the accelerator
/// `auto` picks, SeaBIOS (BIOS boots only) and OVMF (UEFI boots only).
fn host_checks(b: &QemuBackend) -> Vec<HostCheck> {
    let mut out = Vec::new();
    out.push(match b.probe() {
        Probe::Available { version } => HostCheck {
            name: "backend qemu".into(),
            status: CheckStatus::Ok,
            detail: format!("{} {version}", b.binary),
            fix: None,
            blocks: None,
        },
        Probe::Missing { what, package } => HostCheck {
            name: "backend qemu".into(),
            status: CheckStatus::Broken,
            detail: format!("{what} is not installed"),
            fix: Some(format!("install {package}")),
            blocks: None,
        },
        Probe::Broken { error } => HostCheck {
            name: "backend qemu".into(),
            status: CheckStatus::Broken,
            detail: error,
            fix: Some("reinstall qemu-system-x86".into()),
            blocks: None,
        },
    });
    let kvm = b.kvm();
    let (_, reason) = probe::resolve_accel(Accel::Auto, &kvm).expect("auto always resolves");
    out.push(HostCheck {
        name: "qemu accelerator".into(),
        status: if kvm == KvmStatus::Usable {
            CheckStatus::Ok
        } else {
            CheckStatus::Warn
        },
        detail: format!("--accel auto picks {reason}"),
        fix: kvm.fix(),
        blocks: None,
    });
    let seabios = Path::new(probe::SEABIOS).is_file();
    out.push(HostCheck {
        name: "seabios".into(),
        status: if seabios { CheckStatus::Ok } else { CheckStatus::Broken },
        detail: if seabios {
            probe::SEABIOS.into()
        } else {
            format!("{} is missing", probe::SEABIOS)
        },
        fix: (!seabios).then(|| "install seabios".into()),
        blocks: (!seabios).then(|| "qemu BIOS boots (--firmware bios, images without a recorded kernel)".into()),
    });
    let ovmf = probe::find_ovmf();
    out.push(HostCheck {
        name: "ovmf".into(),
        status: if ovmf.is_some() {
            CheckStatus::Ok
        } else {
            CheckStatus::Broken
        },
        detail: ovmf.map_or_else(|| "no OVMF firmware found".into(), |o| o.code.display().to_string()),
        fix: probe::find_ovmf().is_none().then(|| "install ovmf".into()),
        blocks: probe::find_ovmf()
            .is_none()
            .then(|| "qemu UEFI boots (--firmware efi)".into()),
    });
    out.push(mounts::host_check(&b.host));
    out
}

/// The accelerator `auto` resolves to on this host, with the reason (for `nubo doctor`).
pub fn auto_accel(backend: &QemuBackend) -> (Accel, String) {
    probe::resolve_accel(Accel::Auto, &backend.kvm()).expect("auto always resolves")
}
