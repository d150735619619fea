//! An in-memory backend for tests of the engine (feature `fake`): no processes, no files of
//! its own but the overlay `store_disk` makes (as libvirt would). It keeps each VM's state in
//! memory, records every call, can be told to fail a boot, and advertises whatever
//! capabilities a test gives it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use nubo_core::VmState;

use crate::{
    Backend, BackendError, BackendSnapshot, BootInfo, Capabilities, Capability, ConsoleLog, ConsoleStream, HostCheck,
    Launch, MachineSpec, Probe, Reach, Restored, SnapshotTaken, StopMode, VmRef,
};

/// Bytes of "memory" a fake snapshot of a running VM holds.
pub const FAKE_VM_STATE: u64 = 1 << 20;

/// Clones share their VMs, calls and failure switch, so a test keeps one to look inside the
/// one it gave the registry.
#[derive(Clone)]
pub struct FakeBackend {
    pub id: &'static str,
    pub aliases: &'static [&'static str],
    pub auto: bool,
    pub caps: Capabilities,
    /// When set, `boot` fails with this detail.
    pub fail_boot: Arc<Mutex<Option<String>>>,
    /// State by VM UUID.
    pub vms: Arc<Mutex<HashMap<String, VmState>>>,
    /// `verb name` for every call that acts on a VM, in order.
    pub calls: Arc<Mutex<Vec<String>>>,
    /// Each VM's snapshot table (by UUID), as an overlay's would be.
    pub snapshots: Arc<Mutex<HashMap<String, Vec<BackendSnapshot>>>>,
    /// When set, the backend assigns VMs this UUID in `define` (as libvirt does) and keeps
    /// the seed itself (`store_seed`), recording its bytes here, and the OS disk
    /// (`store_disk`: a real overlay at `<vm dir>/../../pool/<name>.qcow2`, as libvirt's storage
    /// driver makes one), recording its size and base.
    pub assigns_uuid: Option<&'static str>,
    pub stored_seed: Arc<Mutex<Option<Vec<u8>>>>,
    pub stored_disk: Arc<Mutex<Option<(u64, std::path::PathBuf)>>>,
    /// What `launch_now` answers: `None` (nothing fresher), the XML, or an error's detail.
    pub launch_now: Arc<Mutex<Option<Result<String, String>>>>,
    /// The disk of every machine handed to `boot` or `snapshot_restore`, in order.
    pub handed: Arc<Mutex<Vec<crate::spec::Disk>>>,
    /// Every booted VM's name, by UUID.
    pub names: Arc<Mutex<HashMap<String, String>>>,
    /// By VM name, the most VMs of that name ever active at once, counted at each boot: more
    /// than one is a double VMM.
    pub most_active: Arc<Mutex<HashMap<String, usize>>>,
    /// When set, the console is these bytes through `console_feed`, as a remote libvirt
    /// domain's stream is (no log is written on this host).
    pub console_feed: Arc<Mutex<Option<Vec<u8>>>>,
}

impl FakeBackend {
    pub fn new(id: &'static str) -> FakeBackend {
        FakeBackend {
            id,
            aliases: &[],
            auto: true,
            caps: Capabilities::new(
                &[
                    Capability::Pause,
                    Capability::DirectKernel,
                    Capability::Efi,
                    Capability::Bios,
                    Capability::PortForwards,
                    Capability::RestrictedNetwork,
                ],
                &[],
            ),
            fail_boot: Arc::new(Mutex::new(None)),
            vms: Arc::new(Mutex::new(HashMap::new())),
            calls: Arc::new(Mutex::new(Vec::new())),
            snapshots: Arc::new(Mutex::new(HashMap::new())),
            assigns_uuid: None,
            stored_seed: Arc::new(Mutex::new(None)),
            stored_disk: Arc::new(Mutex::new(None)),
            launch_now: Arc::new(Mutex::new(None)),
            handed: Arc::new(Mutex::new(Vec::new())),
            names: Arc::new(Mutex::new(HashMap::new())),
            most_active: Arc::new(Mutex::new(HashMap::new())),
            console_feed: Arc::new(Mutex::new(None)),
        }
    }

