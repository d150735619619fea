//! `vm create`: validate everything, then make the VM step by step, each step undone if a later
//! one fails. A `create` killed midway leaves a record in phase `creating`; the next `create` of
//! the name tears down what it finds and starts over, so interrupted work converges.

use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Instant;

use nubo_backend::{Accel, Backend, BootMode, MachineSpec, MachineType, NetworkSpec, SeedDevice, SeedFormat, VmHandle};
use nubo_core::{ByteSize, VmName};
use nubo_image::{Firmware, ImageRecord, ImageRef, ImageStore};
use serde::{Deserialize, Serialize};

use crate::record::{self, ImageUse, Phase, SshInfo, VmRecord};
use crate::{Engine, EngineError, Event};

/// What the user asked for. Stored in the record (payload bytes only by digest) so that a
/// second `create` with the same request is recognised, and a different one named.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateRequest {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_keys: Vec<String>,
    #[serde(skip)]
    pub user_data: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_sha256: Option<String>,
    #[serde(skip)]
    pub network_config: Option<Vec<u8>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_config_sha256: Option<String>,
    /// The user's own seed image, attached as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initrd: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// `bios`, `efi`, or a path to UEFI firmware code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineType>,
    pub accel: Accel,
    /// User-mode networking with `restrict=on`: the guest reaches nothing but its forwards.
    #[serde(default)]
    pub restrict_network: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_user: Option<String>,
}

impl CreateRequest {
    /// Fills the payload digests, so two requests compare by content.
    pub fn normalized(mut self) -> CreateRequest {
        self.user_data_sha256 = self.user_data.as_deref().map(sha256_hex);
        self.network_config_sha256 = self.network_config.as_deref().map(sha256_hex);
        self
    }
}

