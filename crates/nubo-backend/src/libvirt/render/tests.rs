use std::path::{Path, PathBuf};

use super::*;
use crate::spec::{Disk, MachineKind, NetworkMode};

fn spec(boot: Boot) -> MachineSpec {
    MachineSpec {
        name: "web".into(),
        uuid: "6f1c2f0e-8a45-4c1e-9d0e-1b2c3d4e5f60".into(),
        vm_dir: "/var/lib/nubo/vms/web".into(),
        run_dir: "/run/nubo/vms/web".into(),
        vcpus: 2,
        memory_mib: 1024,
        disk: Disk {
            overlay: "/var/lib/nubo/libvirt-pool/web.qcow2".into(),
            base: "/var/lib/nubo/images/blobs/abc.qcow2".into(),
            base_format: "qcow2".into(),
            ..Default::default()
        },
        seed: None,
        boot,
        machine: MachineKind::Default,
        network: NetworkMode::Forward,
        ports: Vec::new(),
        options: Default::default(),
        mounts: Vec::new(),
    }
}

fn bios() -> Boot {
    Boot::Firmware {
        firmware: Firmware::Bios,
    }
}

fn params(machine: Machine, net: Net, seed: bool) -> DomainParams<'static> {
    DomainParams {
        uuid: Some("6f1c2f0e-8a45-4c1e-9d0e-1b2c3d4e5f60"),
        virt_type: "qemu",
        machine,
        seed: seed.then(|| SeedSource::Volume {
            pool: "nubo-1234abcd".into(),
            volume: "web-cidata.iso".into(),
        }),
        os_disk: true,
        net,
        console_log: Some(Path::new("/var/lib/nubo/vms/web/console.log")),
        dac: None,
    }
}

fn net() -> Net {
    Net::Network {
        name: "default".into(),
        mac: Some("52:54:00:12:34:56".into()),
    }
}

/// Compares with `testdata/<name>.xml`; `NUBO_BLESS=1` rewrites it (then review the diff).
fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("src/libvirt/testdata/{name}.xml"));
    if std::env::var_os("NUBO_BLESS").is_some() {
        std::fs::write(&path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path).unwrap();
    assert_eq!(actual, expected, "golden {name}");
}

#[test]
fn domain_bios_pc_ide_seed_golden() {
    let xml = domain(&spec(bios()), &params(Machine::Pc, net(), true));

    golden("bios-pc", &xml);
}

#[test]
fn domain_efi_q35_virtio_scsi_seed_golden() {
    let s = spec(Boot::Firmware {
        firmware: Firmware::Efi,
    });

    let xml = domain(&s, &params(Machine::Q35, net(), true));

    golden("efi-q35", &xml);
}

#[test]
fn domain_direct_kernel_golden() {
    let s = spec(Boot::Kernel {
        kernel: "/var/lib/nubo/images/boot/abc/vmlinuz".into(),
        initrd: Some("/var/lib/nubo/images/boot/abc/initrd.img".into()),
        cmdline: "root=/dev/vda1 console=ttyS0".into(),
    });

    let xml = domain(&s, &params(Machine::Pc, net(), true));

    golden("kernel", &xml);
}

#[test]
fn domain_first_define_has_no_uuid_seed_or_mac_golden() {
    let mut p = params(
        Machine::Pc,
        Net::Network {
            name: "default".into(),
            mac: None,
        },
        false,
    );
    p.uuid = None;
    p.os_disk = false;

    let xml = domain(&spec(bios()), &p);

    golden("first-define", &xml);
}

#[test]
fn domain_user_network_nonroot_seclabel_golden() {
    let mut p = params(
        Machine::Pc,
        Net::User {
            ssh_port: 40022,
            restrict: true,
        },
        true,
    );
    p.dac = Some((1000, 1000));

    let xml = domain(&spec(bios()), &p);

    golden("user-net-seclabel", &xml);
}

#[test]
fn domain_user_network_published_ports_are_hostfwds() {
    let p = params(
        Machine::Pc,
        Net::User {
            ssh_port: 40022,
            restrict: true,
        },
        true,
    );
    let mut s = spec(bios());
    s.ports = vec!["8080:80".parse().unwrap(), "5353:53/udp".parse().unwrap()];

    let xml = domain(&s, &p);

    assert!(
        xml.contains("<qemu:arg value='user,id=nubonet0,restrict=on,hostfwd=tcp:127.0.0.1:40022-:22,hostfwd=tcp:127.0.0.1:8080-:80,hostfwd=udp:127.0.0.1:5353-:53'/>"),
        "{xml}"
    );
}

