use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use nubo_core::VmName;
use nubo_engine::{Engine, EngineError, Event, Step, WaitFor};
use nubo_spec::{CloudInitSpec, DiskSource, Field, Firmware, KernelBoot, Machine, Network, Payload, VmSpec};

use super::print_event;
use crate::cli::vm::{AccelArg, CreateArgs, MachineArg};

pub fn run(a: &CreateArgs, engine: &Engine, home: Option<&Path>) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let spec = spec_or_default(a, engine, home)?;
    if a.dry_run {
        let plan = engine.dry_run(&spec).map_err(flagged)?;
        return crate::output::print_json(&serde_json::json!({ "spec": spec, "plan": plan }));
    }
    let created = engine.create(&spec, &mut print_event).map_err(flagged)?;
    let rec = &created.record;
    let ssh = engine
        .reach(rec)
        .ok()
        .and_then(|r| r.ssh)
        .map(|addr| format!(", ssh {}@{addr}", rec.ssh.user))
        .unwrap_or_default();
    eprintln!(
        "vm `{}` {} (uuid {}{ssh}) in {:.2}s",
        rec.name,
        if created.existed {
            "exists"
        } else {
            "created and started"
        },
        rec.uuid,
        created.started.elapsed().as_secs_f64()
    );
    if a.wait {
        // An appliance has no seed and maybe no cloud-init: ready means its SSH answers.
        let target = if rec.machine.seed.is_some() {
            WaitFor::CloudInit
        } else {
            WaitFor::Ssh
        };
        // The engine's readiness state machine, stepped here: a phase is printed as it is
        // reached, and the CLI (not the engine) sleeps between looks.
        let mut ready = engine.readiness(&rec.name, target, a.boot_timeout, t0)?;
        let waiting = format!(
            "waiting for vm `{0}` to be ready (it is created and running: `nubo vm wait {0}` follows it again)",
            rec.name
        );
        let out = loop {
            match ready.step() {
                Step::Phase(p, t) => print_event(Event::Phase(p, t)),
                Step::PollAfter(d) => engine.sleep(d, &waiting)?,
                Step::Done(out) => break out,
                Step::Failed(e) => return Err(EngineError::from(e).into()),
            }
        };
        if let Some(f) = out.finished {
            eprintln!(
                "vm `{}` is ready: cloud-init {} finished, datasource {} [seed={}]",
                rec.name,
                f.version,
                f.datasource,
                f.seed.as_deref().unwrap_or("?")
            );
        } else {
            eprintln!("vm `{}` is ready", rec.name);
        }
        if let Some(a) = &out.address {
            eprintln!("  {}", super::address_line(a));
        }
    }
    println!("{}", rec.name);
    Ok(())
}

/// The flag of `vm create` that sets a spec field, for errors: every field is mapped (no
/// wildcard arm), so a new field cannot go unmapped.
pub fn flag(field: Field) -> &'static str {
    match field {
        Field::Name => "NAME",
        Field::SourceImageReference => "--image",
        Field::SourceDiskPath => "--disk",
        Field::SourceUrl => "--url-img",
        Field::SourceUrlChecksum => "--checksum",
        Field::SourceUrlInsecureNoChecksum => "--insecure-no-checksum",
        Field::SourceUrlAllowHttp => "--allow-http",
        Field::ResourcesVcpus => "--vcpus",
        Field::ResourcesMemory => "--memory",
        Field::ResourcesDiskSize => "--disk-size",
        Field::Firmware => "--firmware",
        Field::BootKernel => "--kernel",
        Field::BootInitrd => "--initrd",
        Field::BootCmdline => "--cmdline",
        Field::Machine => "--machine",
        Field::Overrides => "--machine/--accel/--connect/--pool",
        Field::Network => "--network",
        Field::Ports => "--publish",
        Field::CloudInitHostname => "--hostname",
        Field::CloudInitSshKeys => "--ssh-key",
        Field::CloudInitUserData => "--user-data",
        Field::CloudInitNetworkConfig => "--network-config",
        Field::CloudInitVendorData => "--vendor-data",
        Field::CloudInitSeed => "--seed",
        Field::Backend => "--backend",
        Field::SshUser => "--ssh-user",
        Field::BootTimeout => "--boot-timeout",
        Field::Mounts => "--mount",
    }
}

