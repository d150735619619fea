//! Shared folders on the qemu backend: virtio-fs through one `virtiofsd` per folder, 9p as the
//! fallback where virtiofsd is not installed. The cloud-hypervisor backend starts, finds and
//! stops its virtiofsds through the same functions (it has virtio-fs only, no 9p).
//!
//! - virtio-fs: nubo starts `virtiofsd --socket-path RUN/fsN.sock --shared-dir HOST [--readonly]`
//!   before QEMU, detached in its own process group (nubo has no daemon, and QEMU is
//!   daemonized too). QEMU connects to the socket as a vhost-user client; virtiofsd exits by
//!   itself when QEMU disconnects (the VM stops or dies). nubo writes each virtiofsd's pid to
//!   `RUN/fsN.pid` and kills any left (recognised by `--socket-path <its socket>` on its command
//!   line, as QEMU is by `-uuid`) on stop, destroy and a failed boot. vhost-user needs the guest's
//!   RAM shared with virtiofsd: `memory-backend-memfd,share=on` as the machine's memory.
//! - 9p: QEMU serves the folder itself (`-fsdev local,security_model=none`), `readonly=on` for
//!   read-only ones. Debian's cloud kernel has no 9p, so this is only a fallback.
//!
//! Read-only is enforced on the host side in both cases: a guest that remounts read-write still
//! cannot write.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::state::check_socket_path;
use crate::process::{self, Vmm};
use crate::spec::{MachineSpec, MountTransport, SharedDir};
use crate::{BackendError, HostEnv};

pub const VIRTIOFSD: &str = "virtiofsd";
/// Where distributions put virtiofsd outside PATH (Debian's and Fedora's packages).
const VIRTIOFSD_DIRS: &[&str] = &["/usr/libexec", "/usr/lib/qemu"];
/// How long virtiofsd may take to create its socket: it only parses options and binds.
const SOCKET_WAIT: Duration = Duration::from_secs(10);

/// virtiofsd, from PATH or where distributions install it.
pub fn find_virtiofsd(host: &HostEnv) -> Option<PathBuf> {
    host.which(VIRTIOFSD).or_else(|| {
        VIRTIOFSD_DIRS
            .iter()
            .map(|d| Path::new(d).join(VIRTIOFSD))
            .find(|p| p.is_file())
    })
}

/// The vhost-user socket of the `index`th shared folder.
pub fn socket(run_dir: &Path, index: usize) -> PathBuf {
    run_dir.join(format!("fs{index}.sock"))
}

/// The QEMU device id of the folder in slot `index`.
pub fn device_id(index: usize) -> String {
    format!("fsdev{index}")
}

/// The QEMU id of the folder's chardev (virtio-fs) or fsdev (9p) in slot `index`.
pub fn chardev_id(index: usize) -> String {
    format!("fs{index}")
}

/// Hot-plug of folder `m` into a running QEMU, slot `index`: its virtiofsd is started, then the
/// QMP commands in [`plug_commands`] connect QEMU to it. Only virtio-fs plugs: 9p's `-fsdev`
/// has no QMP equivalent.
pub fn start_hot(name: &str, run_dir: &Path, index: usize, m: &SharedDir, host: &HostEnv) -> Result<(), BackendError> {
    let binary = find_virtiofsd(host).ok_or_else(|| virtiofsd_missing("qemu"))?;
    check_socket_path(&socket(run_dir, index))?;
    stop_indices(name, run_dir, [index])?;
    start_one(name, run_dir, index, m, &binary)
}

