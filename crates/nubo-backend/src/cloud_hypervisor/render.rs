//! Everything nubo says to Cloud Hypervisor, as pure functions with golden tests: the VMM's
//! command line, the `vm.create` body (the whole VM as JSON), the snapshot and restore
//! bodies; and how its replies are read: `vm.info`'s state, error replies (JSON arrays of
//! strings) shown as they are.
//!
//! Choices that matter to guests:
//! - The overlay is a qcow2 virtio disk with `backing_files` on: Cloud Hypervisor opens the
//!   base named in the overlay's header, which nubo wrote itself with the base's proven
//!   format (raw or qcow2; `check` refuses others). On only when the chain was proven just
//!   before this boot (`Disk::chain_inspected`, issue 21): the overlay's one backing file is
//!   the recorded base, which names no file of its own. Off, Cloud Hypervisor opens no file
//!   but the overlay. The seed is a second, read-only raw
//!   virtio disk: Cloud Hypervisor has no CD-ROM, and cloud-init finds a NoCloud seed by its
//!   label on any block device.
//! - The serial port goes to a file Cloud Hypervisor writes itself, whether or not anyone is
//!   attached: readiness and `vm logs` read it. The virtio console is a pty for `vm console`.
//! - Shared folders are `fs` devices on virtiofsd's vhost-user sockets (`RUN/fsN.sock`, the
//!   qemu backend's layout and processes), with the guest's memory `shared`; the guest mounts
//!   them by tag through the seed, as on qemu.
//! - The kernel command line ends with `console=ttyS0,115200`: the last `console=` is
//!   /dev/console, where cloud-init prints the line readiness waits for; `console=hvc0`
//!   before it puts kernel messages and a login on the attachable console too.

use std::path::Path;

use nubo_core::VmState;
use serde_json::{json, Value};

use super::state::ChState;
use crate::spec::{Boot, MachineSpec};
use crate::BackendError;

/// The console the serial log (readiness) and the attachable console read, in that order of
/// importance: the last one is /dev/console.
pub const CONSOLES: (&str, &str) = ("console=hvc0", "console=ttyS0,115200");

/// The VMM's command line: the API socket only; the VM comes through `vm.create`.
pub fn vmm_argv(binary: &str, st: &ChState) -> Vec<String> {
    vec![
        binary.to_owned(),
        "--api-socket".to_owned(),
        format!("path={}", st.api_socket.display()),
    ]
}

/// The `vm.create` body. `firmware` is the resolved firmware of a firmware boot.
pub fn vm_config(spec: &MachineSpec, st: &ChState, firmware: Option<&Path>) -> Result<Value, BackendError> {
    let payload = match (&spec.boot, firmware) {
        (
            Boot::Kernel {
                kernel,
                initrd,
                cmdline,
            },
            _,
        ) => {
            let mut p = json!({
                "kernel": kernel,
                "cmdline": format!("{} {} {}", CONSOLES.0, cmdline.trim(), CONSOLES.1),
            });
            if let Some(i) = initrd {
                p["initramfs"] = json!(i);
            }
            p
        }
        (Boot::Firmware { .. }, Some(fw)) => json!({ "firmware": fw }),
        (Boot::Firmware { .. }, None) => {
            return Err(BackendError::InvalidSpec(format!(
                "vm `{}` boots through firmware but none was resolved",
                spec.name
            )))
        }
    };
    let mut disks = vec![json!({
        "id": "disk0",
        "path": spec.disk.overlay,
        "image_type": "Qcow2",
        "backing_files": spec.disk.chain_inspected,
    })];
    if let Some(seed) = &spec.seed {
        disks.push(json!({
            "id": "seed0",
            "path": seed.path,
            "readonly": true,
            "image_type": "Raw",
        }));
    }
    let mut config = json!({
        "cpus": {"boot_vcpus": spec.vcpus, "max_vcpus": spec.vcpus},
        "memory": {"size": spec.memory_mib << 20},
        "payload": payload,
        "disks": disks,
        "rng": {"src": "/dev/urandom"},
        "serial": {"mode": "File", "file": st.console_log},
        "console": {"mode": "Pty"},
        "platform": {"uuid": spec.uuid},
    });
    if let (Some(tap), Some(mac)) = (&st.tap, &st.mac) {
        config["net"] = json!([{"id": "net0", "tap": tap, "mac": mac}]);
    }
    if !spec.mounts.is_empty() {
        // vhost-user: virtiofsd maps the guest's RAM, so it is shared memory.
        config["memory"]["shared"] = json!(true);
        config["fs"] = crate::spec::slots(&spec.mounts)
            .map(|(i, m)| {
                json!({
                    "id": format!("fs{i}"),
                    "tag": m.tag,
                    "socket": crate::qemu::mounts::socket(&st.run_dir, i),
                    "num_queues": 1,
                    "queue_size": 1024,
                })
            })
            .collect();
    }
    Ok(config)
}

fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// `vm.snapshot`: memory, device state and config into `dir` (the VM must be paused).
pub fn snapshot_body(dir: &Path) -> Value {
    json!({ "destination_url": file_url(dir) })
}

/// `vm.restore`: a fresh VMM takes the VM from `dir`, paused until `vm.resume`.
pub fn restore_body(dir: &Path) -> Value {
    json!({ "source_url": file_url(dir), "prefault": false })
}

/// `vm.info`'s `state` as nubo's: `Created` (defined, never booted or shut down) and
/// `Shutdown` are stopped, whatever the VMM process does. Pure.
pub fn parse_state(info: &[u8]) -> Option<VmState> {
    let v: Value = serde_json::from_slice(info).ok()?;
    Some(match v.get("state")?.as_str()? {
        "Running" => VmState::Running,
        "Paused" | "BreakPoint" => VmState::Paused,
        "Created" | "Shutdown" => VmState::Stopped,
        _ => return None,
    })
}

/// The pty `vm.info` names for the virtio console.
pub fn console_pty(info: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(info).ok()?;
    let c = v.get("config")?.get("console")?;
    (c.get("mode")?.as_str()? == "Pty")
        .then(|| c.get("file")?.as_str().map(str::to_owned))
        .flatten()
}

/// An error reply as Cloud Hypervisor wrote it: its JSON array of strings joined with `: `,
/// each string cut before the `Stack backtrace:` the VMM appends (addresses, no words), and
/// control characters escaped. Anything else is shown escaped and bounded. Pure.
pub fn describe_error(status: u16, body: &[u8]) -> String {
    let text = match serde_json::from_slice::<Vec<String>>(body) {
        Ok(parts) => parts
            .iter()
            .map(|p| {
                p.split("\n\nStack backtrace:")
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            })
            .filter(|p| !p.is_empty())
            .collect::<Vec<_>>()
            .join(": "),
        Err(_) if body.is_empty() => format!("HTTP status {status} with no body"),
        Err(_) => String::from_utf8_lossy(&body[..body.len().min(2048)]).into_owned(),
    };
    nubo_core::file::escape_control(&text)
}