    /// Notes a boot of `uuid` as `name`, and how many VMs of that name are now active.
    fn count_launch(&self, name: &str, uuid: &str) {
        let mut names = self.names.lock().expect("not poisoned");
        names.insert(uuid.to_owned(), name.to_owned());
        let vms = self.vms.lock().expect("not poisoned");
        let active = names
            .iter()
            .filter(|(u, n)| *n == name && vms.get(*u).is_some_and(|s| s.is_active()))
            .count();
        drop(vms);
        let mut most = self.most_active.lock().expect("not poisoned");
        let m = most.entry(name.to_owned()).or_insert(0);
        *m = (*m).max(active);
    }

    /// A backend that assigns `uuid` and stores the seed itself (libvirt's flow).
    pub fn assigning(mut self, uuid: &'static str) -> FakeBackend {
        self.assigns_uuid = Some(uuid);
        self
    }

    /// The VM's snapshot table.
    pub fn table(&self, uuid: &str) -> Vec<BackendSnapshot> {
        self.snapshots
            .lock()
            .expect("not poisoned")
            .get(uuid)
            .cloned()
            .unwrap_or_default()
    }

    /// Puts a snapshot in the VM's table behind nubo's back (made with qemu-img, say).
    pub fn add_snapshot(&self, uuid: &str, snap: BackendSnapshot) {
        self.snapshots
            .lock()
            .expect("not poisoned")
            .entry(uuid.to_owned())
            .or_default()
            .push(snap);
    }

    pub fn with_aliases(mut self, aliases: &'static [&'static str]) -> FakeBackend {
        self.aliases = aliases;
        self
    }

    pub fn auto(mut self, auto: bool) -> FakeBackend {
        self.auto = auto;
        self
    }

    pub fn with_caps(mut self, caps: Capabilities) -> FakeBackend {
        self.caps = caps;
        self
    }

    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().expect("not poisoned").clone()
    }

    /// Makes a running VM's VMM vanish, as a crash or `kill -9` would.
    pub fn crash(&self, uuid: &str) {
        self.vms
            .lock()
            .expect("not poisoned")
            .insert(uuid.to_owned(), VmState::Stopped);
    }

    fn note(&self, verb: &str, name: &str) {
        self.calls.lock().expect("not poisoned").push(format!("{verb} {name}"));
    }

    fn get(&self, uuid: &str) -> VmState {
        self.vms
            .lock()
            .expect("not poisoned")
            .get(uuid)
            .copied()
            .unwrap_or(VmState::Stopped)
    }

    fn set(&self, uuid: &str, s: VmState) {
        self.vms.lock().expect("not poisoned").insert(uuid.to_owned(), s);
    }
}

impl Backend for FakeBackend {
    fn define(&self, spec: &MachineSpec) -> Result<Option<crate::Defined>, BackendError> {
        let Some(uuid) = self.assigns_uuid else {
            return Ok(None);
        };
        self.note("define", &spec.name);
        Ok(Some(crate::Defined {
            uuid: uuid.to_owned(),
            state: serde_json::json!({ "defined": true }),
        }))
    }

    fn store_disk(
        &self,
        spec: &MachineSpec,
        _state: &serde_json::Value,
        size: u64,
    ) -> Result<Option<std::path::PathBuf>, BackendError> {
        if self.assigns_uuid.is_none() {
            return Ok(None);
        }
        self.note("store_disk", &spec.name);
        *self.stored_disk.lock().expect("not poisoned") = Some((size, spec.disk.base.clone()));
        // A real overlay, as libvirt's storage driver makes it: every boot inspects it.
        let pool = spec
            .vm_dir
            .parent()
            .and_then(std::path::Path::parent)
            .unwrap_or(&spec.vm_dir)
            .join("pool");
        std::fs::create_dir_all(&pool).map_err(BackendError::io("creating the fake pool"))?;
        let path = pool.join(format!("{}.qcow2", spec.name));
        let format = spec
            .disk
            .base_format
            .parse()
            .map_err(|e| BackendError::InvalidSpec(format!("{e}")))?;
        nubo_disk::create_overlay(&spec.disk.base, format, &path, Some(size))
            .map_err(|e| BackendError::InvalidSpec(e.to_string()))?;
        Ok(Some(path))
    }