/// The QMP commands (pure) that add the folder in slot `index` to a running pc machine: the
/// vhost-user chardev on its virtiofsd's socket, then the PCI device (ACPI hot-plug).
pub fn plug_commands(run_dir: &Path, index: usize, m: &SharedDir) -> [(&'static str, serde_json::Value); 2] {
    [
        (
            "chardev-add",
            serde_json::json!({
                "id": chardev_id(index),
                "backend": {"type": "socket", "data": {
                    "addr": {"type": "unix", "data": {"path": socket(run_dir, index)}},
                    "server": false,
                }},
            }),
        ),
        (
            "device_add",
            serde_json::json!({
                "driver": "vhost-user-fs-pci",
                "id": device_id(index),
                "chardev": chardev_id(index),
                "tag": m.tag,
            }),
        ),
    ]
}

fn pid_file(run_dir: &Path, index: usize) -> PathBuf {
    run_dir.join(format!("fs{index}.pid"))
}

fn log_file(run_dir: &Path, index: usize) -> PathBuf {
    run_dir.join(format!("fs{index}.log"))
}

/// A value inside QEMU's `key=value,...` option syntax: a comma is doubled so a path holding
/// one cannot add options of its own.
fn opt(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// QEMU's arguments for the VM's shared folders (pure): the shared memory backend when any is
/// virtio-fs, then one device per folder. `-m` stays as rendered; `size` matches it.
pub fn argv(spec: &MachineSpec, run_dir: &Path, micro: bool) -> Vec<String> {
    let mut a = Vec::new();
    if spec.mounts.is_empty() {
        return a;
    }
    if spec.mounts.iter().any(|m| m.transport == MountTransport::Virtiofs) {
        a.push("-object".into());
        a.push(format!(
            "memory-backend-memfd,id=mem0,size={}M,share=on",
            spec.memory_mib
        ));
        a.push("-machine".into());
        a.push("memory-backend=mem0".into());
    }
    for (i, m) in crate::spec::slots(&spec.mounts) {
        let id = chardev_id(i);
        match m.transport {
            MountTransport::Virtiofs => {
                a.push("-chardev".into());
                a.push(format!("socket,id={id},path={}", opt(&socket(run_dir, i))));
                a.push("-device".into());
                let dev = if micro {
                    "vhost-user-fs-device"
                } else {
                    "vhost-user-fs-pci"
                };
                a.push(format!("{dev},id={},chardev={id},tag={}", device_id(i), m.tag));
            }
            MountTransport::NineP => {
                a.push("-fsdev".into());
                let ro = if m.read_only { ",readonly=on" } else { "" };
                a.push(format!("local,id={id},path={},security_model=none{ro}", opt(&m.host)));
                a.push("-device".into());
                let dev = if micro { "virtio-9p-device" } else { "virtio-9p-pci" };
                a.push(format!("{dev},fsdev={id},mount_tag={}", m.tag));
            }
        }
    }
    a
}

/// virtiofsd's argv for one folder (pure). Separate arguments, so no path is parsed as an
/// option. Run as root it sandboxes itself in namespaces; otherwise it cannot, and serves as
/// the calling user (`--sandbox none`).
pub fn virtiofsd_argv(binary: &Path, m: &SharedDir, socket: &Path, root: bool) -> Vec<String> {
    let mut a = vec![
        binary.display().to_string(),
        "--socket-path".into(),
        socket.display().to_string(),
        "--shared-dir".into(),
        m.host.display().to_string(),
        "--cache".into(),
        "auto".into(),
        "--sandbox".into(),
        if root { "namespace" } else { "none" }.into(),
        "--log-level".into(),
        "warn".into(),
    ];
    if m.read_only {
        a.push("--readonly".into());
    }
    a
}

/// Before anything exists: socket paths fit, and virtiofsd is there when a folder needs it.
/// `backend` names who asks, in the error.
pub fn check(spec: &MachineSpec, host: &HostEnv, backend: &'static str) -> Result<(), BackendError> {
    for (i, m) in crate::spec::slots(&spec.mounts) {
        if m.transport == MountTransport::Virtiofs {
            check_socket_path(&socket(&spec.run_dir, i))?;
            if find_virtiofsd(host).is_none() {
                return Err(virtiofsd_missing(backend));
            }
        }
    }
    Ok(())
}

pub fn virtiofsd_missing(backend: &'static str) -> BackendError {
    BackendError::Unavailable {
        backend,
        why: "shared folders over virtio-fs need virtiofsd, which is not installed: install it (scripts/install-deps.sh), or recreate the VM without --mount".into(),
    }
}

/// The transport for new shared folders: virtio-fs where virtiofsd is installed, else 9p.
pub fn transport(host: &HostEnv) -> (MountTransport, Option<String>) {
    match find_virtiofsd(host) {
        Some(_) => (MountTransport::Virtiofs, None),
        None => (
            MountTransport::NineP,
            Some("virtiofsd is not installed: shared folders use 9p, which Debian's cloud kernel (linux-image-cloud-amd64) lacks; install virtiofsd (scripts/install-deps.sh) for virtio-fs".into()),
        ),
    }
}

/// The VM's running virtiofsds until QEMU has them: dropped without [`Started::keep`] (QEMU
/// failed to start), it kills them.
pub struct Started<'a> {
    spec: &'a MachineSpec,
    run_dir: &'a Path,
    keep: bool,
}

impl Started<'_> {
    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for Started<'_> {
    fn drop(&mut self) {
        if !self.keep {
            let _ = stop(self.spec, self.run_dir);
        }
    }
}

