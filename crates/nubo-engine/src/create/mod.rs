//! `vm create`: validate the spec (pure), plan (facts, then a pure decision), let the backend
//! check the machine, and only then make the VM step by step, each step undone if a later one
//! fails. A `create` killed midway leaves a record in phase `creating`; the next `create` of
//! the name tears down what it finds and starts over, so interrupted work converges.

pub mod seed;

use std::fs;

use std::path::{Path, PathBuf};
use std::time::Instant;

use nubo_backend::{Backend, Disk, MachineSpec, SeedDevice, SeedFormat, VmRef};
use nubo_image::ImageStore;
use nubo_spec::{DiskSource, VmSpec};

use crate::plan::{self, Base, Facts, Plan, SeedPlan};
use crate::record::{self, Phase, SshLogin, VmRecord};
use crate::{Engine, EngineError, Event, Fetch};

/// The largest own seed (`--seed`) nubo copies: NoCloud seeds are kilobytes.
pub const MAX_OWN_SEED: u64 = 64 << 20;

pub struct Created {
    pub record: VmRecord,
    /// It was there already, with the same spec.
    pub existed: bool,
    pub started: Instant,
}

/// The files a plan names that must exist: read (bounded) or checked now, before any write.
struct Inputs {
    own_seed: Option<(Vec<u8>, SeedFormat)>,
}

/// The seed codec's content checks of cloud-init payloads, which [`VmSpec::validate_with`] runs
/// before the VM's lock is taken or any file is made.
pub const SEED_CHECKS: nubo_spec::PayloadChecks = nubo_spec::PayloadChecks {
    user_data: |b| nubo_seed::validate_user_data(b).map_err(|e| e.to_string()),
    network_config: |b| nubo_seed::validate_network_config(b).map_err(|e| e.to_string()),
    vendor_data: |b| nubo_seed::validate_vendor_data(b).map_err(|e| e.to_string()),
};

impl Engine {
    /// Validates `spec` and plans its creation, writing nothing for the VM (an image that is
    /// not local yet is pulled into the store). The plan is what a dry run prints.
    pub fn plan(&self, spec: &VmSpec, events: &mut dyn FnMut(Event)) -> Result<(Plan, Facts), EngineError> {
        self.plan_with(spec, true, events)
    }

    /// [`plan`](Self::plan) for a dry run: the same code path, minus every write (an image
    /// that is not local is not pulled; the plan says so by failing with the command to run).
    pub fn dry_run(&self, spec: &VmSpec) -> Result<Plan, EngineError> {
        let (plan, _) = self.plan_with(spec, false, &mut |_| {})?;
        // The file checks a create makes (a FIFO or device as `--kernel` is refused), read-only.
        self.inputs(spec, &plan)?;
        Ok(plan)
    }

    fn plan_with(
        &self,
        spec: &VmSpec,
        pull: bool,
        events: &mut dyn FnMut(Event),
    ) -> Result<(Plan, Facts), EngineError> {
        spec.validate_with(&SEED_CHECKS)?;
        let facts = self.gather(spec, pull, events)?;
        let (mut plan, _caps) = plan::decide(spec, &facts, &self.registry)?;
        let backend = self.registry.resolve(plan.backend)?;
        let (mounts, notes) = crate::mounts::resolve(spec, &plan, backend)?;
        plan.mounts = mounts;
        plan.notes.extend(notes);
        let preview = self.machine_spec(&plan, "00000000-0000-0000-0000-000000000000", None);
        plan.notes.extend(backend.check(&preview)?);
        Ok((plan, facts))
    }

