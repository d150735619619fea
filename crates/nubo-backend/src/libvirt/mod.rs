//! The libvirt backend: QEMU through libvirtd's C API, loaded at run time ([`ffi`]).
//!
//! Create follows libvirt's own order: define the domain without a seed, read the UUID
//! libvirt assigned ([`Backend::define`]), let the engine build the seed with it, store it as
//! the volume `<domain>-cidata.iso` through the volume upload stream ([`Backend::store_seed`]),
//! redefine the domain with the same UUID and the seed CD-ROM ([`Backend::prepare`]), start.
//! Every domain nubo defines carries nubo's `<metadata>` with the VM's directory; a domain
//! without it (or with another directory) is never adopted, stopped or removed.

pub mod base;
mod config;
mod connect_fix;
pub mod ffi;
pub mod mounts;
pub mod render;
pub mod tls;
pub mod xml;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nubo_core::VmState;
use nubo_spec::uri::Origin;
use nubo_spec::ConnectUri;
use serde::{Deserialize, Serialize};

use self::ffi::{Connection, Domain, DomainState, VirtError};
use self::render::{DomainParams, Machine, Net, SeedSource};
use crate::spec::{Boot, Firmware, MachineKind, MachineSpec, NetworkMode, SeedDevice, SeedFormat};
use crate::{
    Backend, BackendError, BackendSnapshot, BootInfo, Capabilities, Capability, CheckStatus, ConsoleLog, ConsoleStream,
    Defined, HostCheck, Launch, Probe, Reach, Restored, SharedDir, SnapshotTaken, StopMode, VmRef,
};

pub use self::config::LibvirtConfig;

const ID: &str = "libvirt";
/// The options `overrides.libvirt` takes.
const OPTIONS: &[&str] = &["uri", "pool", "machine"];
/// The libvirt network a VM joins unless `--network` names another.
pub const DEFAULT_NETWORK: &str = "default";
/// Debian packages that provide the daemon and the QEMU driver (never libvirt-daemon-system:
/// it autostarts a NAT network).
pub const PACKAGES: &str = "libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-driver-network libvirt-daemon-driver-storage libvirt-clients dnsmasq-base";
/// The largest seed volume read back (NoCloud seeds are kilobytes).
const MAX_SEED: usize = 64 << 20;

pub struct LibvirtBackend {
    /// `NUBO_LIBVIRT_URI`, when set.
    pub default_uri: Option<ConnectUri>,
    /// Open connections by URI, shared by this backend's calls and threads (libvirt's
    /// connections are thread-safe): over TLS each new one costs a handshake, and a long-lived
    /// process (the controller) makes many calls per VM. One found closed is opened again.
    conns: Mutex<HashMap<String, Arc<Connection>>>,
    /// Base volumes verified by this process ([`base::Verified`]).
    verified: base::Verified,
}

impl LibvirtBackend {
    pub fn new(default_uri: Option<ConnectUri>) -> LibvirtBackend {
        LibvirtBackend {
            default_uri,
            conns: Mutex::new(HashMap::new()),
            verified: base::Verified::default(),
        }
    }

    /// The open connection to `uri`, else a new one. A connection whose socket was found
    /// closed by a call (a daemon restart) is replaced; that one call failed, the next works.
    fn conn(&self, uri: &ConnectUri) -> Result<Arc<Connection>, BackendError> {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = conns.get(uri.as_str()) {
            if c.is_alive() {
                return Ok(c.clone());
            }
        }
        conns.remove(uri.as_str());
        let c = Arc::new(connect(uri)?);
        conns.insert(uri.as_str().to_owned(), c.clone());
        Ok(c)
    }

    /// From its [`LibvirtConfig`] in `config` (the default when none is set).
    pub fn configured(config: &crate::BackendConfig) -> LibvirtBackend {
        LibvirtBackend::new(config.get::<LibvirtConfig>(ID).uri)
    }

    /// The URI new VMs use: `NUBO_LIBVIRT_URI`, else `qemu:///system` for root and
    /// `qemu:///session` for anyone else.
    pub fn uri(&self) -> ConnectUri {
        self.default_uri.clone().unwrap_or_else(|| {
            if nix::unistd::geteuid().is_root() {
                ConnectUri::system()
            } else {
                ConnectUri::session()
            }
        })
    }

    /// The spec's `uri` option (a manifest's or `--connect`'s), checked against the allowlist
    /// again here so no path around `VmSpec::validate` reaches libvirt with it.
    fn spec_uri(&self, spec: &MachineSpec) -> Result<ConnectUri, BackendError> {
        match spec.options.get("uri") {
            Some(u) => ConnectUri::parse(u, Origin::Spec).map_err(|e| BackendError::InvalidSpec(e.to_string())),
            None => Ok(self.uri()),
        }
    }
}

/// What the backend keeps per VM (recorded by the engine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibvirtState {
    /// Checked against the allowlist whenever a record is read.
    pub uri: ConnectUri,
    pub pool: String,
    /// The libvirt network, or `None` for user-mode networking.
    pub network: Option<String>,
    pub mac: Option<String>,
    /// The forwarded SSH port of user-mode networking.
    pub ssh_port: Option<u16>,
    pub seed_volume: Option<String>,
    /// The verified base the OS disk volume `<domain>.qcow2` sits on: in a pool other than
    /// nubo's own, a volume of that name is nubo's only when this is its backing store.
    #[serde(default)]
    pub base: Option<PathBuf>,
    /// On a remote host: the path there of the base volume (`nubo-base-<digest>.<format>`,
    /// [`base`]) the OS disk volume sits on instead of `base`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_volume: Option<String>,
    pub console_log: PathBuf,
    /// Whether the network must be restricted (user-mode `restrict=on`).
    #[serde(default)]
    pub restrict: bool,
}

fn remote(what: impl Into<String>) -> impl FnOnce(VirtError) -> BackendError {
    let what = what.into();
    move |e| BackendError::Remote {
        what,
        detail: e.message,
    }
}

fn unavailable(why: String) -> BackendError {
    BackendError::Unavailable { backend: ID, why }
}

fn connect(uri: &ConnectUri) -> Result<Connection, BackendError> {
    if let Err(e) = ffi::loadable() {
        return Err(unavailable(format!(
            "{} cannot be loaded ({e}): install the Debian packages {PACKAGES}",
            ffi::SONAME
        )));
    }
    Connection::open(uri).map_err(|e| {
        let fix = connect_fix::fix(uri, &e.to_string());
        let e = connect_fix::detail(uri, &e.to_string());
        unavailable(format!("libvirt at `{uri}` is unreachable ({e}): {fix}"))
    })
}

/// The AF_UNIX socket a local URI talks to, for the cheap reachability check.
pub fn socket_of(uri: &ConnectUri, uid: u32) -> Option<PathBuf> {
    uri.socket(uid)
}

fn machine_of(spec: &MachineSpec) -> Result<Machine, BackendError> {
    match spec.options.get("machine").map(String::as_str) {
        None | Some("pc") => Ok(Machine::Pc),
        Some("q35") => Ok(Machine::Q35),
        Some(other) => Err(BackendError::InvalidSpec(format!(
            "libvirt option machine `{other}` is not a machine nubo renders: use pc or q35"
        ))),
    }
}

/// The pool name for a VM: `--pool`, else nubo's own directory pool for this NUBO_ROOT.
fn pool_of(spec: &MachineSpec) -> String {
    spec.options
        .get("pool")
        .cloned()
        .unwrap_or_else(|| own_pool_name(&spec.vm_dir))
}

/// nubo's own pool for the root that holds `vm_dir` (`<root>/vms/<name>`): named after a
/// hash of its directory, so two nubo roots on one libvirtd never share a pool.
fn own_pool_name(vm_dir: &Path) -> String {
    let dir = own_pool_dir(vm_dir);
    // FNV-1a: stable across builds and platforms.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in dir.as_os_str().as_encoded_bytes() {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("nubo-{:08x}", h as u32)
}

fn own_pool_dir(vm_dir: &Path) -> PathBuf {
    vm_dir
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"))
        .join("libvirt-pool")
}

fn caller() -> (u32, u32) {
    (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw())
}

impl LibvirtBackend {
    /// The pool a VM's seed goes in, started (nubo's own is defined on first use).
    fn ensure_pool(&self, conn: &Connection, spec: &MachineSpec) -> Result<ffi::StoragePool, BackendError> {
        let name = pool_of(spec);
        let pool = match conn.pool(&name).map_err(remote(format!("looking up pool `{name}`")))? {
            Some(p) => p,
            None if spec.options.contains_key("pool") => {
                return Err(BackendError::InvalidSpec(format!(
                    "libvirt storage pool `{name}` does not exist: create it (virsh pool-define-as) or leave --pool out for nubo's own"
                )))
            }
            None => {
                let dir = own_pool_dir(&spec.vm_dir);
                conn.define_pool(&render::dir_pool(&name, &dir))
                    .map_err(remote(format!("defining nubo's storage pool `{name}` at {}", dir.display())))?
            }
        };
        if !pool.is_active().map_err(remote(format!("pool `{name}`")))? {
            pool.start().map_err(remote(format!("starting pool `{name}`")))?;
        }
        Ok(pool)
    }