/// What the user can do when `endpoint` failed.
pub fn fix_for(endpoint: &str, vmm_log: &Path) -> String {
    let log = vmm_log.display();
    match endpoint {
        "vm.create" => format!("check the kernel, firmware and disks named above exist and are readable; the VMM's log is {log}"),
        "vm.boot" => format!("the VMM could not start the guest (KVM, memory, firmware); see {log}"),
        "vm.snapshot" => format!("snapshots need a real KVM host (vCPU state is saved with KVM_GET_NESTED_STATE) and space in the VM's directory; the VM keeps running; see {log}"),
        "vm.restore" => format!("the snapshot may be from another Cloud Hypervisor version or incomplete: take a new one; see {log}"),
        _ => format!("see the VMM's log {log}; `nubo vm stop --force` ends a wedged VMM"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use crate::spec::{Disk, Firmware, MachineKind, NetworkMode, SeedDevice, SeedFormat};

    fn spec(boot: Boot, network: NetworkMode) -> MachineSpec {
        MachineSpec {
            name: "micro".into(),
            uuid: "5e1b9f7c-1d2e-4f00-8a9b-0123456789ab".into(),
            vm_dir: "/var/lib/nubo/vms/micro".into(),
            run_dir: "/run/nubo/vms/micro".into(),
            vcpus: 2,
            memory_mib: 512,
            disk: Disk {
                overlay: "/var/lib/nubo/vms/micro/disk.qcow2".into(),
                base: "/var/lib/nubo/images/blobs/ab.qcow2".into(),
                base_format: "qcow2".into(),
                chain_inspected: true,
                ..Default::default()
            },
            seed: Some(SeedDevice {
                path: "/var/lib/nubo/vms/micro/seed.img".into(),
                format: SeedFormat::Iso,
            }),
            boot,
            machine: MachineKind::Microvm,
            network,
            ports: Vec::new(),
            options: BTreeMap::new(),
            mounts: Vec::new(),
        }
    }

    fn kernel() -> Boot {
        Boot::Kernel {
            kernel: "/boot/vmlinuz".into(),
            initrd: Some("/boot/initrd.img".into()),
            cmdline: "root=/dev/vda1 ro ".into(),
        }
    }

    #[test]
    fn vm_config_kernel_boot_with_network_golden() {
        let s = spec(kernel(), NetworkMode::Forward);
        let st = ChState::layout(&s);

        let v = vm_config(&s, &st, None).unwrap();

        let want = json!({
            "cpus": {"boot_vcpus": 2, "max_vcpus": 2},
            "memory": {"size": 536870912u64},
            "payload": {
                "kernel": "/boot/vmlinuz",
                "initramfs": "/boot/initrd.img",
                "cmdline": "console=hvc0 root=/dev/vda1 ro console=ttyS0,115200",
            },
            "disks": [
                {"id": "disk0", "path": "/var/lib/nubo/vms/micro/disk.qcow2", "image_type": "Qcow2", "backing_files": true},
                {"id": "seed0", "path": "/var/lib/nubo/vms/micro/seed.img", "readonly": true, "image_type": "Raw"},
            ],
            "net": [{"id": "net0", "tap": "nt5e1b9f7c1d2e", "mac": "52:54:00:67:89:ad"}],
            "rng": {"src": "/dev/urandom"},
            "serial": {"mode": "File", "file": "/var/lib/nubo/vms/micro/console.log"},
            "console": {"mode": "Pty"},
            "platform": {"uuid": "5e1b9f7c-1d2e-4f00-8a9b-0123456789ab"},
        });
        assert_eq!(v, want);
    }

    /// Regression (issue 21): Cloud Hypervisor followed whatever backing file the overlay named.
    #[test]
    fn vm_config_uninspected_chain_keeps_backing_files_off() {
        let mut s = spec(kernel(), NetworkMode::None);
        s.disk.chain_inspected = false;
        let st = ChState::layout(&s);

        let v = vm_config(&s, &st, None).unwrap();

        assert_eq!(v["disks"][0]["backing_files"], false);
    }

    #[test]
    fn vm_config_firmware_boot_no_network_golden() {
        let mut s = spec(
            Boot::Firmware {
                firmware: Firmware::Efi,
            },
            NetworkMode::None,
        );
        s.seed = None;
        let st = ChState::layout(&s);

        let v = vm_config(&s, &st, Some(Path::new("/usr/share/cloud-hypervisor/CLOUDHV.fd"))).unwrap();

        assert_eq!(
            v["payload"],
            json!({"firmware": "/usr/share/cloud-hypervisor/CLOUDHV.fd"})
        );
        assert_eq!(v["disks"].as_array().unwrap().len(), 1);
        assert!(v.get("net").is_none());
    }

    #[test]
    fn vm_config_shared_folders_are_fs_devices_on_shared_memory() {
        let mut s = spec(kernel(), NetworkMode::None);
        s.mounts = vec![
            crate::spec::SharedDir {
                tag: crate::spec::mount_tag(0),
                host: "/srv/data".into(),
                guest: "/mnt/data".into(),
                read_only: false,
                transport: crate::spec::MountTransport::Virtiofs,
            },
            crate::spec::SharedDir {
                tag: crate::spec::mount_tag(1),
                host: "/srv/docs".into(),
                guest: "/mnt/docs".into(),
                read_only: true,
                transport: crate::spec::MountTransport::Virtiofs,
            },
        ];
        let st = ChState::layout(&s);

        let v = vm_config(&s, &st, None).unwrap();

        assert_eq!(v["memory"], json!({"size": 536870912u64, "shared": true}));
        assert_eq!(
            v["fs"],
            json!([
                {"id": "fs0", "tag": "mount0", "socket": "/run/nubo/vms/micro/fs0.sock", "num_queues": 1, "queue_size": 1024},
                {"id": "fs1", "tag": "mount1", "socket": "/run/nubo/vms/micro/fs1.sock", "num_queues": 1, "queue_size": 1024},
            ])
        );
    }

    #[test]
    fn vm_config_firmware_unresolved_is_error() {
        let s = spec(
            Boot::Firmware {
                firmware: Firmware::Efi,
            },
            NetworkMode::None,
        );

        assert!(vm_config(&s, &ChState::layout(&s), None).is_err());
    }

    #[test]
    fn vmm_argv_golden() {
        let s = spec(kernel(), NetworkMode::None);

        let a = vmm_argv("cloud-hypervisor", &ChState::layout(&s));

        assert_eq!(
            a,
            ["cloud-hypervisor", "--api-socket", "path=/run/nubo/vms/micro/ch.sock"]
        );
    }

    #[test]
    fn snapshot_and_restore_bodies_golden() {
        let d = PathBuf::from("/var/lib/nubo/vms/micro/snapshots/s1");

        assert_eq!(
            snapshot_body(&d),
            json!({"destination_url": "file:///var/lib/nubo/vms/micro/snapshots/s1"})
        );
        assert_eq!(
            restore_body(&d),
            json!({"source_url": "file:///var/lib/nubo/vms/micro/snapshots/s1", "prefault": false})
        );
    }

    #[test]
    fn parse_state_maps_every_ch_state() {
        let s = |x: &str| parse_state(format!("{{\"state\":\"{x}\",\"config\":{{}}}}").as_bytes());

        assert_eq!(s("Running"), Some(VmState::Running));
        assert_eq!(s("Paused"), Some(VmState::Paused));
        assert_eq!(s("Created"), Some(VmState::Stopped));
        assert_eq!(s("Shutdown"), Some(VmState::Stopped));
        assert_eq!(s("Exploded"), None);
        assert_eq!(parse_state(b"not json"), None);
    }

    #[test]
    fn console_pty_from_info() {
        let info = br#"{"state":"Running","config":{"console":{"file":"/dev/pts/7","mode":"Pty"}}}"#;

        assert_eq!(console_pty(info).as_deref(), Some("/dev/pts/7"));
    }

    #[test]
    fn describe_error_joins_strings_and_drops_backtrace() {
        let body = br#"["Error from API","The VM could not be snapshotted","Could not get vCPU state GetNestedState(Invalid argument (os error 22)\n\nStack backtrace:\n   0: <unknown>\n)"]"#;

        let d = describe_error(500, body);

        assert_eq!(
            d,
            "Error from API: The VM could not be snapshotted: Could not get vCPU state GetNestedState(Invalid argument (os error 22)"
        );
    }

    #[test]
    fn describe_error_not_json_is_escaped_text() {
        assert_eq!(describe_error(500, b"oops\x1b[2J"), "oops\\u{1b}[2J");
        assert_eq!(describe_error(502, b""), "HTTP status 502 with no body");
    }
}
