//! `plan` = gather facts (I/O: the image store and pulls, base inspection, backend probes,
//! host resources), then decide (pure: unit-tested with hand-made facts). Nothing is written
//! for a VM until a plan exists and its backend has accepted it.

use std::path::PathBuf;

use nubo_backend::{Boot, Capabilities, Capability, Firmware, MachineKind, NetworkMode, Registry, SelectionInput};
use nubo_image::ImageRecord;
use nubo_spec::{DiskSource, Field, HostFacts, Machine, Network, VmSpec};
use serde::Serialize;

use crate::EngineError;

/// Used when neither the spec nor the image says.
pub const DEFAULT_VCPUS: u32 = 1;
pub const DEFAULT_MEMORY_MIB: u64 = 1024;
/// Who `nubo vm ssh` logs in as when neither the spec nor the image names a user.
pub const DEFAULT_SSH_USER: &str = "root";

/// The base disk a VM's overlay will sit on, as inspected.
#[derive(Debug, Clone, Serialize)]
pub struct Base {
    pub path: PathBuf,
    /// The base's format, proven by nubo's inspector.
    pub format: nubo_disk::Format,
    pub virtual_size: u64,
}

/// What `plan` learned from the world before deciding.
#[derive(Debug, Clone)]
pub struct Facts {
    pub image: Option<ImageRecord>,
    pub base: Base,
    pub host: HostFacts,
    /// Ids of auto-selectable, installed backends, in registry order.
    pub available: Vec<&'static str>,
    /// `nubo vm default-backend`.
    pub default_backend: Option<String>,
    /// `NUBO_VM_BACKEND`.
    pub env_backend: Option<String>,
}

/// Everything `create` decided before touching the disk. Printable: a dry run shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub name: String,
    pub backend: &'static str,
    pub backend_reason: String,
    /// Which precedence rule chose the backend.
    pub backend_source: nubo_backend::Source,
    pub base: Base,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<crate::record::ImageUse>,
    pub vcpus: u32,
    pub memory_mib: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<u64>,
    pub boot: Boot,
    pub machine: MachineKind,
    pub network: NetworkMode,
    /// Host ports forwarded to the guest.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<nubo_core::PortForward>,
    pub options: std::collections::BTreeMap<String, String>,
    /// `None`: no seed at all (an appliance).
    pub seed: SeedPlan,
    pub hostname: String,
    pub ssh_user: String,
    pub notes: Vec<String>,
    /// Shared folders, resolved (canonical host directories, tags, transport).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<nubo_backend::SharedDir>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SeedPlan {
    /// Appliance: no cloud-init, no seed.
    None,
    /// The user's own seed image, attached as is.
    Own(PathBuf),
    /// nubo builds the NoCloud seed.
    Generated,
}

fn invalid(field: Field, msg: impl Into<String>) -> EngineError {
    EngineError::spec(field, msg)
}