    /// The state `define` recorded, its connection and the VM's pool (started if need be):
    /// where `store_disk` and `store_seed` make their volumes.
    fn recorded_pool(
        &self,
        spec: &MachineSpec,
        state: &serde_json::Value,
    ) -> Result<(LibvirtState, Arc<Connection>, ffi::StoragePool), BackendError> {
        let st: LibvirtState = serde_json::from_value(state.clone()).map_err(|e| BackendError::BadState {
            name: spec.name.clone(),
            detail: e.to_string(),
        })?;
        let conn = self.conn(&st.uri)?;
        let pool = self.ensure_pool(&conn, spec)?;
        Ok((st, conn, pool))
    }

    /// The network mode realised: a libvirt network, or user-mode networking.
    fn net_for(&self, conn: &Connection, spec: &MachineSpec) -> Result<(Option<String>, bool), BackendError> {
        if !spec.ports.is_empty() {
            return ports_net(&spec.network);
        }
        match &spec.network {
            NetworkMode::Named(n) => match conn.network(n).map_err(remote(format!("looking up network `{n}`")))? {
                Some(_) => Ok((Some(n.clone()), false)),
                None => Err(BackendError::InvalidSpec(format!(
                    "libvirt network `{n}` does not exist: define it (virsh net-define) or leave --network out"
                ))),
            },
            NetworkMode::Forward => {
                let has_default = conn
                    .network(DEFAULT_NETWORK)
                    .map_err(remote("looking up network `default`"))?
                    .is_some();
                Ok((has_default.then(|| DEFAULT_NETWORK.to_owned()), false))
            }
            NetworkMode::Restricted => Ok((None, true)),
            NetworkMode::None => Ok((None, false)),
        }
    }

    /// The domain of this VM, if any; refuses one nubo did not define for this VM.
    fn own_domain(&self, conn: &Connection, name: &str, vm_dir: &Path) -> Result<Option<Domain>, BackendError> {
        let Some(dom) = conn
            .domain(name)
            .map_err(remote(format!("looking up domain `{name}`")))?
        else {
            return Ok(None);
        };
        let info = xml::parse_domain(&dom.xml(ffi::XML_INACTIVE).map_err(remote(format!("domain `{name}`")))?)
            .map_err(|e| BackendError::Remote {
                what: format!("domain `{name}`"),
                detail: e,
            })?;
        if info.nubo_dir.as_deref() != Some(&*vm_dir.to_string_lossy()) {
            return Err(BackendError::InvalidSpec(format!(
                "libvirt domain `{name}` exists and was not created by nubo for {}: nubo never adopts or removes it; choose another VM name, or remove the domain yourself",
                vm_dir.display()
            )));
        }
        Ok(Some(dom))
    }

    fn params<'a>(
        &self,
        spec: &'a MachineSpec,
        st: &'a LibvirtState,
        uuid: Option<&'a str>,
        os_disk: bool,
    ) -> Result<DomainParams<'a>, BackendError> {
        let machine = machine_of(spec)?;
        let seed = match (&spec.seed, &st.seed_volume) {
            (
                Some(SeedDevice {
                    format: SeedFormat::Iso,
                    ..
                }),
                Some(v),
            ) => Some(SeedSource::Volume {
                pool: st.pool.clone(),
                volume: v.clone(),
            }),
            (
                Some(SeedDevice {
                    format: SeedFormat::Vfat,
                    path,
                }),
                _,
            ) => Some(SeedSource::VfatFile(path.clone())),
            _ => None,
        };
        let net = match (&st.network, st.ssh_port) {
            (Some(n), _) => Net::Network {
                name: n.clone(),
                mac: st.mac.clone(),
            },
            (None, Some(port)) => Net::User {
                ssh_port: port,
                restrict: st.restrict,
            },
            (None, None) => Net::None,
        };
        let system = st.uri.is_local() && st.uri.instance() == nubo_spec::uri::Instance::System;
        Ok(DomainParams {
            uuid,
            virt_type: virt_type(),
            machine,
            seed,
            os_disk,
            net,
            console_log: st.uri.is_local().then_some(st.console_log.as_path()),
            dac: system.then(caller),
        })
    }

    fn state_of(vm: &VmRef) -> Result<LibvirtState, BackendError> {
        serde_json::from_value(vm.state.clone()).map_err(|e| BackendError::BadState {
            name: vm.name.to_owned(),
            detail: e.to_string(),
        })
    }

    /// The state recorded, or (a create killed before it was recorded) the default URI's.
    fn state_or_default(&self, vm: &VmRef) -> LibvirtState {
        Self::state_of(vm).unwrap_or_else(|_| LibvirtState {
            uri: self.uri(),
            pool: own_pool_name(vm.vm_dir),
            network: None,
            mac: None,
            ssh_port: None,
            seed_volume: Some(render::seed_volume_name(vm.name)),
            base: None,
            base_volume: None,
            console_log: vm.vm_dir.join("console.log"),
            restrict: false,
        })
    }

    /// Defines the domain; a q35 one with shared folders is defined again from what libvirt
    /// made of it plus empty root ports (`mounts::with_spare_root_ports`), for `vm mount`.
    fn define_xml(&self, conn: &Connection, xml: &str, name: &str) -> Result<Domain, BackendError> {
        let what = || format!("defining domain `{name}`");
        let dom = conn.define_domain(xml).map_err(remote(what()))?;
        if !xml.contains("<filesystem") {
            return Ok(dom);
        }
        let defined = dom.xml(ffi::XML_INACTIVE).map_err(remote(what()))?;
        match mounts::with_spare_root_ports(&defined).map_err(|e| BackendError::Remote {
            what: what(),
            detail: e,
        })? {
            Some(again) => conn.define_domain(&again).map_err(remote(what())),
            None => Ok(dom),
        }
    }
}

/// Published ports are QEMU `hostfwd`s of user-mode networking (in `<qemu:commandline>`, as
/// the SSH forward): libvirt 11's own `<portForward>` needs the passt backend, which Debian's
/// libvirt does not pull in. A VM that publishes ports therefore gets user-mode networking
/// rather than the `default` network; a named network is refused.
fn ports_net(mode: &NetworkMode) -> Result<(Option<String>, bool), BackendError> {
    match mode {
        NetworkMode::Forward => Ok((None, false)),
        NetworkMode::Restricted => Ok((None, true)),
        NetworkMode::None => Ok((None, false)),
        NetworkMode::Named(n) => Err(BackendError::unsupported(
            ID,
            format!("port forwards on libvirt network `{n}`"),
            "user-mode networking (--network forward or restricted) for --publish, or reach the guest at its address on the network",
        )),
    }
}

/// `kvm` where KVM runs stock guest kernels, else `qemu` (TCG): the same policy as the qemu
/// backend (PVM's /dev/kvm hangs stock kernels).
fn virt_type() -> &'static str {
    let (accel, _) = crate::qemu::auto_accel(&crate::qemu::QemuBackend::default());
    match accel {
        crate::qemu::options::Accel::Kvm => "kvm",
        _ => "qemu",
    }
}

fn free_port() -> Result<u16, BackendError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(BackendError::io("picking a free port on 127.0.0.1"))
}

fn vm_state(s: DomainState) -> VmState {
    match s {
        DomainState::Running | DomainState::Blocked | DomainState::ShuttingDown => VmState::Running,
        DomainState::Paused | DomainState::PmSuspended => VmState::Paused,
        DomainState::Shutoff | DomainState::Crashed | DomainState::NoState => VmState::Stopped,
    }
}

