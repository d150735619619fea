//! The daemonless QEMU backend: QEMU started with `-daemonize` and driven over QMP.

pub mod probe;
pub mod qmp;
pub mod render;

use std::fs;
use std::io::BufReader;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use nubo_core::VmState;

use crate::spec::{Accel, MachineSpec, MachineType};
use crate::{Backend, BackendError, BootInfo, Capabilities, Probe, StopMode, VmHandle};

pub const BINARY: &str = "qemu-system-x86_64";
/// How long a QMP exchange may take before the VMM counts as unresponsive.
const QMP_TIMEOUT: Duration = Duration::from_secs(5);

pub struct QemuBackend {
    pub binary: String,
    /// Where to look for `kvm_pvm` and `/dev/kvm` (overridable for tests).
    pub sys_module: PathBuf,
    pub dev_kvm: PathBuf,
}

impl Default for QemuBackend {
    fn default() -> Self {
        QemuBackend {
            binary: BINARY.into(),
            sys_module: "/sys/module".into(),
            dev_kvm: "/dev/kvm".into(),
        }
    }
}

impl QemuBackend {
    pub fn kvm(&self) -> probe::KvmStatus {
        probe::probe_kvm(&self.sys_module, &self.dev_kvm)
    }

    fn qmp(&self, vm: &VmHandle) -> Result<qmp::Qmp<BufReader<UnixStream>, UnixStream>, BackendError> {
        let what = || format!("QMP socket {} of VM `{}`", vm.qmp_socket.display(), vm.name);
        let s = UnixStream::connect(&vm.qmp_socket).map_err(BackendError::io(what()))?;
        s.set_read_timeout(Some(QMP_TIMEOUT))
            .map_err(BackendError::io(what()))?;
        s.set_write_timeout(Some(QMP_TIMEOUT))
            .map_err(BackendError::io(what()))?;
        let r = s.try_clone().map_err(BackendError::io(what()))?;
        qmp::Qmp::handshake(BufReader::new(r), s).map_err(|e| BackendError::Remote {
            what: what(),
            detail: e.to_string(),
        })
    }

    fn command(&self, vm: &VmHandle, cmd: &str) -> Result<(), BackendError> {
        let mut q = self.qmp(vm)?;
        q.execute(cmd, None).map(|_| ()).map_err(|e| BackendError::Remote {
            what: format!("VM `{}`", vm.name),
            detail: e.to_string(),
        })
    }
}

/// The VMM process of `vm`, if it is alive and really this VM's (its command line carries the
/// VM's UUID, so a pid reused by another process after a crash is not mistaken for it).
pub fn live_pid(vm: &VmHandle) -> Option<Pid> {
    let pid: i32 = fs::read_to_string(&vm.pid_file).ok()?.trim().parse().ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let ours = cmdline.split(|b| *b == 0).any(|arg| arg == vm.uuid.as_bytes());
    ours.then(|| Pid::from_raw(pid))
}

/// Every live process that is this VM's QEMU: the one in the pid file, and any other whose
/// command line carries `-uuid <uuid>`. The scan finds a QEMU whose `nubo vm create` was
/// killed before QEMU wrote its pid file; left running, it would hold the pid file's lock.
fn vm_pids(vm: &VmHandle) -> Vec<Pid> {
    let mut pids: Vec<Pid> = live_pid(vm).into_iter().collect();
    let Ok(entries) = fs::read_dir("/proc") else {
        return pids;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let ours = args.windows(2).any(|w| w[0] == b"-uuid" && w[1] == vm.uuid.as_bytes());
        if ours && !pids.contains(&Pid::from_raw(pid)) {
            pids.push(Pid::from_raw(pid));
        }
    }
    pids
}

fn wait_gone(vm: &VmHandle, timeout: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if live_pid(vm).is_none() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    live_pid(vm).is_none()
}

