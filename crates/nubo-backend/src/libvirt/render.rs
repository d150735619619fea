//! Pure renderers: the domain, storage pool and volume XML nubo hands libvirt.
//!
//! One function per document, no I/O, golden-tested. Every string that reaches the XML is
//! escaped, so no name or path can add an element or an attribute.

use std::fmt::Write;
use std::path::Path;

use crate::spec::{Boot, Firmware, MachineSpec};

/// nubo's XML namespace for the `<metadata>` that marks a domain as nubo's own.
pub const METADATA_NS: &str = "https://nubo.dev/xmlns/libvirt/1";
/// QEMU's namespace in domain XML, for the user-mode network fallback.
const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";

/// QEMU's machine type, a libvirt backend option (`machine: pc|q35`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Machine {
    /// The seed CD-ROM goes on IDE, which every guest kernel drives.
    Pc,
    /// The seed CD-ROM goes on virtio-scsi: q35's default (SATA/AHCI) is missing from cloud kernels.
    Q35,
}

/// Where the guest's network comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Net {
    /// A libvirt network, with DHCP; the MAC identifies the VM's lease.
    /// `mac`: `None` on the first define (libvirt picks one, kept on every redefine).
    Network {
        name: String,
        mac: Option<String>,
    },
    /// QEMU user-mode networking with SSH forwarded from 127.0.0.1 (no libvirt network).
    User {
        ssh_port: u16,
        restrict: bool,
    },
    None,
}

/// The seed, as the domain sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedSource {
    /// A volume of a storage pool (`<domain>-cidata.iso`): an ISO CD-ROM.
    Volume { pool: String, volume: String },
    /// A FAT seed file of the user's own (`--seed`): a read-only virtio disk.
    VfatFile(std::path::PathBuf),
}

/// Everything the domain XML depends on besides the machine spec.
#[derive(Debug, Clone)]
pub struct DomainParams<'a> {
    /// `None` on the first define (libvirt assigns one); the assigned one on every redefine.
    pub uuid: Option<&'a str>,
    /// `kvm` or `qemu` (TCG).
    pub virt_type: &'a str,
    pub machine: Machine,
    pub seed: Option<SeedSource>,
    /// Whether the OS disk (`spec.disk.overlay`) is attached: not on the first define, which
    /// comes before the disk volume exists (it is made once the pool is recorded, so a killed
    /// create finds and deletes it).
    pub os_disk: bool,
    pub net: Net,
    /// The serial log file virtlogd writes, on the daemon's host; `None` on a remote host,
    /// where this host's VM directory does not exist (the console is read through the stream).
    pub console_log: Option<&'a Path>,
    /// A static DAC label (`uid`, `gid`) with `relabel='no'`: QEMU runs as the caller and
    /// nothing of the caller's is chowned (a non-root caller on `qemu:///system`).
    pub dac: Option<(u32, u32)>,
}

pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

fn p(path: &Path) -> String {
    escape(&path.to_string_lossy())
}