impl Backend for LibvirtBackend {
    fn id(&self) -> &'static str {
        ID
    }

    fn aliases(&self) -> &'static [&'static str] {
        &["virt"]
    }

    fn auto_selectable(&self) -> bool {
        true
    }

    fn probe(&self) -> Probe {
        if let Err(e) = ffi::loadable() {
            return Probe::Missing {
                what: format!("{} ({e})", ffi::SONAME),
                package: PACKAGES.into(),
            };
        }
        let uri = self.uri();
        match Connection::open(&uri).and_then(|c| c.versions()) {
            Ok((lib, hv)) => Probe::Available {
                version: format!("libvirt {lib} at {uri}, QEMU {hv}"),
            },
            Err(e) => Probe::Broken {
                error: format!("libvirt at `{uri}` is unreachable: {e}"),
            },
        }
    }

    /// Cheap and bounded: the library loads and the URI's socket accepts a connection. No
    /// libvirt call is made, so a wedged daemon cannot hang `vm create`'s selection.
    fn installed(&self) -> bool {
        let uri = self.uri();
        let Some(sock) = socket_of(&uri, caller().0) else {
            return false;
        };
        sock.exists() && ffi::loadable().is_ok() && UnixStream::connect(&sock).is_ok()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::new(
            &[
                Capability::Snapshot,
                Capability::Pause,
                Capability::DirectKernel,
                Capability::Efi,
                Capability::Bios,
                Capability::Supervised,
                Capability::NamedNetworks,
                Capability::PortForwards,
                Capability::RestrictedNetwork,
                Capability::HostResources,
            ],
            OPTIONS,
        )
    }

    fn host_checks(&self) -> Vec<HostCheck> {
        checks(self)
    }

    fn host_resources(&self) -> Result<crate::HostResources, BackendError> {
        let uri = self.uri();
        let (free_memory, total_memory, cpus) = connect(&uri)?
            .node_resources()
            .map_err(|e| unavailable(format!("libvirt at `{uri}` did not report its memory: {e}")))?;
        Ok(crate::HostResources {
            free_memory,
            total_memory,
            cpus,
        })
    }

    fn mount_transport(&self) -> Result<(crate::MountTransport, Option<String>), BackendError> {
        Ok((crate::MountTransport::Virtiofs, None))
    }

    /// A local libvirt hot-plugs a virtio-fs `<filesystem>`; a folder for a remote host's
    /// guest would be on that host, which nubo does not reach for files.
    fn check_hot_plug(&self, machine: &MachineSpec, dir: &SharedDir) -> Result<(), BackendError> {
        let uri = self.spec_uri(machine)?;
        if !uri.is_local() {
            return Err(BackendError::unsupported(
                ID,
                format!(
                    "adding or removing shared folder {} on VM `{}` of remote host `{uri}`",
                    dir.guest.display(),
                    machine.name
                ),
                "a local libvirt or the qemu backend for shared folders",
            ));
        }
        Ok(())
    }

    /// `virDomainAttachDeviceFlags` of the folder's `<filesystem>` (libvirt starts its
    /// virtiofsd and hot-plugs the device), on memory shared from boot; a pc machine takes it on
    /// its root bus, q35 in a spare root port (`define_xml`).
    fn mount_running(&self, vm: &VmRef, machine: &MachineSpec, dir: &SharedDir) -> Result<(), BackendError> {
        self.check_hot_plug(machine, dir)?;
        let (_conn, dom) = self.domain_of(vm)?;
        let (shared, has) = self.live_facts(vm, &dom, &dir.tag)?;
        if !shared {
            return Err(crate::memory_not_shared(ID, vm.name, dir));
        }
        if has {
            // Left by an interrupted `vm mount`: plugged again, so it is this folder.
            self.detach_live(vm, &dom, dir)?;
        }
        dom.attach_device_live(&mounts::filesystem(dir)).map_err(remote(format!(
            "adding shared folder {} to domain `{}`",
            dir.host.display(),
            vm.name
        )))
    }

    /// `virDomainDetachDeviceFlags`, waited for (`detach_live`).
    fn unmount_running(&self, vm: &VmRef, machine: &MachineSpec, dir: &SharedDir) -> Result<(), BackendError> {
        self.check_hot_plug(machine, dir)?;
        let (_conn, dom) = self.domain_of(vm)?;
        self.detach_live(vm, &dom, dir)
    }

    fn check(&self, spec: &MachineSpec) -> Result<Vec<String>, BackendError> {
        if let Some(k) = spec.options.keys().find(|k| !OPTIONS.contains(&k.as_str())) {
            return Err(BackendError::InvalidSpec(format!(
                "the libvirt backend has no option `{k}`: it takes {}",
                OPTIONS.join(", ")
            )));
        }
        machine_of(spec)?;
        if spec.machine == MachineKind::Microvm {
            return Err(BackendError::unsupported(ID, "the microvm machine", "the qemu backend"));
        }
        if let Boot::Firmware {
            firmware: Firmware::EfiCode(p),
        } = &spec.boot
        {
            return Err(BackendError::InvalidSpec(format!(
                "the libvirt backend picks UEFI firmware itself: use --firmware efi instead of {}",
                p.display()
            )));
        }
        let uri = self.spec_uri(spec)?;
        if !uri.is_local() && !spec.ports.is_empty() {
            // QEMU's forwards would listen on the remote host's 127.0.0.1, out of this host's reach.
            return Err(BackendError::unsupported(
                ID,
                "published ports (--publish) on a remote libvirt host",
                "a libvirt network there (--network NAME) and `nubo vm ssh --jump USER@HOST NAME`, or a VM on this host for --publish",
            ));
        }
        if !uri.is_local() && !spec.mounts.is_empty() {
            // The folder was resolved on this host, but libvirt's virtiofsd would serve a path
            // of the remote host.
            return Err(BackendError::unsupported(
                ID,
                "shared folders (--mount) on a remote libvirt host",
                "`nubo vm cp` to copy files to the VM, or a VM on this host for --mount",
            ));
        }
        let conn = self.conn(&uri)?;
        let mut notes = Vec::new();
        let (net, _) = self.net_for(&conn, spec)?;
        if !spec.ports.is_empty() && spec.network == NetworkMode::Forward {
            notes.push(
                "published ports are forwarded by QEMU's user-mode networking: the VM gets it instead of a libvirt network"
                    .into(),
            );
        } else if net.is_none() && spec.network == NetworkMode::Forward {
            notes.push(format!(
                "libvirt at `{uri}` has no network `default`: user-mode networking with SSH forwarded on 127.0.0.1"
            ));
        }
        if let Some(pool) = spec.options.get("pool") {
            if conn
                .pool(pool)
                .map_err(remote(format!("looking up pool `{pool}`")))?
                .is_none()
            {
                return Err(BackendError::InvalidSpec(format!(
                    "libvirt storage pool `{pool}` does not exist at `{uri}`: create it or leave --pool out for nubo's own"
                )));
            }
        }
        self.own_domain(&conn, &spec.name, &spec.vm_dir)?;
        let pool = pool_of(spec);
        let disk = render::disk_volume_name(&spec.name);
        // An inactive pool (after a host reboot) is started by `store_disk`, which checks again.
        if let Some(p) = conn
            .pool(&pool)
            .map_err(remote(format!("looking up pool `{pool}`")))?
            .filter(|p| p.is_active().unwrap_or(false))
        {
            let _ = p.refresh();
            if let Some(v) = p.volume(&disk).map_err(remote(format!("looking up volume `{disk}`")))? {
                // On a remote host the VM's disk backs onto the base's volume in the pool.
                let base = if uri.is_local() {
                    Some(spec.disk.base.clone())
                } else {
                    remote_base_path(&p, &spec.disk.base, &spec.disk.base_format)
                };
                if !disk_is_ours(&v, &pool, &spec.vm_dir, base.as_deref(), &disk)? {
                    return Err(foreign_disk(&disk, &pool));
                }
            }
        }
        Ok(notes)
    }

    fn define(&self, spec: &MachineSpec) -> Result<Option<Defined>, BackendError> {
        let uri = self.spec_uri(spec)?;
        let conn = self.conn(&uri)?;
        let pool = self.ensure_pool(&conn, spec)?;
        // A domain of ours left by a killed create: converge by starting over.
        if let Some(old) = self.own_domain(&conn, &spec.name, &spec.vm_dir)? {
            let _ = old.destroy();
            old.undefine(ffi::UNDEFINE_ALL)
                .map_err(remote(format!("undefining the interrupted domain `{}`", spec.name)))?;
        }
        let (network, restrict) = self.net_for(&conn, spec)?;
        let ssh_port = if network.is_none() && spec.network != NetworkMode::None {
            Some(free_port()?)
        } else {
            None
        };
        let mut st = LibvirtState {
            uri,
            pool: pool_of(spec),
            network,
            mac: None,
            ssh_port,
            seed_volume: None,
            base: Some(spec.disk.base.clone()),
            base_volume: None,
            console_log: spec.vm_dir.join("console.log"),
            restrict,
        };
        drop(pool);
        // Without the OS disk: its volume is made next (`store_disk`), once this state naming
        // the pool is recorded, so a create killed after it finds and deletes the volume.
        let xml = render::domain(spec, &self.params(spec, &st, None, false)?);
        let dom = self.define_xml(&conn, &xml, &spec.name)?;
        let uuid = dom.uuid().map_err(remote(format!("domain `{}`", spec.name)))?;
        let info = xml::parse_domain(
            &dom.xml(ffi::XML_INACTIVE)
                .map_err(remote(format!("domain `{}`", spec.name)))?,
        )
        .map_err(|e| BackendError::Remote {
            what: format!("domain `{}`", spec.name),
            detail: e,
        })?;
        st.mac = info.mac;
        Ok(Some(Defined {
            uuid,
            state: serde_json::to_value(&st).expect("state serialises"),
        }))
    }

    fn store_disk(
        &self,
        spec: &MachineSpec,
        state: &serde_json::Value,
        size: u64,
    ) -> Result<Option<PathBuf>, BackendError> {
        let (st, conn, pool) = self.recorded_pool(spec, state)?;
        let name = render::disk_volume_name(&spec.name);
        // On a remote host the store's base file is not there: the overlay backs onto the
        // base's content-addressed volume in the pool, uploaded once and verified.
        let backing = if st.uri.is_local() {
            spec.disk.base.clone()
        } else {
            PathBuf::from(
                base::ensure(
                    &conn,
                    (st.uri.as_str(), &self.verified),
                    &pool,
                    &st.pool,
                    &spec.disk.base,
                    &spec.disk.base_format,
                )?
                .path,
            )
        };
        // A volume of ours left by a killed create is replaced; anyone else's is refused.
        if let Some(old) = pool
            .volume(&name)
            .map_err(remote(format!("looking up volume `{name}`")))?
        {
            if !disk_is_ours(&old, &st.pool, &spec.vm_dir, Some(&backing), &name)? {
                return Err(foreign_disk(&name, &st.pool));
            }
            old.delete()
                .map_err(remote(format!("deleting the stale disk volume `{name}`")))?;
        }
        let xml = render::disk_volume(&name, size, &backing, &spec.disk.base_format, caller());
        let vol = pool
            .create_volume(&xml)
            .map_err(remote(format!("creating disk volume `{name}` in pool `{}`", st.pool)))?;
        let path = match vol.path() {
            Ok(p) => p,
            Err(e) => {
                let _ = vol.delete();
                return Err(remote(format!("volume `{name}`"))(e));
            }
        };
        Ok(Some(PathBuf::from(path)))
    }

    fn store_seed(
        &self,
        spec: &MachineSpec,
        state: &serde_json::Value,
        bytes: &[u8],
        format: SeedFormat,
    ) -> Result<Option<SeedDevice>, BackendError> {
        if format != SeedFormat::Iso {
            // A FAT seed of the user's own stays a file the engine writes.
            return Ok(None);
        }
        let (st, conn, pool) = self.recorded_pool(spec, state)?;
        let name = render::seed_volume_name(&spec.name);
        // A volume left by a killed create is replaced: the domain it belonged to was ours.
        if let Some(old) = pool
            .volume(&name)
            .map_err(remote(format!("looking up volume `{name}`")))?
        {
            old.delete()
                .map_err(remote(format!("deleting the stale seed volume `{name}`")))?;
        }
        let vol = pool
            .create_volume(&render::seed_volume(&name, bytes.len() as u64, caller()))
            .map_err(remote(format!("creating seed volume `{name}` in pool `{}`", st.pool)))?;
        if let Err(e) = conn.upload(&vol, bytes) {
            let _ = vol.delete();
            return Err(remote(format!("uploading seed volume `{name}`"))(e));
        }
        let path = vol.path().map_err(remote(format!("volume `{name}`")))?;
        Ok(Some(SeedDevice {
            path: PathBuf::from(path),
            format: SeedFormat::Iso,
        }))
    }

    fn prepare(&self, spec: &MachineSpec) -> Result<serde_json::Value, BackendError> {
        let uri = self.spec_uri(spec)?;
        let conn = self.conn(&uri)?;
        let dom = self
            .own_domain(&conn, &spec.name, &spec.vm_dir)?
            .ok_or_else(|| BackendError::Remote {
                what: format!("domain `{}`", spec.name),
                detail: "it vanished between define and redefine".into(),
            })?;
        let info = xml::parse_domain(
            &dom.xml(ffi::XML_INACTIVE)
                .map_err(remote(format!("domain `{}`", spec.name)))?,
        )
        .map_err(|e| BackendError::Remote {
            what: format!("domain `{}`", spec.name),
            detail: e,
        })?;
        let (network, restrict) = self.net_for(&conn, spec)?;
        let base_volume = if uri.is_local() {
            None
        } else {
            let pool = self.ensure_pool(&conn, spec)?;
            base::backing_of(&pool, &render::disk_volume_name(&spec.name))?
        };
        let st = LibvirtState {
            uri,
            pool: pool_of(spec),
            ssh_port: if network.is_none() && spec.network != NetworkMode::None {
                Some(free_port()?)
            } else {
                None
            },
            network,
            mac: info.mac,
            seed_volume: spec
                .seed
                .as_ref()
                .filter(|s| s.format == SeedFormat::Iso)
                .map(|_| render::seed_volume_name(&spec.name)),
            base: Some(spec.disk.base.clone()),
            base_volume,
            console_log: spec.vm_dir.join("console.log"),
            restrict,
        };
        // The redefine carries the UUID libvirt assigned, the OS disk and the seed CD-ROM.
        let xml = render::domain(spec, &self.params(spec, &st, Some(&spec.uuid), true)?);
        self.define_xml(&conn, &xml, &spec.name)?;
        Ok(serde_json::to_value(&st).expect("state serialises"))
    }

    fn boot(&self, spec: &MachineSpec, state: &mut serde_json::Value) -> Result<BootInfo, BackendError> {
        let vm = VmRef {
            name: &spec.name,
            uuid: &spec.uuid,
            vm_dir: &spec.vm_dir,
            state,
        };
        let mut st = Self::state_of(&vm)?;
        let conn = self.conn(&st.uri)?;
        // The disk and seed are volumes of the pool: after a host reboot nubo's own pool (not
        // autostarted) is inactive and the domain would not find them.
        let pool = self.ensure_pool(&conn, spec)?;
        if !st.uri.is_local() {
            check_remote_chain(&pool, &spec.name, st.base_volume.as_deref())?;
        }
        if self.own_domain(&conn, &spec.name, &spec.vm_dir)?.is_none() {
            return Err(BackendError::Remote {
                what: format!("domain `{}`", spec.name),
                detail: format!(
                    "it is not defined at `{}` (removed outside nubo?): remove the VM with `nubo vm rm --force {}` and create it again",
                    st.uri, spec.name
                ),
            });
        }
        if st
            .ssh_port
            .is_some_and(|p| TcpListener::bind((Ipv4Addr::LOCALHOST, p)).is_err())
        {
            st.ssh_port = Some(free_port()?);
        }
        crate::ports::check_free(&spec.ports)?;
        // This boot's console log; the previous one is kept.
        if st.console_log.exists() {
            let mut prev = st.console_log.clone().into_os_string();
            prev.push(".1");
            std::fs::rename(&st.console_log, &prev)
                .map_err(BackendError::io(format!("rotating {}", st.console_log.display())))?;
        }
        // Redefined on every boot from the recorded machine: the XML is nubo's, always.
        let xml = render::domain(spec, &self.params(spec, &st, Some(&spec.uuid), true)?);
        let dom = self.define_xml(&conn, &xml, &spec.name)?;
        // Snapshots whose metadata libvirt lost come back from their saved XML.
        redefine_snapshots(&dom, &spec.vm_dir, &spec.uuid)?;
        dom.start()
            .map_err(remote(format!("starting domain `{}`", spec.name)))?;
        let mut notes = vec![format!(
            "libvirt domain `{}` at `{}` ({})",
            spec.name,
            st.uri,
            match virt_type() {
                "kvm" => "KVM",
                _ => "TCG: KVM cannot run stock guest kernels here",
            }
        )];
        match (&st.network, st.ssh_port) {
            (Some(n), _) => notes.push(format!("network: libvirt network `{n}`")),
            (None, Some(p)) => notes.push(format!("network: user-mode, SSH on 127.0.0.1:{p}")),
            _ => {}
        }
        *state = serde_json::to_value(&st).expect("state serialises");
        Ok(BootInfo {
            pid: None,
            launch: Launch::Xml(xml),
            notes,
        })
    }

    fn state(&self, vm: &VmRef) -> Result<VmState, BackendError> {
        let st = self.state_or_default(vm);
        let conn = self.conn(&st.uri)?;
        match self.own_domain(&conn, vm.name, vm.vm_dir)? {
            Some(d) => Ok(vm_state(d.state().map_err(remote(format!("domain `{}`", vm.name)))?)),
            None => Ok(VmState::Stopped),
        }
    }

    fn stop(&self, vm: &VmRef, mode: StopMode) -> Result<(), BackendError> {
        let st = self.state_or_default(vm);
        let conn = self.conn(&st.uri)?;
        let Some(dom) = self.own_domain(&conn, vm.name, vm.vm_dir)? else {
            return Ok(());
        };
        let off = |d: &Domain| d.state().map(|s| vm_state(s) == VmState::Stopped).unwrap_or(true);
        if let StopMode::Graceful(timeout) = mode {
            if dom.shutdown().is_ok() {
                let t0 = Instant::now();
                while t0.elapsed() < timeout {
                    if off(&dom) {
                        return Ok(());
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        match dom.destroy() {
            Ok(()) => Ok(()),
            Err(_) if off(&dom) => Ok(()),
            Err(e) => Err(remote(format!("destroying domain `{}`", vm.name))(e)),
        }
    }

    fn destroy(&self, vm: &VmRef) -> Result<(), BackendError> {
        let st = self.state_or_default(vm);
        let conn = self.conn(&st.uri)?;
        if let Some(dom) = self.own_domain(&conn, vm.name, vm.vm_dir)? {
            if dom.state().map(vm_state).unwrap_or(VmState::Stopped) != VmState::Stopped {
                let _ = dom.destroy();
            }
            dom.undefine(ffi::UNDEFINE_ALL)
                .map_err(remote(format!("undefining domain `{}`", vm.name)))?;
        }
        let name = render::seed_volume_name(vm.name);
        if let Some(pool) = conn
            .pool(&st.pool)
            .map_err(remote(format!("looking up pool `{}`", st.pool)))?
        {
            // Volumes of an inactive pool (after a host reboot) cannot be looked up.
            if !pool.is_active().unwrap_or(true) {
                let _ = pool.start();
            }
            let _ = pool.refresh();
            if let Some(v) = pool
                .volume(&name)
                .map_err(remote(format!("looking up volume `{name}`")))?
            {
                v.delete().map_err(remote(format!("deleting seed volume `{name}`")))?;
            }
            // The OS disk, with its internal snapshots; never a volume of that name nubo did
            // not make (the base it sits on is outside the pool and never touched).
            let disk = render::disk_volume_name(vm.name);
            if let Some(v) = pool
                .volume(&disk)
                .map_err(remote(format!("looking up volume `{disk}`")))?
            {
                // The base volume is recorded by `prepare`: a create killed between `store_disk`
                // and it left only the local base, whose volume in the pool is found by digest.
                let derived = match (&st.base_volume, &st.base) {
                    (None, Some(b)) if !st.uri.is_local() => {
                        let format = b.extension().and_then(|e| e.to_str()).unwrap_or_default();
                        remote_base_path(&pool, b, format)
                    }
                    _ => None,
                };
                let backing = st
                    .base_volume
                    .as_deref()
                    .map(Path::new)
                    .or(derived.as_deref())
                    .or(st.base.as_deref());
                if disk_is_ours(&v, &st.pool, vm.vm_dir, backing, &disk)? {
                    v.delete().map_err(remote(format!("deleting disk volume `{disk}`")))?;
                }
            }
        }
        Ok(())
    }

    fn reach(&self, vm: &VmRef) -> Result<Reach, BackendError> {
        let st = Self::state_of(vm)?;
        match (&st.network, st.ssh_port) {
            (Some(n), _) => {
                let leases = self.leases(&st, n)?;
                let ip = leases.first().map(|l| l.ip.clone());
                Ok(Reach {
                    ssh: ip
                        .as_deref()
                        .and_then(|i| i.parse().ok())
                        .map(|a: std::net::IpAddr| SocketAddr::new(a, 22)),
                    guest_addresses: leases.into_iter().map(|l| l.ip).collect(),
                    // Observed: libvirt's DHCP leases.
                    predicted: false,
                    network: format!(
                        "libvirt network `{n}` (DHCP lease of {})",
                        st.mac.as_deref().unwrap_or("?")
                    ),
                })
            }
            // The forward listens on the remote host's 127.0.0.1, which this host cannot reach.
            (None, Some(p)) if !st.uri.is_local() => Ok(Reach {
                ssh: None,
                guest_addresses: vec![crate::qemu::USER_NET_GUEST_ADDR.into()],
                predicted: false,
                network: format!(
                    "user-mode networking on the libvirt host of `{}`, SSH forwarded from that host's 127.0.0.1:{p} (reach it through that host, e.g. ssh -J)",
                    st.uri
                ),
            }),
            (None, Some(p)) => Ok(Reach {
                ssh: Some(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), p)),
                guest_addresses: vec![crate::qemu::USER_NET_GUEST_ADDR.into()],
                predicted: false,
                network: format!("user-mode networking, SSH forwarded from 127.0.0.1:{p}"),
            }),
            _ => Ok(Reach {
                ssh: None,
                guest_addresses: Vec::new(),
                predicted: false,
                network: "none".into(),
            }),
        }
    }

    fn console(&self, vm: &VmRef) -> ConsoleLog {
        let current = Self::state_of(vm)
            .map(|s| s.console_log)
            .unwrap_or_else(|_| vm.vm_dir.join("console.log"));
        let mut prev = current.clone().into_os_string();
        prev.push(".1");
        let prev = PathBuf::from(prev);
        ConsoleLog {
            previous: prev.exists().then_some(prev),
            current,
        }
    }

    fn snapshot_create(&self, vm: &VmRef, spec: &MachineSpec, name: &str) -> Result<SnapshotTaken, BackendError> {
        let (_, dom) = self.domain_of(vm)?;
        let running = dom.state().map(vm_state).unwrap_or(VmState::Stopped) != VmState::Stopped;
        let t0 = Instant::now();
        let snap = dom
            .snapshot_create(&render::snapshot(name), 0)
            .map_err(remote(format!("snapshot `{name}` of domain `{}`", vm.name)))?;
        let frozen = running.then(|| t0.elapsed());
        let xml = snap.xml().map_err(remote(format!("snapshot `{name}`")))?;
        save_snapshot_xml(vm.vm_dir, name, &xml)?;
        Ok(SnapshotTaken {
            snapshot: backend_snapshot(&xml, vm.name, &state_sizes(vm.name, &spec.disk.overlay))?,
            frozen,
        })
    }

    /// Its snapshots live in the qcow2 overlay's table.
    fn snapshot_delete_by_hand(&self, _vm: &VmRef, spec: &MachineSpec, name: &str) -> Option<crate::ByHand> {
        Some(crate::ByHand::qcow2_snapshot_delete(spec, name))
    }

    fn snapshot_list(&self, vm: &VmRef, spec: &MachineSpec) -> Result<Vec<BackendSnapshot>, BackendError> {
        let (_, dom) = self.domain_of(vm)?;
        let sizes = state_sizes(vm.name, &spec.disk.overlay);
        dom.snapshots()
            .map_err(remote(format!("snapshots of domain `{}`", vm.name)))?
            .iter()
            .map(|x| backend_snapshot(x, vm.name, &sizes))
            .collect()
    }

    fn launch_now(&self, vm: &VmRef) -> Option<Result<Launch, BackendError>> {
        // Flags 0: the live XML of a running domain (with what libvirt added: its id, device
        // aliases and addresses, seclabels), else the persistent one. Never
        // VIR_DOMAIN_XML_SECURE: nothing secret is printed.
        Some(self.domain_of(vm).and_then(|(_, dom)| {
            dom.xml(0)
                .map(Launch::Xml)
                .map_err(remote(format!("domain `{}`", vm.name)))
        }))
    }

    fn snapshot_delete(&self, vm: &VmRef, _spec: &MachineSpec, name: &str) -> Result<(), BackendError> {
        let (_, dom) = self.domain_of(vm)?;
        if let Some(snap) = dom.snapshot(name).map_err(remote(format!("snapshot `{name}`")))? {
            snap.delete()
                .map_err(remote(format!("deleting snapshot `{name}` of domain `{}`", vm.name)))?;
        }
        let _ = std::fs::remove_file(snapshot_xml_path(vm.vm_dir, name));
        Ok(())
    }

    fn snapshot_restore(
        &self,
        spec: &MachineSpec,
        state: &mut serde_json::Value,
        name: &str,
    ) -> Result<Restored, BackendError> {
        let vm = VmRef {
            name: &spec.name,
            uuid: &spec.uuid,
            vm_dir: &spec.vm_dir,
            state,
        };
        let (_, dom) = self.domain_of(&vm)?;
        let snap = dom
            .snapshot(name)
            .map_err(remote(format!("snapshot `{name}`")))?
            .ok_or_else(|| {
                BackendError::InvalidSpec(format!(
                    "domain `{0}` has no snapshot `{name}`: `nubo vm snapshot ls {0}` lists what it holds",
                    spec.name
                ))
            })?;
        let info = xml::parse_snapshot(&snap.xml().map_err(remote(format!("snapshot `{name}`")))?).map_err(|e| {
            BackendError::Remote {
                what: format!("snapshot `{name}`"),
                detail: e,
            }
        })?;
        let running = dom.state().map(vm_state).unwrap_or(VmState::Stopped) != VmState::Stopped;
        if running && !info.has_memory() {
            return Err(BackendError::InvalidSpec(format!(
                "snapshot `{name}` of VM `{0}` holds no memory (it was taken while the VM was stopped), so it cannot replace a running guest: stop the VM (`nubo vm stop {0}`) and restore it again to revert the disk",
                spec.name
            )));
        }
        snap.revert(0)
            .map_err(remote(format!("reverting domain `{}` to snapshot `{name}`", spec.name)))?;
        Ok(match (running, info.has_memory()) {
            (true, _) => Restored::Running,
            (false, false) => Restored::DiskOnly,
            (false, true) => Restored::Started(BootInfo {
                pid: None,
                launch: Launch::Xml(dom.xml(0).unwrap_or_default()),
                notes: vec![format!(
                    "domain `{}` started from snapshot `{name}`'s memory",
                    spec.name
                )],
            }),
        })
    }

    fn pause(&self, vm: &VmRef) -> Result<(), BackendError> {
        let (_, dom) = self.domain_of(vm)?;
        dom.suspend()
            .map_err(remote(format!("suspending domain `{}`", vm.name)))
    }

    fn resume(&self, vm: &VmRef) -> Result<(), BackendError> {
        let (_, dom) = self.domain_of(vm)?;
        dom.resume().map_err(remote(format!("resuming domain `{}`", vm.name)))
    }

    fn disk_is_remote(&self, state: &serde_json::Value) -> bool {
        serde_json::from_value::<LibvirtState>(state.clone()).is_ok_and(|s| !s.uri.is_local())
    }

    fn lease_hostname(&self, vm: &VmRef) -> Option<String> {
        self.lease_of(vm).ok().flatten()
    }

    fn console_feed(&self, vm: &VmRef) -> Option<Result<Box<dyn ConsoleStream>, BackendError>> {
        let st = Self::state_of(vm).ok()?;
        if st.uri.is_local() {
            // virtlogd writes the serial log into the VM's directory on this host.
            return None;
        }
        Some(self.open_console(vm, false))
    }

    fn attach_console(&self, vm: &VmRef) -> Result<Box<dyn ConsoleStream>, BackendError> {
        self.open_console(vm, true)
    }
}

impl LibvirtBackend {
    /// The running domain's console stream; `force` takes it over from another client.
    fn open_console(&self, vm: &VmRef, force: bool) -> Result<Box<dyn ConsoleStream>, BackendError> {
        let (conn, dom) = self.domain_of(vm)?;
        if dom.state().map(vm_state).unwrap_or(VmState::Stopped) == VmState::Stopped {
            return Err(BackendError::InvalidSpec(format!(
                "vm `{0}` is stopped: start it first (`nubo vm start {0}`)",
                vm.name
            )));
        }
        let stream = conn
            .open_console_with(&dom, force)
            .map_err(remote(format!("opening the console of domain `{}`", vm.name)))?;
        Ok(Box::new(Console {
            stream: std::sync::Arc::new(stream),
            _conn: conn,
        }))
    }
}

/// Whether `vol` (named `name`, in `pool`) is an OS disk nubo made for the VM of `vm_dir`:
/// every volume of nubo's own pool is; in another pool (`--pool`), only one whose backing store
/// is the VM's base (`virt-install` names its disks `<domain>.qcow2` too).
fn disk_is_ours(
    vol: &ffi::StorageVol,
    pool: &str,
    vm_dir: &Path,
    base: Option<&Path>,
    name: &str,
) -> Result<bool, BackendError> {
    if pool == own_pool_name(vm_dir) {
        return Ok(true);
    }
    let xml = vol.xml().map_err(remote(format!("volume `{name}`")))?;
    let backing = xml::volume_backing(&xml).map_err(|e| BackendError::Remote {
        what: format!("volume `{name}`"),
        detail: e,
    })?;
    Ok(disk_owned(pool, vm_dir, base, backing.as_deref()))
}

/// The path in `pool` of the content-addressed base volume of the store blob `base` (named by
/// its digest, see [`base::volume_name`]), when there is one: what a remote VM's disk volume
/// backs onto. `None` for a base that is not a store blob, or whose volume is not in the pool.
fn remote_base_path(pool: &ffi::StoragePool, base: &Path, format: &str) -> Option<PathBuf> {
    let name = remote_base_name(base, format)?;
    let vol = pool.volume(&name).ok()??;
    vol.path().ok().map(PathBuf::from)
}

/// [`remote_base_path`]'s name, pure: `nubo-base-<16 hex>.<format>` of a store blob.
fn remote_base_name(base: &Path, format: &str) -> Option<String> {
    let digest = base::digest_from_name(base)?;
    let name = base::volume_name(&digest, format);
    base::is_base_volume(&name).then_some(name)
}

/// [`disk_is_ours`]'s rule, pure: nubo's own pool, or a backing store that is the VM's base.
fn disk_owned(pool: &str, vm_dir: &Path, base: Option<&Path>, backing: Option<&str>) -> bool {
    pool == own_pool_name(vm_dir) || matches!((base, backing), (Some(b), Some(x)) if Path::new(x) == b)
}

/// On a remote host, before each boot, in place of the engine's local chain check: the OS disk
/// volume still backs onto the base volume recorded at create (content-addressed, verified by
/// its read-back digest then), and nothing else.
fn check_remote_chain(pool: &ffi::StoragePool, vm: &str, base_volume: Option<&str>) -> Result<(), BackendError> {
    let disk = render::disk_volume_name(vm);
    let backing = base::backing_of(pool, &disk)?;
    if !remote_chain_ok(backing.as_deref(), base_volume) {
        return Err(BackendError::Remote {
            what: format!("disk volume `{disk}`"),
            detail: format!(
                "it backs onto {}, not the base volume {} recorded at create: remove the VM (`nubo vm rm --force {vm}`) and create it again",
                backing.as_deref().unwrap_or("nothing"),
                base_volume.unwrap_or("(none)")
            ),
        });
    }
    Ok(())
}

/// [`check_remote_chain`]'s rule, pure: the overlay backs onto exactly the recorded volume,
/// and that is a base volume nubo names.
fn remote_chain_ok(backing: Option<&str>, recorded: Option<&str>) -> bool {
    let named_base = backing
        .and_then(|b| Path::new(b).file_name())
        .and_then(|n| n.to_str())
        .is_some_and(base::is_base_volume);
    backing.is_some() && backing == recorded && named_base
}

/// nubo's own pool name for the NUBO_ROOT `root` (`nubo image prune --connect`).
pub fn own_pool_for_root(root: &Path) -> String {
    own_pool_name(&root.join("vms").join("x"))
}

/// `nubo image prune --connect URI`: deletes the base volumes of `pool` at `uri` no OS disk
/// volume backs onto; returns their names (only names them with `dry_run`).
pub fn prune_base_volumes(uri: &ConnectUri, pool: &str, dry_run: bool) -> Result<Vec<String>, BackendError> {
    let conn = connect(uri)?;
    let Some(p) = conn.pool(pool).map_err(remote(format!("looking up pool `{pool}`")))? else {
        return Ok(Vec::new());
    };
    if !p.is_active().map_err(remote(format!("pool `{pool}`")))? {
        p.start().map_err(remote(format!("starting pool `{pool}`")))?;
    }
    base::prune(&p, pool, dry_run)
}

fn foreign_disk(name: &str, pool: &str) -> BackendError {
    BackendError::InvalidSpec(format!(
        "libvirt storage pool `{pool}` already holds a volume `{name}` that nubo did not make for this VM: nubo never replaces or deletes it; choose another VM name or pool, or delete the volume yourself (virsh vol-delete --pool {pool} {name})"
    ))
}

fn snapshot_xml_path(vm_dir: &Path, name: &str) -> PathBuf {
    vm_dir.join("snapshots").join(format!("{name}.xml"))
}

/// Keeps a snapshot's XML under `vms/<name>/snapshots/`, so it can be redefined after any
/// define that lost libvirt's metadata.
fn save_snapshot_xml(vm_dir: &Path, name: &str, xml: &str) -> Result<(), BackendError> {
    let dir = vm_dir.join("snapshots");
    std::fs::create_dir_all(&dir).map_err(BackendError::io(format!("creating {}", dir.display())))?;
    let path = snapshot_xml_path(vm_dir, name);
    nubo_core::write_atomic(&path, xml.as_bytes()).map_err(BackendError::io(format!("writing {}", path.display())))
}

/// Each internal snapshot's saved VM-state size, from the OS disk's own qcow2 snapshot table
/// (libvirt's snapshot XML does not carry it), read in-process and read-only while QEMU may
/// hold the disk open. Empty when the disk cannot be read from this host (a remote URI).
fn state_sizes(vm: &str, disk: &Path) -> Vec<(String, u64)> {
    crate::qemu::snapshot::table(vm, disk)
        .map(|t| t.into_iter().map(|s| (s.name, s.vm_state_size)).collect())
        .unwrap_or_default()
}

/// A snapshot as libvirt describes it, with its VM-state size from `sizes` (the table's last
/// entry of that name: the newest).
fn backend_snapshot(xml: &str, vm: &str, sizes: &[(String, u64)]) -> Result<BackendSnapshot, BackendError> {
    let info = xml::parse_snapshot(xml).map_err(|e| BackendError::Remote {
        what: format!("a snapshot of domain `{vm}`"),
        detail: e,
    })?;
    let vm_state_size = sizes.iter().rev().find(|(n, _)| *n == info.name).map_or(0, |(_, s)| *s);
    Ok(BackendSnapshot {
        has_memory: info.has_memory(),
        vm_state_size,
        created: info
            .created
            .map(|t| humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(t)).to_string()),
        name: info.name,
    })
}