    /// Gathers what `decide` needs: the image (pulled if missing), the inspected base, the
    /// host's resources and which backends are installed.
    fn gather(&self, spec: &VmSpec, pull: bool, events: &mut dyn FnMut(Event)) -> Result<Facts, EngineError> {
        let fetch = |what: &Fetch, events: &mut dyn FnMut(Event)| {
            if pull {
                self.fetch(what, events)
            } else {
                Err(EngineError::Unavailable {
                    what: "planning without the image".into(),
                    fix: "a dry run does not download: pull the image first with `nubo image pull`".into(),
                })
            }
        };
        let image = match &spec.source {
            DiskSource::Image { reference } => {
                let r = match nubo_image::AnyRef::parse(reference) {
                    Ok(nubo_image::AnyRef::Local(r)) => r,
                    Ok(nubo_image::AnyRef::Oci(o)) => {
                        events(Event::Step(format!("resolving `{o}` from its registry")));
                        return self.gather_with(spec, Some(fetch(&Fetch::Oci(o), events)?));
                    }
                    Err(e) => return Err(EngineError::spec(nubo_spec::Field::SourceImageReference, e.to_string())),
                };
                // A dry run writes nothing, not even the store's empty directories.
                let store = if pull {
                    ImageStore::open(&self.roots.images())?
                } else {
                    ImageStore::open_read_only(&self.roots.images())
                };
                match store.get(&r)? {
                    Some(rec) => Some(rec),
                    None if nubo_image::catalog::lookup(&r).is_some() => {
                        events(Event::Step(format!("image `{r}` is not in the store: pulling it")));
                        Some(fetch(&Fetch::Catalog(r), events)?)
                    }
                    None => Some(store.require(&r)?),
                }
            }
            DiskSource::Url {
                url,
                checksum,
                insecure_no_checksum,
                allow_http,
            } => Some(fetch(
                &Fetch::Url {
                    url: url.clone(),
                    checksum: checksum.clone(),
                    insecure_no_checksum: *insecure_no_checksum,
                    allow_http: *allow_http,
                },
                events,
            )?),
            DiskSource::Disk { .. } => None,
        };
        self.gather_with(spec, image)
    }

    /// The rest of [`gather`](Self::gather), once the image (if any) is known.
    fn gather_with(&self, spec: &VmSpec, image: Option<nubo_image::ImageRecord>) -> Result<Facts, EngineError> {
        let base = match (&image, &spec.source) {
            (Some(rec), _) => Base {
                path: rec.path.clone(),
                format: rec.format.parse::<nubo_disk::Format>().map_err(|_| {
                    EngineError::spec(
                        nubo_spec::Field::SourceImageReference,
                        format!(
                            "image `{}` records format `{}`, which nubo cannot boot",
                            rec.reference, rec.format
                        ),
                    )
                })?,
                virtual_size: rec.virtual_size,
            },
            (None, DiskSource::Disk { path }) => {
                // The strict inspector: a disk that is not self-contained (backing files, VMDK
                // extents) or not a format nubo allows is refused before QEMU sees it.
                let info = nubo_disk::inspect_base(path)?;
                Base {
                    path: path.clone(),
                    format: info.format,
                    virtual_size: info.virtual_size,
                }
            }
            (None, _) => unreachable!("image and url sources resolve to an image record"),
        };
        let available = self
            .registry
            .iter()
            .filter(|b| b.auto_selectable() && b.installed())
            .map(|b| b.id())
            .collect();
        Ok(Facts {
            image,
            base,
            host: crate::host::facts(),
            available,
            default_backend: self.default_backend()?,
            env_backend: self.env_backend.clone(),
        })
    }

    fn fetch(&self, what: &Fetch, events: &mut dyn FnMut(Event)) -> Result<nubo_image::ImageRecord, EngineError> {
        let f = self.fetcher.as_ref().ok_or_else(|| EngineError::Unavailable {
            what: "pulling images".into(),
            fix: "pull the image first with `nubo image pull`".into(),
        })?;
        f.fetch(what, &self.cancel, events)
    }

    /// Files the spec names, checked (and the own seed read, bounded) before any write.
    fn inputs(&self, spec: &VmSpec, plan: &Plan) -> Result<Inputs, EngineError> {
        let check = |field: nubo_spec::Field, what: &str, p: &Path| {
            nubo_core::file::open_regular(p, what)
                .map(drop)
                .map_err(|e| EngineError::spec(field, e.to_string()))
        };
        if let Some(k) = &spec.boot {
            check(nubo_spec::Field::BootKernel, "kernel", &k.kernel)?;
            if let Some(i) = &k.initrd {
                check(nubo_spec::Field::BootInitrd, "initrd", i)?;
            }
        }
        if let nubo_spec::Firmware::Path(p) = &spec.firmware {
            check(nubo_spec::Field::Firmware, "firmware", p)?;
        }
        let own_seed = match &plan.seed {
            SeedPlan::Own(p) => {
                let bytes = nubo_core::file::read_bounded(p, "seed", MAX_OWN_SEED)
                    .map_err(|e| EngineError::spec(nubo_spec::Field::CloudInitSeed, e.to_string()))?;
                let format = match nubo_seed::SeedFormat::sniff(&bytes) {
                    Some(nubo_seed::SeedFormat::Iso) => SeedFormat::Iso,
                    Some(nubo_seed::SeedFormat::Vfat) => SeedFormat::Vfat,
                    None => {
                        return Err(EngineError::spec(
                            nubo_spec::Field::CloudInitSeed,
                            format!(
                                "{} is neither an ISO9660 nor a FAT image: build one with `nubo seed build`",
                                p.display()
                            ),
                        ))
                    }
                };
                Some((bytes, format))
            }
            _ => None,
        };
        Ok(Inputs { own_seed })
    }

