//! Wave-1 records (schema 1, no `schema` field): QEMU's runtime files lived in
//! `machine.handle`, the request was a bag of strings, the SSH port sat in the record. Only
//! the qemu backend existed then, so its state is rebuilt from those fields: the qemu
//! backend's state uses the same field names on purpose.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;

use nubo_backend::{Boot, Disk, Firmware, Launch, MachineKind, MachineSpec, NetworkMode, SeedDevice};
use nubo_spec::{CloudInitSpec, DiskSource, KernelBoot, Machine, Network, Payload, Resources, VmSpec};
use serde::Deserialize;

use super::{ImageUse, Phase, SshLogin, VmRecord, SCHEMA};

#[derive(Deserialize)]
struct V1 {
    name: String,
    uuid: String,
    backend: String,
    phase: Phase,
    created: String,
    request: Request,
    #[serde(default)]
    image: Option<ImageUse>,
    machine: Machine1,
    #[serde(default)]
    ssh: Option<Ssh1>,
    #[serde(default)]
    accel_reason: Option<String>,
    #[serde(default)]
    argv: Vec<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Request {
    image: Option<String>,
    disk: Option<PathBuf>,
    backend: Option<String>,
    vcpus: Option<u32>,
    memory_mib: Option<u64>,
    disk_size: Option<u64>,
    hostname: Option<String>,
    ssh_keys: Vec<String>,
    user_data_sha256: Option<String>,
    network_config_sha256: Option<String>,
    seed: Option<PathBuf>,
    kernel: Option<PathBuf>,
    initrd: Option<PathBuf>,
    cmdline: Option<String>,
    firmware: Option<String>,
    machine: Option<String>,
    accel: Option<String>,
    restrict_network: bool,
    ssh_user: Option<String>,
}

#[derive(Deserialize)]
struct Machine1 {
    handle: serde_json::Map<String, serde_json::Value>,
    vcpus: u32,
    memory_mib: u64,
    disk: PathBuf,
    #[serde(default)]
    seed: Option<SeedDevice>,
    boot: Boot1,
    machine: String,
    network: Network1,
    console_log: PathBuf,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase", tag = "mode")]
enum Boot1 {
    Bios,
    Efi {
        code: PathBuf,
        vars: PathBuf,
    },
    Kernel {
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        cmdline: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
enum Network1 {
    None,
    User {
        ssh_forward: Option<std::net::SocketAddr>,
        restrict: bool,
    },
}

#[derive(Deserialize)]
struct Ssh1 {
    user: String,
    nubo_key: bool,
}

/// A wave-1 record in today's shape.
pub fn migrate(v: serde_json::Value) -> Result<VmRecord, String> {
    let old: V1 = serde_json::from_value(v).map_err(|e| format!("not a wave-1 record either: {e}"))?;
    let m = old.machine;
    let r = old.request;
    let (base, base_format) = backing_of(&m.disk)?;

    let mut state = m.handle;
    state.remove("name");
    state.remove("uuid");
    state.insert("console_log".into(), serde_json::json!(m.console_log));
    let (network, port) = match m.network {
        Network1::None => (NetworkMode::None, None),
        Network1::User { ssh_forward, restrict } => (
            if restrict {
                NetworkMode::Restricted
            } else {
                NetworkMode::Forward
            },
            ssh_forward.map(|a| a.port()),
        ),
    };
    if let Some(p) = port {
        state.insert("ssh_port".into(), p.into());
    }
    let boot = match m.boot {
        Boot1::Bios => Boot::Firmware {
            firmware: Firmware::Bios,
        },
        Boot1::Efi { code, vars } => {
            state.insert("efi_vars".into(), serde_json::json!(vars));
            Boot::Firmware {
                firmware: Firmware::EfiCode(code),
            }
        }
        Boot1::Kernel {
            kernel,
            initrd,
            cmdline,
        } => Boot::Kernel {
            kernel,
            initrd,
            cmdline,
        },
    };
    let mut options = BTreeMap::new();
    if m.machine == "q35" {
        options.insert("machine".to_owned(), "q35".to_owned());
    }
    if let Some(a) = r.accel.as_deref().filter(|a| *a != "auto") {
        options.insert("accel".to_owned(), a.to_owned());
    }
    let machine_kind = if m.machine == "microvm" {
        MachineKind::Microvm
    } else {
        MachineKind::Default
    };
    let name = nubo_core::VmName::parse(&old.name).map_err(|e| e.to_string())?;
    let spec = VmSpec {
        name,
        source: match (&r.image, &r.disk) {
            (Some(reference), _) => DiskSource::Image {
                reference: reference.clone(),
            },
            (None, Some(path)) => DiskSource::Disk { path: path.clone() },
            (None, None) => DiskSource::Disk { path: base.clone() },
        },
        resources: Resources {
            vcpus: r.vcpus,
            memory: r.memory_mib.map(|m| nubo_core::ByteSize(m << 20)),
            disk_size: r.disk_size.map(nubo_core::ByteSize),
        },
        firmware: match r.firmware.as_deref() {
            None => nubo_spec::Firmware::Auto,
            Some("bios") => nubo_spec::Firmware::Bios,
            Some("efi") => nubo_spec::Firmware::Efi,
            Some(p) => nubo_spec::Firmware::Path(PathBuf::from(p)),
        },
        boot: r.kernel.map(|kernel| KernelBoot {
            kernel,
            initrd: r.initrd,
            cmdline: r.cmdline,
        }),
        machine: match machine_kind {
            MachineKind::Microvm => Machine::Microvm,
            MachineKind::Default => Machine::Default,
        },
        overrides: if options.is_empty() {
            BTreeMap::new()
        } else {
            BTreeMap::from([("qemu".to_owned(), options.clone())])
        },
        network: if r.restrict_network {
            Network::Restricted
        } else {
            Network::Forward
        },
        ports: Vec::new(),
        cloud_init: CloudInitSpec {
            hostname: r.hostname,
            ssh_keys: r.ssh_keys,
            user_data: r.user_data_sha256.and_then(digest_payload),
            network_config: r.network_config_sha256.and_then(digest_payload),
            vendor_data: None,
            seed: r.seed,
        },
        backend: r.backend,
        ssh_user: r.ssh_user,
        boot_timeout: None,
        mounts: Vec::new(),
    };
    let ssh = old.ssh.map_or_else(
        || SshLogin {
            user: "root".into(),
            nubo_key: false,
        },
        |s| SshLogin {
            user: s.user,
            nubo_key: s.nubo_key,
        },
    );
    Ok(VmRecord {
        schema: SCHEMA,
        machine: MachineSpec {
            name: old.name.clone(),
            uuid: old.uuid.clone(),
            vm_dir: m.disk.parent().map(PathBuf::from).unwrap_or_default(),
            run_dir: state
                .get("run_dir")
                .and_then(|v| v.as_str())
                .map(PathBuf::from)
                .unwrap_or_default(),
            vcpus: m.vcpus,
            memory_mib: m.memory_mib,
            disk: Disk {
                overlay: m.disk,
                base,
                base_format,
                ..Disk::default()
            },
            seed: m.seed,
            boot,
            machine: machine_kind,
            network,
            ports: Vec::new(),
            options,
            mounts: Vec::new(),
        },
        name: old.name,
        uuid: old.uuid,
        backend: old.backend,
        phase: old.phase,
        created: old.created,
        spec,
        image: old.image,
        backend_state: serde_json::Value::Object(state),
        ssh,
        launch: (!old.argv.is_empty()).then_some(Launch::Argv(old.argv)),
        notes: old
            .accel_reason
            .into_iter()
            .map(|r| format!("accelerator: {r}"))
            .collect(),
        snapshots: Vec::new(),
        current_snapshot: None,
        seed_inputs: None,
    })
}

/// The base an overlay nubo made sits on, from the overlay's own qcow2 header (nubo wrote it,
/// with the backing format recorded).
fn backing_of(overlay: &std::path::Path) -> Result<(PathBuf, String), String> {
    let f = nubo_core::file::open_regular(overlay, "overlay").map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    f.take(2 << 20)
        .read_to_end(&mut head)
        .map_err(|e| format!("reading {}: {e}", overlay.display()))?;
    let h = nubo_disk::parse_qcow2_header(&head).map_err(|e| format!("{}: {e}", overlay.display()))?;
    let file = h
        .backing_file
        .ok_or_else(|| format!("overlay {} has no backing file", overlay.display()))?;
    let format = h
        .backing_format
        .ok_or_else(|| format!("overlay {} records no backing format", overlay.display()))?;
    let mut path = PathBuf::from(file);
    if path.is_relative() {
        path = overlay.parent().unwrap_or(std::path::Path::new("/")).join(path);
    }
    Ok((path, format))
}

/// Wave 1 kept a payload's digest but not its length.
fn digest_payload(sha256: String) -> Option<Payload> {
    serde_json::from_value(serde_json::json!({ "sha256": sha256, "len": 0 })).ok()
}