/// Snapshots saved under `vms/<name>/snapshots/` that libvirt does not know (its metadata was
/// lost with an undefine, say) are redefined onto `dom`, parents first, with `uuid` written in.
fn redefine_snapshots(dom: &Domain, vm_dir: &Path, uuid: &str) -> Result<usize, BackendError> {
    let mut saved: Vec<(u64, String)> = Vec::new();
    for e in std::fs::read_dir(vm_dir.join("snapshots"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "xml") {
            continue;
        }
        let text = nubo_core::file::read_bounded(&p, "snapshot XML", 1 << 20)
            .map_err(|e| BackendError::InvalidSpec(e.to_string()))?;
        let text = String::from_utf8_lossy(&text).into_owned();
        let created = xml::parse_snapshot(&text).ok().and_then(|i| i.created).unwrap_or(0);
        saved.push((created, text));
    }
    saved.sort();
    let mut n = 0;
    for (_, text) in saved {
        let info = xml::parse_snapshot(&text).map_err(BackendError::InvalidSpec)?;
        if dom
            .snapshot(&info.name)
            .map_err(remote("looking up a snapshot"))?
            .is_some()
        {
            continue;
        }
        let xml = xml::rewrite_snapshot_uuid(&text, uuid).map_err(BackendError::InvalidSpec)?;
        dom.snapshot_create(&xml, ffi::SNAPSHOT_CREATE_REDEFINE)
            .map_err(remote(format!("redefining snapshot `{}`", info.name)))?;
        n += 1;
    }
    Ok(n)
}

