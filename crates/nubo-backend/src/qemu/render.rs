//! The QEMU command line for a [`MachineSpec`]: a pure function, golden-tested.
//!
//! Choices that matter to guests:
//! - Disks and the seed are virtio-blk: every cloud kernel has virtio_blk, while q35 would put a
//!   CD-ROM on SATA, which linux-image-cloud-amd64 cannot see (no AHCI driver).
//! - `-nodefaults`: no stray VGA, parallel port, floppy or CD-ROM the guest would probe.
//! - The serial port is a socket chardev with a `logfile`: the console log is written by QEMU
//!   itself whether or not anyone is attached, and `nubo vm console` attaches to the socket.
//! - `-daemonize`: QEMU reports start-up errors on stderr before it detaches, so a failed boot
//!   is seen by `nubo vm create`, and no nubo process has to stay behind.
//! - virtio-rng: first boot generates SSH host keys; without an entropy source that can stall
//!   for minutes under TCG.

use serde_json::json;

use super::options::{Accel, Machine, QemuOptions};
use super::state::QemuState;
use crate::spec::{Boot, Firmware, MachineSpec, NetworkMode};
use crate::BackendError;

/// The console the guest kernel must write to for readiness to see it (ttyS0 is the first
/// 16550 UART on pc, q35 and microvm alike).
pub const SERIAL_CONSOLE: &str = "console=ttyS0,115200";
/// The CPU under TCG: everything QEMU can emulate, except nested virtualisation.
pub const TCG_CPU: &str = "max,svm=off,vmx=off";

/// microvm has a PIT but no HPET, no ACPI PM timer and no port 0x61. Under TCG the kernel's fast
/// TSC calibration against the PIT fails whenever QEMU's vCPU thread is descheduled mid-measure
/// (seen in 4 of 12 boots on a loaded host); with no other reference the kernel marks the TSC
/// unstable and, on a hardware-reduced ACPI machine with no timer tick, spins for ever in the
/// delay-loop calibration. `tsc_early_khz=` (added under TCG, see [`argv`]) gives the kernel the
/// frequency so nothing depends on timing; `tsc=reliable` stops the clocksource watchdog
/// from disowning the TSC later. See docs/architecture.md "microvm".
pub const MICROVM_CMDLINE: &str = "tsc=reliable";

/// Seccomp: no obsolete syscalls, no resource-control syscalls. `elevateprivileges=deny` and
/// `spawn=deny` would be stronger but make QEMU 10 fail at `-daemonize` (it forks and calls
/// setsid after the filter is installed); nubo needs `-daemonize` to see start-up errors.
pub const SANDBOX: &str = "on,obsolete=deny,resourcecontrol=deny";

/// Appended for a restore of a memory snapshot onto a stopped VM: QEMU starts with the guest
/// stopped (`prelaunch`), nubo loads the snapshot over QMP, then sends `cont`.
pub const START_PAUSED: &str = "-S";

