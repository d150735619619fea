//! Shared folders in libvirt's domain XML (pure): virtio-fs `<filesystem>` devices, which libvirt
//! serves by starting its own virtiofsd per device (found through QEMU's vhost-user descriptors,
//! `/usr/share/qemu/vhost-user/` or `/etc/qemu/vhost-user/`), and the shared memfd memory
//! vhost-user needs. Read-only is `<readonly/>`, which libvirt passes to virtiofsd as
//! `--readonly`: the device refuses writes, not the guest.

use super::render::escape;
use crate::spec::{MachineSpec, SharedDir};

/// `<memoryBacking>` for a domain with shared folders; empty without.
pub fn memory_backing(spec: &MachineSpec) -> String {
    if spec.mounts.is_empty() {
        return String::new();
    }
    "  <memoryBacking>\n    <source type='memfd'/>\n    <access mode='shared'/>\n  </memoryBacking>\n".into()
}

/// One `<filesystem>` per shared folder.
pub fn filesystems(spec: &MachineSpec) -> String {
    spec.mounts.iter().map(|m| filesystem(m) + "\n").collect()
}

/// The `<filesystem>` of one folder: what the domain XML holds, and what `vm mount` attaches.
pub fn filesystem(m: &SharedDir) -> String {
    format!(
        "    <filesystem type='mount' accessmode='passthrough'>\n      <driver type='virtiofs'/>\n      <source dir='{}'/>\n      <target dir='{}'/>{}\n    </filesystem>",
        escape(&m.host.to_string_lossy()),
        escape(&m.tag),
        if m.read_only { "\n      <readonly/>" } else { "" }
    )
}

/// Free `pcie-root-port`s a q35 domain with shared folders keeps for `vm mount`: a q35 machine
/// hot-plugs a PCIe device only into an empty root port, and libvirt adds none beyond its
/// devices' (virt-install adds spares the same way).
pub const SPARE_ROOT_PORTS: usize = 4;

/// The domain XML as libvirt defined it (addresses assigned), with root ports added so that
/// [`SPARE_ROOT_PORTS`] are empty; `None` when it needs none (not q35, no shared folder, or
/// enough spares already).
pub fn with_spare_root_ports(defined: &str) -> Result<Option<String>, String> {
    let doc = roxmltree::Document::parse(defined).map_err(|e| e.to_string())?;
    let q35 = doc
        .descendants()
        .any(|n| n.has_tag_name("type") && n.attribute("machine").is_some_and(|m| m.contains("q35")));
    let shares = doc.descendants().any(|n| n.has_tag_name("filesystem"));
    if !q35 || !shares {
        return Ok(None);
    }
    let parse_hex = |s: &str| u32::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let used: Vec<u32> = doc
        .descendants()
        .filter(|n| n.has_tag_name("address") && n.attribute("type") == Some("pci"))
        .filter_map(|n| n.attribute("bus").and_then(parse_hex))
        .collect();
    let free = doc
        .descendants()
        .filter(|n| {
            n.has_tag_name("controller")
                && n.attribute("type") == Some("pci")
                && n.attribute("model") == Some("pcie-root-port")
        })
        .filter_map(|n| n.attribute("index").and_then(|i| i.parse::<u32>().ok()))
        .filter(|i| !used.contains(i))
        .count();
    if free >= SPARE_ROOT_PORTS {
        return Ok(None);
    }
    let Some(end) = defined.rfind("</devices>") else {
        return Err("the domain XML has no </devices>".into());
    };
    let ports = "  <controller type='pci' model='pcie-root-port'/>\n  ".repeat(SPARE_ROOT_PORTS - free);
    Ok(Some(format!("{}{ports}{}", &defined[..end], &defined[end..])))
}

/// Whether the live domain XML shares its memory (`<memoryBacking><access mode='shared'/>`),
/// which vhost-user needs from boot, and holds a `<filesystem>` of tag `tag`.
pub fn live_facts(xml: &str, tag: &str) -> Result<(bool, bool), String> {
    let doc = roxmltree::Document::parse(xml).map_err(|e| e.to_string())?;
    let shared = doc.descendants().any(|n| {
        n.has_tag_name("access")
            && n.attribute("mode") == Some("shared")
            && n.parent().is_some_and(|p| p.has_tag_name("memoryBacking"))
    });
    let has = doc.descendants().filter(|n| n.has_tag_name("filesystem")).any(|f| {
        f.children()
            .any(|c| c.has_tag_name("target") && c.attribute("dir") == Some(tag))
    });
    Ok((shared, has))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What libvirt makes of a q35 domain with one folder: its devices each in a root port.
    fn defined(machine: &str, ports: &[u32], used: &[u32], fs: bool) -> String {
        let mut x = format!("<domain type='qemu'><os><type arch='x86_64' machine='{machine}'>hvm</type></os><devices>");
        for p in ports {
            x += &format!("<controller type='pci' index='{p}' model='pcie-root-port'><address type='pci' domain='0x0000' bus='0x00' slot='0x02' function='0x{p:x}'/></controller>");
        }
        for u in used {
            x += &format!("<disk type='file'><address type='pci' domain='0x0000' bus='0x{u:02x}' slot='0x00' function='0x0'/></disk>");
        }
        if fs {
            x += "<filesystem type='mount'><target dir='mount0'/></filesystem>";
        }
        x + "</devices></domain>"
    }

    #[test]
    fn spare_root_ports_added_to_q35_with_folders() {
        let xml = defined("pc-q35-10.0", &[1, 2, 3], &[1, 2], true);

        let again = with_spare_root_ports(&xml).unwrap().unwrap();

        // One port was free: three more make four.
        assert_eq!(again.matches("model='pcie-root-port'/>").count(), 3);
        assert!(again.ends_with("</devices></domain>"));
        assert!(roxmltree::Document::parse(&again).is_ok());
    }

    #[test]
    fn spare_root_ports_not_added_when_not_needed() {
        assert_eq!(
            with_spare_root_ports(&defined("pc-i440fx-10.0", &[], &[], true)).unwrap(),
            None
        );
        assert_eq!(
            with_spare_root_ports(&defined("pc-q35-10.0", &[1], &[1], false)).unwrap(),
            None
        );
        assert_eq!(
            with_spare_root_ports(&defined("pc-q35-10.0", &[1, 2, 3, 4, 5], &[1], true)).unwrap(),
            None
        );
    }

    #[test]
    fn live_facts_reads_shared_memory_and_the_tag() {
        let xml = "<domain><memoryBacking><source type='memfd'/><access mode='shared'/></memoryBacking><devices><filesystem type='mount'><driver type='virtiofs'/><target dir='mount1'/></filesystem></devices></domain>";

        assert_eq!(live_facts(xml, "mount1").unwrap(), (true, true));
        assert_eq!(live_facts(xml, "mount2").unwrap(), (true, false));
        assert_eq!(
            live_facts("<domain><devices/></domain>", "mount1").unwrap(),
            (false, false)
        );
    }

    #[test]
    fn filesystem_escapes_the_host_path() {
        let d = SharedDir {
            tag: "mount3".into(),
            host: "/srv/a'<b".into(),
            guest: "/mnt/x".into(),
            read_only: true,
            transport: crate::MountTransport::Virtiofs,
        };

        let x = filesystem(&d);

        assert!(
            x.contains("<source dir='/srv/a&apos;&lt;b'/>") && x.contains("<readonly/>"),
            "{x}"
        );
        assert!(roxmltree::Document::parse(&x).is_ok());
    }
}