/// Spec errors named by the flags the user typed rather than by field paths.
fn flagged(e: EngineError) -> anyhow::Error {
    match e {
        EngineError::Spec(errors) => {
            let lines: Vec<String> = errors
                .errors()
                .iter()
                .map(|fe| format!("{} ({}): {}", flag(fe.field), fe.path, fe.message))
                .collect();
            anyhow::anyhow!("{}", lines.join("\n"))
        }
        other => other.into(),
    }
}

/// [`spec`], with the default image (`nubo image default`) when no source is given.
fn spec_or_default(a: &CreateArgs, engine: &Engine, home: Option<&Path>) -> anyhow::Result<VmSpec> {
    let default = if a.image.is_none() && a.disk.is_none() && a.url_img.is_none() {
        let image = engine.default_image()?;
        eprintln!("  no --image, --disk or --url-img: using the default image `{image}` (`nubo image default --set REF` changes it)");
        Some(image)
    } else {
        None
    };
    spec(a, default.as_deref(), home)
}

/// The VmSpec `vm create`'s flags describe; `default_image` is the image used when no source
/// flag is given, `home` what a key path's `~/` stands for. Small inputs are read here
/// (bounded; a regular file, a pipe or `-`); everything else is checked by the spec's own validation and the
/// engine's plan.
pub fn spec(a: &CreateArgs, default_image: Option<&str>, home: Option<&Path>) -> anyhow::Result<VmSpec> {
    let name = VmName::parse(&a.name)?;
    let source = match (&a.image, &a.disk, &a.url_img) {
        (Some(r), None, None) => DiskSource::Image { reference: r.clone() },

        (None, Some(p), None) => DiskSource::Disk { path: absolute(p)? },
        (None, None, Some(url)) => DiskSource::Url {
            url: url.clone(),
            checksum: a.checksum.clone(),
            insecure_no_checksum: a.insecure_no_checksum,
            allow_http: a.allow_http,
        },
        (None, None, None) => match default_image {
            Some(r) => DiskSource::Image {
                reference: r.to_owned(),
            },
            None => anyhow::bail!("give --image REF (see `nubo image ls`), --disk PATH or --url-img URL"),
        },
        _ => anyhow::bail!("give one of --image, --disk and --url-img"),
    };
    let read = |flag: &str, p: &Path| -> anyhow::Result<Payload> {
        let bytes = nubo_core::input::read_small_input(p, flag, nubo_spec::limits::MAX_PAYLOAD)?;
        Ok(Payload::new(bytes))
    };
    let mut ssh_keys = Vec::new();
    for k in &a.ssh_keys {
        ssh_keys.extend(crate::ssh_keys::parse(k, home)?);
    }
    let mut spec = VmSpec::new(name, source);
    spec.resources.vcpus = a.vcpus;
    spec.resources.memory = a.memory;
    spec.resources.disk_size = a.disk_size;
    spec.firmware = match a.firmware.as_deref() {
        None => Firmware::Auto,
        Some("bios") => Firmware::Bios,
        Some("efi") => Firmware::Efi,
        Some(p) => Firmware::Path(absolute(Path::new(p))?),
    };
    spec.boot = a
        .kernel
        .as_deref()
        .map(|k| -> anyhow::Result<KernelBoot> {
            Ok(KernelBoot {
                kernel: absolute(k)?,
                initrd: a.initrd.as_deref().map(absolute).transpose()?,
                cmdline: a.cmdline.clone(),
            })
        })
        .transpose()?;
    // --machine pc|q35 are QEMU's machine types: a per-backend override; microvm is neutral.
    let mut qemu = std::collections::BTreeMap::new();
    match a.machine {
        Some(MachineArg::Microvm) => spec.machine = Machine::Microvm,
        Some(MachineArg::Q35) => {
            qemu.insert("machine".to_owned(), "q35".to_owned());
        }
        Some(MachineArg::Pc) => {
            qemu.insert("machine".to_owned(), "pc".to_owned());
        }
        None => {}
    }
    match a.accel {
        AccelArg::Auto => {}
        AccelArg::Kvm => {
            qemu.insert("accel".to_owned(), "kvm".to_owned());
        }
        AccelArg::Tcg => {
            qemu.insert("accel".to_owned(), "tcg".to_owned());
        }
    }
    // libvirt's options: the URI and pool, and the machine type when libvirt is asked for.
    let mut libvirt = std::collections::BTreeMap::new();
    // With --tls-dir the URI carries nubo's `pkipath`, which a spec may not: it reaches the
    // backend as its default URI instead (`vm::run`).
    if let Some(uri) = a.connect.as_ref().filter(|_| a.tls_dir.is_none()) {
        libvirt.insert("uri".to_owned(), uri.clone());
    }
    if let Some(pool) = &a.pool {
        libvirt.insert("pool".to_owned(), pool.clone());
    }
    if matches!(a.backend.as_deref(), Some("libvirt" | "virt")) {
        if let Some(m) = qemu.remove("machine") {
            libvirt.insert("machine".to_owned(), m);
        }
    }
    if !qemu.is_empty() {
        spec.overrides.insert("qemu".to_owned(), qemu);
    }
    if !libvirt.is_empty() {
        spec.overrides.insert("libvirt".to_owned(), libvirt);
    }
    if a.restrict_network {
        spec.network = Network::Restricted;
    }
    if let Some(n) = &a.network {
        spec.network = match n.as_str() {
            "forward" => Network::Forward,
            "restricted" => Network::Restricted,
            "none" => Network::None,
            name => Network::Named(name.to_owned()),
        };
    }
    spec.ports = publish(&a.publish)?;
    spec.cloud_init = CloudInitSpec {
        hostname: a.hostname.clone(),
        ssh_keys,
        user_data: a.user_data.as_deref().map(|p| read("--user-data", p)).transpose()?,
        network_config: a
            .network_config
            .as_deref()
            .map(|p| read("--network-config", p))
            .transpose()?,
        vendor_data: None,
        seed: a.seed.as_deref().map(absolute).transpose()?,
    };
    spec.mounts = mounts(&a.mounts)?;
    spec.backend = a.backend.clone();
    spec.ssh_user = a.ssh_user.clone();
    spec.boot_timeout = a.wait.then_some(a.boot_timeout);
    Ok(spec)
}