#[test]
fn domain_pc_never_uses_sata() {
    let xml = domain(&spec(bios()), &params(Machine::Pc, net(), true));

    assert!(!xml.contains("sata"), "{xml}");
    assert!(xml.contains("<target dev='hdc' bus='ide'/>"), "{xml}");
}

#[test]
fn domain_q35_seed_on_virtio_scsi_not_sata() {
    let xml = domain(&spec(bios()), &params(Machine::Q35, net(), true));

    assert!(!xml.contains("sata"), "{xml}");
    assert!(xml.contains("<controller type='scsi' model='virtio-scsi'/>"), "{xml}");
    assert!(xml.contains("<target dev='sda' bus='scsi'/>"), "{xml}");
}

#[test]
fn domain_hostile_name_is_escaped() {
    let mut s = spec(bios());
    s.name = "x'/><evil a='".into();

    let xml = domain(&s, &params(Machine::Pc, net(), false));

    let parsed = crate::libvirt::xml::parse_domain(&xml).unwrap();
    assert_eq!(parsed.name.as_deref(), Some("x'/><evil a='"));
}

#[test]
fn domain_read_back_finds_marker_mac_and_seed() {
    let xml = domain(&spec(bios()), &params(Machine::Pc, net(), true));

    let info = crate::libvirt::xml::parse_domain(&xml).unwrap();

    assert_eq!(info.nubo_dir.as_deref(), Some("/var/lib/nubo/vms/web"));
    assert_eq!(info.mac.as_deref(), Some("52:54:00:12:34:56"));
    assert_eq!(info.network.as_deref(), Some("default"));
    assert_eq!(
        info.seed_volume,
        Some(("nubo-1234abcd".into(), "web-cidata.iso".into()))
    );
}

#[test]
fn parse_domain_without_marker_has_no_dir() {
    let info = crate::libvirt::xml::parse_domain("<domain><name>x</name><metadata><other:vm xmlns:other='urn:x'><other:dir>/a</other:dir></other:vm></metadata></domain>").unwrap();

    assert_eq!(info.nubo_dir, None);
}

#[test]
fn parse_domain_refuses_dtd_entities() {
    let e =
        crate::libvirt::xml::parse_domain("<!DOCTYPE d [<!ENTITY x SYSTEM 'file:///etc/passwd'>]><domain>&x;</domain>");

    assert!(e.is_err());
}

#[test]
fn seed_volume_golden() {
    golden("seed-volume", &seed_volume("web-cidata.iso", 374784, (0, 0)));
}

#[test]
fn disk_volume_golden() {
    golden(
        "disk-volume",
        &disk_volume(
            "web.qcow2",
            20 << 30,
            Path::new("/var/lib/nubo/images/blobs/abc.qcow2"),
            "qcow2",
            (1000, 1000),
        ),
    );
}

#[test]
fn disk_volume_backing_reads_back_hostile_path() {
    let base = Path::new("/x/a'</path><path>/etc/shadow");

    let xml = disk_volume("web.qcow2", 1 << 30, base, "raw", (0, 0));

    assert_eq!(
        crate::libvirt::xml::volume_backing(&xml).unwrap().as_deref(),
        Some("/x/a'</path><path>/etc/shadow")
    );
}

#[test]
fn volume_backing_absent_is_none() {
    let xml = seed_volume("web-cidata.iso", 4096, (0, 0));

    assert_eq!(crate::libvirt::xml::volume_backing(&xml).unwrap(), None);
}

#[test]
fn disk_volume_name_is_domain_dot_qcow2() {
    assert_eq!(disk_volume_name("web"), "web.qcow2");
}

#[test]
fn domain_disk_source_is_the_specs_overlay() {
    let mut s = spec(bios());
    s.disk.overlay = "/srv/pools/fast/web.qcow2".into();

    let xml = domain(&s, &params(Machine::Pc, net(), true));

    assert!(xml.contains("<source file='/srv/pools/fast/web.qcow2'/>"), "{xml}");
}

fn child<'a, 'i>(n: roxmltree::Node<'a, 'i>, tag: &str) -> Option<roxmltree::Node<'a, 'i>> {
    n.children().find(|c| c.has_tag_name(tag))
}

fn source<'a>(n: roxmltree::Node<'a, '_>) -> Option<&'a str> {
    child(n, "source").and_then(|c| c.attribute("file"))
}