/// A value inside QEMU's `key=value,...` option syntax: a comma is doubled so a path holding
/// one cannot add options of its own.
fn opt(p: &std::path::Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// `opts.accel` must be resolved (not `Auto`). `tsc_khz` is the host's TSC frequency, which a
/// TCG guest's TSC runs at; it is used only for microvm under TCG (KVM guests get the
/// frequency from kvmclock).
pub fn argv(
    binary: &str,
    spec: &MachineSpec,
    st: &QemuState,
    opts: QemuOptions,
    tsc_khz: Option<u64>,
) -> Result<Vec<String>, BackendError> {
    let mut a: Vec<String> = vec![binary.to_owned()];
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    let micro = opts.machine == Machine::Microvm;
    let dev = |pci: &str, mmio: &str| if micro { mmio.to_owned() } else { pci.to_owned() };

    push(&["-name", &format!("{},process=nubo-{}", spec.name, spec.name)]);
    push(&["-uuid", &spec.uuid]);
    let mut machine = match opts.machine {
        Machine::Pc => "pc".to_owned(),
        Machine::Q35 => "q35".to_owned(),
        // rtc for wall-clock time; isa-serial for ttyS0; ACPI on so the kernel finds the
        // virtio-mmio transports in the ACPI tables: with acpi=off QEMU lists them as
        // `virtio_mmio.device=` arguments instead, which do nothing when virtio_mmio is a
        // module (Debian's cloud kernel), and the root disk never appears.
        Machine::Microvm => "microvm,isa-serial=on,rtc=on,acpi=on".to_owned(),
    };
    if let Boot::Firmware {
        firmware: Firmware::Efi | Firmware::EfiCode(_),
    } = &spec.boot
    {
        machine.push_str(",pflash0=pflash0,pflash1=pflash1");
    }
    push(&["-machine", &machine]);
    match opts.accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        // svm and vmx off: with them a guest loads kvm_amd/kvm_intel at boot (nested
        // virtualisation nobody can use at TCG speed), about a minute of guest time under load.
        Accel::Tcg => push(&["-accel", "tcg,thread=multi", "-cpu", TCG_CPU]),
        Accel::Auto => {
            return Err(BackendError::InvalidSpec(
                "accelerator must be resolved before rendering".into(),
            ))
        }
    }
    push(&["-smp", &spec.vcpus.to_string(), "-m", &format!("{}M", spec.memory_mib)]);
    push(&[
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-sandbox",
        SANDBOX,
    ]);

    let serial = format!(
        "socket,id=serial0,path={},server=on,wait=off,logfile={},logappend=on",
        opt(&st.serial_socket),
        opt(&st.console_log)
    );
    push(&["-chardev", &serial, "-serial", "chardev:serial0"]);
    let qmp = format!("socket,id=qmp0,path={},server=on,wait=off", opt(&st.qmp_socket));
    push(&["-chardev", &qmp, "-mon", "chardev=qmp0,mode=control"]);
    push(&["-pidfile", &st.pid_file.display().to_string(), "-daemonize"]);

    match &spec.boot {
        Boot::Firmware { .. } if micro => return Err(microvm_needs_kernel()),
        Boot::Firmware {
            firmware: Firmware::Bios,
        } => {}
        Boot::Firmware { firmware } => {
            let code = match firmware {
                Firmware::EfiCode(p) => p.clone(),
                _ => super::probe::find_ovmf().map(|o| o.code).ok_or_else(ovmf_missing)?,
            };
            let vars = st
                .efi_vars
                .as_ref()
                .ok_or_else(|| BackendError::InvalidSpec(format!("vm `{}` has no UEFI variable store", spec.name)))?;
            push(&["-blockdev", &raw_node("pflash0", &code, true).to_string()]);
            push(&["-blockdev", &raw_node("pflash1", vars, false).to_string()]);
        }
        Boot::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            push(&["-kernel", &kernel.display().to_string()]);
            if let Some(i) = initrd {
                push(&["-initrd", &i.display().to_string()]);
            }
            let mut line = cmdline.trim().to_owned();
            if micro {
                line.push(' ');
                line.push_str(MICROVM_CMDLINE);
                if let (Accel::Tcg, Some(khz)) = (opts.accel, tsc_khz) {
                    line.push_str(&format!(" tsc_early_khz={khz}"));
                }
            }
            line.push(' ');
            line.push_str(SERIAL_CONSOLE);
            push(&["-append", line.trim_start()]);
        }
    }

    // The whole chain is spelled out with explicit drivers: QEMU probes no format and opens
    // no backing file but the base nubo names (the overlay's own backing-file header is
    // overridden by `backing`), and the base's own chain ends at the base: `"backing": null`,
    // so a base replaced by one with a backing file (issue 21) cannot make QEMU open that file
    // even if it were swapped after nubo's inspection. The raw driver has no `backing` option.
    let mut base = json!({
        "driver": spec.disk.base_format,
        "node-name": "base0",
        "read-only": true,
        "file": {"driver": "file", "filename": spec.disk.base, "read-only": true},
    });
    if spec.disk.base_format != "raw" {
        base["backing"] = serde_json::Value::Null;
    }
    let disk = json!({
        "driver": "qcow2",
        "node-name": "disk0",
        "discard": "unmap",
        "detect-zeroes": "unmap",
        "file": {"driver": "file", "filename": spec.disk.overlay, "discard": "unmap"},
        "backing": base,
    });
    // With -kernel, QEMU's linuxboot option ROM takes boot index 0 itself.
    let bootindex = if matches!(spec.boot, Boot::Kernel { .. }) {
        ""
    } else {
        ",bootindex=0"
    };
    let disk_dev = format!("{},drive=disk0{bootindex}", dev("virtio-blk-pci", "virtio-blk-device"));
    push(&["-blockdev", &disk.to_string(), "-device", &disk_dev]);
    if let Some(seed) = &spec.seed {
        push(&[
            "-blockdev",
            &raw_node("seed0", &seed.path, true).to_string(),
            "-device",
            &format!("{},drive=seed0", dev("virtio-blk-pci", "virtio-blk-device")),
        ]);
    }
    let restrict = match &spec.network {
        NetworkMode::None => None,
        NetworkMode::Forward => Some(false),
        NetworkMode::Restricted => Some(true),
        NetworkMode::Named(n) => {
            return Err(BackendError::unsupported(
                "qemu",
                format!("network `{n}`"),
                "the libvirt backend for named networks, or network forward|restricted",
            ))
        }
    };
    if restrict.is_none() {
        // `-nodefaults` already leaves the default NIC out; said explicitly so the argv shows it.
        push(&["-nic", "none"]);
    }
    if let Some(restrict) = restrict {
        let mut netdev = format!("user,id=net0,restrict={}", if restrict { "on" } else { "off" });
        if let Some(port) = st.ssh_port {
            netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{port}-:22"));
        }
        netdev.push_str(&hostfwds(&spec.ports));
        push(&["-netdev", &netdev]);
        push(&[
            "-device",
            &format!(
                "{},netdev=net0,mac={}",
                dev("virtio-net-pci", "virtio-net-device"),
                mac_from_uuid(&spec.uuid)
            ),
        ]);
    }
    push(&["-device", &dev("virtio-rng-pci", "virtio-rng-device")]);
    a.extend(super::mounts::argv(spec, &st.run_dir, micro));
    Ok(a)
}