    /// The backend-neutral machine for `plan`.
    pub(crate) fn machine_spec(&self, plan: &Plan, uuid: &str, seed: Option<SeedDevice>) -> MachineSpec {
        let vm_dir = self.roots.vm_dir(&plan.name);
        MachineSpec {
            name: plan.name.clone(),
            uuid: uuid.to_owned(),
            run_dir: self.roots.vm_run_dir(&plan.name),
            vcpus: plan.vcpus,
            memory_mib: plan.memory_mib,
            disk: Disk {
                overlay: vm_dir.join("disk.qcow2"),
                base: plan.base.path.clone(),
                base_format: plan.base.format.qemu_driver().to_owned(),
                // Set once the overlay is made over the inspected base (`make`).
                base_size: None,
                chain_inspected: false,
                remote: false,
            },
            seed,
            boot: plan.boot.clone(),
            machine: plan.machine,
            network: plan.network.clone(),
            ports: plan.ports.clone(),
            options: plan.options.clone(),
            mounts: plan.mounts.clone(),
            vm_dir,
        }
    }

    /// Creates and boots the VM. A VM of that name that was created with the same spec is
    /// returned as is (started if it was stopped); a different spec is an error naming the
    /// differences.
    pub fn create(&self, spec: &VmSpec, events: &mut dyn FnMut(Event)) -> Result<Created, EngineError> {
        self.create_with(spec, true, events)
    }

    /// [`Engine::create`] that leaves the VM defined and stopped (disk, seed and domain made,
    /// nothing booted): a controller's `running: false`. An existing VM is left as it is.
    pub fn create_stopped(&self, spec: &VmSpec, events: &mut dyn FnMut(Event)) -> Result<Created, EngineError> {
        self.create_with(spec, false, events)
    }

    fn create_with(&self, spec: &VmSpec, start: bool, events: &mut dyn FnMut(Event)) -> Result<Created, EngineError> {
        let t0 = Instant::now();
        let (plan, _facts) = self.plan(spec, events)?;
        let inputs = self.inputs(spec, &plan)?;
        let name = plan.name.clone();
        let uuid = uuid::Uuid::new_v4().to_string();
        let (_, nubo_key) = self.nubo_key()?;
        // Built in memory now: a seed that cannot be built fails before anything is written.
        let seed = match &plan.seed {
            SeedPlan::Generated => {
                // A backend whose network has no DHCP (Cloud Hypervisor's tap) gives the
                // guest's address here, for the seed's network-config.
                let net = self
                    .registry
                    .resolve(plan.backend)?
                    .guest_network(&self.machine_spec(&plan, &uuid, None));
                Some(seed::build(
                    &self.with_uuid(spec, &uuid),
                    &uuid,
                    &plan.hostname,
                    &nubo_key,
                    net.as_ref(),
                    &plan.mounts,
                )?)
            }
            _ => None,
        };
        // Cancelled before the lock, nothing was written (a pull writes only whole images).
        self.check_cancel(&format!("creating vm `{name}`"))?;
        let lock = self.lock(&name, "create")?;
        let dir = self.roots.vm_dir(&name);
        match record::load(&dir)? {
            Some(rec) if rec.phase == Phase::Created => {
                drop(inputs);
                return self.existing(rec, spec, &dir, t0, start, events);
            }
            Some(rec) => {
                events(Event::Step(format!("vm `{name}`: cleaning up an interrupted create")));
                self.teardown(&rec)?;
            }
            None if dir.exists() => {
                // A directory without a record: create was killed before writing it, so nothing
                // was started and nothing else was made.
                fs::remove_dir_all(&dir).map_err(EngineError::io(&name, format!("removing {}", dir.display())))?;
            }
            None => {}
        }
        // Only a new VM probes its ports: an existing one holds them itself. Refused, the VM
        // leaves nothing behind, not even its lock file.
        if let Err(e) = nubo_backend::ports::check_free(&plan.ports) {
            lock.remove();
            return Err(EngineError::spec(nubo_spec::Field::Ports, e.to_string()));
        }
        for n in &plan.notes {
            events(Event::Note(n.clone()));
        }
        events(Event::Step(plan.backend_reason.clone()));
        let backend = self.registry.resolve(plan.backend)?;
        let mut undo = Undo {
            dir: dir.clone(),
            name: name.clone(),
            uuid: uuid.clone(),
            state: serde_json::Value::Null,
            backend,
            lock: Some(lock),
            armed: true,
        };
        let identity = SeedIdentity {
            hostname: plan.hostname.clone(),
            nubo_key,
        };
        let rec = self.make(spec, &plan, &uuid, seed, inputs, &identity, &mut undo, start, events)?;
        undo.armed = false;
        Ok(Created {
            record: rec,
            existed: false,
            started: t0,
        })
    }

