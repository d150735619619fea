//! One test per validation rule, plus collection, differences and the serde round trip.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use nubo_core::size::{GIB, MIB, TIB};
use nubo_core::{ByteSize, VmName};
use proptest::prelude::*;

use crate::*;

const KEY: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq7b4C0m1VfOq2nq6m3b4e6o8kqP7Qk3pQfWw0cV1kR user@host";

fn spec() -> VmSpec {
    VmSpec::new(
        VmName::parse("web-1").unwrap(),
        DiskSource::Image {
            reference: "debian:12".into(),
        },
    )
}

/// The paths of `s`'s errors, or nothing when it is valid.
/// The checks the engine and the manifest loader pass: the seed codec's.
const SEED: PayloadChecks = PayloadChecks {
    user_data: |b| nubo_seed::validate_user_data(b).map_err(|e| e.to_string()),
    network_config: |b| nubo_seed::validate_network_config(b).map_err(|e| e.to_string()),
    vendor_data: |b| nubo_seed::validate_vendor_data(b).map_err(|e| e.to_string()),
};

fn paths(s: &VmSpec) -> Vec<String> {
    match s.validate_with(&SEED) {
        Ok(()) => Vec::new(),
        Err(e) => e.errors().iter().map(|e| e.path.clone()).collect(),
    }
}

fn message(s: &VmSpec) -> String {
    s.validate_with(&SEED).unwrap_err().to_string()
}

fn full() -> VmSpec {
    let mut s = spec();
    s.resources = Resources {
        vcpus: Some(2),
        memory: Some(ByteSize(2 * GIB)),
        disk_size: Some(ByteSize(20 * GIB)),
    };
    s.overrides = BTreeMap::from([("qemu".into(), BTreeMap::from([("accel".into(), "tcg".into())]))]);
    s.network = Network::Restricted;
    s.cloud_init = CloudInitSpec {
        hostname: Some("web-1.example".into()),
        ssh_keys: vec![KEY.into()],
        user_data: Some(Payload::new(b"#cloud-config\nruncmd: [[touch, /x]]\n".to_vec())),
        network_config: Some(Payload::new(b"version: 2\n".to_vec())),
        vendor_data: None,
        seed: None,
    };
    s.backend = Some("qemu".into());
    s.ssh_user = Some("debian".into());
    s.boot_timeout = Some(Duration::from_secs(300));
    s
}

#[test]
fn validate_defaults_is_ok() {
    let s = spec();

    let result = s.validate();

    assert_eq!(result, Ok(()));
}

#[test]
fn validate_full_spec_is_ok() {
    let s = full();

    let result = s.validate();

    assert_eq!(result, Ok(()));
}

#[test]
fn validate_vcpus_zero_reports_path() {
    let mut s = spec();
    s.resources.vcpus = Some(0);

    assert_eq!(paths(&s), ["spec.resources.vcpus"]);
}

#[test]
fn validate_vcpus_over_max_reports_path() {
    let mut s = spec();
    s.resources.vcpus = Some(289);

    assert!(message(&s).contains("spec.resources.vcpus: is 289, over the maximum of 288"));
}

#[test]
fn validate_memory_unaligned_reports_path() {
    let mut s = spec();
    s.resources.memory = Some(ByteSize(GIB + 1));

    assert_eq!(
        message(&s),
        "spec.resources.memory: is 1073741825 bytes, not a whole number of MiB: give e.g. `1024M`"
    );
}

#[test]
fn validate_memory_too_small_reports_path() {
    let mut s = spec();
    s.resources.memory = Some(ByteSize(64 * MIB));

    assert!(message(&s).starts_with("spec.resources.memory: is 64M, under the 128M"));
}

#[test]
fn validate_memory_huge_reports_path() {
    let mut s = spec();
    s.resources.memory = Some(ByteSize(99999 * TIB));

    assert!(message(&s).contains("over the limit of 16T"));
}

#[test]
fn validate_disk_size_zero_reports_path() {
    let mut s = spec();
    s.resources.disk_size = Some(ByteSize(0));

    assert_eq!(paths(&s), ["spec.resources.diskSize"]);
}

#[test]
fn validate_disk_size_unaligned_suggests_rounded_up() {
    let mut s = spec();
    s.resources.disk_size = Some(ByteSize(1000));

    assert!(message(&s).contains("give e.g. 1024"));
}