/// The domain XML for `spec`.
pub fn domain(spec: &MachineSpec, d: &DomainParams<'_>) -> String {
    let mut x = String::new();
    let qemu_ns = matches!(d.net, Net::User { .. });
    let _ = write!(x, "<domain type='{}'", escape(d.virt_type));
    if qemu_ns {
        let _ = write!(x, " xmlns:qemu='{QEMU_NS}'");
    }
    x.push_str(">\n");
    let _ = writeln!(x, "  <name>{}</name>", escape(&spec.name));
    if let Some(u) = d.uuid {
        let _ = writeln!(x, "  <uuid>{}</uuid>", escape(u));
    }
    let _ = writeln!(
        x,
        "  <metadata>\n    <nubo:vm xmlns:nubo='{METADATA_NS}'>\n      <nubo:dir>{}</nubo:dir>\n    </nubo:vm>\n  </metadata>",
        p(&spec.vm_dir)
    );
    let _ = writeln!(x, "  <memory unit='MiB'>{}</memory>", spec.memory_mib);
    x.push_str(&super::mounts::memory_backing(spec));
    let _ = writeln!(x, "  <vcpu>{}</vcpu>", spec.vcpus);
    let machine = match d.machine {
        Machine::Pc => "pc",
        Machine::Q35 => "q35",
    };
    match &spec.boot {
        Boot::Firmware {
            firmware: Firmware::Efi,
        } => {
            // libvirt picks the firmware from QEMU's descriptors; left free it takes the first
            // match, which on q35 is Debian's Secure Boot build with Microsoft's keys enrolled,
            // and that refuses the unsigned GRUB of nubo's own images. Secure Boot off selects
            // plain OVMF, the firmware the qemu backend boots.
            let _ = writeln!(
                x,
                "  <os firmware='efi'>\n    <type arch='x86_64' machine='{machine}'>hvm</type>\n    <firmware>\n      <feature enabled='no' name='secure-boot'/>\n    </firmware>\n    <boot dev='hd'/>\n  </os>"
            );
        }
        Boot::Firmware { .. } => {
            let _ = writeln!(
                x,
                "  <os>\n    <type arch='x86_64' machine='{machine}'>hvm</type>\n    <boot dev='hd'/>\n  </os>"
            );
        }
        Boot::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            let _ = writeln!(x, "  <os>\n    <type arch='x86_64' machine='{machine}'>hvm</type>");
            let _ = writeln!(x, "    <kernel>{}</kernel>", p(kernel));
            if let Some(i) = initrd {
                let _ = writeln!(x, "    <initrd>{}</initrd>", p(i));
            }
            // The serial console readiness follows, as the qemu backend appends it.
            let line = format!("{} {}", cmdline.trim(), crate::qemu::render::SERIAL_CONSOLE);
            let _ = writeln!(x, "    <cmdline>{}</cmdline>\n  </os>", escape(line.trim_start()));
        }
    }
    x.push_str("  <features>\n    <acpi/>\n    <apic/>\n  </features>\n");
    if d.virt_type == "kvm" {
        x.push_str("  <cpu mode='host-passthrough'/>\n");
    } else {
        x.push_str("  <cpu mode='maximum' migratable='off'/>\n");
    }
    x.push_str(
        "  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>\n",
    );
    x.push_str("  <devices>\n");
    // The base is spelled out with its proven format: libvirt and QEMU never probe it.
    if d.os_disk {
        let _ = writeln!(
        x,
        "    <disk type='file' device='disk'>\n      <driver name='qemu' type='qcow2' discard='unmap'/>\n      <source file='{}'/>\n      <backingStore type='file'>\n        <format type='{}'/>\n        <source file='{}'/>\n        <backingStore/>\n      </backingStore>\n      <target dev='vda' bus='virtio'/>\n    </disk>",
        p(&spec.disk.overlay),
        escape(&spec.disk.base_format),
        p(&spec.disk.base)
        );
    }
    match &d.seed {
        Some(SeedSource::Volume { pool, volume }) => {
            let target = match d.machine {
                Machine::Pc => "<target dev='hdc' bus='ide'/>",
                Machine::Q35 => "<target dev='sda' bus='scsi'/>",
            };
            let _ = writeln!(
                x,
                "    <disk type='volume' device='cdrom'>\n      <driver name='qemu' type='raw'/>\n      <source pool='{}' volume='{}'/>\n      {target}\n      <readonly/>\n    </disk>",
                escape(pool),
                escape(volume)
            );
        }
        Some(SeedSource::VfatFile(path)) => {
            let _ = writeln!(
                x,
                "    <disk type='file' device='disk'>\n      <driver name='qemu' type='raw'/>\n      <source file='{}'/>\n      <target dev='vdb' bus='virtio'/>\n      <readonly/>\n    </disk>",
                p(path)
            );
        }
        None => {}
    }
    if d.machine == Machine::Q35 {
        x.push_str("    <controller type='scsi' model='virtio-scsi'/>\n");
    }
    if let Net::Network { name, mac } = &d.net {
        let _ = writeln!(
            x,
            "    <interface type='network'>\n      <source network='{}'/>",
            escape(name)
        );
        if let Some(mac) = mac {
            let _ = writeln!(x, "      <mac address='{}'/>", escape(mac));
        }
        x.push_str("      <model type='virtio'/>\n    </interface>\n");
    }
    x.push_str(&super::mounts::filesystems(spec));
    let log = d
        .console_log
        .map(|l| format!("      <log file='{}' append='off'/>\n", p(l)))
        .unwrap_or_default();
    let _ = writeln!(
        x,
        "    <serial type='pty'>\n{log}      <target port='0'/>\n    </serial>\n    <console type='pty'>\n      <target type='serial' port='0'/>\n    </console>"
    );
    x.push_str("    <rng model='virtio'>\n      <backend model='random'>/dev/urandom</backend>\n    </rng>\n");
    x.push_str("    <memballoon model='none'/>\n  </devices>\n");
    if let Some((uid, gid)) = d.dac {
        let _ = writeln!(
            x,
            "  <seclabel type='static' model='dac' relabel='no'>\n    <label>+{uid}:+{gid}</label>\n  </seclabel>"
        );
    }
    if let Net::User { ssh_port, restrict } = &d.net {
        let restrict = if *restrict { ",restrict=on" } else { "" };
        // A fixed, high slot: libvirt places its own devices from slot 2 on and does not know
        // about this one (0x1f is q35's LPC; 0x1e is free on both machines).
        let bus = match d.machine {
            Machine::Pc => "pci.0",
            Machine::Q35 => "pcie.0",
        };
        let _ = writeln!(
            x,
            "  <qemu:commandline>\n    <qemu:arg value='-netdev'/>\n    <qemu:arg value='user,id=nubonet0{restrict},hostfwd=tcp:127.0.0.1:{ssh_port}-:22{}'/>\n    <qemu:arg value='-device'/>\n    <qemu:arg value='virtio-net-pci,netdev=nubonet0,bus={bus},addr=0x1e'/>\n  </qemu:commandline>",
            escape(&crate::qemu::render::hostfwds(&spec.ports))
        );
    }
    x.push_str("</domain>\n");
    x
}

