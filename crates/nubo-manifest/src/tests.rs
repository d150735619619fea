//! Golden lowering tests (manifest -> VmSpec, one per field) and the error-position corpus
//! (every broken manifest refused at `file:line:col: path: message`).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nubo_core::{ByteSize, VmName};
use nubo_spec::{CloudInitSpec, DiskSource, Firmware, KernelBoot, Machine, Network, Payload, VmSpec};

use super::*;

/// Files in memory, so lowering tests read no host file. Home is inside `/m`, the manifests'
/// directory, so `~/` paths pass the default (lexical) load restriction.
struct MemFiles(HashMap<PathBuf, Vec<u8>>);

impl Files for MemFiles {
    fn read(&self, path: &Path, what: &str, max: u64) -> Result<Vec<u8>, String> {
        match self.0.get(path) {
            Some(b) if b.len() as u64 > max => Err(format!("{what} {} is over {max} bytes", path.display())),
            Some(b) => Ok(b.clone()),
            None => Err(format!("{what} {}: no such file", path.display())),
        }
    }

    fn home(&self) -> Option<PathBuf> {
        Some(PathBuf::from("/m/home/u"))
    }
}

fn files() -> MemFiles {
    MemFiles(HashMap::from([
        (
            PathBuf::from("/m/user-data.yaml"),
            b"#cloud-config\nruncmd: [true]\n".to_vec(),
        ),
        (PathBuf::from("/m/net.yaml"), b"version: 2\n".to_vec()),
        (PathBuf::from("/m/vendor.yaml"), b"#cloud-config\n".to_vec()),
        (
            PathBuf::from("/m/home/u/.ssh/id_ed25519.pub"),
            b"# mine\nssh-ed25519 AAAAfile me@host\n\nssh-rsa AAAArsa other\n".to_vec(),
        ),
    ]))
}

const HEAD: &str = "apiVersion: nubo.dev/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: web\nspec:\n";

/// A VirtualMachine named `web` whose spec is `body` (already indented by two).
fn vm(body: &str) -> String {
    format!("{HEAD}{body}")
}

fn source(text: &str) -> Source {
    Source {
        file: "vm.yaml".into(),
        dir: PathBuf::from("/m"),
        bytes: text.as_bytes().to_vec(),
    }
}

fn lower_text(text: &str) -> Result<Vec<Lowered>, ManifestErrors> {
    read_all(&[source(text)], &files())
}