fn sha256_hex(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// The fields in which two requests differ, as `field: old -> new`.
pub fn differences(old: &CreateRequest, new: &CreateRequest) -> Vec<String> {
    let to_map = |r: &CreateRequest| match serde_json::to_value(r) {
        Ok(serde_json::Value::Object(m)) => m,
        _ => serde_json::Map::new(),
    };
    let (a, b) = (to_map(old), to_map(new));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let show = |v: Option<&serde_json::Value>| v.map_or_else(|| "unset".to_owned(), |v| v.to_string());
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{k}: {} -> {}", show(a.get(k)), show(b.get(k))))
        .collect()
}

/// Everything `create` decided before touching the disk.
pub struct Plan {
    pub name: VmName,
    pub backend: &'static str,
    pub backend_reason: String,
    pub base: PathBuf,
    pub base_format: nubo_disk::Format,
    pub image: Option<ImageRecord>,
    pub vcpus: u32,
    pub memory_mib: u64,
    pub disk_size: Option<u64>,
    pub boot: BootChoice,
    pub machine: MachineType,
    pub hostname: String,
    pub personalise: bool,
    pub ssh_user: String,
    pub notes: Vec<String>,
}

pub enum BootChoice {
    Bios,
    Efi {
        code: PathBuf,
        vars_template: PathBuf,
    },
    Kernel {
        kernel: PathBuf,
        initrd: Option<PathBuf>,
        cmdline: String,
    },
}

const MIN_MEMORY_MIB: u64 = 128;
const MAX_VCPUS: u32 = 288;
/// Used when neither the request nor the image says.
const DEFAULT_VCPUS: u32 = 1;
const DEFAULT_MEMORY_MIB: u64 = 1024;

fn invalid(msg: impl Into<String>) -> EngineError {
    EngineError::InvalidInput(msg.into())
}

fn must_exist(what: &str, p: &Path) -> Result<(), EngineError> {
    if p.is_file() {
        Ok(())
    } else {
        Err(invalid(format!(
            "{what} {} does not exist or is not a file",
            p.display()
        )))
    }
}

impl Engine {
    /// Checks every option and resolves the image, writing nothing.
    pub fn plan(&self, req: &CreateRequest) -> Result<Plan, EngineError> {
        let name = VmName::parse(&req.name)?;
        let mut notes = Vec::new();
        let (image, base, base_format) = match (&req.image, &req.disk) {
            (Some(_), Some(_)) => return Err(invalid("give either --image or --disk, not both")),
            (None, None) => return Err(invalid("give --image REF (see `nubo image ls`) or --disk PATH")),
            (Some(r), None) => {
                let r = ImageRef::parse(r).map_err(|e| invalid(e.to_string()))?;
                let store = ImageStore::open(&self.roots.images())?;
                let rec = store.require(&r)?;
                let format = rec.format.parse::<nubo_disk::Format>().map_err(|_| {
                    invalid(format!(
                        "image `{r}` records format `{}`, which nubo cannot boot",
                        rec.format
                    ))
                })?;
                (Some(rec.clone()), rec.path.clone(), format)
            }
            (None, Some(p)) => {
                let info = nubo_disk::inspect(p)?;
                notes.push(format!(
                    "--disk {} is used as a read-only base under an overlay: it must not change while the VM exists",
                    p.display()
                ));
                (None, p.clone(), info.format)
            }
        };
        let cloud_init = image.as_ref().is_none_or(|i| i.cloud_init);
        let personal_opts = req.hostname.is_some()
            || !req.ssh_keys.is_empty()
            || req.user_data.is_some()
            || req.network_config.is_some();
        if !cloud_init && (personal_opts || req.seed.is_some()) {
            return Err(invalid(format!(
                "image `{}` is an appliance (no cloud-init): --hostname, --ssh-key, --user-data, --network-config and --seed do not apply to it",
                req.image.as_deref().unwrap_or_default()
            )));
        }
        if req.seed.is_some() && personal_opts {
            return Err(invalid(
                "--seed attaches your own seed as is: put the hostname, keys and user-data in it instead of --hostname/--ssh-key/--user-data/--network-config",
            ));
        }
        if let Some(seed) = &req.seed {
            must_exist("seed", seed)?;
        }
        if let Some(ud) = &req.user_data {
            nubo_seed::validate_user_data(ud)?;
        }
        let hostname = req.hostname.clone().unwrap_or_else(|| name.to_string());
        nubo_seed::validate_hostname(&hostname)?;

        let vcpus = req
            .vcpus
            .or(image.as_ref().map(|i| i.default_vcpus))
            .unwrap_or(DEFAULT_VCPUS);
        if vcpus == 0 || vcpus > MAX_VCPUS {
            return Err(invalid(format!(
                "--vcpus {vcpus} is out of range: give 1 to {MAX_VCPUS}"
            )));
        }
        let memory_mib = req
            .memory_mib
            .or(image.as_ref().map(|i| i.default_memory_mib))
            .unwrap_or(DEFAULT_MEMORY_MIB);
        if memory_mib < MIN_MEMORY_MIB {
            return Err(invalid(format!(
                "--memory {} is too small: give at least {}",
                ByteSize(memory_mib << 20),
                ByteSize(MIN_MEMORY_MIB << 20)
            )));
        }
        if let Some(size) = req.disk_size {
            let base_size = match &image {
                Some(i) => i.virtual_size,
                None => nubo_disk::inspect(&base)?.virtual_size,
            };
            if size < base_size {
                return Err(invalid(format!(
                    "--disk-size {} is smaller than the image's virtual size {}: give at least {}",
                    ByteSize(size),
                    ByteSize(base_size),
                    ByteSize(base_size)
                )));
            }
        }

        let machine = req.machine.unwrap_or(MachineType::Pc);
        let boot = self.plan_boot(req, image.as_ref(), machine, &mut notes)?;

        let handle = self.handle(&name, "");
        for p in [&handle.qmp_socket, &handle.serial_socket] {
            nubo_backend::qemu::check_socket_path(p)?;
        }
        let (backend, backend_reason) = self.select_backend(req, image.as_ref())?;
        let ssh_user = req
            .ssh_user
            .clone()
            .or_else(|| image.as_ref().and_then(|i| i.default_user.clone()))
            .unwrap_or_else(|| "root".to_owned());
        Ok(Plan {
            name,
            backend,
            backend_reason,
            base,
            base_format,
            image,
            vcpus,
            memory_mib,
            disk_size: req.disk_size,
            boot,
            machine,
            hostname,
            personalise: cloud_init && req.seed.is_none(),
            ssh_user,
            notes,
        })
    }

    fn plan_boot(
        &self,
        req: &CreateRequest,
        image: Option<&ImageRecord>,
        machine: MachineType,
        notes: &mut Vec<String>,
    ) -> Result<BootChoice, EngineError> {
        if req.kernel.is_none() && (req.initrd.is_some() || req.cmdline.is_some()) {
            return Err(invalid("--initrd and --cmdline need --kernel"));
        }
        if req.kernel.is_some() && req.firmware.is_some() {
            return Err(invalid("--kernel boots without firmware: drop --firmware, or drop --kernel to boot through the image's boot loader"));
        }
        if let Some(k) = &req.kernel {
            must_exist("kernel", k)?;
            if let Some(i) = &req.initrd {
                must_exist("initrd", i)?;
            }
            let cmdline =
                match (&req.cmdline, image.and_then(|i| i.boot.as_ref())) {
                    (Some(c), _) => c.clone(),
                    (None, Some(b)) => b.cmdline.clone(),
                    (None, None) => return Err(invalid(
                        "--kernel needs --cmdline here (the image records none), e.g. --cmdline 'root=/dev/vda1 ro'",
                    )),
                };
            return Ok(BootChoice::Kernel {
                kernel: k.clone(),
                initrd: req.initrd.clone(),
                cmdline,
            });
        }
        let offers = |f: Firmware| image.is_none_or(|i| i.firmware.is_empty() || i.firmware.contains(&f));
        match req.firmware.as_deref() {
            Some("bios") => {
                if !offers(Firmware::Bios) {
                    return Err(invalid("the image does not boot with BIOS firmware: use --firmware efi"));
                }
                Ok(BootChoice::Bios)
            }
            Some("efi") => {
                if !offers(Firmware::Efi) {
                    return Err(invalid("the image does not boot with UEFI firmware: use --firmware bios"));
                }
                let o = nubo_backend::qemu::probe::find_ovmf()
                    .ok_or_else(|| invalid("--firmware efi needs OVMF, which is not installed: install the ovmf package"))?;
                Ok(BootChoice::Efi { code: o.code, vars_template: o.vars })
            }
            Some(path) => {
                let code = PathBuf::from(path);
                must_exist("firmware", &code)?;
                let o = nubo_backend::qemu::probe::find_ovmf().ok_or_else(|| {
                    invalid("--firmware PATH needs a UEFI variable store template, and no OVMF_VARS file is installed: install the ovmf package")
                })?;
                Ok(BootChoice::Efi { code, vars_template: o.vars })
            }
            None => match image.and_then(|i| i.boot.as_ref()) {
                Some(b) => {
                    notes.push(
                        "booting the image's own kernel directly (no firmware or GRUB: faster); --firmware bios|efi boots through the boot loader instead"
                            .to_owned(),
                    );
                    Ok(BootChoice::Kernel { kernel: b.kernel.clone(), initrd: b.initrd.clone(), cmdline: b.cmdline.clone() })
                }
                None if machine == MachineType::Microvm => Err(invalid(
                    "--machine microvm boots only a kernel, and the image records none: give --kernel/--initrd/--cmdline",
                )),
                None => Ok(BootChoice::Bios),
            },
        }
    }

    fn select_backend(
        &self,
        req: &CreateRequest,
        image: Option<&ImageRecord>,
    ) -> Result<(&'static str, String), EngineError> {
        let default = self.default_backend()?;
        let available: Vec<&str> = self
            .registry
            .iter()
            .filter(|b| b.auto_selectable() && b.installed())
            .map(|b| b.id())
            .collect();
        let input = nubo_backend::SelectionInput {
            flag: req.backend.as_deref(),
            image: image.and_then(|i| i.hypervisor.as_deref()),
            env: self.env_backend.as_deref(),
            default: default.as_deref(),
            available: &available,
            microvm_workload: false,
            direct_kernel: req.kernel.is_some(),
        };
        let s = nubo_backend::select(&self.registry, &input)?;
        Ok((s.id, format!("backend {} (chosen by {})", s.id, s.source.describe())))
    }

    pub(crate) fn handle(&self, name: &VmName, uuid: &str) -> VmHandle {
        let run = self.roots.vm_run_dir(name.as_str());
        VmHandle {
            name: name.to_string(),
            uuid: uuid.to_owned(),
            qmp_socket: run.join("qmp.sock"),
            serial_socket: run.join("serial.sock"),
            pid_file: run.join("vmm.pid"),
            run_dir: run,
        }
    }

    /// Creates and boots the VM. A VM of that name that was created with the same request is
    /// returned as is (started if it was stopped); a different request is an error naming the
    /// differences.
    pub fn create(&self, req: CreateRequest, events: &mut dyn FnMut(Event)) -> Result<Created, EngineError> {
        let t0 = Instant::now();
        let req = req.normalized();
        let plan = self.plan(&req)?;
        let name = plan.name.clone();
        let _lock = self.lock(name.as_str())?;
        let dir = self.roots.vm_dir(name.as_str());
        match record::load(&dir)? {
            Some(rec) if rec.phase == Phase::Created => {
                let diffs = differences(&rec.request, &req);
                if !diffs.is_empty() {
                    return Err(EngineError::Conflict {
                        name: name.to_string(),
                        differences: diffs,
                    });
                }
                let backend = self.backend_of(&rec)?;
                let mut rec = rec;
                if backend.state(&rec.machine.handle)? == nubo_core::VmState::Stopped {
                    events(Event::Step(format!(
                        "vm `{name}` exists with this spec and is stopped: starting it"
                    )));
                    self.boot_locked(&mut rec, backend, events)?;
                    record::save(&dir, &rec)?;
                } else {
                    events(Event::Step(format!(
                        "vm `{name}` already exists with this spec and is running"
                    )));
                }
                return Ok(Created {
                    record: rec,
                    existed: true,
                    started: t0,
                });
            }
            Some(rec) => {
                events(Event::Step(format!("vm `{name}`: cleaning up an interrupted create")));
                self.teardown(&rec)?;
            }
            None if dir.exists() => {
                // A directory without a record: create was killed before writing it, so nothing
                // was started and nothing else was made.
                fs::remove_dir_all(&dir)
                    .map_err(EngineError::io(name.as_str(), format!("removing {}", dir.display())))?;
            }
            None => {}
        }
        for n in &plan.notes {
            events(Event::Note(n.clone()));
        }
        events(Event::Step(plan.backend_reason.clone()));
        let mut undo = Undo {
            dir: dir.clone(),
            handle: None,
            backend: None,
            armed: true,
        };
        let rec = self.make(&req, &plan, &mut undo, events)?;
        undo.armed = false;
        Ok(Created {
            record: rec,
            existed: false,
            started: t0,
        })
    }

    fn make<'a>(
        &'a self,
        req: &CreateRequest,
        plan: &Plan,
        undo: &mut Undo<'a>,
        events: &mut dyn FnMut(Event),
    ) -> Result<VmRecord, EngineError> {
        let name = plan.name.as_str();
        let io = |what: String| EngineError::io(name, what);
        let dir = &undo.dir;
        fs::create_dir_all(self.roots.vms()).map_err(io(format!("creating {}", self.roots.vms().display())))?;
        fs::create_dir(dir).map_err(io(format!("creating {}", dir.display())))?;
        let uuid = uuid::Uuid::new_v4().to_string();
        let handle = self.handle(&plan.name, &uuid);
        let backend = self.registry.resolve(plan.backend)?;
        undo.handle = Some(handle.clone());
        undo.backend = Some(backend);

        let disk = dir.join("disk.qcow2");
        let boot = match &plan.boot {
            BootChoice::Bios => BootMode::Bios,
            BootChoice::Kernel {
                kernel,
                initrd,
                cmdline,
            } => BootMode::Kernel {
                kernel: kernel.clone(),
                initrd: initrd.clone(),
                cmdline: cmdline.clone(),
            },
            BootChoice::Efi { code, .. } => BootMode::Efi {
                code: code.clone(),
                vars: dir.join("efivars.fd"),
            },
        };
        let port = crate::ssh::free_port()?;
        let mac = mac_from_uuid(&uuid);
        let seed_path = dir.join("seed.img");
        let machine = MachineSpec {
            handle,
            uuid: uuid.clone(),
            vcpus: plan.vcpus,
            memory_mib: plan.memory_mib,
            disk: disk.clone(),
            disk_format: "qcow2".into(),
            seed: (plan.personalise || req.seed.is_some()).then(|| SeedDevice {
                path: seed_path.clone(),
                format: SeedFormat::Iso,
            }),
            boot,
            machine: plan.machine,
            accel: req.accel,
            network: NetworkSpec::User {
                ssh_forward: Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port))),
                restrict: req.restrict_network,
                mac: mac.clone(),
            },
            console_log: dir.join("console.log"),
        };
        let (_, nubo_key) = crate::ssh::ensure_key(&self.roots.ssh_dir())?;
        let mut rec = VmRecord {
            name: name.to_owned(),
            uuid: uuid.clone(),
            backend: plan.backend.to_owned(),
            phase: Phase::Creating,
            created: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            request: req.clone(),
            image: plan.image.as_ref().map(|i| ImageUse {
                reference: i.reference.clone(),
                digest: i.digest.clone(),
            }),
            machine,
            ssh: Some(SshInfo {
                port,
                user: plan.ssh_user.clone(),
                nubo_key: plan.personalise && req.user_data.is_none(),
            }),
            accel_reason: None,
            argv: Vec::new(),
        };
        // The record comes first: from here on, an interrupted create is found and converged.
        // It need not be durable yet: after a power loss there is no QEMU to converge.
        record::save_unsynced(dir, &rec)?;

        nubo_disk::create_overlay(&plan.base, plan.base_format, &disk, plan.disk_size)?;
        events(Event::Step(format!(
            "overlay {} over {}",
            disk.display(),
            plan.base.display()
        )));

        if let Some(user_seed) = &req.seed {
            let bytes = fs::read(user_seed).map_err(io(format!("reading seed {}", user_seed.display())))?;
            let format = nubo_seed::SeedFormat::sniff(&bytes).ok_or_else(|| {
                invalid(format!(
                    "--seed {} is neither an ISO9660 nor a FAT image: build one with `nubo seed build`",
                    user_seed.display()
                ))
            })?;
            nubo_core::write_atomic_unsynced(&seed_path, &bytes)
                .map_err(io(format!("writing {}", seed_path.display())))?;
            if let Some(s) = rec.machine.seed.as_mut() {
                s.format = backend_seed_format(format);
            }
            events(Event::Step(format!(
                "seed: your {} attached as is",
                user_seed.display()
            )));
        } else if plan.personalise {
            let mut keys = req.ssh_keys.clone();
            keys.push(nubo_key.clone());
            let (user_data, vendor_data) = match &req.user_data {
                Some(ud) => {
                    // The user's user-data is passed through untouched; nubo's key rides in
                    // vendor-data, which cloud-init applies unless the user-data overrides
                    // `ssh_authorized_keys`.
                    let vd = nubo_seed::render_cloud_config(&nubo_seed::CloudConfig {
                        hostname: None,
                        ssh_authorized_keys: keys,
                    });
                    events(Event::Note(
                        "your user-data is passed through as is; nubo's SSH key goes in vendor-data, so `nubo vm ssh` works unless your user-data sets ssh_authorized_keys (then add nubo's key, `nubo vm ssh-key`, to it)".into(),
                    ));
                    (ud.clone(), Some(vd))
                }
                None => (
                    nubo_seed::render_cloud_config(&nubo_seed::CloudConfig {
                        hostname: Some(plan.hostname.clone()),
                        ssh_authorized_keys: keys,
                    }),
                    None,
                ),
            };
            let spec = nubo_seed::SeedSpec {
                instance_id: uuid.clone(),
                local_hostname: plan.hostname.clone(),
                user_data: Some(user_data),
                network_config: req.network_config.clone(),
                vendor_data,
            };
            let bytes = nubo_seed::build(&spec, nubo_seed::SeedFormat::Iso)?;
            nubo_core::write_atomic_unsynced(&seed_path, &bytes)
                .map_err(io(format!("writing {}", seed_path.display())))?;
            events(Event::Step(format!(
                "seed {} (NoCloud, instance-id {uuid})",
                seed_path.display()
            )));
        }
        if let BootChoice::Efi { vars_template, .. } = &plan.boot {
            let vars = dir.join("efivars.fd");
            fs::copy(vars_template, &vars).map_err(io(format!(
                "copying {} to {}",
                vars_template.display(),
                vars.display()
            )))?;
        }
        self.boot_locked(&mut rec, backend, events)?;
        // One syncfs makes the seed and the `creating` record durable together, after QEMU has
        // started rather than on its critical path; only then is the VM recorded as created.
        sync_fs(dir).map_err(io(format!("syncing {}", dir.display())))?;
        rec.phase = Phase::Created;
        record::save(dir, &rec)?;
        Ok(rec)
    }

    /// Boots `rec` (lock held): rotates the console log, re-picks the SSH port when another
    /// program took it, and notes what the backend reports in `rec`; the caller saves it.
    pub(crate) fn boot_locked(
        &self,
        rec: &mut VmRecord,
        backend: &dyn Backend,
        events: &mut dyn FnMut(Event),
    ) -> Result<(), EngineError> {
        crate::lifecycle::rotate_console(&rec.machine.console_log)
            .map_err(EngineError::io(&rec.name, "rotating the console log"))?;
        const ATTEMPTS: u32 = 3;
        for attempt in 1..=ATTEMPTS {
            if let NetworkSpec::User {
                ssh_forward: Some(addr),
                ..
            } = &mut rec.machine.network
            {
                if !crate::ssh::port_free(addr.port()) {
                    let port = crate::ssh::free_port()?;
                    addr.set_port(port);
                    if let Some(s) = rec.ssh.as_mut() {
                        s.port = port;
                    }
                }
            }
            match backend.boot(&rec.machine) {
                Ok(info) => {
                    events(Event::Step(format!("accelerator: {}", info.accel_reason)));
                    rec.accel_reason = Some(info.accel_reason);
                    rec.argv = info.argv;
                    return Ok(());
                }
                // Someone took the port between our check and QEMU's bind: pick another.
                Err(nubo_backend::BackendError::Remote { detail, .. })
                    if attempt < ATTEMPTS && detail.contains("host forwarding rule") =>
                {
                    let port = crate::ssh::free_port()?;
                    if let NetworkSpec::User {
                        ssh_forward: Some(addr),
                        ..
                    } = &mut rec.machine.network
                    {
                        addr.set_port(port);
                    }
                    if let Some(s) = rec.ssh.as_mut() {
                        s.port = port;
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("the last attempt returns")
    }
}

fn sync_fs(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let d = fs::File::open(dir)?;
    nix::unistd::syncfs(d.as_raw_fd()).map_err(std::io::Error::from)
}

fn backend_seed_format(f: nubo_seed::SeedFormat) -> SeedFormat {
    match f {
        nubo_seed::SeedFormat::Iso => SeedFormat::Iso,
        nubo_seed::SeedFormat::Vfat => SeedFormat::Vfat,
    }
}

/// A locally administered unicast MAC in QEMU's 52:54:00 range, stable for the VM's life.
pub fn mac_from_uuid(uuid: &str) -> String {
    let hex: Vec<u8> = uuid.bytes().filter(u8::is_ascii_hexdigit).collect();
    let byte = |i: usize| {
        std::str::from_utf8(&hex[i * 2..i * 2 + 2])
            .ok()
            .and_then(|s| u8::from_str_radix(s, 16).ok())
            .unwrap_or(0)
    };
    format!("52:54:00:{:02x}:{:02x}:{:02x}", byte(0), byte(1), byte(2))
}

pub struct Created {
    pub record: VmRecord,
    /// It was there already, with the same request.
    pub existed: bool,
    pub started: Instant,
}

/// Undoes a create that failed: stops what was booted and removes the VM directory (overlay,
/// seed, record). Disarmed once the create succeeds.
struct Undo<'a> {
    dir: PathBuf,
    handle: Option<VmHandle>,
    backend: Option<&'a dyn Backend>,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if let (Some(h), Some(b)) = (&self.handle, self.backend) {
            let _ = b.destroy(h);
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_names_changed_fields_only() {
        let a = CreateRequest {
            name: "a".into(),
            image: Some("debian:12".into()),
            vcpus: Some(1),
            ..Default::default()
        };
        let b = CreateRequest {
            vcpus: Some(2),
            ..a.clone()
        };

        assert_eq!(differences(&a, &b), vec!["vcpus: 1 -> 2".to_owned()]);
    }

    #[test]
    fn differences_user_data_compared_by_digest() {
        let a = CreateRequest {
            user_data: Some(b"#cloud-config\n".to_vec()),
            ..Default::default()
        }
        .normalized();
        let b = CreateRequest {
            user_data: Some(b"#cloud-config\na: 1\n".to_vec()),
            ..Default::default()
        }
        .normalized();

        let d = differences(&a, &b);

        assert_eq!(d.len(), 1);
        assert!(d[0].starts_with("user_data_sha256:"), "{d:?}");
    }

    #[test]
    fn differences_same_request_is_empty() {
        let a = CreateRequest {
            name: "a".into(),
            ssh_keys: vec!["k".into()],
            ..Default::default()
        }
        .normalized();

        assert!(differences(&a, &a.clone()).is_empty());
    }

    #[test]
    fn mac_from_uuid_is_qemu_local_range() {
        assert_eq!(
            mac_from_uuid("0b9f1c1e-7f61-4b8e-9a7c-2d2f6f6f0001"),
            "52:54:00:0b:9f:1c"
        );
    }
}