/// libvirt's console stream for a domain (`nubo vm console`): one thread reads while another
/// writes; `shutdown` aborts the stream, which ends a blocked read.
struct Console {
    stream: std::sync::Arc<ffi::Stream>,
    _conn: std::sync::Arc<Connection>,
}

impl std::io::Read for Console {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.recv(buf).map_err(|e| std::io::Error::other(e.message))
    }
}

impl std::io::Write for Console {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.send(buf).map_err(|e| std::io::Error::other(e.message))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ConsoleStream for Console {
    fn try_clone_reader(&self) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        Ok(Box::new(Console {
            stream: self.stream.clone(),
            _conn: self._conn.clone(),
        }))
    }

    fn shutdown(&self) {
        self.stream.abort();
    }
}

/// A lease of the VM's MAC on its network.
pub struct Lease {
    pub ip: String,
    pub hostname: Option<String>,
}

impl LibvirtBackend {
    /// Detaches folder `dir` from running domain `dom` and waits until the guest has released
    /// it (libvirt then stops its virtiofsd). Already gone: nothing to do.
    fn detach_live(&self, vm: &VmRef, dom: &Domain, dir: &SharedDir) -> Result<(), BackendError> {
        if !self.live_facts(vm, dom, &dir.tag)?.1 {
            return Ok(());
        }
        dom.detach_device_live(&mounts::filesystem(dir))
            .map_err(remote(format!(
                "removing shared folder {} from domain `{}`",
                dir.guest.display(),
                vm.name
            )))?;
        crate::wait_unplugged(format!("domain `{}`", vm.name), dir, || {
            Ok(self.live_facts(vm, dom, &dir.tag)?.1)
        })
    }