fn spec_of(text: &str) -> VmSpec {
    let mut l = lower_text(text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(l.len(), 1);
    l.remove(0).spec
}

/// The one error `text` gives, as shown.
fn error_of(text: &str) -> String {
    let e = lower_text(text).expect_err("refused");
    assert_eq!(e.errors().len(), 1, "{e}");
    e.to_string()
}

fn web(source: DiskSource) -> VmSpec {
    VmSpec::new(VmName::parse("web").unwrap(), source)
}

fn debian() -> VmSpec {
    web(DiskSource::Image {
        reference: "debian:12".into(),
    })
}

// ---------------------------------------------------------------------------------------------
// Golden lowering, one field at a time

#[test]
fn lower_image_is_image_source() {
    assert_eq!(spec_of(&vm("  image: debian:12\n")), debian());
}

#[test]
fn lower_disk_relative_to_manifest_dir() {
    let spec = spec_of(&vm("  disk: ./disks/base.qcow2\n"));

    assert_eq!(
        spec,
        web(DiskSource::Disk {
            path: "/m/disks/base.qcow2".into()
        })
    );
}

#[test]
fn lower_url_checksum_insecure_allow_http() {
    let sum = format!("sha256:{}", "a".repeat(64));
    let spec = spec_of(&vm(&format!(
        "  url: http://mirror.example/x.qcow2\n  checksum: {sum}\n  allowHttp: true\n"
    )));

    assert_eq!(
        spec,
        web(DiskSource::Url {
            url: "http://mirror.example/x.qcow2".into(),
            checksum: Some(sum),
            insecure_no_checksum: false,
            allow_http: true,
        })
    );
}

#[test]
fn lower_url_insecure_no_checksum() {
    let spec = spec_of(&vm(
        "  url: https://mirror.example/x.qcow2\n  insecureNoChecksum: true\n",
    ));

    assert_eq!(
        spec.source,
        DiskSource::Url {
            url: "https://mirror.example/x.qcow2".into(),
            checksum: None,
            insecure_no_checksum: true,
            allow_http: false,
        }
    );
}

#[test]
fn lower_resources_vcpus_memory_disk_size() {
    let spec = spec_of(&vm(
        "  image: debian:12\n  resources: { vcpus: 2, memory: 2G, diskSize: 20G }\n",
    ));

    let mut want = debian();
    want.resources.vcpus = Some(2);
    want.resources.memory = Some(ByteSize(2 << 30));
    want.resources.disk_size = Some(ByteSize(20 << 30));
    assert_eq!(spec, want);
}

#[test]
fn lower_firmware_words_and_path() {
    let cases = [
        ("auto", Firmware::Auto),
        ("bios", Firmware::Bios),
        ("efi", Firmware::Efi),
        ("./OVMF_CODE.fd", Firmware::Path("/m/OVMF_CODE.fd".into())),
    ];

    for (text, want) in cases {
        let spec = spec_of(&vm(&format!("  image: debian:12\n  firmware: {text}\n")));

        assert_eq!(spec.firmware, want, "{text}");
    }
}

#[test]
fn lower_boot_kernel_initrd_cmdline() {
    let spec = spec_of(&vm(
        "  image: debian:12\n  boot:\n    kernel: vmlinuz\n    initrd: ~/initrd.img\n    cmdline: root=/dev/vda1 console=ttyS0\n",
    ));

    assert_eq!(
        spec.boot,
        Some(KernelBoot {
            kernel: "/m/vmlinuz".into(),
            initrd: Some("/m/home/u/initrd.img".into()),
            cmdline: Some("root=/dev/vda1 console=ttyS0".into()),
        })
    );
}

#[test]
fn lower_machine_microvm() {
    let spec = spec_of(&vm("  image: debian:12\n  machine: microvm\n"));

    assert_eq!(spec.machine, Machine::Microvm);
}

#[test]
fn lower_overrides_qemu() {
    let spec = spec_of(&vm(
        "  image: debian:12\n  overrides:\n    qemu: { machine: q35, accel: tcg }\n",
    ));

    let qemu = BTreeMap::from([
        ("accel".to_owned(), "tcg".to_owned()),
        ("machine".to_owned(), "q35".to_owned()),
    ]);
    assert_eq!(spec.overrides, BTreeMap::from([("qemu".to_owned(), qemu)]));
}

#[test]
fn lower_network_words_and_name() {
    let cases = [
        ("forward", Network::Forward),
        ("restricted", Network::Restricted),
        ("none", Network::None),
        ("default", Network::Named("default".into())),
    ];

    for (text, want) in cases {
        let spec = spec_of(&vm(&format!("  image: debian:12\n  network: {text}\n")));

        assert_eq!(spec.network, want, "{text}");
    }
}

#[test]
fn lower_backend_ssh_user_boot_timeout() {
    let spec = spec_of(&vm(
        "  image: debian:12\n  backend: qemu\n  sshUser: debian\n  bootTimeout: 5m\n",
    ));

    let mut want = debian();
    want.backend = Some("qemu".into());
    want.ssh_user = Some("debian".into());
    want.boot_timeout = Some(Duration::from_secs(300));
    assert_eq!(spec, want);
    assert_eq!(spec.boot_timeout, want.boot_timeout);
}

#[test]
fn lower_cloud_init_inline() {
    let spec = spec_of(&vm(concat!(
        "  image: debian:12\n",
        "  cloudInit:\n",
        "    hostname: web-1\n",
        "    sshKeys: [\"ssh-ed25519 AAAAinline me\"]\n",
        "    userData: |\n",
        "      #cloud-config\n",
        "      runcmd: [true]\n",
        "    networkConfig: |\n",
        "      version: 2\n",
        "    vendorData: \"#cloud-config\\n\"\n",
    )));

    assert_eq!(
        spec.cloud_init,
        CloudInitSpec {
            hostname: Some("web-1".into()),
            ssh_keys: vec!["ssh-ed25519 AAAAinline me".into()],
            user_data: Some(Payload::new(b"#cloud-config\nruncmd: [true]\n".to_vec())),
            network_config: Some(Payload::new(b"version: 2\n".to_vec())),
            vendor_data: Some(Payload::new(b"#cloud-config\n".to_vec())),
            seed: None,
        }
    );
}

#[test]
fn lower_cloud_init_files_and_key_file() {
    let spec = spec_of(&vm(concat!(
        "  image: debian:12\n",
        "  cloudInit:\n",
        "    sshKeys: [\"ssh-ed25519 AAAAinline me\", \"@~/.ssh/id_ed25519.pub\"]\n",
        "    userDataFile: ./user-data.yaml\n",
        "    networkConfigFile: net.yaml\n",
        "    vendorDataFile: vendor.yaml\n",
    )));

    assert_eq!(
        spec.cloud_init,
        CloudInitSpec {
            hostname: None,
            ssh_keys: vec![
                "ssh-ed25519 AAAAinline me".into(),
                "ssh-ed25519 AAAAfile me@host".into(),
                "ssh-rsa AAAArsa other".into()
            ],
            user_data: Some(Payload::new(b"#cloud-config\nruncmd: [true]\n".to_vec())),
            network_config: Some(Payload::new(b"version: 2\n".to_vec())),
            vendor_data: Some(Payload::new(b"#cloud-config\n".to_vec())),
            seed: None,
        }
    );
}

#[test]
fn lower_cloud_init_seed_relative() {
    let spec = spec_of(&vm("  image: debian:12\n  cloudInit:\n    seed: seeds/web.iso\n"));

    assert_eq!(spec.cloud_init.seed, Some(PathBuf::from("/m/seeds/web.iso")));
}

fn workload(body: &str) -> String {
    format!("apiVersion: nubo.dev/v1alpha1\nkind: Workload\nmetadata:\n  name: fn\nspec:\n  type: microvm\n{body}")
}

#[test]
fn lower_workload_microvm_every_field() {
    let l = lower_text(&workload(concat!(
        "  microvm:\n",
        "    image: debian:12\n",
        "    vcpus: 1\n",
        "    memory: 512M\n",
        "    diskSize: 4G\n",
        "    kernel: ./vmlinuz\n",
        "    initrd: ./initrd\n",
        "    cmdline: console=ttyS0\n",
        "    overrides: { qemu: { accel: tcg } }\n",
        "    network: restricted\n",
        "    cloudInit: { hostname: fn-1 }\n",
        "    sshUser: debian\n",
        "    bootTimeout: 90s\n",
    )))
    .unwrap_or_else(|e| panic!("{e}"));

    let mut want = VmSpec::new(
        VmName::parse("fn").unwrap(),
        DiskSource::Image {
            reference: "debian:12".into(),
        },
    );
    want.resources.vcpus = Some(1);
    want.resources.memory = Some(ByteSize(512 << 20));
    want.resources.disk_size = Some(ByteSize(4 << 30));
    want.boot = Some(KernelBoot {
        kernel: "/m/vmlinuz".into(),
        initrd: Some("/m/initrd".into()),
        cmdline: Some("console=ttyS0".into()),
    });
    want.machine = Machine::Microvm;
    want.overrides = BTreeMap::from([(
        "qemu".to_owned(),
        BTreeMap::from([("accel".to_owned(), "tcg".to_owned())]),
    )]);
    want.network = Network::Restricted;
    want.cloud_init.hostname = Some("fn-1".into());
    want.backend = None;
    want.ssh_user = Some("debian".into());
    want.boot_timeout = Some(Duration::from_secs(90));
    assert_eq!(l[0].spec, want);
    assert_eq!(l[0].notes.len(), 1, "the default backend is said");
    assert!(l[0].notes[0].contains("selection precedence"), "{:?}", l[0].notes);
}

#[test]
fn lower_workload_cloud_hypervisor_accepted() {
    let spec = spec_of(&workload(
        "  backend: cloud-hypervisor\n  microvm: { image: debian:12 }\n",
    ));

    assert_eq!(spec.backend.as_deref(), Some("cloud-hypervisor"));
    assert_eq!(spec.machine, Machine::Microvm);
}

#[test]
fn lower_multi_document_and_directory_order_kept() {
    let text = format!(
        "{}---\n{}",
        vm("  image: debian:12\n"),
        workload("  microvm: { image: debian:12 }\n")
    );

    let names: Vec<String> = lower_text(&text)
        .unwrap()
        .iter()
        .map(|l| l.spec.name.to_string())
        .collect();

    assert_eq!(names, ["web", "fn"]);
}

// ---------------------------------------------------------------------------------------------
// YAML 1.1 traps: in text fields they stay the text written; in boolean fields they are refused

#[test]
fn yaml11_no_in_text_field_stays_string() {
    let spec = spec_of(&vm("  image: debian:12\n  cloudInit:\n    hostname: no\n"));

    assert_eq!(spec.cloud_init.hostname.as_deref(), Some("no"));
}

#[test]
fn yaml11_on_in_text_field_stays_string() {
    let spec = spec_of(&vm("  image: debian:12\n  network: on\n"));

    assert_eq!(spec.network, Network::Named("on".into()));
}

#[test]
fn yaml11_octal_in_text_field_stays_string() {
    let spec = spec_of(&vm("  image: debian:12\n  overrides: { qemu: { machine: 0777 } }\n"));

    assert_eq!(spec.overrides["qemu"]["machine"], "0777");
}

#[test]
fn yaml11_yes_in_boolean_field_refused() {
    let e = error_of(&vm(
        "  url: https://mirror.example/x.qcow2\n  insecureNoChecksum: yes\n",
    ));

    assert_eq!(
        e,
        "vm.yaml:7:23: spec.insecureNoChecksum: expected `true` or `false` (YAML 1.2: yes/no/on/off are not booleans)"
    );
}

// ---------------------------------------------------------------------------------------------
// The error-position corpus

#[test]
fn corpus_bad_indentation() {
    let e = error_of(&vm("  image: debian:12\n    vcpus: 2\n"));

    assert_eq!(
        e,
        "vm.yaml:7:10: mapping values are not allowed in this context: check the indentation (a nested key must be indented under its parent, a sibling aligned with it)"
    );
}

#[test]
fn corpus_wrong_type_vcpus() {
    let e = error_of(&vm("  image: debian:12\n  resources:\n    vcpus: two\n"));

    assert_eq!(
        e,
        "vm.yaml:8:12: spec.resources.vcpus: expected a whole number such as `2`"
    );
}

#[test]
fn corpus_wrong_type_list_expected() {
    let e = error_of(&vm("  image: debian:12\n  cloudInit:\n    sshKeys: ssh-ed25519 AAAA\n"));

    assert_eq!(
        e,
        "vm.yaml:8:14: spec.cloudInit.sshKeys: expected a list (`[a, b]`, or one `- a` line per entry)"
    );
}

#[test]
fn corpus_memory_not_a_size() {
    let e = error_of(&vm("  image: debian:12\n  resources:\n    memory: 2X\n"));

    assert_eq!(
        e,
        "vm.yaml:8:5: spec.resources.memory: \"2X\" is not a size (use 512M, 2G, ...)"
    );
}

#[test]
fn corpus_memory_without_unit() {
    let e = error_of(&vm("  image: debian:12\n  resources:\n    memory: 2048\n"));

    assert_eq!(
        e,
        "vm.yaml:8:5: spec.resources.memory: `2048` has no unit: write e.g. `2048M` or `2G`"
    );
}

#[test]
fn corpus_unknown_field_suggests_nearest() {
    let e = error_of(&vm("  image: debian:12\n  cloudInit:\n    sshKey: []\n"));

    assert!(
        e.starts_with("vm.yaml:8:5: spec.cloudInit.sshKey: unknown field `sshKey` (did you mean `sshKeys`?): the fields here are hostname, sshKeys,"),
        "{e}"
    );
}

#[test]
fn corpus_unknown_top_level_field_suggests_nearest() {
    let e = error_of(&format!("{HEAD}  image: debian:12\nstatus: {{}}\n").replace("metadata:", "metdata:"));

    assert!(
        e.starts_with("vm.yaml:3:1: metdata: unknown field `metdata` (did you mean `metadata`?)"),
        "{e}"
    );
}

#[test]
fn corpus_unknown_machine_value_lists_known() {
    let e = error_of(&vm("  image: debian:12\n  machine: micro\n"));

    assert_eq!(
        e,
        "vm.yaml:7:12: spec.machine: unknown value `micro` (did you mean `microvm`?): write one of default, microvm"
    );
}

#[test]
fn corpus_duplicate_key() {
    let e = error_of(&vm("  image: debian:12\n  image: ubuntu:24.04\n"));

    assert_eq!(
        e,
        "vm.yaml:7:3: spec.image: mapping key `image` appears twice: keep one (cloud-init would silently drop the first)"
    );
}

#[test]
fn corpus_document_over_one_mib() {
    let mut text = vm("  image: debian:12\n");
    text.push_str(&format!("# {}\n", "x".repeat(MAX_MANIFEST as usize)));

    let e = error_of(&text);

    assert_eq!(
        e,
        format!(
            "vm.yaml:1:1: the document is {} bytes, over the 1048576-byte limit: make it smaller",
            text.len()
        )
    );
}

#[test]
fn corpus_document_just_under_one_mib_accepted() {
    let mut text = vm("  image: debian:12\n");
    let pad = MAX_MANIFEST as usize - text.len() - 3;
    text.push_str(&format!("# {}\n", "x".repeat(pad)));

    let specs = lower_text(&text).unwrap();

    assert_eq!(specs.len(), 1);
}

#[test]
fn corpus_binary_garbage() {
    let mut bytes = vm("  image: debian:12\n").into_bytes();
    bytes.extend_from_slice(&[0xff, 0xfe, 0x00, 0x9c]);

    let e = read_all(
        &[Source {
            file: "vm.yaml".into(),
            dir: "/m".into(),
            bytes,
        }],
        &files(),
    )
    .unwrap_err();

    assert_eq!(e.to_string(), "vm.yaml:7:1: the bytes here are not UTF-8");
}

#[test]
fn corpus_alias_bomb() {
    let mut text = vm("  image: debian:12\n  overrides:\n").replace(
        "spec:\n",
        "x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\nspec:\n",
    );
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        text = text.replace("spec:\n", &format!("x{i}: &a{i} [{refs}]\nspec:\n"));
    }

    let e = error_of(&text);

    assert!(e.starts_with("vm.yaml:") && e.contains("alias bomb"), "{e}");
}