#[test]
fn validate_disk_size_huge_reports_path() {
    let mut s = spec();
    s.resources.disk_size = Some(ByteSize(65 * TIB));

    assert!(message(&s).starts_with("spec.resources.diskSize: is 65T, over the limit of 64T"));
}

#[test]
fn validate_boot_timeout_u64_max_is_refused() {
    let mut s = spec();
    s.boot_timeout = Some(Duration::from_secs(u64::MAX));

    assert_eq!(paths(&s), ["spec.bootTimeout"]);
}

#[test]
fn validate_boot_timeout_zero_is_refused() {
    let mut s = spec();
    s.boot_timeout = Some(Duration::ZERO);

    assert_eq!(paths(&s), ["spec.bootTimeout"]);
}

#[test]
fn validate_hostname_underscore_reports_path() {
    let mut s = spec();
    s.cloud_init.hostname = Some("web_1".into());

    assert!(message(&s).starts_with("spec.cloudInit.hostname: hostname `web_1` is invalid"));
}

#[test]
fn validate_user_data_plain_text_reports_path() {
    let mut s = spec();
    s.cloud_init.user_data = Some(Payload::new(b"hostname: a\n".to_vec()));

    assert_eq!(paths(&s), ["spec.cloudInit.userData"]);
}

#[test]
fn validate_without_payload_checks_leaves_content_to_the_seed() {
    let mut s = spec();
    s.cloud_init.user_data = Some(Payload::new(b"hostname: a\n".to_vec()));

    assert_eq!(s.validate(), Ok(()));
}

#[test]
fn validate_without_payload_checks_still_refuses_17_mib() {
    let mut s = spec();
    s.cloud_init.user_data = Some(Payload::new(vec![b'#'; 17 * MIB as usize]));

    assert!(s.validate().is_err());
}

#[test]
fn validate_user_data_17_mib_is_refused_before_parsing() {
    let mut s = spec();
    s.cloud_init.user_data = Some(Payload::new(vec![b'#'; 17 * MIB as usize]));

    assert!(message(&s).contains("is 17825792 bytes, over the seed's 16M limit"));
}

#[test]
fn validate_vendor_data_17_mib_is_refused() {
    let mut s = spec();
    s.cloud_init.vendor_data = Some(Payload::new(vec![0; 17 * MIB as usize]));

    assert_eq!(paths(&s), ["spec.cloudInit.vendorData"]);
}

#[test]
fn validate_network_config_digest_only_is_refused() {
    let mut s = full();
    let json = serde_json::to_string(&s).unwrap();
    s = serde_json::from_str(&json).unwrap();
    s.cloud_init.user_data = None;

    assert_eq!(paths(&s), ["spec.cloudInit.networkConfig"]);
}

#[test]
fn validate_ssh_key_unknown_type_reports_index() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec![KEY.into(), "ssh-foo AAAA x".into()];

    assert!(message(&s)
        .starts_with("spec.cloudInit.sshKeys[1]: is not a public key line: it does not start with a key type"));
}

#[test]
fn validate_ssh_key_private_key_says_so() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec!["-----BEGIN OPENSSH PRIVATE KEY-----".into()];

    assert!(message(&s).contains("this is a private key"));
}

#[test]
fn validate_ssh_key_two_lines_is_refused() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec![format!("{KEY}\n{KEY}")];

    assert!(message(&s).contains("holds several lines"));
}

#[test]
fn validate_ssh_key_trailing_newline_is_accepted() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec![format!("{KEY}\n")];

    assert_eq!(paths(&s), Vec::<String>::new());
}

#[test]
fn validate_ssh_key_control_char_is_refused() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec![format!("{KEY}\x1b[2J")];

    assert!(message(&s).contains("contains `\\u{1b}`"));
}

#[test]
fn validate_ssh_key_too_long_is_refused() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec![format!("ssh-rsa {}", "A".repeat(20_000))];

    assert!(message(&s).contains("over the 16384 of any real key line"));
}

#[test]
fn validate_ssh_key_type_alone_is_refused() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec!["ssh-ed25519".into()];

    assert!(message(&s).contains("no key after it"));
}

#[test]
fn validate_ssh_key_certificate_is_accepted() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec!["ssh-ed25519-cert-v01@openssh.com AAAA".into()];

    assert_eq!(paths(&s), Vec::<String>::new());
}

#[test]
fn validate_ssh_user_option_shaped_refused() {
    let mut s = spec();
    s.ssh_user = Some("-oProxyCommand=touch /tmp/x".into());

    assert!(message(&s).starts_with("spec.sshUser: user name `-oProxyCommand=touch /tmp/x` starts with `-`"));
}