fn kill_now(vm: &VmHandle) -> Result<(), BackendError> {
    let pids = vm_pids(vm);
    for pid in &pids {
        match kill(*pid, Signal::SIGKILL) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => {
                return Err(BackendError::Io {
                    what: format!("killing QEMU (pid {pid}) of VM `{}`", vm.name),
                    source: e.into(),
                })
            }
        }
    }
    let start = Instant::now();
    while !vm_pids(vm).is_empty() {
        if start.elapsed() > Duration::from_secs(10) {
            return Err(BackendError::Remote {
                what: format!("VM `{}`", vm.name),
                detail: format!("QEMU (pids {pids:?}) survived SIGKILL for 10 s"),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn remove_runtime_files(vm: &VmHandle) -> Result<(), BackendError> {
    for p in [&vm.qmp_socket, &vm.serial_socket, &vm.pid_file] {
        match fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(BackendError::Io {
                    what: format!("removing {}", p.display()),
                    source: e,
                })
            }
            _ => {}
        }
    }
    Ok(())
}

/// AF_UNIX `sun_path` holds 107 bytes plus NUL: refuse up front, naming the path.
pub fn check_socket_path(p: &Path) -> Result<(), BackendError> {
    let len = p.as_os_str().len();
    if len > nubo_core::roots::MAX_SOCKET_PATH {
        return Err(BackendError::InvalidSpec(format!(
            "socket path {} is {len} bytes, more than the {} a unix socket allows: set NUBO_RUN_DIR to a shorter directory",
            p.display(),
            nubo_core::roots::MAX_SOCKET_PATH
        )));
    }
    Ok(())
}

impl Backend for QemuBackend {
    fn id(&self) -> &'static str {
        "qemu"
    }

    fn auto_selectable(&self) -> bool {
        true
    }

    fn probe(&self) -> Probe {
        let Some(bin) = probe::which(&self.binary, std::env::var_os("PATH").as_deref()) else {
            return Probe::Missing {
                what: self.binary.clone(),
                package: "qemu-system-x86".into(),
            };
        };
        match Command::new(&bin).arg("--version").stdin(Stdio::null()).output() {
            Ok(o) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                Probe::Available {
                    version: probe::parse_version(&text).unwrap_or_else(|| text.trim().to_owned()),
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
        probe::which(&self.binary, std::env::var_os("PATH").as_deref()).is_some()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            snapshot: false,
            pause: true,
            direct_kernel: true,
            efi: probe::find_ovmf().is_some(),
            machines: vec![MachineType::Pc, MachineType::Q35, MachineType::Microvm],
        }
    }

    fn boot(&self, spec: &MachineSpec) -> Result<BootInfo, BackendError> {
        let h = &spec.handle;
        for p in [&h.qmp_socket, &h.serial_socket] {
            check_socket_path(p)?;
        }
        if live_pid(h).is_some() {
            return Err(BackendError::InvalidSpec(format!("VM `{}` is already running", h.name)));
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&h.run_dir)
            .map_err(BackendError::io(format!("creating {}", h.run_dir.display())))?;
        remove_runtime_files(h)?;
        let (accel, accel_reason) = probe::resolve_accel(spec.accel, &self.kvm())?;
        let tsc_khz = (spec.machine == MachineType::Microvm && accel == Accel::Tcg)
            .then(probe::host_tsc_khz)
            .flatten();
        let argv = render::argv(&self.binary, spec, accel, tsc_khz)?;
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
            let _ = remove_runtime_files(h);
            return Err(BackendError::Remote {
                what: format!("QEMU refused to start VM `{}`", h.name),
                detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            });
        }
        let pid = live_pid(h).ok_or_else(|| BackendError::Remote {
            what: format!("VM `{}`", h.name),
            detail: format!("QEMU exited right after starting; see {}", spec.console_log.display()),
        })?;
        Ok(BootInfo {
            pid: pid.as_raw() as u32,
            argv,
            accel,
            accel_reason,
        })
    }

    fn state(&self, vm: &VmHandle) -> Result<VmState, BackendError> {
        if live_pid(vm).is_none() {
            return Ok(VmState::Stopped);
        }
        // A live process whose QMP does not answer is still a running VMM (busy, or wedged);
        // `stop --force` deals with it.
        let status = self.qmp(vm).and_then(|mut q| {
            q.status().map_err(|e| BackendError::Remote {
                what: vm.name.clone(),
                detail: e.to_string(),
            })
        });
        Ok(match status.as_deref() {
            Ok("paused") | Ok("suspended") => VmState::Paused,
            _ => VmState::Running,
        })
    }

    fn alive(&self, vm: &VmHandle) -> bool {
        live_pid(vm).is_some()
    }

    fn stop(&self, vm: &VmHandle, mode: StopMode) -> Result<(), BackendError> {
        if let StopMode::Graceful(timeout) = mode {
            if live_pid(vm).is_some() && self.command(vm, "system_powerdown").is_ok() && wait_gone(vm, timeout) {
                return remove_runtime_files(vm);
            }
        }
        kill_now(vm)?;
        remove_runtime_files(vm)
    }

    fn destroy(&self, vm: &VmHandle) -> Result<(), BackendError> {
        kill_now(vm)?;
        match fs::remove_dir_all(&vm.run_dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(BackendError::Io {
                what: format!("removing {}", vm.run_dir.display()),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    fn pause(&self, vm: &VmHandle) -> Result<(), BackendError> {
        self.command(vm, "stop")
    }

    fn resume(&self, vm: &VmHandle) -> Result<(), BackendError> {
        self.command(vm, "cont")
    }
}

/// The accelerator `auto` resolves to on this host, with the reason (for `nubo doctor`).
pub fn auto_accel(backend: &QemuBackend) -> (Accel, String) {
    probe::resolve_accel(Accel::Auto, &backend.kvm()).expect("auto always resolves")
}