/// Decides the plan from the spec and the facts. Pure.
pub fn decide(
    spec: &VmSpec,
    facts: &Facts,
    registry: &nubo_backend::Registry,
) -> Result<(Plan, Capabilities), EngineError> {
    let image = facts.image.as_ref();
    let mut notes = Vec::new();
    let ci = &spec.cloud_init;
    let cloud_init = image.is_none_or(|i| i.cloud_init);
    let personal = ci.hostname.is_some()
        || !ci.ssh_keys.is_empty()
        || ci.user_data.is_some()
        || ci.network_config.is_some()
        || ci.vendor_data.is_some();
    if !cloud_init && (personal || ci.seed.is_some()) {
        let field = if ci.seed.is_some() {
            Field::CloudInitSeed
        } else if ci.hostname.is_some() {
            Field::CloudInitHostname
        } else if !ci.ssh_keys.is_empty() {
            Field::CloudInitSshKeys
        } else if ci.user_data.is_some() {
            Field::CloudInitUserData
        } else if ci.network_config.is_some() {
            Field::CloudInitNetworkConfig
        } else {
            Field::CloudInitVendorData
        };
        return Err(invalid(
            field,
            format!(
                "image `{}` is an appliance (no cloud-init): hostname, SSH keys, user-data, network-config, vendor-data and an own seed do not apply to it",
                image.map(|i| i.reference.as_str()).unwrap_or_default()
            ),
        ));
    }
    let seed = match (&ci.seed, cloud_init) {
        (_, false) => SeedPlan::None,
        (Some(p), true) => SeedPlan::Own(p.clone()),
        (None, true) => SeedPlan::Generated,
    };

    let vcpus = spec
        .resources
        .vcpus
        .or(image.map(|i| i.default_vcpus))
        .unwrap_or(DEFAULT_VCPUS);
    let memory_mib = spec
        .resources
        .memory
        .map(|m| m.0 >> 20)
        .or(image.map(|i| i.default_memory_mib))
        .unwrap_or(DEFAULT_MEMORY_MIB);
    let admitted = nubo_spec::admit(
        &nubo_spec::ResolvedResources {
            vcpus,
            memory: memory_mib << 20,
        },
        &facts.host,
    )?;
    notes.extend(admitted);
    let disk_size = spec.resources.disk_size.map(|d| d.0);
    if let Some(size) = disk_size {
        if size < facts.base.virtual_size {
            return Err(invalid(
                Field::ResourcesDiskSize,
                format!(
                    "{} is smaller than the image's virtual size {}: give at least {}",
                    nubo_core::ByteSize(size),
                    nubo_core::ByteSize(facts.base.virtual_size),
                    nubo_core::ByteSize(facts.base.virtual_size)
                ),
            ));
        }
    }

    let machine = match spec.machine {
        Machine::Default => MachineKind::Default,
        Machine::Microvm => MachineKind::Microvm,
    };
    let boot = decide_boot(spec, image, machine, &mut notes)?;
    let network = match &spec.network {
        Network::Forward => NetworkMode::Forward,
        Network::Restricted => NetworkMode::Restricted,
        Network::Named(n) => NetworkMode::Named(n.clone()),
        Network::None => NetworkMode::None,
    };

    let input = SelectionInput {
        flag: spec.backend.as_deref(),
        image: image.and_then(|i| i.hypervisor.as_deref()),
        env: facts.env_backend.as_deref(),
        default: facts.default_backend.as_deref(),
        available: &facts.available,
        microvm_workload: machine == MachineKind::Microvm,
        direct_kernel: spec.boot.is_some(),
        restricted_network: network == NetworkMode::Restricted,
    };
    let selection = nubo_backend::select(registry, &input)?;
    let backend = registry.resolve(selection.id)?;
    let caps = backend.capabilities();
    let options = spec.overrides.get(backend.id()).cloned().unwrap_or_default();
    if let Some(other) = spec.overrides.keys().find(|k| registry.resolve(k).is_err()) {
        return Err(EngineError::spec_at(
            Field::Overrides,
            &format!(".{other}"),
            format!(
                "`{other}` is not a backend: known backends are {}",
                registry.names().join(", ")
            ),
        ));
    }
    refuse_unsupported(registry, backend.id(), &caps, &boot, machine, &network, &options)?;
    if !spec.ports.is_empty() && !caps.has(Capability::PortForwards) {
        return Err(EngineError::spec(
            Field::Ports,
            nubo_backend::BackendError::unsupported(
                backend.id(),
                "port forwards",
                format!(
                    "{}, or reach the guest at its own address",
                    registry.alternative(Capability::PortForwards, "another backend")
                ),
            )
            .to_string(),
        ));
    }

    let hostname = ci.hostname.clone().unwrap_or_else(|| spec.name.to_string());
    let ssh_user = spec
        .ssh_user
        .clone()
        .or_else(|| image.and_then(|i| i.default_user.clone()))
        .unwrap_or_else(|| DEFAULT_SSH_USER.to_owned());
    if let DiskSource::Disk { path } = &spec.source {
        notes.push(format!(
            "disk {} is used as a read-only base under an overlay: it must not change while the VM exists",
            path.display()
        ));
    }
    Ok((
        Plan {
            name: spec.name.to_string(),
            backend: backend.id(),
            backend_reason: format!("backend {} (chosen by {})", backend.id(), selection.source.describe()),
            backend_source: selection.source,
            base: facts.base.clone(),
            image: image.map(|i| crate::record::ImageUse {
                reference: i.reference.clone(),
                digest: i.digest.clone(),
            }),
            vcpus,
            memory_mib,
            disk_size,
            boot,
            machine,
            network,
            ports: spec.ports.clone(),
            options,
            seed,
            hostname,
            ssh_user,
            notes,
            mounts: Vec::new(),
        },
        caps,
    ))
}