    fn store_seed(
        &self,
        spec: &MachineSpec,
        _state: &serde_json::Value,
        bytes: &[u8],
        format: crate::SeedFormat,
    ) -> Result<Option<crate::SeedDevice>, BackendError> {
        if self.assigns_uuid.is_none() {
            return Ok(None);
        }
        self.note("store_seed", &spec.name);
        *self.stored_seed.lock().expect("not poisoned") = Some(bytes.to_vec());
        Ok(Some(crate::SeedDevice {
            path: format!("/pool/{}-cidata.iso", spec.name).into(),
            format,
        }))
    }

    fn id(&self) -> &'static str {
        self.id
    }
    fn aliases(&self) -> &'static [&'static str] {
        self.aliases
    }
    fn auto_selectable(&self) -> bool {
        self.auto
    }
    fn probe(&self) -> Probe {
        Probe::Available { version: "fake".into() }
    }
    fn installed(&self) -> bool {
        true
    }
    fn capabilities(&self) -> Capabilities {
        self.caps.clone()
    }
    fn host_checks(&self) -> Vec<HostCheck> {
        Vec::new()
    }
    fn check(&self, spec: &MachineSpec) -> Result<Vec<String>, BackendError> {
        if let Some(k) = spec.options.keys().find(|k| !self.caps.options.contains(&k.as_str())) {
            return Err(BackendError::InvalidSpec(format!(
                "{} option `{k}` is unknown",
                self.id
            )));
        }
        Ok(Vec::new())
    }
    fn prepare(&self, spec: &MachineSpec) -> Result<serde_json::Value, BackendError> {
        self.note("prepare", &spec.name);
        Ok(serde_json::json!({ "boots": 0 }))
    }
    fn boot(&self, spec: &MachineSpec, state: &mut serde_json::Value) -> Result<BootInfo, BackendError> {
        self.note("boot", &spec.name);
        self.handed.lock().expect("not poisoned").push(spec.disk.clone());
        if let Some(detail) = self.fail_boot.lock().expect("not poisoned").clone() {
            return Err(BackendError::Remote {
                what: format!("fake refused to start VM `{}`", spec.name),
                detail,
            });
        }
        if self.get(&spec.uuid).is_active() {
            return Err(BackendError::AlreadyRunning {
                name: spec.name.clone(),
            });
        }
        self.set(&spec.uuid, VmState::Running);
        self.count_launch(&spec.name, &spec.uuid);
        let boots = state["boots"].as_u64().unwrap_or(0) + 1;
        state["boots"] = boots.into();
        Ok(BootInfo {
            pid: None,
            launch: Launch::Argv(vec!["fake".into(), spec.name.clone()]),
            notes: Vec::new(),
        })
    }
    fn state(&self, vm: &VmRef) -> Result<VmState, BackendError> {
        Ok(self.get(vm.uuid))
    }
    fn stop(&self, vm: &VmRef, _mode: StopMode) -> Result<(), BackendError> {
        self.note("stop", vm.name);
        self.set(vm.uuid, VmState::Stopped);
        Ok(())
    }
    fn launch_now(&self, _vm: &VmRef) -> Option<Result<crate::Launch, BackendError>> {
        self.launch_now.lock().expect("not poisoned").clone().map(|r| {
            r.map(crate::Launch::Xml).map_err(|detail| BackendError::Remote {
                what: "the fake daemon".into(),
                detail,
            })
        })
    }

    fn destroy(&self, vm: &VmRef) -> Result<(), BackendError> {
        self.note("destroy", vm.name);
        self.vms.lock().expect("not poisoned").remove(vm.uuid);
        Ok(())
    }
    fn reach(&self, _vm: &VmRef) -> Result<Reach, BackendError> {
        Ok(Reach {
            ssh: None,
            guest_addresses: Vec::new(),
            network: "fake".into(),
            predicted: false,
        })
    }
    fn console(&self, vm: &VmRef) -> ConsoleLog {
        ConsoleLog {
            current: vm.vm_dir.join("console.log"),
            previous: None,
        }
    }
    fn attach_console(&self, _vm: &VmRef) -> Result<Box<dyn ConsoleStream>, BackendError> {
        Err(BackendError::unsupported(self.id, "console", "the qemu backend"))
    }
    fn console_feed(&self, _vm: &VmRef) -> Option<Result<Box<dyn ConsoleStream>, BackendError>> {
        let bytes = self.console_feed.lock().expect("not poisoned").clone()?;
        Some(Ok(Box::new(FeedStream(std::io::Cursor::new(bytes)))))
    }
    fn pause(&self, vm: &VmRef) -> Result<(), BackendError> {
        self.set(vm.uuid, VmState::Paused);
        Ok(())
    }
    fn freeze_disk_layer(&self, vm: &VmRef, frozen: usize, new_top: &std::path::Path) -> Result<(), BackendError> {
        self.note(
            "freeze-disk-layer",
            &format!("{} {frozen} {}", vm.name, new_top.display()),
        );
        Ok(())
    }

    fn snapshot_create(&self, vm: &VmRef, _spec: &MachineSpec, name: &str) -> Result<SnapshotTaken, BackendError> {
        self.note("snapshot-create", &format!("{} {name}", vm.name));
        let running = self.get(vm.uuid).is_active();
        let snap = BackendSnapshot {
            name: name.to_owned(),
            has_memory: running,
            vm_state_size: if running { FAKE_VM_STATE } else { 0 },
            created: Some("2026-12-02T00:00:00Z".into()),
        };
        self.add_snapshot(vm.uuid, snap.clone());
        Ok(SnapshotTaken {
            snapshot: snap,
            frozen: running.then(|| std::time::Duration::from_millis(1)),
        })
    }

    /// Its snapshots live in the qcow2 overlay's table.
    fn snapshot_delete_by_hand(&self, _vm: &VmRef, spec: &MachineSpec, name: &str) -> Option<crate::ByHand> {
        Some(crate::ByHand::qcow2_snapshot_delete(spec, name))
    }

    fn snapshot_list(&self, vm: &VmRef, _spec: &MachineSpec) -> Result<Vec<BackendSnapshot>, BackendError> {
        Ok(self.table(vm.uuid))
    }

    fn snapshot_delete(&self, vm: &VmRef, _spec: &MachineSpec, name: &str) -> Result<(), BackendError> {
        self.note("snapshot-delete", &format!("{} {name}", vm.name));
        if let Some(t) = self.snapshots.lock().expect("not poisoned").get_mut(vm.uuid) {
            t.retain(|s| s.name != name);
        }
        Ok(())
    }

    fn snapshot_restore(
        &self,
        spec: &MachineSpec,
        state: &mut serde_json::Value,
        name: &str,
    ) -> Result<Restored, BackendError> {
        self.note("snapshot-restore", &format!("{} {name}", spec.name));
        self.handed.lock().expect("not poisoned").push(spec.disk.clone());
        let snap = self
            .table(&spec.uuid)
            .into_iter()
            .find(|s| s.name == name)
            .ok_or_else(|| BackendError::InvalidSpec(format!("fake has no snapshot `{name}`")))?;
        match (self.get(&spec.uuid).is_active(), snap.has_memory) {
            (true, true) => Ok(Restored::Running),
            (true, false) => Err(BackendError::InvalidSpec(format!(
                "snapshot `{name}` holds no memory: stop the VM first"
            ))),
            (false, false) => Ok(Restored::DiskOnly),
            (false, true) => self.boot(spec, state).map(Restored::Started),
        }
    }

    fn resume(&self, vm: &VmRef) -> Result<(), BackendError> {
        self.set(vm.uuid, VmState::Running);
        Ok(())
    }
}

/// A console stream over fixed bytes, then its end.
struct FeedStream(std::io::Cursor<Vec<u8>>);

impl std::io::Read for FeedStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl std::io::Write for FeedStream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ConsoleStream for FeedStream {
    fn try_clone_reader(&self) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        Ok(Box::new(FeedStream(std::io::Cursor::new(self.0.get_ref().clone()))))
    }
    fn shutdown(&self) {}
}