#[test]
fn validate_ssh_user_too_long_refused() {
    let mut s = spec();
    s.ssh_user = Some("a".repeat(33));

    assert_eq!(paths(&s), ["spec.sshUser"]);
}

#[test]
fn validate_ssh_user_with_space_refused() {
    let mut s = spec();
    s.ssh_user = Some("a b".into());

    assert!(message(&s).contains("contains ` `"));
}

#[test]
fn check_ssh_user_portable_names_accepted() {
    let names = ["debian", "_svc", "ec2-user", "a.b", "u1"];

    let results: Vec<bool> = names.iter().map(|n| check_ssh_user(n).is_ok()).collect();

    assert_eq!(results, [true; 5]);
}

#[test]
fn validate_seed_with_hostname_and_keys_names_both() {
    let mut s = spec();
    s.cloud_init.seed = Some("/srv/seed.iso".into());
    s.cloud_init.hostname = Some("a".into());
    s.cloud_init.ssh_keys = vec![KEY.into()];

    assert!(message(&s).starts_with("spec.cloudInit.seed: is attached as is, so hostname, sshKeys cannot be added"));
}

#[test]
fn validate_seed_alone_is_accepted() {
    let mut s = spec();
    s.cloud_init.seed = Some("/srv/seed.iso".into());

    assert_eq!(paths(&s), Vec::<String>::new());
}

#[test]
fn validate_kernel_with_firmware_reports_firmware() {
    let mut s = spec();
    s.firmware = Firmware::Efi;
    s.boot = Some(KernelBoot {
        kernel: "/boot/vmlinuz".into(),
        initrd: None,
        cmdline: None,
    });

    assert!(message(&s).starts_with("spec.firmware: is efi, but a kernel boots without firmware"));
}

#[test]
fn validate_cmdline_newline_reports_path() {
    let mut s = spec();
    s.boot = Some(KernelBoot {
        kernel: "/boot/vmlinuz".into(),
        initrd: None,
        cmdline: Some("console=ttyS0\ninit=/bin/sh".into()),
    });

    assert_eq!(paths(&s), ["spec.boot.cmdline"]);
}

#[test]
fn validate_cmdline_too_long_reports_path() {
    let mut s = spec();
    s.boot = Some(KernelBoot {
        kernel: "/boot/vmlinuz".into(),
        initrd: None,
        cmdline: Some("a".repeat(4097)),
    });

    assert!(message(&s).contains("over the 4096 a kernel accepts"));
}

#[test]
fn validate_relative_paths_report_each() {
    let mut s = spec();
    s.source = DiskSource::Disk {
        path: "disk.qcow2".into(),
    };
    s.firmware = Firmware::Path("OVMF_CODE.fd".into());
    s.cloud_init.seed = Some("seed.iso".into());

    assert_eq!(
        paths(&s),
        ["spec.source.disk.path", "spec.firmware.path", "spec.cloudInit.seed"]
    );
}

#[test]
fn validate_initrd_with_nul_reports_path() {
    let mut s = spec();
    s.boot = Some(KernelBoot {
        kernel: "/boot/vmlinuz".into(),
        initrd: Some("/boot/initrd\0x".into()),
        cmdline: None,
    });

    assert!(message(&s).starts_with("spec.boot.initrd: contains a NUL byte"));
}

#[test]
fn validate_microvm_with_bios_reports_machine() {
    let mut s = spec();
    s.machine = Machine::Microvm;
    s.firmware = Firmware::Bios;

    assert_eq!(paths(&s), ["spec.machine"]);
}

#[test]
fn validate_backend_uppercase_reports_path() {
    let mut s = spec();
    s.backend = Some("QEMU".into());

    assert!(message(&s).starts_with("spec.backend: backend id `QEMU` starts with `Q`"));
}

#[test]
fn validate_named_network_slash_reports_path() {
    let mut s = spec();
    s.network = Network::Named("../etc".into());

    assert_eq!(paths(&s), ["spec.network.named"]);
}

#[test]
fn validate_override_control_char_reports_key_path() {
    let mut s = spec();
    s.overrides = BTreeMap::from([("qemu".into(), BTreeMap::from([("machine".into(), "q35\n-x".into())]))]);

    assert_eq!(paths(&s), ["spec.overrides.qemu.machine"]);
}