    /// `spec` with `${vm.uuid}` in its user-data replaced by `uuid` when
    /// [`Engine::user_data_uuid`] asks for it (a controller's placeholder: the UUID is known only
    /// once the backend defined the VM); the seed inputs recorded stay the unrendered spec's.
    fn with_uuid<'s>(&self, spec: &'s VmSpec, uuid: &str) -> std::borrow::Cow<'s, VmSpec> {
        const PLACEHOLDER: &[u8] = b"${vm.uuid}";
        let Some(data) = spec.cloud_init.user_data.as_ref().and_then(|p| p.content()) else {
            return std::borrow::Cow::Borrowed(spec);
        };
        if !self.user_data_uuid || !data.windows(PLACEHOLDER.len()).any(|w| w == PLACEHOLDER) {
            return std::borrow::Cow::Borrowed(spec);
        }
        let mut out = Vec::with_capacity(data.len());
        let mut i = 0;
        while i < data.len() {
            if data[i..].starts_with(PLACEHOLDER) {
                out.extend_from_slice(uuid.as_bytes());
                i += PLACEHOLDER.len();
            } else {
                out.push(data[i]);
                i += 1;
            }
        }
        let mut s = spec.clone();
        s.cloud_init.user_data = Some(nubo_spec::Payload::new(out));
        std::borrow::Cow::Owned(s)
    }

    fn existing(
        &self,
        mut rec: VmRecord,
        spec: &VmSpec,
        dir: &Path,
        t0: Instant,
        start: bool,
        events: &mut dyn FnMut(Event),
    ) -> Result<Created, EngineError> {
        let name = rec.name.clone();
        let diffs = rec.spec.differences(spec);
        if !diffs.is_empty() {
            return Err(EngineError::Conflict {
                name,
                differences: diffs,
            });
        }
        let backend = self.backend_of(&rec)?;
        if start && backend.state(&rec.vm_ref(dir))? == nubo_core::VmState::Stopped {
            events(Event::Step(format!(
                "vm `{name}` exists with this spec and is stopped: starting it"
            )));
            self.boot_locked(&mut rec, backend, events)?;
            record::save(dir, &rec)?;
        } else {
            events(Event::Step(format!(
                "vm `{name}` already exists with this spec and is running"
            )));
        }
        Ok(Created {
            record: rec,
            existed: true,
            started: t0,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn make(
        &self,
        spec: &VmSpec,
        plan: &Plan,
        uuid: &str,
        seed: Option<seed::SeedBytes>,
        inputs: Inputs,
        identity: &SeedIdentity,
        undo: &mut Undo<'_>,
        start: bool,
        events: &mut dyn FnMut(Event),
    ) -> Result<VmRecord, EngineError> {
        let name = plan.name.as_str();
        let io = |what: String| EngineError::io(name, what);
        let dir = undo.dir.clone();
        nubo_core::fsmode::create_dir_all(&self.roots.vms(), nubo_core::fsmode::DIR)
            .map_err(io(format!("creating {}", self.roots.vms().display())))?;
        // 0700: the VM's directory holds its seed, which may carry passwords.
        nubo_core::fsmode::create_dir(&dir, nubo_core::fsmode::PRIVATE_DIR)
            .map_err(io(format!("creating {}", dir.display())))?;
        let seed_path = dir.join("seed.img");
        let seed_device = match (&seed, &inputs.own_seed) {
            (Some(_), _) => Some(SeedDevice {
                path: seed_path.clone(),
                format: SeedFormat::Iso,
            }),
            (None, Some((_, format))) => Some(SeedDevice {
                path: seed_path.clone(),
                format: *format,
            }),
            (None, None) => None,
        };
        let machine = self.machine_spec(plan, uuid, seed_device);
        let mut rec = VmRecord {
            schema: record::SCHEMA,
            name: name.to_owned(),
            uuid: uuid.to_owned(),
            backend: plan.backend.to_owned(),
            phase: Phase::Creating,
            created: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            spec: spec.clone(),
            image: plan.image.clone(),
            machine,
            backend_state: serde_json::Value::Null,
            ssh: SshLogin {
                user: plan.ssh_user.clone(),
                nubo_key: seed.as_ref().is_some_and(|s| s.nubo_key),
            },
            launch: None,
            notes: Vec::new(),
            snapshots: Vec::new(),
            current_snapshot: None,
            seed_inputs: Some(crate::observe::seed_inputs_digest(spec)),
        };
        // The record comes first: from here on, an interrupted create is found and converged.
        // It need not be durable yet: after a power loss there is no VMM to converge.
        record::save_unsynced(&dir, &rec)?;

        // A backend that assigns the VM's identity (libvirt: the domain's UUID) defines the VM
        // now, without its disk and seed; the seed is then built with that UUID as instance-id.
        let mut seed = seed;
        if let Some(defined) = undo.backend.define(&rec.machine)? {
            rec.uuid = defined.uuid.clone();
            rec.machine.uuid = defined.uuid.clone();
            rec.backend_state = defined.state;
            undo.uuid = defined.uuid.clone();
            undo.state = rec.backend_state.clone();
            record::save_unsynced(&dir, &rec)?;
            if seed.is_some() {
                let net = undo.backend.guest_network(&rec.machine);
                seed = Some(seed::build(
                    &self.with_uuid(spec, &defined.uuid),
                    &defined.uuid,
                    &identity.hostname,
                    &identity.nubo_key,
                    net.as_ref(),
                    &rec.machine.mounts,
                )?);
            }
            events(Event::Step(format!(
                "{} assigned the VM its UUID {}",
                plan.backend, defined.uuid
            )));
        }
        // The OS disk: a thin qcow2 over the verified base (inspected again here), never smaller
        // than it. A backend that keeps it itself (a libvirt volume) makes it; else the engine's
        // overlay in the VM's directory, made durable by the one syncfs after the VMM starts,
        // like the record and the seed.
        let base = nubo_disk::overlay_base(&plan.base.path, plan.base.format, plan.disk_size)?;
        // Every later boot checks the base still has this size (issue 21).
        rec.machine.disk.base_size = Some(base.base_size());
        match undo.backend.store_disk(&rec.machine, &rec.backend_state, base.size())? {
            Some(path) => {
                events(Event::Step(format!(
                    "OS disk stored by the {} backend at {} (thin qcow2 over {})",
                    plan.backend,
                    path.display(),
                    plan.base.path.display()
                )));
                rec.machine.disk.overlay = path;
                rec.machine.disk.remote = undo.backend.disk_is_remote(&rec.backend_state);
                record::save_unsynced(&dir, &rec)?;
            }
            None => {
                base.create_unsynced(&rec.machine.disk.overlay)?;
                events(Event::Step(format!(
                    "overlay {} over {}",
                    rec.machine.disk.overlay.display(),
                    plan.base.path.display()
                )));
            }
        }
        let uuid = rec.uuid.clone();
        // A backend that keeps the seed itself (a libvirt volume) stores it; else `seed.img`.
        let stored = match (&seed, &inputs.own_seed) {
            (Some(s), _) => undo
                .backend
                .store_seed(&rec.machine, &rec.backend_state, &s.bytes, SeedFormat::Iso)?,
            (None, Some((bytes, format))) => {
                undo.backend
                    .store_seed(&rec.machine, &rec.backend_state, bytes, *format)?
            }
            (None, None) => None,
        };
        if let Some(device) = stored {
            events(Event::Step(format!(
                "seed stored by the {} backend at {} (NoCloud, instance-id {uuid})",
                plan.backend,
                device.path.display()
            )));
            rec.machine.seed = Some(device);
            record::save_unsynced(&dir, &rec)?;
        } else {
            write_seed(name, &seed_path, seed, inputs.own_seed, &uuid, events)?;
        }
        // The last point a cancellation is seen before the VMM starts: from here `undo` tears
        // down what was made, as for any error.
        self.check_cancel(&format!("creating vm `{name}` (what it had made is removed)"))?;
        rec.backend_state = undo.backend.prepare(&rec.machine)?;
        undo.state = rec.backend_state.clone();
        if start {
            self.boot_locked(&mut rec, undo.backend, events)?;
            undo.state = rec.backend_state.clone();
        }
        // One syncfs makes the seed and the `creating` record durable together, after the VMM
        // has started rather than on its critical path; only then is the VM recorded as created.
        sync_fs(&dir).map_err(io(format!("syncing {}", dir.display())))?;
        rec.phase = Phase::Created;
        record::save(&dir, &rec)?;
        Ok(rec)
    }
}

/// Writes the seed nubo built, or the user's own, as `seed.img` in the VM's directory.
fn write_seed(
    name: &str,
    seed_path: &Path,
    seed: Option<seed::SeedBytes>,
    own_seed: Option<(Vec<u8>, SeedFormat)>,
    uuid: &str,
    events: &mut dyn FnMut(Event),
) -> Result<(), EngineError> {
    let io = |what: String| EngineError::io(name, what);
    match (seed, own_seed) {
        (Some(s), _) => {
            write_private(seed_path, &s.bytes).map_err(io(format!("writing {}", seed_path.display())))?;
            for n in s.notes {
                events(Event::Note(n));
            }
            events(Event::Step(format!(
                "seed {} (NoCloud, instance-id {uuid})",
                seed_path.display()
            )));
        }
        (None, Some((bytes, _))) => {
            write_private(seed_path, &bytes).map_err(io(format!("writing {}", seed_path.display())))?;
            events(Event::Step("seed: your own seed attached as is".into()));
        }
        (None, None) => {}
    }
    Ok(())
}

impl Engine {
    /// Boots `rec` (lock held) over its disk chain, inspected again just now, and notes what the
    /// backend reports in `rec`; the caller saves it.
    pub(crate) fn boot_locked(
        &self,
        rec: &mut VmRecord,
        backend: &dyn Backend,
        events: &mut dyn FnMut(Event),
    ) -> Result<(), EngineError> {
        let machine = self.inspected_machine(rec)?;
        let info = backend.boot(&machine, &mut rec.backend_state)?;
        for n in &info.notes {
            events(Event::Step(n.clone()));
        }
        rec.launch = Some(info.launch);
        rec.notes = info.notes;
        Ok(())
    }
}

/// What the seed is rebuilt with when the backend assigns the VM's UUID.
struct SeedIdentity {
    hostname: String,
    nubo_key: String,
}

/// Writes a file only its owner can read, without the fsync (see `make`).
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = nubo_core::fsmode::create_new(path, nubo_core::fsmode::PRIVATE)?;
    f.write_all(data)
}

fn sync_fs(dir: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let d = fs::File::open(dir)?;
    nix::unistd::syncfs(d.as_raw_fd()).map_err(std::io::Error::from)
}

/// Undoes a create that failed: stops what was booted and lets the backend delete what it
/// made (a libvirt domain and volumes), removes the VM directory (overlay, seed, record) and
/// the lock file of the VM that now does not exist. Disarmed on success.
struct Undo<'a> {
    dir: PathBuf,
    name: String,
    uuid: String,
    state: serde_json::Value,
    backend: &'a dyn Backend,
    lock: Option<crate::lock::VmLock>,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let vm = VmRef {
            name: &self.name,
            uuid: &self.uuid,
            vm_dir: &self.dir,
            state: &self.state,
        };
        let _ = self.backend.destroy(&vm);
        let _ = fs::remove_dir_all(&self.dir);
        if let Some(l) = self.lock.take() {
            l.remove();
        }
    }
}
