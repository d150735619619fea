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

use crate::spec::{Accel, BootMode, MachineSpec, MachineType, NetworkSpec};
use crate::BackendError;

/// The console the guest kernel must write to for readiness to see it (ttyS0 is the first
/// 16550 UART on pc, q35 and microvm alike).
pub const SERIAL_CONSOLE: &str = "console=ttyS0,115200";

/// microvm has a PIT but no HPET, no ACPI PM timer and no port 0x61. Under TCG the kernel's fast
/// TSC calibration against the PIT fails whenever QEMU's vCPU thread is descheduled mid-measure
/// (seen in 4 of 12 boots on a loaded host); with no other reference the kernel marks the TSC
/// unstable and, on a hardware-reduced ACPI machine with no timer tick, spins for ever in the
/// delay-loop calibration. `tsc_early_khz=` (added under TCG, see [`argv`]) gives the kernel the
/// frequency so nothing depends on timing; `tsc=reliable` stops the clocksource watchdog
/// from disowning the TSC later. See docs/architecture.md "microvm".
pub const MICROVM_CMDLINE: &str = "tsc=reliable";

/// `tsc_khz` is the host's TSC frequency, which a TCG guest's TSC runs at; it is used only for
/// microvm under TCG (KVM guests get the frequency from kvmclock).
pub fn argv(binary: &str, spec: &MachineSpec, accel: Accel, tsc_khz: Option<u64>) -> Result<Vec<String>, BackendError> {
    let mut a: Vec<String> = vec![binary.to_owned()];
    let mut push = |items: &[&str]| a.extend(items.iter().map(|s| s.to_string()));
    let h = &spec.handle;
    let micro = spec.machine == MachineType::Microvm;
    let dev = |pci: &str, mmio: &str| if micro { mmio.to_owned() } else { pci.to_owned() };

    push(&["-name", &format!("{},process=nubo-{}", h.name, h.name)]);
    push(&["-uuid", &spec.uuid]);
    let machine = match spec.machine {
        MachineType::Pc => "pc",
        MachineType::Q35 => "q35",
        // rtc for wall-clock time; isa-serial for ttyS0; ACPI on so the kernel finds the
        // virtio-mmio transports in the ACPI tables: with acpi=off QEMU lists them as
        // `virtio_mmio.device=` arguments instead, which do nothing when virtio_mmio is a
        // module (Debian's cloud kernel), and the root disk never appears.
        MachineType::Microvm => "microvm,isa-serial=on,rtc=on,acpi=on",
    };
    push(&["-machine", machine]);
    match accel {
        Accel::Kvm => push(&["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => push(&["-accel", "tcg,thread=multi", "-cpu", "max"]),
        Accel::Auto => {
            return Err(BackendError::InvalidSpec(
                "accelerator must be resolved before rendering".into(),
            ))
        }
    }
    push(&["-smp", &spec.vcpus.to_string(), "-m", &format!("{}M", spec.memory_mib)]);
    push(&["-nodefaults", "-no-user-config", "-display", "none"]);

    let serial = format!(
        "socket,id=serial0,path={},server=on,wait=off,logfile={},logappend=on",
        h.serial_socket.display(),
        spec.console_log.display()
    );
    push(&["-chardev", &serial, "-serial", "chardev:serial0"]);
    let qmp = format!("socket,id=qmp0,path={},server=on,wait=off", h.qmp_socket.display());
    push(&["-chardev", &qmp, "-mon", "chardev=qmp0,mode=control"]);
    push(&["-pidfile", &h.pid_file.display().to_string(), "-daemonize"]);

    match &spec.boot {
        BootMode::Bios if micro => return Err(microvm_needs_kernel()),
        BootMode::Efi { .. } if micro => return Err(microvm_needs_kernel()),
        BootMode::Bios => {}
        BootMode::Efi { code, vars } => {
            push(&[
                "-drive",
                &format!("if=pflash,format=raw,unit=0,readonly=on,file={}", code.display()),
            ]);
            push(&[
                "-drive",
                &format!("if=pflash,format=raw,unit=1,file={}", vars.display()),
            ]);
        }
        BootMode::Kernel {
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
                if let (Accel::Tcg, Some(khz)) = (accel, tsc_khz) {
                    line.push_str(&format!(" tsc_early_khz={khz}"));
                }
            }
            line.push(' ');
            line.push_str(SERIAL_CONSOLE);
            push(&["-append", line.trim_start()]);
        }
    }

    let disk = format!(
        "if=none,id=disk0,file={},format={},discard=unmap,detect-zeroes=unmap",
        spec.disk.display(),
        spec.disk_format
    );
    // With -kernel, QEMU's linuxboot option ROM takes boot index 0 itself.
    let bootindex = if matches!(spec.boot, BootMode::Kernel { .. }) {
        ""
    } else {
        ",bootindex=0"
    };
    let disk_dev = format!("{},drive=disk0{bootindex}", dev("virtio-blk-pci", "virtio-blk-device"));
    push(&["-drive", &disk, "-device", &disk_dev]);
    if let Some(seed) = &spec.seed {
        let drive = format!("if=none,id=seed0,file={},format=raw,readonly=on", seed.path.display());
        push(&[
            "-drive",
            &drive,
            "-device",
            &format!("{},drive=seed0", dev("virtio-blk-pci", "virtio-blk-device")),
        ]);
    }
    match &spec.network {
        NetworkSpec::None => {}
        NetworkSpec::User {
            ssh_forward,
            restrict,
            mac,
        } => {
            let mut netdev = format!("user,id=net0,restrict={}", if *restrict { "on" } else { "off" });
            if let Some(fwd) = ssh_forward {
                netdev.push_str(&format!(",hostfwd=tcp:{}:{}-:22", fwd.ip(), fwd.port()));
            }
            push(&["-netdev", &netdev]);
            push(&[
                "-device",
                &format!("{},netdev=net0,mac={mac}", dev("virtio-net-pci", "virtio-net-device")),
            ]);
        }
    }
    push(&["-device", &dev("virtio-rng-pci", "virtio-rng-device")]);
    Ok(a)
}

fn microvm_needs_kernel() -> BackendError {
    BackendError::InvalidSpec(
        "the microvm machine has no firmware and boots only a kernel: pass --kernel (or use an image that records one), or use --machine pc".into(),
    )
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::spec::{SeedDevice, SeedFormat, VmHandle};

    fn spec(boot: BootMode, machine: MachineType) -> MachineSpec {
        MachineSpec {
            handle: VmHandle {
                name: "web".into(),
                uuid: "0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001".into(),
                run_dir: "/run/nubo/web".into(),
                qmp_socket: "/run/nubo/web/qmp.sock".into(),
                serial_socket: "/run/nubo/web/serial.sock".into(),
                pid_file: "/run/nubo/web/qemu.pid".into(),
            },
            uuid: "0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001".into(),
            vcpus: 2,
            memory_mib: 2048,
            disk: "/var/lib/nubo/vms/web/disk.qcow2".into(),
            disk_format: "qcow2".into(),
            seed: Some(SeedDevice {
                path: "/var/lib/nubo/vms/web/seed.iso".into(),
                format: SeedFormat::Iso,
            }),
            boot,
            machine,
            accel: Accel::Auto,
            network: NetworkSpec::User {
                ssh_forward: Some("127.0.0.1:40022".parse().unwrap()),
                restrict: true,
                mac: "52:54:00:12:34:56".into(),
            },
            console_log: "/var/lib/nubo/vms/web/console.log".into(),
        }
    }

    const COMMON: &str = "qemu-system-x86_64 -name web,process=nubo-web -uuid 0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001";
    const RUNTIME: &str = "-smp 2 -m 2048M -nodefaults -no-user-config -display none \
-chardev socket,id=serial0,path=/run/nubo/web/serial.sock,server=on,wait=off,logfile=/var/lib/nubo/vms/web/console.log,logappend=on -serial chardev:serial0 \
-chardev socket,id=qmp0,path=/run/nubo/web/qmp.sock,server=on,wait=off -mon chardev=qmp0,mode=control \
-pidfile /run/nubo/web/qemu.pid -daemonize";
    const DEVICES_PCI: &str = "-drive if=none,id=disk0,file=/var/lib/nubo/vms/web/disk.qcow2,format=qcow2,discard=unmap,detect-zeroes=unmap -device virtio-blk-pci,drive=disk0,bootindex=0 \
-drive if=none,id=seed0,file=/var/lib/nubo/vms/web/seed.iso,format=raw,readonly=on -device virtio-blk-pci,drive=seed0 \
-netdev user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22 -device virtio-net-pci,netdev=net0,mac=52:54:00:12:34:56 \
-device virtio-rng-pci";

    fn joined(s: &MachineSpec, accel: Accel) -> String {
        argv("qemu-system-x86_64", s, accel, None).unwrap().join(" ")
    }

    #[test]
    fn argv_bios_tcg_golden() {
        let got = joined(&spec(BootMode::Bios, MachineType::Pc), Accel::Tcg);

        assert_eq!(
            got,
            format!("{COMMON} -machine pc -accel tcg,thread=multi -cpu max {RUNTIME} {DEVICES_PCI}")
        );
    }

    #[test]
    fn argv_efi_kvm_q35_golden() {
        let boot = BootMode::Efi {
            code: "/usr/share/OVMF/OVMF_CODE_4M.fd".into(),
            vars: "/v/web/efivars.fd".into(),
        };

        let got = joined(&spec(boot, MachineType::Q35), Accel::Kvm);

        assert_eq!(
            got,
            format!(
                "{COMMON} -machine q35 -accel kvm -cpu host {RUNTIME} \
-drive if=pflash,format=raw,unit=0,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd -drive if=pflash,format=raw,unit=1,file=/v/web/efivars.fd {DEVICES_PCI}"
            )
        );
    }

    #[test]
    fn argv_direct_kernel_appends_serial_console() {
        let boot = BootMode::Kernel {
            kernel: "/k/vmlinuz".into(),
            initrd: Some(PathBuf::from("/k/initrd.img")),
            cmdline: "root=LABEL=root ro".into(),
        };

        let got = joined(&spec(boot, MachineType::Pc), Accel::Tcg);

        assert!(
            got.contains(
                "-kernel /k/vmlinuz -initrd /k/initrd.img -append root=LABEL=root ro console=ttyS0,115200 -drive"
            ),
            "{got}"
        );
    }

    #[test]
    fn argv_microvm_uses_mmio_devices_and_timer_fix() {
        let boot = BootMode::Kernel {
            kernel: "/k/vmlinuz".into(),
            initrd: None,
            cmdline: "root=/dev/vda1".into(),
        };

        let a = argv(
            "qemu-system-x86_64",
            &spec(boot, MachineType::Microvm),
            Accel::Tcg,
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
        let err = argv("q", &spec(BootMode::Bios, MachineType::Microvm), Accel::Tcg, None).unwrap_err();

        assert!(err.to_string().contains("--kernel"));
    }

    #[test]
    fn argv_unresolved_accel_refused() {
        assert!(argv("q", &spec(BootMode::Bios, MachineType::Pc), Accel::Auto, None).is_err());
    }

    #[test]
    fn argv_no_seed_no_network() {
        let mut s = spec(BootMode::Bios, MachineType::Pc);
        s.seed = None;
        s.network = NetworkSpec::None;

        let got = joined(&s, Accel::Tcg);

        assert!(!got.contains("seed0") && !got.contains("netdev"), "{got}");
    }
}