/// `nubo doctor`'s line: virtiofsd for shared folders.
pub fn host_check(host: &HostEnv) -> crate::HostCheck {
    let found = find_virtiofsd(host);
    crate::HostCheck {
        name: "virtiofsd".into(),
        status: if found.is_some() {
            crate::CheckStatus::Ok
        } else {
            crate::CheckStatus::Warn
        },
        detail: found.as_ref().map_or_else(
            || "not installed: --mount falls back to 9p, which Debian's cloud kernel lacks".into(),
            |p| p.display().to_string(),
        ),
        fix: found
            .is_none()
            .then(|| "run scripts/install-deps.sh (virtiofsd from crates.io; Debian 12 has no package)".into()),
        blocks: found
            .is_none()
            .then(|| "shared folders over virtio-fs (vm create --mount)".into()),
    }
}

/// Starts one virtiofsd per virtio-fs folder (after killing any a previous boot left) and waits
/// for each socket. On any failure the ones already started are killed. `backend` names who
/// asks, in errors.
pub fn start<'a>(
    spec: &'a MachineSpec,
    run_dir: &'a Path,
    host: &HostEnv,
    backend: &'static str,
) -> Result<Started<'a>, BackendError> {
    stop(spec, run_dir)?;
    let started = Started {
        spec,
        run_dir,
        keep: false,
    };
    start_all(spec, run_dir, host, backend)?;
    Ok(started)
}

fn start_all(spec: &MachineSpec, run_dir: &Path, host: &HostEnv, backend: &'static str) -> Result<(), BackendError> {
    let wanted: Vec<(usize, &SharedDir)> = crate::spec::slots(&spec.mounts)
        .filter(|(_, m)| m.transport == MountTransport::Virtiofs)
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let binary = find_virtiofsd(host).ok_or_else(|| virtiofsd_missing(backend))?;
    for (i, m) in wanted {
        start_one(&spec.name, run_dir, i, m, &binary)?;
    }
    Ok(())
}