    /// [`mounts::live_facts`] of the running domain: memory shared, folder `tag` present.
    fn live_facts(&self, vm: &VmRef, dom: &Domain, tag: &str) -> Result<(bool, bool), BackendError> {
        let xml = dom.xml(0).map_err(remote(format!("domain `{}`", vm.name)))?;
        mounts::live_facts(&xml, tag).map_err(|e| BackendError::Remote {
            what: format!("domain `{}`", vm.name),
            detail: e,
        })
    }

    /// The VM's connection and domain; an error when the domain is gone.
    fn domain_of(&self, vm: &VmRef) -> Result<(Arc<Connection>, Domain), BackendError> {
        let st = self.state_or_default(vm);
        let conn = self.conn(&st.uri)?;
        let dom = self
            .own_domain(&conn, vm.name, vm.vm_dir)?
            .ok_or_else(|| BackendError::Remote {
                what: format!("domain `{}`", vm.name),
                detail: format!("it is not defined at `{}`", st.uri),
            })?;
        Ok((conn, dom))
    }

    fn leases(&self, st: &LibvirtState, network: &str) -> Result<Vec<Lease>, BackendError> {
        let Some(mac) = &st.mac else {
            return Ok(Vec::new());
        };
        let conn = self.conn(&st.uri)?;
        let Some(net) = conn
            .network(network)
            .map_err(remote(format!("looking up network `{network}`")))?
        else {
            return Ok(Vec::new());
        };
        Ok(net
            .leases(mac)
            .map_err(remote(format!("DHCP leases of network `{network}`")))?
            .into_iter()
            .map(|l| Lease {
                ip: l.ip,
                hostname: l.hostname,
            })
            .collect())
    }