/// The user's published ports as QEMU `hostfwd` options (they work with `restrict=on`: a
/// forward is a connection the host makes, not one the guest starts).
pub fn hostfwds(ports: &[nubo_core::PortForward]) -> String {
    ports
        .iter()
        .map(|p| {
            format!(
                ",hostfwd={}:{}:{}-:{}",
                p.protocol.as_str(),
                p.host_ip,
                p.host_port,
                p.guest_port
            )
        })
        .collect()
}

fn raw_node(name: &str, path: &std::path::Path, read_only: bool) -> serde_json::Value {
    json!({
        "driver": "raw",
        "node-name": name,
        "read-only": read_only,
        "file": {"driver": "file", "filename": path, "read-only": read_only},
    })
}

pub(crate) fn ovmf_missing() -> BackendError {
    BackendError::Unavailable {
        backend: "qemu",
        why: "UEFI boot needs OVMF, which is not installed: install the ovmf package".into(),
    }
}

fn microvm_needs_kernel() -> BackendError {
    BackendError::InvalidSpec(
        "the microvm machine has no firmware and boots only a kernel: pass --kernel (or use an image that records one), or use --machine pc".into(),
    )
}

/// A locally administered unicast MAC in QEMU's 52:54:00 range, stable for the VM's life.
pub fn mac_from_uuid(uuid: &str) -> String {
    let hex: Vec<u8> = uuid.bytes().filter(u8::is_ascii_hexdigit).collect();
    let byte = |i: usize| {
        hex.get(i * 2..i * 2 + 2)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| u8::from_str_radix(s, 16).ok())
            .unwrap_or(0)
    };
    format!("52:54:00:{:02x}:{:02x}:{:02x}", byte(0), byte(1), byte(2))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::spec::{Disk, MachineKind, SeedDevice, SeedFormat};

    fn spec(boot: Boot) -> MachineSpec {
        MachineSpec {
            name: "web".into(),
            uuid: "0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001".into(),
            vm_dir: "/var/lib/nubo/vms/web".into(),
            run_dir: "/run/nubo/vms/web".into(),
            vcpus: 2,
            memory_mib: 2048,
            disk: Disk {
                overlay: "/var/lib/nubo/vms/web/disk.qcow2".into(),
                base: "/var/lib/nubo/images/blobs/sha256/ab".into(),
                base_format: "qcow2".into(),
                ..Default::default()
            },
            seed: Some(SeedDevice {
                path: "/var/lib/nubo/vms/web/seed.img".into(),
                format: SeedFormat::Iso,
            }),
            boot,
            machine: MachineKind::Default,
            network: NetworkMode::Restricted,
            ports: Vec::new(),
            options: Default::default(),
            mounts: Vec::new(),
        }
    }

    fn state(s: &MachineSpec) -> QemuState {
        QemuState {
            ssh_port: Some(40022),
            efi_vars: Some("/var/lib/nubo/vms/web/efivars.fd".into()),
            ..QemuState::layout(s)
        }
    }

    fn opts(machine: Machine, accel: Accel) -> QemuOptions {
        QemuOptions { machine, accel }
    }

    const BIOS: Boot = Boot::Firmware {
        firmware: Firmware::Bios,
    };

    const COMMON: &str = "qemu-system-x86_64 -name web,process=nubo-web -uuid 0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001";
    const RUNTIME: &str = "-smp 2 -m 2048M -nodefaults -no-user-config -display none -sandbox on,obsolete=deny,resourcecontrol=deny \
-chardev socket,id=serial0,path=/run/nubo/vms/web/serial.sock,server=on,wait=off,logfile=/var/lib/nubo/vms/web/console.log,logappend=on -serial chardev:serial0 \
-chardev socket,id=qmp0,path=/run/nubo/vms/web/qmp.sock,server=on,wait=off -mon chardev=qmp0,mode=control \
-pidfile /run/nubo/vms/web/vmm.pid -daemonize";
    const DEVICES_PCI: &str = r#"-blockdev {"backing":{"backing":null,"driver":"qcow2","file":{"driver":"file","filename":"/var/lib/nubo/images/blobs/sha256/ab","read-only":true},"node-name":"base0","read-only":true},"detect-zeroes":"unmap","discard":"unmap","driver":"qcow2","file":{"discard":"unmap","driver":"file","filename":"/var/lib/nubo/vms/web/disk.qcow2"},"node-name":"disk0"} -device virtio-blk-pci,drive=disk0,bootindex=0 -blockdev {"driver":"raw","file":{"driver":"file","filename":"/var/lib/nubo/vms/web/seed.img","read-only":true},"node-name":"seed0","read-only":true} -device virtio-blk-pci,drive=seed0 -netdev user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22 -device virtio-net-pci,netdev=net0,mac=52:54:00:0b:9f:1c -device virtio-rng-pci"#;

    fn joined(s: &MachineSpec, o: QemuOptions) -> String {
        argv("qemu-system-x86_64", s, &state(s), o, None).unwrap().join(" ")
    }

    #[test]
    fn argv_published_ports_follow_ssh_forward_with_restrict() {
        let mut s = spec(BIOS);
        s.ports = vec!["8080:80".parse().unwrap(), "0.0.0.0:5353:53/udp".parse().unwrap()];

        let got = joined(&s, opts(Machine::Pc, Accel::Tcg));

        assert!(
            got.contains("-netdev user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22,hostfwd=tcp:127.0.0.1:8080-:80,hostfwd=udp:0.0.0.0:5353-:53 "),
            "{got}"
        );
    }

    #[test]
    fn argv_bios_tcg_golden() {
        let got = joined(&spec(BIOS), opts(Machine::Pc, Accel::Tcg));

        assert_eq!(
            got,
            format!("{COMMON} -machine pc -accel tcg,thread=multi -cpu max,svm=off,vmx=off {RUNTIME} {DEVICES_PCI}")
        );
    }

    #[test]
    fn argv_efi_kvm_q35_golden() {
        let boot = Boot::Firmware {
            firmware: Firmware::EfiCode("/usr/share/OVMF/OVMF_CODE_4M.fd".into()),
        };

        let got = joined(&spec(boot), opts(Machine::Q35, Accel::Kvm));

        assert_eq!(
            got,
            format!(
                r#"{COMMON} -machine q35,pflash0=pflash0,pflash1=pflash1 -accel kvm -cpu host {RUNTIME} -blockdev {{"driver":"raw","file":{{"driver":"file","filename":"/usr/share/OVMF/OVMF_CODE_4M.fd","read-only":true}},"node-name":"pflash0","read-only":true}} -blockdev {{"driver":"raw","file":{{"driver":"file","filename":"/var/lib/nubo/vms/web/efivars.fd","read-only":false}},"node-name":"pflash1","read-only":false}} {DEVICES_PCI}"#
            )
        );
    }

    #[test]
    fn argv_direct_kernel_appends_serial_console() {
        let boot = Boot::Kernel {
            kernel: "/k/vmlinuz".into(),
            initrd: Some(PathBuf::from("/k/initrd.img")),
            cmdline: "root=LABEL=root ro".into(),
        };

        let got = joined(&spec(boot), opts(Machine::Pc, Accel::Tcg));

        assert!(
            got.contains(
                "-kernel /k/vmlinuz -initrd /k/initrd.img -append root=LABEL=root ro console=ttyS0,115200 -blockdev"
            ),
            "{got}"
        );
        assert!(got.contains("virtio-blk-pci,drive=disk0 "), "{got}");
    }

    #[test]
    fn argv_microvm_uses_mmio_devices_and_timer_fix() {
        let boot = Boot::Kernel {
            kernel: "/k/vmlinuz".into(),
            initrd: None,
            cmdline: "root=/dev/vda1".into(),
        };
        let s = spec(boot);

        let a = argv(
            "qemu-system-x86_64",
            &s,
            &state(&s),
            opts(Machine::Microvm, Accel::Tcg),
            Some(2596120),
        )
        .unwrap();

        assert!(a.contains(&"microvm,isa-serial=on,rtc=on,acpi=on".to_owned()));
        assert!(a.contains(&"root=/dev/vda1 tsc=reliable tsc_early_khz=2596120 console=ttyS0,115200".to_owned()));
        assert!(a.contains(&"virtio-blk-device,drive=disk0".to_owned()));
        assert!(!a.iter().any(|x| x.contains("-pci")));
    }

    #[test]
    fn argv_microvm_bios_refused() {
        let s = spec(BIOS);

        let err = argv("q", &s, &state(&s), opts(Machine::Microvm, Accel::Tcg), None).unwrap_err();

        assert!(err.to_string().contains("--kernel"));
    }

    #[test]
    fn argv_unresolved_accel_refused() {
        let s = spec(BIOS);

        assert!(argv("q", &s, &state(&s), opts(Machine::Pc, Accel::Auto), None).is_err());
    }

    #[test]
    fn argv_no_seed_no_network() {
        let mut s = spec(BIOS);
        s.seed = None;
        s.network = NetworkMode::None;

        let got = joined(&s, opts(Machine::Pc, Accel::Tcg));

        assert!(!got.contains("seed0") && !got.contains("netdev"), "{got}");
        assert!(got.contains("-nic none"), "{got}");
    }

    /// The base0 node of the OS disk's `-blockdev`, as JSON.
    fn base_node(s: &MachineSpec) -> serde_json::Value {
        let argv = argv("qemu-system-x86_64", s, &state(s), opts(Machine::Pc, Accel::Tcg), None).unwrap();
        let disk = argv
            .iter()
            .find(|a| a.contains("\"disk0\""))
            .expect("the OS disk's -blockdev");
        serde_json::from_str::<serde_json::Value>(disk).unwrap()["backing"].clone()
    }

    /// Regression (issue 21): a base replaced by a qcow2 with a backing file made QEMU resolve
    /// that chain itself (`base0` opened /etc/shadow). Every base that can have a backing file
    /// ends its chain with `"backing": null`.
    #[test]
    fn argv_base_chain_ends_at_base_for_every_cow_format() {
        let mut s = spec(BIOS);
        for format in ["qcow2", "vmdk"] {
            s.disk.base_format = format.into();

            let base = base_node(&s);

            assert_eq!(base.get("backing"), Some(&serde_json::Value::Null), "{format}: {base}");
            assert_eq!(base["driver"], format);
        }
    }

    #[test]
    fn argv_raw_base_has_no_backing_key() {
        let mut s = spec(BIOS);
        s.disk.base_format = "raw".into();

        let base = base_node(&s);

        assert_eq!(
            (base.get("backing"), &base["driver"]),
            (None, &serde_json::json!("raw"))
        );
    }

    #[test]
    fn argv_comma_in_path_cannot_add_options() {
        let mut s = spec(BIOS);
        s.vm_dir = "/data/a,logfile=/etc/x".into();

        let got = joined(&s, opts(Machine::Pc, Accel::Tcg));

        assert!(got.contains("logfile=/data/a,,logfile=/etc/x/console.log"), "{got}");
    }

    #[test]
    fn argv_named_network_unsupported_names_libvirt() {
        let mut s = spec(BIOS);
        s.network = NetworkMode::Named("default".into());

        let err = argv("q", &s, &state(&s), opts(Machine::Pc, Accel::Tcg), None).unwrap_err();

        assert!(err.to_string().contains("libvirt"), "{err}");
    }

    #[test]
    fn mac_from_uuid_is_qemu_local_range() {
        assert_eq!(
            mac_from_uuid("0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001"),
            "52:54:00:0b:9f:1c"
        );
    }

    #[test]
    fn mac_from_uuid_short_input_does_not_panic() {
        assert_eq!(mac_from_uuid("ab"), "52:54:00:ab:00:00");
    }
}