/// `--publish` values, each parsed strictly; the first bad one is named with its flag.
fn publish(values: &[String]) -> anyhow::Result<Vec<nubo_core::PortForward>> {
    values
        .iter()
        .map(|v| nubo_core::PortForward::parse(v).with_context(|| "--publish".to_owned()))
        .collect()
}

/// `--mount HOST_DIR[:GUEST_DIR][:ro]`, each host directory made absolute against the cwd.
pub fn mounts(args: &[String]) -> anyhow::Result<Vec<nubo_spec::MountSpec>> {
    args.iter()
        .map(|text| {
            let mut m = nubo_spec::MountSpec::parse(text).map_err(|why| anyhow::anyhow!("--mount: {why}"))?;
            m.host_path = absolute(&m.host_path)?;
            Ok(m)
        })
        .collect()
}

/// Paths are recorded absolute: a later `start` may run from another directory.
fn absolute(p: &Path) -> anyhow::Result<std::path::PathBuf> {
    std::path::absolute(p).with_context(|| format!("resolving {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_flags_parse_into_spec() {
        let s = from_flags(&[
            "web",
            "--publish",
            "8080:80",
            "-p",
            "0.0.0.0:5353:53/udp",
            "--restrict-network",
        ]);

        assert_eq!(
            s.ports.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
            ["127.0.0.1:8080:80/tcp", "0.0.0.0:5353:53/udp"]
        );
    }

    #[test]
    fn publish_malformed_names_flag() {
        let argv = ["nubo", "vm", "create", "web", "--publish", "80"];
        let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
        let crate::cli::Command::Vm(crate::cli::vm::VmCmd::Create(a)) = cli.command else {
            panic!("not vm create")
        };

        let err = format!("{:#}", spec(&a, Some("debian:12"), None).unwrap_err());

        assert!(err.contains("--publish") && err.contains("`80`"), "{err}");
    }

    #[test]
    fn no_source_uses_default_image() {
        let s = from_flags(&["web"]);

        assert_eq!(
            s.source,
            DiskSource::Image {
                reference: "debian:12".into()
            }
        );
    }

    #[test]
    fn parity_publish_ports() {
        let d = Dir::new();

        same(
            from_flags(&[
                "web",
                "--image",
                "debian:12",
                "-p",
                "8080:80",
                "-p",
                "127.0.0.1:2222:22/tcp",
            ]),
            from_manifest(
                d.dir.path(),
                "  image: debian:12\n  ports: [\"8080:80\", \"2222:22\"]\n",
            ),
        );
    }

    // -----------------------------------------------------------------------------------------
    // The same VM from flags and from a manifest: the two paths produce equal specs (issue 13).

    use clap::Parser;

    fn from_flags(args: &[&str]) -> VmSpec {
        let argv = ["nubo", "vm", "create"].iter().chain(args);
        let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
        let crate::cli::Command::Vm(crate::cli::vm::VmCmd::Create(a)) = cli.command else {
            panic!("not vm create")
        };
        spec(&a, Some("debian:12"), None).unwrap()
    }

    fn from_manifest(dir: &Path, body: &str) -> VmSpec {
        let text =
            format!("apiVersion: nubo.dev/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: web\nspec:\n{body}");
        let src = nubo_manifest::Source {
            file: "vm.yaml".into(),
            dir: dir.to_path_buf(),
            bytes: text.into_bytes(),
        };
        let files = nubo_manifest::HostFiles {
            home: None,
            restrictor: nubo_manifest::LoadRestrictor::RootOnly,
        };
        let mut l = nubo_manifest::read_all(&[src], &files).unwrap_or_else(|e| panic!("{e}"));
        l.remove(0).spec
    }

    fn same(flags: VmSpec, manifest: VmSpec) {
        assert_eq!(flags.differences(&manifest), Vec::<String>::new());
        assert_eq!(flags, manifest);
    }

    struct Dir {
        dir: tempfile::TempDir,
    }

    impl Dir {
        fn new() -> Dir {
            let dir = tempfile::tempdir().unwrap();
            let w = |n: &str, c: &str| std::fs::write(dir.path().join(n), c).unwrap();
            w("user-data", "#cloud-config\nruncmd: [true]\n");
            w("net.yaml", "version: 2\n");
            w("keys.pub", "ssh-ed25519 AAAAfile a\nssh-rsa AAAArsa b\n");
            for f in ["base.qcow2", "vmlinuz", "initrd", "seed.iso", "CODE.fd"] {
                w(f, "x");
            }
            Dir { dir }
        }

        fn p(&self, name: &str) -> String {
            self.dir.path().join(name).display().to_string()
        }
    }

    #[test]
    fn parity_image_resources_cloud_init_backend_user() {
        let d = Dir::new();

        let flags = from_flags(&[
            "web",
            "--image",
            "debian:12",
            "--vcpus",
            "2",
            "--memory",
            "2G",
            "--disk-size",
            "20G",
            "--hostname",
            "web-1",
            "--ssh-key",
            "ssh-ed25519 AAAAinline me",
            "--backend",
            "qemu",
            "--ssh-user",
            "debian",
            "--restrict-network",
            "--wait",
            "--boot-timeout",
            "5m",
        ]);
        let manifest = from_manifest(
            d.dir.path(),
            "  image: debian:12\n  resources: { vcpus: 2, memory: 2G, diskSize: 20G }\n  cloudInit:\n    hostname: web-1\n    sshKeys: [\"ssh-ed25519 AAAAinline me\"]\n  backend: qemu\n  sshUser: debian\n  network: restricted\n  bootTimeout: 5m\n",
        );

        assert_eq!(flags.boot_timeout, manifest.boot_timeout);
        same(flags, manifest);
    }

    #[test]
    fn parity_disk_kernel_microvm_accel() {
        let d = Dir::new();

        let flags = from_flags(&[
            "web",
            "--disk",
            &d.p("base.qcow2"),
            "--kernel",
            &d.p("vmlinuz"),
            "--initrd",
            &d.p("initrd"),
            "--cmdline",
            "root=/dev/vda1 console=ttyS0",
            "--machine",
            "microvm",
            "--accel",
            "tcg",
        ]);
        let manifest = from_manifest(
            d.dir.path(),
            "  disk: ./base.qcow2\n  boot:\n    kernel: vmlinuz\n    initrd: ./initrd\n    cmdline: root=/dev/vda1 console=ttyS0\n  machine: microvm\n  overrides: { qemu: { accel: tcg } }\n",
        );

        same(flags, manifest);
    }

    #[test]
    fn parity_network_none_and_named() {
        let d = Dir::new();
        let none = from_flags(&["web", "--image", "debian:12", "--network", "none"]);
        let named = from_flags(&["web", "--image", "debian:12", "--network", "default"]);

        assert_eq!(none.network, Network::None);
        same(
            none,
            from_manifest(d.dir.path(), "  image: debian:12\n  network: none\n"),
        );
        same(
            named,
            from_manifest(d.dir.path(), "  image: debian:12\n  network: default\n"),
        );
    }

    #[test]
    fn network_with_restrict_network_is_a_usage_error() {
        let argv = [
            "nubo",
            "vm",
            "create",
            "web",
            "--image",
            "debian:12",
            "--network",
            "none",
            "--restrict-network",
        ];

        assert!(crate::cli::Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn parity_url_checksum_allow_http() {
        let d = Dir::new();
        let sum = format!("sha256:{}", "b".repeat(64));

        let flags = from_flags(&[
            "web",
            "--url-img",
            "http://mirror.example/x.qcow2",
            "--checksum",
            &sum,
            "--allow-http",
        ]);
        let manifest = from_manifest(
            d.dir.path(),
            &format!("  url: http://mirror.example/x.qcow2\n  checksum: {sum}\n  allowHttp: true\n"),
        );

        same(flags, manifest);
    }

    #[test]
    fn parity_url_insecure_firmware_path() {
        let d = Dir::new();

        let flags = from_flags(&[
            "web",
            "--url-img",
            "https://mirror.example/x.qcow2",
            "--insecure-no-checksum",
            "--firmware",
            &d.p("CODE.fd"),
        ]);
        let manifest = from_manifest(
            d.dir.path(),
            "  url: https://mirror.example/x.qcow2\n  insecureNoChecksum: true\n  firmware: ./CODE.fd\n",
        );

        same(flags, manifest);
    }

    #[test]
    fn parity_efi_q35_user_data_network_config_key_file() {
        let d = Dir::new();
        let at_keys = format!("@{}", d.p("keys.pub"));

        let flags = from_flags(&[
            "web",
            "--image",
            "debian:12",
            "--firmware",
            "efi",
            "--machine",
            "q35",
            "--user-data",
            &d.p("user-data"),
            "--network-config",
            &d.p("net.yaml"),
            "--ssh-key",
            &at_keys,
        ]);
        let manifest = from_manifest(
            d.dir.path(),
            "  image: debian:12\n  firmware: efi\n  overrides: { qemu: { machine: q35 } }\n  cloudInit:\n    userDataFile: user-data\n    networkConfigFile: ./net.yaml\n    sshKeys: [\"@keys.pub\"]\n",
        );

        same(flags, manifest);
    }

    #[test]
    fn parity_own_seed_bios() {
        let d = Dir::new();

        let flags = from_flags(&[
            "web",
            "--image",
            "debian:12",
            "--seed",
            &d.p("seed.iso"),
            "--firmware",
            "bios",
        ]);
        let manifest = from_manifest(
            d.dir.path(),
            "  image: debian:12\n  firmware: bios\n  cloudInit:\n    seed: seed.iso\n",
        );

        same(flags, manifest);
    }
}