    /// The hostname of the VM's DHCP lease, if it has one: a lease bearing the domain name
    /// can only come from a guest that read the seed.
    pub fn lease_of(&self, vm: &VmRef) -> Result<Option<String>, BackendError> {
        let st = Self::state_of(vm)?;
        let Some(n) = &st.network else {
            return Ok(None);
        };
        Ok(self.leases(&st, n)?.into_iter().find_map(|l| l.hostname))
    }

    /// The seed volume's bytes, read back through libvirt (for `vm inspect` and tests).
    pub fn read_seed(&self, vm: &VmRef) -> Result<Vec<u8>, BackendError> {
        let st = Self::state_of(vm)?;
        let conn = self.conn(&st.uri)?;
        let name = render::seed_volume_name(vm.name);
        let pool = conn
            .pool(&st.pool)
            .map_err(remote(format!("looking up pool `{}`", st.pool)))?
            .ok_or_else(|| BackendError::Remote {
                what: format!("pool `{}`", st.pool),
                detail: "not found".into(),
            })?;
        let vol = pool
            .volume(&name)
            .map_err(remote(format!("looking up volume `{name}`")))?
            .ok_or_else(|| BackendError::Remote {
                what: format!("volume `{name}`"),
                detail: "not found".into(),
            })?;
        conn.download(&vol, MAX_SEED)
            .map_err(remote(format!("downloading volume `{name}`")))
    }
}

fn check(name: &str, status: CheckStatus, detail: String, fix: Option<String>, blocks: Option<&str>) -> HostCheck {
    HostCheck {
        name: name.into(),
        status,
        detail,
        fix,
        blocks: blocks.map(str::to_owned),
    }
}

/// `nubo doctor`'s libvirt checks: library, daemon (URI, versions), group, domain
/// capabilities, and the PVM pitfall, each with its fix.
fn checks(b: &LibvirtBackend) -> Vec<HostCheck> {
    let mut out = Vec::new();
    if let Err(e) = ffi::loadable() {
        out.push(check(
            "libvirt library",
            CheckStatus::Broken,
            format!("{} cannot be loaded: {e}", ffi::SONAME),
            Some(format!(
                "install the Debian packages {PACKAGES} (from bookworm-backports, --no-install-recommends)"
            )),
            None,
        ));
        return out;
    }
    out.push(check(
        "libvirt library",
        CheckStatus::Ok,
        format!("{} loaded at run time", ffi::SONAME),
        None,
        None,
    ));
    let uri = b.uri();
    let conn = match Connection::open(&uri) {
        Ok(c) => c,
        Err(e) => {
            out.push(check(
                "libvirt daemon",
                CheckStatus::Broken,
                format!("`{uri}` is unreachable: {}", connect_fix::detail(&uri, &e.to_string())),
                Some(if uri.transport() == nubo_spec::uri::Transport::Ssh {
                    connect_fix::fix(&uri, &e.to_string())
                } else {
                    "start libvirtd and virtlogd (or virtqemud), or point NUBO_LIBVIRT_URI at a running one".into()
                }),
                None,
            ));
            return out;
        }
    };
    let versions = conn
        .versions()
        .map(|(l, h)| format!("libvirt {l}, QEMU {h}"))
        .unwrap_or_default();
    out.push(check(
        "libvirt daemon",
        CheckStatus::Ok,
        format!("`{uri}` reachable ({versions})"),
        None,
        None,
    ));
    if !nix::unistd::geteuid().is_root() && uri.instance() == nubo_spec::uri::Instance::System {
        let in_group = nix::unistd::Group::from_name("libvirt")
            .ok()
            .flatten()
            .is_some_and(|g| nix::unistd::getgroups().is_ok_and(|gs| gs.contains(&g.gid)));
        out.push(check(
            "libvirt group",
            if in_group { CheckStatus::Ok } else { CheckStatus::Warn },
            if in_group {
                "you are in the `libvirt` group".into()
            } else {
                "you are not in the `libvirt` group: qemu:///system may refuse you".into()
            },
            (!in_group).then(|| "sudo adduser $USER libvirt, then log in again".into()),
            None,
        ));
    }
    let vt = virt_type();
    match conn.domain_capabilities(Some(vt)) {
        Ok(caps) => {
            let efi = caps.contains("<value>efi</value>");
            let machines: Vec<&str> = ["pc", "q35"]
                .into_iter()
                .filter(|m| {
                    caps.contains(&format!("'{m}'")) || caps.contains(&format!(">{m}<")) || caps.contains("pc-i440fx")
                })
                .collect();
            out.push(check(
                "libvirt domain capabilities",
                CheckStatus::Ok,
                format!(
                    "QEMU driver: {} ({}), machines {}",
                    if vt == "kvm" { "KVM" } else { "TCG" },
                    if efi {
                        "UEFI firmware available"
                    } else {
                        "no UEFI firmware"
                    },
                    machines.join(", ")
                ),
                None,
                None,
            ));
            if !efi {
                out.push(check(
                    "libvirt UEFI",
                    CheckStatus::Warn,
                    "libvirt found no UEFI firmware".into(),
                    Some("install the ovmf package".into()),
                    Some("--firmware efi on libvirt"),
                ));
            }
        }
        Err(e) => out.push(check(
            "libvirt domain capabilities",
            CheckStatus::Broken,
            format!("the QEMU driver answers no capabilities: {e}"),
            Some("install libvirt-daemon-driver-qemu and qemu-system-x86".into()),
            None,
        )),
    }
    let kvm = crate::qemu::QemuBackend::default().kvm();
    if matches!(kvm, crate::qemu::probe::KvmStatus::Pvm) {
        out.push(check(
            "libvirt on PVM",
            CheckStatus::Warn,
            "/dev/kvm is PVM: nubo defines TCG domains (type `qemu`), and with the stock qemu.conf libvirt re-probes QEMU on every define (about 50 s)".into(),
            Some("in qemu.conf set user = \"root\", group = \"root\", dynamic_ownership = 0, remember_owner = 0 (define then takes milliseconds)".into()),
            None,
        ));
    }
    out
}

#[cfg(test)]
mod tests_unit {
    use super::*;

    fn env_uri(s: &str) -> ConnectUri {
        ConnectUri::parse(s, Origin::Env).unwrap()
    }

    #[test]
    fn socket_of_query_socket_wins() {
        assert_eq!(
            socket_of(&env_uri("qemu:///system?socket=/tmp/x/libvirt-sock"), 0),
            Some(PathBuf::from("/tmp/x/libvirt-sock"))
        );
    }

    #[test]
    fn socket_of_remote_uri_is_none() {
        assert_eq!(socket_of(&env_uri("qemu+ssh://host/system"), 0), None);
    }