#[test]
fn corpus_unknown_kind_lists_known() {
    let e = error_of(&HEAD.replace("VirtualMachine", "VirtualMachin"));

    assert_eq!(
        e,
        "vm.yaml:2:7: kind: unknown kind `VirtualMachin`: nubo knows VirtualMachine, Workload (did you mean `VirtualMachine`?)"
    );
}

#[test]
fn corpus_wrong_api_version() {
    let e = error_of(&vm("  image: debian:12\n").replace("v1alpha1", "v1"));

    assert_eq!(
        e,
        "vm.yaml:1:13: apiVersion: apiVersion `nubo.dev/v1` is not one nubo reads: write `nubo.dev/v1alpha1`"
    );
}

#[test]
fn corpus_unknown_workload_type_lists_known() {
    let e = error_of(&workload("  microvm: { image: debian:12 }\n").replace("type: microvm", "type: container"));

    assert_eq!(
        e,
        "vm.yaml:6:9: spec.type: unknown workload type `container`: write one of microvm"
    );
}

#[test]
fn corpus_workload_libvirt_refused_with_reason() {
    let e = error_of(&workload("  backend: libvirt\n  microvm: { image: debian:12 }\n"));

    assert!(
        e.starts_with("vm.yaml:7:3: spec.backend: the libvirt backend cannot run a microvm workload"),
        "{e}"
    );
}