/// Regression (issue 21): the domain's OS disk spells the whole chain out and ends it at the
/// base with an empty `<backingStore/>`, so neither libvirt nor QEMU follows a backing file a
/// replaced base names. Read with an XML parser, for every base format.
#[test]
fn domain_disk_chain_is_explicit_and_ends_at_base() {
    let mut s = spec(bios());
    for format in ["qcow2", "raw", "vmdk"] {
        s.disk.base_format = format.into();

        let xml = domain(&s, &params(Machine::Pc, net(), true));

        let doc = roxmltree::Document::parse(&xml).unwrap();
        let disk = doc
            .descendants()
            .find(|n| n.has_tag_name("disk") && n.attribute("device") == Some("disk"))
            .unwrap();
        let top = child(disk, "backingStore").unwrap();
        let end = child(top, "backingStore").unwrap();
        assert_eq!(source(disk), Some("/var/lib/nubo/libvirt-pool/web.qcow2"));
        assert_eq!(
            (top.attribute("type"), source(top)),
            (Some("file"), Some("/var/lib/nubo/images/blobs/abc.qcow2"))
        );
        assert_eq!(child(top, "format").and_then(|f| f.attribute("type")), Some(format));
        assert_eq!((end.has_children(), end.attributes().len()), (false, 0), "{xml}");
    }
}

#[test]
fn dir_pool_golden() {
    golden(
        "dir-pool",
        &dir_pool("nubo-1234abcd", Path::new("/var/lib/nubo/libvirt-pool")),
    );
}

const SNAPSHOT_XML: &str = "<domainsnapshot>\n  <name>s1</name>\n  <state>running</state>\n  <parent>\n    <name>s0</name>\n  </parent>\n  <creationTime>1764700000</creationTime>\n  <memory snapshot='internal'/>\n  <domain type='qemu'>\n    <name>web</name>\n    <uuid>11111111-2222-3333-4444-555555555555</uuid>\n  </domain>\n</domainsnapshot>\n";

#[test]
fn snapshot_xml_rewrite_replaces_only_the_domain_uuid() {
    let out = crate::libvirt::xml::rewrite_snapshot_uuid(SNAPSHOT_XML, "6f1c2f0e-8a45-4c1e-9d0e-1b2c3d4e5f60").unwrap();

    assert_eq!(
        out,
        SNAPSHOT_XML.replace(
            "11111111-2222-3333-4444-555555555555",
            "6f1c2f0e-8a45-4c1e-9d0e-1b2c3d4e5f60"
        )
    );
}

#[test]
fn snapshot_xml_rewrite_without_domain_is_error() {
    let e = crate::libvirt::xml::rewrite_snapshot_uuid("<domainsnapshot><name>x</name></domainsnapshot>", "u");

    assert!(e.is_err());
}

#[test]
fn parse_snapshot_reads_state_time_parent() {
    let info = crate::libvirt::xml::parse_snapshot(SNAPSHOT_XML).unwrap();

    assert_eq!(info.name, "s1");
    assert!(info.has_memory());
    assert_eq!(info.created, Some(1764700000));
    assert_eq!(info.parent.as_deref(), Some("s0"));
}

#[test]
fn snapshot_request_escapes_name() {
    assert_eq!(
        snapshot("a<b"),
        "<domainsnapshot>\n  <name>a&lt;b</name>\n</domainsnapshot>\n"
    );
}

#[test]
fn domain_shared_folders_memfd_virtiofs_golden() {
    let mut s = spec(bios());
    s.mounts = vec![
        crate::SharedDir {
            tag: "mount0".into(),
            host: "/srv/data".into(),
            guest: "/srv/data".into(),
            read_only: false,
            transport: crate::MountTransport::Virtiofs,
        },
        crate::SharedDir {
            tag: "mount1".into(),
            host: "/srv/it's <ro>".into(),
            guest: "/mnt/ro".into(),
            read_only: true,
            transport: crate::MountTransport::Virtiofs,
        },
    ];

    let xml = domain(&s, &params(Machine::Pc, net(), true));

    golden("mounts", &xml);
}

#[test]
fn domain_remote_host_has_no_serial_log_file() {
    let d = DomainParams {
        console_log: None,
        ..params(Machine::Pc, net(), true)
    };

    let x = domain(&spec(bios()), &d);

    assert!(x.contains("<serial type='pty'>\n      <target port='0'/>"), "{x}");
    assert!(!x.contains("<log "), "{x}");
}