    /// A BIOS VM named `web` whose spec names libvirt URI `uri`.
    fn web_spec(uri: &str) -> MachineSpec {
        MachineSpec {
            name: "web".into(),
            uuid: "6f1c2f0e-8a45-4c1e-9d0e-1b2c3d4e5f60".into(),
            vm_dir: "/var/lib/nubo/vms/web".into(),
            run_dir: "/run/nubo/vms/web".into(),
            vcpus: 1,
            memory_mib: 512,
            disk: crate::spec::Disk {
                overlay: "/o.qcow2".into(),
                base: "/b.qcow2".into(),
                base_format: "qcow2".into(),
                ..Default::default()
            },
            seed: None,
            boot: Boot::Firmware {
                firmware: Firmware::Bios,
            },
            machine: MachineKind::Default,
            network: NetworkMode::Forward,
            options: [("uri".to_owned(), uri.to_owned())].into(),
            ports: Vec::new(),
            mounts: Vec::new(),
        }
    }

    /// Issue 21: a spec's `qemu+ext` URI reached `virConnectOpen`, which ran `command=`.
    #[test]
    fn spec_uri_ext_transport_is_refused_before_connecting() {
        let b = LibvirtBackend::new(None);
        let spec = web_spec("qemu+ext:///system?command=/abs/pwn.sh");

        let e = b.spec_uri(&spec).unwrap_err();

        assert!(e.to_string().contains("`ext`"), "{e}");
    }

    #[test]
    fn check_remote_uri_with_published_port_is_unsupported_before_connecting() {
        let b = LibvirtBackend::new(None);
        // Port 1 on loopback: were it ever contacted, nothing answers and nothing leaves.
        let mut spec = web_spec("qemu+tls://127.0.0.1:1/system");
        spec.ports = vec![nubo_core::PortForward::parse("8080:80").unwrap()];

        let e = b.check(&spec).unwrap_err();

        assert_eq!(e.kind(), nubo_core::ErrorKind::Unsupported, "{e}");
        assert!(
            e.to_string().contains("--publish") && e.to_string().contains("--jump"),
            "{e}"
        );
    }

    #[test]
    fn check_remote_uri_with_shared_folder_is_unsupported_before_connecting() {
        let b = LibvirtBackend::new(None);
        let mut spec = web_spec("qemu+tls://127.0.0.1:1/system");
        spec.mounts = vec![SharedDir {
            tag: "mount0".into(),
            host: "/srv/data".into(),
            guest: "/srv/data".into(),
            read_only: false,
            transport: crate::MountTransport::Virtiofs,
        }];

        let e = b.check(&spec).unwrap_err();

        assert_eq!(e.kind(), nubo_core::ErrorKind::Unsupported, "{e}");
        assert!(
            e.to_string().contains("--mount") && e.to_string().contains("remote"),
            "{e}"
        );
        // And the running-VM verbs likewise.
        let e = b.check_hot_plug(&spec, &spec.mounts[0]).unwrap_err();
        assert!(e.to_string().contains("remote host"), "{e}");
    }

    #[test]
    fn remote_chain_ok_only_over_the_recorded_base_volume() {
        let b = "/p/nubo-base-0123456789abcdef.qcow2";

        assert!(remote_chain_ok(Some(b), Some(b)));
        assert!(!remote_chain_ok(Some("/etc/shadow"), Some("/etc/shadow")));
        assert!(!remote_chain_ok(Some(b), Some("/p/nubo-base-fedcba9876543210.qcow2")));
        assert!(!remote_chain_ok(None, Some(b)));
        assert!(!remote_chain_ok(Some(b), None));
    }

    #[test]
    fn reach_remote_user_mode_has_no_local_ssh_endpoint() {
        let b = LibvirtBackend::new(None);
        let state = serde_json::json!({"uri": "qemu+tls://hv1.example/system", "pool": "p", "network": null,
            "mac": null, "ssh_port": 2222, "seed_volume": null, "console_log": "/x"});
        let vm = VmRef {
            name: "web",
            uuid: "6f1c2f0e-8a45-4c1e-9d0e-1b2c3d4e5f60",
            vm_dir: Path::new("/a/vms/web"),
            state: &state,
        };

        let r = b.reach(&vm).unwrap();

        assert_eq!(r.ssh, None);
        assert!(r.network.contains("that host's 127.0.0.1:2222"), "{}", r.network);
    }

    #[test]
    fn state_record_with_ext_uri_is_refused() {
        let v = serde_json::json!({"uri": "qemu+ext:///system?command=/x", "pool": "p", "network": null,
            "mac": null, "ssh_port": null, "seed_volume": null, "console_log": "/x"});

        assert!(serde_json::from_value::<LibvirtState>(v).is_err());
    }

    /// A 1 GiB qcow2 v3 image whose snapshot table (at cluster 1) holds `(name, vm_state_size)`
    /// entries, built by hand as QEMU lays them out (docs/interop/qcow2.txt, "Snapshots").
    fn qcow2_with_snapshots(snaps: &[(&str, u64)]) -> Vec<u8> {
        let l = nubo_disk::layout::layout(1 << 30, None).unwrap();
        let mut img = vec![0u8; l.len.max(3 << 16) as usize];
        for (at, bytes) in &l.writes {
            img[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
        }
        let mut table = Vec::new();
        for (i, (name, state)) in snaps.iter().enumerate() {
            let id = (i + 1).to_string();
            let mut e = vec![0u8; 40];
            e[12..14].copy_from_slice(&(id.len() as u16).to_be_bytes());
            e[14..16].copy_from_slice(&(name.len() as u16).to_be_bytes());
            e[16..20].copy_from_slice(&1_764_700_000u32.to_be_bytes());
            e[36..40].copy_from_slice(&16u32.to_be_bytes());
            e.extend_from_slice(&state.to_be_bytes());
            e.extend_from_slice(&(1u64 << 30).to_be_bytes());
            e.extend_from_slice(id.as_bytes());
            e.extend_from_slice(name.as_bytes());
            e.resize(e.len().next_multiple_of(8), 0);
            table.extend(e);
        }
        img[60..64].copy_from_slice(&(snaps.len() as u32).to_be_bytes());
        img[64..72].copy_from_slice(&(1u64 << 16).to_be_bytes());
        img[1 << 16..(1 << 16) + table.len()].copy_from_slice(&table);
        img
    }

    const SNAP_S1: &str = "<domainsnapshot>\n  <name>s1</name>\n  <state>running</state>\n  <creationTime>1764700000</creationTime>\n</domainsnapshot>\n";

    #[test]
    fn state_sizes_reads_the_disks_snapshot_table() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("web.qcow2");
        std::fs::write(&disk, qcow2_with_snapshots(&[("s0", 0), ("s1", 287 << 20)])).unwrap();

        let sizes = state_sizes("web", &disk);

        assert_eq!(sizes, vec![("s0".to_owned(), 0), ("s1".to_owned(), 287 << 20)]);
    }

    #[test]
    fn state_sizes_unreadable_disk_is_empty() {
        let dir = tempfile::tempdir().unwrap();

        let sizes = state_sizes("web", &dir.path().join("absent.qcow2"));

        assert!(sizes.is_empty());
    }

    #[test]
    fn backend_snapshot_takes_the_newest_table_entry_of_its_name() {
        let sizes = vec![("s1".to_owned(), 100), ("s2".to_owned(), 7), ("s1".to_owned(), 300)];

        let s = backend_snapshot(SNAP_S1, "web", &sizes).unwrap();

        assert_eq!((s.name.as_str(), s.has_memory, s.vm_state_size), ("s1", true, 300));
    }

    #[test]
    fn backend_snapshot_absent_from_table_is_zero() {
        let s = backend_snapshot(SNAP_S1, "web", &[]).unwrap();

        assert_eq!(s.vm_state_size, 0);
    }

    #[test]
    fn remote_base_name_of_a_store_blob_only() {
        let hex = "0123456789abcdef".repeat(4);
        let blob = PathBuf::from(format!("/r/images/blobs/{hex}.qcow2"));
        assert_eq!(
            remote_base_name(&blob, "qcow2").as_deref(),
            Some("nubo-base-0123456789abcdef.qcow2")
        );
        // A user's own --disk is not named by its digest: no volume is derived from it.
        assert_eq!(remote_base_name(Path::new("/home/u/debian.qcow2"), "qcow2"), None);
        assert_eq!(remote_base_name(&blob, "iso"), None);
    }

    #[test]
    fn disk_owned_in_nubos_own_pool_whatever_its_backing() {
        let dir = Path::new("/a/vms/web");

        assert!(disk_owned(&own_pool_name(dir), dir, None, None));
    }

    #[test]
    fn disk_owned_in_another_pool_only_over_the_vms_base() {
        let dir = Path::new("/a/vms/web");
        let base = Path::new("/a/images/blobs/abc.qcow2");

        assert!(disk_owned(
            "default",
            dir,
            Some(base),
            Some("/a/images/blobs/abc.qcow2")
        ));
        assert!(!disk_owned(
            "default",
            dir,
            Some(base),
            Some("/var/lib/libvirt/images/debian.qcow2")
        ));
        assert!(!disk_owned("default", dir, Some(base), None));
        assert!(!disk_owned("default", dir, None, Some("/a/images/blobs/abc.qcow2")));
    }

    #[test]
    fn own_pool_name_differs_per_root() {
        assert_ne!(
            own_pool_name(Path::new("/a/vms/x")),
            own_pool_name(Path::new("/b/vms/x"))
        );
        assert_eq!(
            own_pool_name(Path::new("/a/vms/x")),
            own_pool_name(Path::new("/a/vms/y"))
        );
    }
}