/// Starts the virtiofsd of folder `m` in slot `i` and waits for its socket. On failure it is
/// not left running.
fn start_one(name: &str, run_dir: &Path, i: usize, m: &SharedDir, binary: &Path) -> Result<(), BackendError> {
    let root = nix::unistd::geteuid().is_root();
    let sock = socket(run_dir, i);
    let _ = fs::remove_file(&sock);
    if !m.host.is_dir() {
        return Err(BackendError::InvalidSpec(format!(
            "shared folder {} of VM `{name}` is no longer a directory: recreate it, or remove the VM and create it without that --mount",
            m.host.display(),
        )));
    }
    let log = log_file(run_dir, i);
    let log_out = fs::File::create(&log).map_err(BackendError::io(format!("creating {}", log.display())))?;
    let argv = virtiofsd_argv(binary, m, &sock, root);
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log_out)
        // Its own process group: a Ctrl-C to `nubo vm create --wait` does not end the VM's
        // file server.
        .process_group(0)
        .spawn()
        .map_err(BackendError::io(format!("starting {}", binary.display())))?;
    let pid = child.id();
    let pf = pid_file(run_dir, i);
    if let Err(e) = fs::write(&pf, format!("{pid}\n")) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(BackendError::io(format!("writing {}", pf.display()))(e));
    }
    let t0 = Instant::now();
    while !sock.exists() {
        // Its own exit status, not /proc: right after the spawn its command line can still
        // read empty (mid-exec, see crate::process).
        let dead = child.try_wait().ok().flatten().is_some();
        if dead || t0.elapsed() > SOCKET_WAIT {
            if !dead {
                let _ = child.kill();
                let _ = child.wait();
            }
            let said = fs::read_to_string(&log).unwrap_or_default();
            return Err(BackendError::Remote {
                what: format!("virtiofsd for shared folder {} of VM `{name}`", m.host.display()),
                detail: if dead {
                    format!("exited at start: {}", nubo_core::file::escape_control(said.trim()))
                } else {
                    format!(
                        "made no socket in {} s; its log is {}",
                        SOCKET_WAIT.as_secs(),
                        log.display()
                    )
                },
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    // Not reaped here: nubo exits long before the VM stops, and init reaps it then.
    drop(child);
    Ok(())
}

/// Kills every virtiofsd of the VM's folders still running (normally each has exited with
/// QEMU) and removes their sockets and pid files. Succeeds when none is left.
pub fn stop(spec: &MachineSpec, run_dir: &Path) -> Result<(), BackendError> {
    stop_indices(&spec.name, run_dir, crate::spec::slots(&spec.mounts).map(|(i, _)| i))
}

/// As [`stop`] for a VM whose machine is not at hand (destroy of an unreadable record): every
/// `fsN.pid` in its run directory.
pub fn stop_found(name: &str, run_dir: &Path) -> Result<(), BackendError> {
    let Ok(entries) = fs::read_dir(run_dir) else {
        return Ok(());
    };
    let indices: Vec<usize> = entries
        .flatten()
        .filter_map(|e| {
            let n = e.file_name();
            n.to_str()?.strip_prefix("fs")?.strip_suffix(".pid")?.parse().ok()
        })
        .collect();
    stop_indices(name, run_dir, indices)
}

pub fn stop_indices(name: &str, run_dir: &Path, indices: impl IntoIterator<Item = usize>) -> Result<(), BackendError> {
    for i in indices {
        let sock = socket(run_dir, i).display().to_string();
        let pf = pid_file(run_dir, i);
        let vmm = Vmm {
            label: "virtiofsd",
            vm: name,
            pid_file: &pf,
            ours: Box::new(|pid| process::cmdline_has_pair(pid, "--socket-path", &sock)),
        };
        vmm.kill_now()?;
        // virtiofsd's own lock file is `<socket>.pid`.
        process::remove_files([PathBuf::from(&sock), PathBuf::from(format!("{sock}.pid")), pf.clone()])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::{Boot, Disk, Firmware, MachineKind, NetworkMode};

    fn dir(i: usize, host: &str, ro: bool, t: MountTransport) -> SharedDir {
        SharedDir {
            tag: crate::spec::mount_tag(i),
            host: host.into(),
            guest: "/mnt/x".into(),
            read_only: ro,
            transport: t,
        }
    }

    fn spec(mounts: Vec<SharedDir>) -> MachineSpec {
        MachineSpec {
            name: "web".into(),
            uuid: "u".into(),
            vm_dir: "/v/web".into(),
            run_dir: "/run/nubo/vms/web".into(),
            vcpus: 1,
            memory_mib: 1024,
            disk: Disk {
                overlay: "/v/web/disk.qcow2".into(),
                base: "/b".into(),
                base_format: "qcow2".into(),
                ..Default::default()
            },
            seed: None,
            boot: Boot::Firmware {
                firmware: Firmware::Bios,
            },
            machine: MachineKind::Default,
            network: NetworkMode::None,
            options: Default::default(),
            ports: Vec::new(),
            mounts,
        }
    }

    #[test]
    fn slot_is_the_tag_number_else_the_position() {
        let mut d = dir(3, "/srv/a", false, MountTransport::Virtiofs);
        assert_eq!(d.slot(0), 3);
        d.tag = "other".into();
        assert_eq!(d.slot(5), 5);
    }

    #[test]
    fn free_mount_tag_fills_the_lowest_gap() {
        let v = MountTransport::Virtiofs;
        assert_eq!(crate::spec::free_mount_tag(&[]), "mount0");
        assert_eq!(
            crate::spec::free_mount_tag(&[dir(1, "/a", false, v), dir(2, "/b", false, v)]),
            "mount0"
        );
        assert_eq!(
            crate::spec::free_mount_tag(&[dir(0, "/a", false, v), dir(2, "/b", false, v)]),
            "mount1"
        );
        assert_eq!(
            crate::spec::free_mount_tag(&[dir(0, "/a", false, v), dir(1, "/b", false, v)]),
            "mount2"
        );
    }

    #[test]
    fn argv_after_an_unmount_keeps_each_folders_slot() {
        // mount0 was taken away: mount1 keeps its socket, chardev and device id.
        let s = spec(vec![dir(1, "/srv/b", false, MountTransport::Virtiofs)]);

        let a = argv(&s, Path::new("/r"), false).join(" ");

        assert!(
            a.ends_with(
                "-chardev socket,id=fs1,path=/r/fs1.sock -device vhost-user-fs-pci,id=fsdev1,chardev=fs1,tag=mount1"
            ),
            "{a}"
        );
    }

    #[test]
    fn plug_commands_golden() {
        let d = dir(2, "/srv/b", true, MountTransport::Virtiofs);

        let [(c1, a1), (c2, a2)] = plug_commands(Path::new("/r"), 2, &d);

        assert_eq!(c1, "chardev-add");
        assert_eq!(
            a1.to_string(),
            r#"{"backend":{"data":{"addr":{"data":{"path":"/r/fs2.sock"},"type":"unix"},"server":false},"type":"socket"},"id":"fs2"}"#
        );
        assert_eq!(c2, "device_add");
        assert_eq!(
            a2.to_string(),
            r#"{"chardev":"fs2","driver":"vhost-user-fs-pci","id":"fsdev2","tag":"mount2"}"#
        );
    }

    #[test]
    fn hot_plug_only_virtiofs_on_pc() {
        use crate::Backend;
        let b = super::super::QemuBackend::default();
        let v = dir(0, "/srv/a", false, MountTransport::Virtiofs);
        let mut s = spec(vec![]);
        assert!(b.check_hot_plug(&s, &v).is_ok());

        let nine = dir(0, "/srv/a", false, MountTransport::NineP);
        let e = b.check_hot_plug(&s, &nine).unwrap_err().to_string();
        assert!(e.contains("9p") && e.contains("unsupported"), "{e}");

        s.options.insert("machine".into(), "q35".into());
        let e = b.check_hot_plug(&s, &v).unwrap_err().to_string();
        assert!(e.contains("only pc"), "{e}");

        s.options.clear();
        s.machine = MachineKind::Microvm;
        let e = b.check_hot_plug(&s, &v).unwrap_err().to_string();
        assert!(e.contains("only pc"), "{e}");
    }

    #[test]
    fn argv_no_mounts_is_empty() {
        let a = argv(&spec(vec![]), Path::new("/run/nubo/vms/web"), false);

        assert!(a.is_empty());
    }

    #[test]
    fn argv_virtiofs_and_9p_golden() {
        let s = spec(vec![
            dir(0, "/srv/data", false, MountTransport::Virtiofs),
            dir(1, "/srv/a,b=c", true, MountTransport::NineP),
        ]);

        let a = argv(&s, Path::new("/run/nubo/vms/web"), false).join(" ");

        assert_eq!(
            a,
            "-object memory-backend-memfd,id=mem0,size=1024M,share=on -machine memory-backend=mem0 \
             -chardev socket,id=fs0,path=/run/nubo/vms/web/fs0.sock -device vhost-user-fs-pci,id=fsdev0,chardev=fs0,tag=mount0 \
             -fsdev local,id=fs1,path=/srv/a,,b=c,security_model=none,readonly=on -device virtio-9p-pci,fsdev=fs1,mount_tag=mount1"
        );
    }

    #[test]
    fn argv_only_9p_no_shared_memory() {
        let s = spec(vec![dir(0, "/srv/data", false, MountTransport::NineP)]);

        let a = argv(&s, Path::new("/r"), true).join(" ");

        assert_eq!(a, "-fsdev local,id=fs0,path=/srv/data,security_model=none -device virtio-9p-device,fsdev=fs0,mount_tag=mount0");
    }

    #[test]
    fn virtiofsd_argv_readonly_root_golden() {
        let m = dir(0, "/srv/-x,y", true, MountTransport::Virtiofs);

        let a = virtiofsd_argv(Path::new("/usr/libexec/virtiofsd"), &m, Path::new("/r/fs0.sock"), true).join(" ");

        assert_eq!(
            a,
            "/usr/libexec/virtiofsd --socket-path /r/fs0.sock --shared-dir /srv/-x,y --cache auto --sandbox namespace --log-level warn --readonly"
        );
    }

    #[test]
    fn virtiofsd_argv_unprivileged_no_sandbox() {
        let m = dir(0, "/srv/x", false, MountTransport::Virtiofs);

        let a = virtiofsd_argv(Path::new("virtiofsd"), &m, Path::new("/r/fs0.sock"), false);

        assert!(a.windows(2).any(|w| w == ["--sandbox", "none"]), "{a:?}");
        assert!(!a.contains(&"--readonly".to_owned()));
    }
}
