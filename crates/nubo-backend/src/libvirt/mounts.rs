//! Shared folders in libvirt's domain XML (pure): virtio-fs `<filesystem>` devices, which libvirt
//! serves by starting its own virtiofsd per device (found through QEMU's vhost-user descriptors,
//! `/usr/share/qemu/vhost-user/` or `/etc/qemu/vhost-user/`), and the shared memfd memory
//! vhost-user needs. Read-only is `<readonly/>`, which libvirt passes to virtiofsd as
//! `--readonly`: the device refuses writes, not the guest.

use std::fmt::Write;

use super::render::escape;
use crate::spec::MachineSpec;

/// `<memoryBacking>` for a domain with shared folders; empty without.
pub fn memory_backing(spec: &MachineSpec) -> String {
    if spec.mounts.is_empty() {
        return String::new();
    }
    "  <memoryBacking>\n    <source type='memfd'/>\n    <access mode='shared'/>\n  </memoryBacking>\n".into()
}

/// One `<filesystem>` per shared folder.
pub fn filesystems(spec: &MachineSpec) -> String {
    let mut x = String::new();
    for m in &spec.mounts {
        let _ = writeln!(
            x,
            "    <filesystem type='mount' accessmode='passthrough'>\n      <driver type='virtiofs'/>\n      <source dir='{}'/>\n      <target dir='{}'/>{}\n    </filesystem>",
            escape(&m.host.to_string_lossy()),
            escape(&m.tag),
            if m.read_only { "\n      <readonly/>" } else { "" }
        );
    }
    x
}