/// nubo's own directory pool.
pub fn dir_pool(name: &str, path: &Path) -> String {
    format!(
        "<pool type='dir'>\n  <name>{}</name>\n  <target>\n    <path>{}</path>\n    <permissions>\n      <mode>0711</mode>\n    </permissions>\n  </target>\n</pool>\n",
        escape(name),
        p(path)
    )
}

/// The seed volume: raw, exactly `len` bytes, readable only by `owner` (QEMU runs as it).
pub fn seed_volume(name: &str, len: u64, owner: (u32, u32)) -> String {
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{len}</capacity>\n  <allocation unit='bytes'>{len}</allocation>\n  <target>\n    <format type='raw'/>\n    <permissions>\n      <owner>{}</owner>\n      <group>{}</group>\n      <mode>0600</mode>\n    </permissions>\n  </target>\n</volume>\n",
        escape(name),
        owner.0,
        owner.1
    )
}

/// The OS disk volume: a thin qcow2 of `capacity` bytes over `base` (outside the pool, so named
/// with its proven `base_format`: libvirt's `qemu-img create` never probes it), 0600 owned by
/// `owner` (QEMU runs as it).
pub fn disk_volume(name: &str, capacity: u64, base: &Path, base_format: &str, owner: (u32, u32)) -> String {
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{capacity}</capacity>\n  <allocation unit='bytes'>0</allocation>\n  <target>\n    <format type='qcow2'/>\n    <permissions>\n      <owner>{}</owner>\n      <group>{}</group>\n      <mode>0600</mode>\n    </permissions>\n  </target>\n  <backingStore>\n    <path>{}</path>\n    <format type='{}'/>\n  </backingStore>\n</volume>\n",
        escape(name),
        owner.0,
        owner.1,
        p(base),
        escape(base_format)
    )
}

/// A base volume (`nubo-base-<digest>.<format>`, [`super::base`]): `len` bytes the upload
/// fills, created raw and sparse (allocation 0: the upload writes every byte) so libvirt
/// writes no header of its own over them and allocates nothing twice. Owned by the daemon's
/// user, 0644: one base is shared by every VM on the host, read by each VM's QEMU under
/// whatever user the host's qemu.conf gives it; guest writes go to the 0600 overlays.
pub fn base_volume(name: &str, len: u64) -> String {
    format!(
        "<volume type='file'>\n  <name>{}</name>\n  <capacity unit='bytes'>{len}</capacity>\n  <allocation unit='bytes'>0</allocation>\n  <target>\n    <format type='raw'/>\n    <permissions>\n      <mode>0644</mode>\n    </permissions>\n  </target>\n</volume>\n",
        escape(name)
    )
}

/// The OS disk volume's name for domain `name`.
pub fn disk_volume_name(name: &str) -> String {
    format!("{name}.qcow2")
}

/// The seed volume's name for domain `name`.
pub fn seed_volume_name(name: &str) -> String {
    format!("{name}-cidata.iso")
}

/// The snapshot nubo asks for: internal, named; with memory when the domain runs.
pub fn snapshot(name: &str) -> String {
    format!("<domainsnapshot>\n  <name>{}</name>\n</domainsnapshot>\n", escape(name))
}

#[cfg(test)]
mod tests;