/// Issue 21: a libvirt URI with the `ext` transport made libvirt run `command=` during a dry run.
#[test]
fn validate_libvirt_uri_ext_transport_reports_path() {
    let mut s = spec();
    s.overrides = BTreeMap::from([(
        "libvirt".into(),
        BTreeMap::from([("uri".into(), "qemu+ext:///system?command=/abs/pwn.sh".into())]),
    )]);

    assert_eq!(paths(&s), ["spec.overrides.libvirt.uri"]);
    assert!(message(&s).contains("`ext`"));
}

#[test]
fn validate_libvirt_uri_alias_backend_is_checked() {
    let mut s = spec();
    s.overrides = BTreeMap::from([(
        "virt".into(),
        BTreeMap::from([("uri".into(), "qemu:///system?socket=/tmp/x".into())]),
    )]);

    assert_eq!(paths(&s), ["spec.overrides.virt.uri"]);
}

#[test]
fn validate_libvirt_uri_tls_is_accepted() {
    let mut s = spec();
    s.overrides = BTreeMap::from([(
        "libvirt".into(),
        BTreeMap::from([("uri".into(), "qemu+tls://hv1.example:16514/system".into())]),
    )]);

    assert_eq!(paths(&s), Vec::<String>::new());
}

#[test]
fn validate_override_bad_backend_key_reports_path() {
    let mut s = spec();
    s.overrides = BTreeMap::from([("Qemu".into(), BTreeMap::new())]);

    assert_eq!(paths(&s), ["spec.overrides.Qemu"]);
}

#[test]
fn validate_image_reference_with_space_reports_path() {
    let mut s = spec();
    s.source = DiskSource::Image {
        reference: "debian 12".into(),
    };

    assert_eq!(paths(&s), ["spec.source.image.reference"]);
}

#[test]
fn validate_image_reference_oci_digest_is_accepted() {
    let mut s = spec();
    s.source = DiskSource::Image {
        reference: format!("ghcr.io/nubo/debian@sha256:{}", "a".repeat(64)),
    };

    assert_eq!(paths(&s), Vec::<String>::new());
}

#[test]
fn validate_url_http_without_allow_reports_path() {
    let mut s = spec();
    s.source = DiskSource::Url {
        url: "http://example.org/a.qcow2".into(),
        checksum: None,
        insecure_no_checksum: false,
        allow_http: false,
    };

    assert!(message(&s).starts_with("spec.source.url.url: `http://example.org/a.qcow2` is plain http"));
}

#[test]
fn validate_url_http_with_allow_is_accepted() {
    let mut s = spec();
    s.source = DiskSource::Url {
        url: "HTTP://example.org/a.qcow2".into(),
        checksum: Some(format!("sha512:{}", "0".repeat(128))),
        insecure_no_checksum: false,
        allow_http: true,
    };

    assert_eq!(paths(&s), Vec::<String>::new());
}

#[test]
fn validate_url_bad_checksum_and_insecure_reports_both() {
    let mut s = spec();
    s.source = DiskSource::Url {
        url: "https://example.org/a b".into(),
        checksum: Some("md5:abc".into()),
        insecure_no_checksum: true,
        allow_http: false,
    };

    assert_eq!(
        paths(&s),
        [
            "spec.source.url.url",
            "spec.source.url.checksum",
            "spec.source.url.insecureNoChecksum"
        ]
    );
}

#[test]
fn validate_url_ftp_reports_path() {
    let mut s = spec();
    s.source = DiskSource::Url {
        url: "ftp://example.org/a".into(),
        checksum: None,
        insecure_no_checksum: false,
        allow_http: false,
    };

    assert_eq!(paths(&s), ["spec.source.url.url"]);
}

#[test]
fn validate_many_problems_collects_all() {
    let mut s = spec();
    s.resources.vcpus = Some(0);
    s.resources.memory = Some(ByteSize(GIB + 1));
    s.ssh_user = Some("-x".into());
    s.boot_timeout = Some(Duration::from_secs(u64::MAX));

    assert_eq!(
        paths(&s),
        [
            "spec.resources.vcpus",
            "spec.resources.memory",
            "spec.sshUser",
            "spec.bootTimeout"
        ]
    );
}