#[test]
fn corpus_duplicate_names_across_documents() {
    let text = format!("{}---\n{}", vm("  image: debian:12\n"), vm("  image: debian:12\n"));

    let e = error_of(&text);

    assert_eq!(
        e,
        "vm.yaml:11:3: metadata.name: `web` is also the name of the document at vm.yaml:4:3: each VM needs its own name"
    );
}

#[test]
fn corpus_missing_user_data_file() {
    let e = error_of(&vm("  image: debian:12\n  cloudInit:\n    userDataFile: ./nope.yaml\n"));

    assert_eq!(
        e,
        "vm.yaml:8:5: spec.cloudInit.userDataFile: user-data /m/nope.yaml: no such file"
    );
}

#[test]
fn corpus_spec_error_mapped_to_key() {
    let e = error_of(&vm("  image: debian:12\n  resources:\n    vcpus: 0\n"));

    assert_eq!(e, "vm.yaml:8:5: spec.resources.vcpus: is 0: give at least 1");
}

#[test]
fn corpus_spec_error_in_key_file_names_entry_and_line() {
    let mut f = files();
    f.0.insert(PathBuf::from("/m/keys"), b"ssh-ed25519 AAAA a\nnot-a-key\n".to_vec());
    let text = vm("  image: debian:12\n  cloudInit:\n    sshKeys:\n      - ssh-ed25519 AAAA x\n      - \"@keys\"\n");

    let e = read_all(&[source(&text)], &f).unwrap_err().to_string();

    assert!(
        e.starts_with(
            "vm.yaml:10:9: spec.cloudInit.sshKeys[1]: the key on line 2 of /m/keys: is not a public key line"
        ),
        "{e}"
    );
}