/// A capability the spec needs and the backend lacks is refused here, before any file exists.
fn refuse_unsupported(
    registry: &Registry,
    id: &'static str,
    caps: &Capabilities,
    boot: &Boot,
    machine: MachineKind,
    network: &NetworkMode,
    options: &std::collections::BTreeMap<String, String>,
) -> Result<(), EngineError> {
    let unsupported = |what: &str, cap: Capability, more: &str| -> EngineError {
        let alt = registry.alternative(cap, "another backend");
        nubo_backend::BackendError::unsupported(id, what, format!("{alt}{more}")).into()
    };
    if matches!(boot, Boot::Kernel { .. }) && !caps.has(Capability::DirectKernel) {
        return Err(unsupported("direct-kernel boot", Capability::DirectKernel, ""));
    }
    // A firmware file the user names (`--firmware PATH`) is the backend's `check` to judge;
    // `--firmware efi` needs firmware the backend finds itself.
    if matches!(
        boot,
        Boot::Firmware {
            firmware: Firmware::Efi
        }
    ) && !caps.has(Capability::Efi)
    {
        return Err(nubo_backend::BackendError::unsupported(
            id,
            "UEFI boot",
            "--firmware PATH to UEFI firmware, or install the backend's (OVMF, the ovmf package, for qemu; an EDK2 CLOUDHV.fd for cloud-hypervisor), or --firmware bios on qemu",
        )
        .into());
    }
    if machine == MachineKind::Microvm && !caps.has(Capability::Microvm) {
        return Err(unsupported("the microvm machine", Capability::Microvm, ""));
    }
    if matches!(network, NetworkMode::Named(_)) && !caps.has(Capability::NamedNetworks) {
        return Err(unsupported(
            "named networks",
            Capability::NamedNetworks,
            ", or network forward|restricted",
        ));
    }
    if let Some(k) = options.keys().find(|k| !caps.options.contains(&k.as_str())) {
        return Err(EngineError::spec_at(
            Field::Overrides,
            &format!(".{id}.{k}"),
            format!(
                "the {id} backend has no option `{k}`: it takes {}",
                if caps.options.is_empty() {
                    "none".to_owned()
                } else {
                    caps.options.join(", ")
                }
            ),
        ));
    }
    Ok(())
}

fn decide_boot(
    spec: &VmSpec,
    image: Option<&ImageRecord>,
    machine: MachineKind,
    notes: &mut Vec<String>,
) -> Result<Boot, EngineError> {
    use nubo_spec::Firmware as F;
    if let Some(k) = &spec.boot {
        let cmdline = match (&k.cmdline, image.and_then(|i| i.boot.as_ref())) {
            (Some(c), _) => c.clone(),
            (None, Some(b)) => b.cmdline.clone(),
            (None, None) => {
                return Err(invalid(
                    Field::BootCmdline,
                    "a kernel boot needs a command line here (the image records none), e.g. 'root=/dev/vda1 ro'",
                ))
            }
        };
        return Ok(Boot::Kernel {
            kernel: k.kernel.clone(),
            initrd: k.initrd.clone(),
            cmdline,
        });
    }
    let offers = |f: nubo_image::Firmware| image.is_none_or(|i| i.firmware.is_empty() || i.firmware.contains(&f));
    let firmware = match &spec.firmware {
        F::Bios if !offers(nubo_image::Firmware::Bios) => {
            return Err(invalid(Field::Firmware, "the image does not boot with BIOS firmware: use efi"))
        }
        F::Efi | F::Path(_) if !offers(nubo_image::Firmware::Efi) => {
            return Err(invalid(Field::Firmware, "the image does not boot with UEFI firmware: use bios"))
        }
        F::Bios => Firmware::Bios,
        F::Efi => Firmware::Efi,
        F::Path(p) => Firmware::EfiCode(p.clone()),
        F::Auto => match image.and_then(|i| i.boot.as_ref()) {
            Some(b) => {
                notes.push(
                    "booting the image's own kernel directly (no firmware or GRUB: faster); firmware bios|efi boots through the boot loader instead"
                        .to_owned(),
                );
                return Ok(Boot::Kernel {
                    kernel: b.kernel.clone(),
                    initrd: b.initrd.clone(),
                    cmdline: b.cmdline.clone(),
                });
            }
            None if machine == MachineKind::Microvm => {
                return Err(invalid(
                    Field::Machine,
                    "the microvm machine boots only a kernel, and the image records none: give a kernel, initrd and cmdline",
                ))
            }
            None => Firmware::Bios,
        },
    };
    Ok(Boot::Firmware { firmware })
}