#[test]
fn differences_equal_specs_is_empty() {
    let (a, b) = (full(), full());

    let d = a.differences(&b);

    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn differences_memory_and_user_data_by_path() {
    let a = full();
    let mut b = full();
    b.resources.memory = Some(ByteSize(4 * GIB));
    b.cloud_init.user_data = Some(Payload::new(b"#cloud-config\n".to_vec()));

    let d = a.differences(&b);

    assert_eq!(d.len(), 2, "{d:?}");
    assert!(
        d[0].starts_with("spec.cloudInit.userData: sha256:") && !d[0].contains("cloud-config"),
        "{d:?}"
    );
    assert_eq!(d[1], "spec.resources.memory: 2G -> 4G");
}

/// Found by the vm_lifecycle live test: `create --wait` then `create` was a "different spec".
#[test]
fn differences_boot_timeout_ignored() {
    let a = full();
    let mut b = full();
    b.boot_timeout = None;

    let d = a.differences(&b);

    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn differences_unset_field_says_unset() {
    let a = spec();
    let mut b = spec();
    b.ssh_user = Some("debian".into());

    let d = a.differences(&b);

    assert_eq!(d, ["spec.sshUser: unset -> \"debian\""]);
}

#[test]
fn differences_payload_read_back_from_record_is_equal() {
    let a = full();
    let b: VmSpec = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();

    let d = a.differences(&b);

    assert!(d.is_empty(), "{d:?}");
}

#[test]
fn serde_round_trip_is_equal_without_payload_content() {
    let mut a = full();
    a.boot = Some(KernelBoot {
        kernel: "/boot/vmlinuz".into(),
        initrd: Some("/boot/initrd.img".into()),
        cmdline: Some("console=ttyS0".into()),
    });
    a.firmware = Firmware::Auto;
    a.network = Network::Named("default".into());

    let json = serde_json::to_string_pretty(&a).unwrap();
    let b: VmSpec = serde_json::from_str(&json).unwrap();

    assert_eq!(b, a);
    assert!(b.cloud_init.user_data.as_ref().unwrap().content().is_none());
    assert!(!json.contains("runcmd"), "{json}");
}

#[test]
fn serde_manifest_shape_deserialises() {
    let json = r##"{
        "name": "web-1",
        "source": {"url": {"url": "https://example.org/a.qcow2", "allowHttp": false}},
        "resources": {"vcpus": 2, "memory": 1073741824},
        "firmware": {"path": "/usr/share/OVMF/OVMF_CODE.fd"},
        "machine": "microvm",
        "network": "restricted",
        "cloudInit": {"userData": "#cloud-config\n", "sshKeys": []},
        "bootTimeout": "5m"
    }"##;

    let s: VmSpec = serde_json::from_str(json).unwrap();

    assert_eq!(s.boot_timeout, Some(Duration::from_secs(300)));
    assert_eq!(
        s.firmware,
        Firmware::Path(PathBuf::from("/usr/share/OVMF/OVMF_CODE.fd"))
    );
    assert_eq!(s.cloud_init.user_data.unwrap().content(), Some(&b"#cloud-config\n"[..]));
}

#[test]
fn serde_network_none_is_the_word_none() {
    let mut s = VmSpec::new(
        VmName::parse("web-1").unwrap(),
        DiskSource::Image {
            reference: "debian:12".into(),
        },
    );
    s.network = Network::None;

    let json = serde_json::to_value(&s).unwrap();
    let back: VmSpec = serde_json::from_value(json.clone()).unwrap();

    assert_eq!(json["network"], "none");
    assert_eq!(back.network, Network::None);
}

#[test]
fn serde_unknown_field_is_refused() {
    let json = r#"{"name": "web-1", "source": {"image": {"reference": "debian:12"}}, "memroy": 1}"#;

    let err = serde_json::from_str::<VmSpec>(json).unwrap_err();

    assert!(err.to_string().contains("memroy"), "{err}");
}

#[test]
fn serde_bad_boot_timeout_names_value() {
    let json = r#"{"name": "web-1", "source": {"image": {"reference": "debian:12"}}, "bootTimeout": "5 parsecs"}"#;

    let err = serde_json::from_str::<VmSpec>(json).unwrap_err();

    assert!(err.to_string().contains("`5 parsecs`"), "{err}");
}

#[test]
fn serde_defaults_are_omitted() {
    let s = spec();

    let json = serde_json::to_string(&s).unwrap();

    assert_eq!(
        json,
        r#"{"name":"web-1","source":{"image":{"reference":"debian:12"}},"resources":{},"firmware":"auto","machine":"default","network":"forward","cloudInit":{}}"#
    );
}

fn arb_path() -> impl Strategy<Value = PathBuf> {
    prop_oneof![".*", "/[a-z/]{0,20}", "[\\x00-\\x7f]{0,10}"].prop_map(PathBuf::from)
}

fn arb_spec() -> impl Strategy<Value = VmSpec> {
    let source = prop_oneof![
        ".*".prop_map(|reference| DiskSource::Image { reference }),
        arb_path().prop_map(|path| DiskSource::Disk { path }),
        (".*", prop::option::of(".*"), any::<bool>(), any::<bool>()).prop_map(
            |(url, checksum, insecure_no_checksum, allow_http)| DiskSource::Url {
                url,
                checksum,
                insecure_no_checksum,
                allow_http,
            }
        ),
    ];
    let resources = (
        prop::option::of(any::<u32>()),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(vcpus, memory, disk)| Resources {
            vcpus,
            memory: memory.map(ByteSize),
            disk_size: disk.map(ByteSize),
        });
    let firmware = prop_oneof![
        Just(Firmware::Auto),
        Just(Firmware::Bios),
        Just(Firmware::Efi),
        arb_path().prop_map(Firmware::Path)
    ];
    let boot = prop::option::of(
        (arb_path(), prop::option::of(arb_path()), prop::option::of(".*")).prop_map(|(kernel, initrd, cmdline)| {
            KernelBoot {
                kernel,
                initrd,
                cmdline,
            }
        }),
    );
    let cloud_init = (
        prop::option::of(".*"),
        prop::collection::vec(".*", 0..3),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..64)),
        prop::option::of(arb_path()),
    )
        .prop_map(|(hostname, ssh_keys, user_data, seed)| CloudInitSpec {
            hostname,
            ssh_keys,
            user_data: user_data.map(Payload::new),
            network_config: None,
            vendor_data: None,
            seed,
        });
    let rest = (
        prop::collection::btree_map(".*", prop::collection::btree_map(".*", ".*", 0..2), 0..2),
        prop_oneof![
            Just(Network::Forward),
            Just(Network::Restricted),
            Just(Network::None),
            ".*".prop_map(Network::Named)
        ],
        prop::option::of(".*"),
        prop::option::of(".*"),
        prop::option::of((any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n))),
        any::<bool>(),
    );
    (source, resources, firmware, boot, cloud_init, rest).prop_map(
        |(
            source,
            resources,
            firmware,
            boot,
            cloud_init,
            (overrides, network, backend, ssh_user, boot_timeout, micro),
        )| {
            let mut s = spec();
            s.source = source;
            s.resources = resources;
            s.firmware = firmware;
            s.boot = boot;
            s.machine = if micro { Machine::Microvm } else { Machine::Default };
            s.overrides = overrides;
            s.network = network;
            s.cloud_init = cloud_init;
            s.backend = backend;
            s.ssh_user = ssh_user;
            s.boot_timeout = boot_timeout;
            s
        },
    )
}