#[test]
fn corpus_invalid_user_data_points_at_file_key() {
    let mut f = files();
    f.0.insert(PathBuf::from("/m/bad.yaml"), b"#cloud-config\n- [\n".to_vec());
    let text = vm("  image: debian:12\n  cloudInit:\n    userDataFile: bad.yaml\n");

    let e = read_all(&[source(&text)], &f).unwrap_err().to_string();

    assert!(e.starts_with("vm.yaml:8:5: spec.cloudInit.userDataFile: "), "{e}");
}

#[test]
fn corpus_every_error_of_every_document_reported() {
    let text = format!(
        "{}---\n{}",
        vm("  image: debian:12\n  resources: { vcpus: 0 }\n"),
        workload("  microvm: { image: debian:12, memory: 1X }\n")
    );

    let e = lower_text(&text).unwrap_err();

    assert_eq!(e.errors().len(), 2, "{e}");
}

#[test]
fn corpus_empty_file_refused() {
    let e = error_of("# nothing\n");

    assert_eq!(
        e,
        "vm.yaml:1:1: the file holds no document: write a manifest (`nubo manifest schema` describes them)"
    );
}

#[test]
fn corpus_file_outside_manifest_dir_refused_at_its_key() {
    let text = vm("  image: debian:12\n  cloudInit:\n    networkConfigFile: ../../../etc/shadow\n");

    let e = read_all(&[source(&text)], &files()).unwrap_err().to_string();

    assert!(
        e.starts_with("vm.yaml:8:5: spec.cloudInit.networkConfigFile: /m/../../../etc/shadow is outside /m"),
        "{e}"
    );
}

#[test]
fn corpus_key_file_outside_manifest_dir_refused() {
    let text = vm("  image: debian:12\n  cloudInit:\n    sshKeys: [\"@/etc/shadow\"]\n");

    let e = read_all(&[source(&text)], &files()).unwrap_err().to_string();

    assert!(
        e.contains("spec.cloudInit.sshKeys[0]: /etc/shadow is outside /m"),
        "{e}"
    );
}

#[test]
fn corpus_disk_outside_manifest_dir_refused() {
    let text = vm("  disk: /var/lib/other.qcow2\n");

    let e = read_all(&[source(&text)], &files()).unwrap_err().to_string();

    assert!(e.contains("spec.disk: /var/lib/other.qcow2 is outside /m"), "{e}");
}