proptest! {
    #[test]
    fn validate_arbitrary_spec_never_panics(s in arb_spec()) {
        let result = s.validate();

        if let Err(e) = result {
            prop_assert!(!e.errors().is_empty());
        }
    }

    #[test]
    fn differences_arbitrary_specs_never_panic(a in arb_spec(), b in arb_spec()) {
        let d = a.differences(&b);

        // Equal but for the boot timeout, which is how long a wait waits, not part of the VM.
        let same_vm = VmSpec { boot_timeout: None, ..a.clone() } == VmSpec { boot_timeout: None, ..b.clone() };
        prop_assert_eq!(d.is_empty(), same_vm);
    }
}

/// A billion-node alias bomb (issue 21 item 10): nine levels of ten aliases each.
fn alias_bomb(header: &str) -> Vec<u8> {
    let mut t = format!("{header}a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        t.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    t.into_bytes()
}

#[test]
fn validate_network_config_alias_bomb_is_refused() {
    let mut s = spec();
    s.cloud_init.network_config = Some(Payload::new(alias_bomb("")));

    assert_eq!(paths(&s), ["spec.cloudInit.networkConfig"]);
}

#[test]
fn validate_vendor_data_alias_bomb_is_refused() {
    let mut s = spec();
    s.cloud_init.vendor_data = Some(Payload::new(alias_bomb("#cloud-config\n")));

    assert_eq!(paths(&s), ["spec.cloudInit.vendorData"]);
}

#[test]
fn validate_ssh_key_secret_line_is_not_quoted() {
    let mut s = spec();
    s.cloud_init.ssh_keys = vec!["root:$6$SECRETMARKER:19000:0:99999:7:::".into()];

    assert!(!message(&s).contains("SECRETMARKER"), "{}", message(&s));
}
