//! libvirt's C API, loaded at run time from `libvirt.so.0` (dlopen), and wrapped safely.
//!
//! This is the only module of nubo with `unsafe` code. Only the functions nubo calls are
//! declared, by hand, from libvirt's public headers (ABI-stable since their introduction).
//! Every handle is an owned type whose `Drop` frees it; every string libvirt returns is
//! copied into a Rust `String` and freed at once; every failure carries the text of
//! `virGetLastError` (thread-local in libvirt) copied before any other call can replace it.
#![allow(unsafe_code)]

use std::ffi::{c_char, c_int, c_longlong, c_uint, c_ulong, c_void, CStr, CString};
use std::sync::OnceLock;

use nubo_spec::ConnectUri;

/// The SONAME nubo loads; it is what the Debian package `libvirt0` installs.
pub const SONAME: &str = "libvirt.so.0";

#[repr(C)]
struct VirError {
    code: c_int,
    domain: c_int,
    message: *mut c_char,
}

#[repr(C)]
struct VirDhcpLease {
    iface: *mut c_char,
    expirytime: c_longlong,
    kind: c_int,
    mac: *mut c_char,
    iaid: *mut c_char,
    ipaddr: *mut c_char,
    prefix: c_uint,
    hostname: *mut c_char,
    clientid: *mut c_char,
}

/// `virNodeInfo`.
#[repr(C)]
struct VirNodeInfo {
    model: [c_char; 32],
    /// KiB.
    memory: c_ulong,
    cpus: c_uint,
    mhz: c_uint,
    nodes: c_uint,
    sockets: c_uint,
    cores: c_uint,
    threads: c_uint,
}

type Ptr = *mut c_void;

/// The functions nubo uses, resolved once.
struct Api {
    _lib: libloading::Library,
    set_error_func: unsafe extern "C" fn(Ptr, Option<unsafe extern "C" fn(Ptr, *mut VirError)>),
    get_last_error: unsafe extern "C" fn() -> *mut VirError,
    reset_last_error: unsafe extern "C" fn(),
    connect_open: unsafe extern "C" fn(*const c_char) -> Ptr,
    connect_close: unsafe extern "C" fn(Ptr) -> c_int,
    connect_is_alive: unsafe extern "C" fn(Ptr) -> c_int,
    connect_get_lib_version: unsafe extern "C" fn(Ptr, *mut c_ulong) -> c_int,
    connect_get_version: unsafe extern "C" fn(Ptr, *mut c_ulong) -> c_int,
    connect_get_uri: unsafe extern "C" fn(Ptr) -> *mut c_char,
    node_get_free_memory: unsafe extern "C" fn(Ptr) -> u64,
    node_get_info: unsafe extern "C" fn(Ptr, *mut VirNodeInfo) -> c_int,
    connect_get_domain_capabilities:
        unsafe extern "C" fn(Ptr, *const c_char, *const c_char, *const c_char, *const c_char, c_uint) -> *mut c_char,
    domain_lookup_by_name: unsafe extern "C" fn(Ptr, *const c_char) -> Ptr,
    domain_define_xml: unsafe extern "C" fn(Ptr, *const c_char) -> Ptr,
    domain_get_uuid_string: unsafe extern "C" fn(Ptr, *mut c_char) -> c_int,
    domain_get_xml_desc: unsafe extern "C" fn(Ptr, c_uint) -> *mut c_char,
    domain_create: unsafe extern "C" fn(Ptr) -> c_int,
    domain_shutdown: unsafe extern "C" fn(Ptr) -> c_int,
    domain_destroy: unsafe extern "C" fn(Ptr) -> c_int,
    domain_suspend: unsafe extern "C" fn(Ptr) -> c_int,
    domain_attach_device_flags: unsafe extern "C" fn(Ptr, *const c_char, c_uint) -> c_int,
    domain_detach_device_flags: unsafe extern "C" fn(Ptr, *const c_char, c_uint) -> c_int,
    domain_resume: unsafe extern "C" fn(Ptr) -> c_int,
    domain_undefine_flags: unsafe extern "C" fn(Ptr, c_uint) -> c_int,
    domain_get_state: unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int, c_uint) -> c_int,
    domain_free: unsafe extern "C" fn(Ptr) -> c_int,
    network_lookup_by_name: unsafe extern "C" fn(Ptr, *const c_char) -> Ptr,
    network_is_active: unsafe extern "C" fn(Ptr) -> c_int,
    network_get_dhcp_leases: unsafe extern "C" fn(Ptr, *const c_char, *mut *mut *mut VirDhcpLease, c_uint) -> c_int,
    network_dhcp_lease_free: unsafe extern "C" fn(*mut VirDhcpLease),
    network_free: unsafe extern "C" fn(Ptr) -> c_int,
    pool_lookup_by_name: unsafe extern "C" fn(Ptr, *const c_char) -> Ptr,
    pool_define_xml: unsafe extern "C" fn(Ptr, *const c_char, c_uint) -> Ptr,
    pool_build: unsafe extern "C" fn(Ptr, c_uint) -> c_int,
    pool_create: unsafe extern "C" fn(Ptr, c_uint) -> c_int,
    pool_is_active: unsafe extern "C" fn(Ptr) -> c_int,
    pool_refresh: unsafe extern "C" fn(Ptr, c_uint) -> c_int,
    pool_free: unsafe extern "C" fn(Ptr) -> c_int,
    vol_lookup_by_name: unsafe extern "C" fn(Ptr, *const c_char) -> Ptr,
    vol_create_xml: unsafe extern "C" fn(Ptr, *const c_char, c_uint) -> Ptr,
    vol_get_path: unsafe extern "C" fn(Ptr) -> *mut c_char,
    vol_get_xml_desc: unsafe extern "C" fn(Ptr, c_uint) -> *mut c_char,
    vol_upload: unsafe extern "C" fn(Ptr, Ptr, c_ulonglong, c_ulonglong, c_uint) -> c_int,
    vol_download: unsafe extern "C" fn(Ptr, Ptr, c_ulonglong, c_ulonglong, c_uint) -> c_int,
    vol_delete: unsafe extern "C" fn(Ptr, c_uint) -> c_int,
    vol_get_name: unsafe extern "C" fn(Ptr) -> *const c_char,
    pool_list_all_volumes: unsafe extern "C" fn(Ptr, *mut *mut Ptr, c_uint) -> c_int,
    vol_free: unsafe extern "C" fn(Ptr) -> c_int,
    snapshot_create_xml: unsafe extern "C" fn(Ptr, *const c_char, c_uint) -> Ptr,
    snapshot_lookup_by_name: unsafe extern "C" fn(Ptr, *const c_char, c_uint) -> Ptr,
    snapshot_get_xml_desc: unsafe extern "C" fn(Ptr, c_uint) -> *mut c_char,
    snapshot_revert: unsafe extern "C" fn(Ptr, c_uint) -> c_int,
    snapshot_delete: unsafe extern "C" fn(Ptr, c_uint) -> c_int,
    snapshot_free: unsafe extern "C" fn(Ptr) -> c_int,
    domain_list_all_snapshots: unsafe extern "C" fn(Ptr, *mut *mut Ptr, c_uint) -> c_int,
    domain_open_console: unsafe extern "C" fn(Ptr, *const c_char, Ptr, c_uint) -> c_int,
    stream_new: unsafe extern "C" fn(Ptr, c_uint) -> Ptr,
    stream_send: unsafe extern "C" fn(Ptr, *const c_char, usize) -> c_int,
    stream_recv: unsafe extern "C" fn(Ptr, *mut c_char, usize) -> c_int,
    stream_finish: unsafe extern "C" fn(Ptr) -> c_int,
    stream_abort: unsafe extern "C" fn(Ptr) -> c_int,
    stream_free: unsafe extern "C" fn(Ptr) -> c_int,
}

#[allow(non_camel_case_types)]
type c_ulonglong = u64;

/// A libvirt error: what failed, and libvirt's own message and code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtError {
    pub code: i32,
    pub message: String,
}

impl std::fmt::Display for VirtError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// libvirt's `VIR_ERR_NO_DOMAIN`, `VIR_ERR_NO_NETWORK`, `VIR_ERR_NO_STORAGE_POOL`,
/// `VIR_ERR_NO_STORAGE_VOL`: the object does not exist.
pub const ERR_NO_DOMAIN: i32 = 42;
pub const ERR_NO_NETWORK: i32 = 43;
pub const ERR_NO_STORAGE_POOL: i32 = 49;
pub const ERR_NO_STORAGE_VOL: i32 = 50;
/// nubo's own code (libvirt's are positive): [`Connection::download_to`] stopped at its bound.
pub const ERR_OVER_MAX: i32 = -1;
/// `VIR_ERR_OPERATION_INVALID`: e.g. destroying a domain that is not running.
pub const ERR_OPERATION_INVALID: i32 = 55;

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// Silences libvirt's default handler, which prints every error on stderr: nubo reports them.
unsafe extern "C" fn quiet(_: Ptr, _: *mut VirError) {}

fn api() -> Result<&'static Api, String> {
    API.get_or_init(load).as_ref().map_err(Clone::clone)
}

/// Whether `libvirt.so.0` can be loaded, and why not.
pub fn loadable() -> Result<(), String> {
    api().map(drop)
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol is libvirt's public function of that name, declared with the
        // signature of libvirt's headers; the pointer is copied out while `_lib` keeps the
        // library loaded for the life of the process (the `Api` lives in a static).
        *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| format!("{SONAME} has no {}: {e}", $name))?
    };
}

fn load() -> Result<Api, String> {
    // SAFETY: loading libvirt runs its ELF constructors, which only initialise its own state.
    let lib = unsafe { libloading::Library::new(SONAME) }.map_err(|e| e.to_string())?;
    let api = Api {
        set_error_func: sym!(lib, "virSetErrorFunc"),
        get_last_error: sym!(lib, "virGetLastError"),
        reset_last_error: sym!(lib, "virResetLastError"),
        connect_open: sym!(lib, "virConnectOpen"),
        connect_close: sym!(lib, "virConnectClose"),
        connect_is_alive: sym!(lib, "virConnectIsAlive"),
        connect_get_lib_version: sym!(lib, "virConnectGetLibVersion"),
        connect_get_version: sym!(lib, "virConnectGetVersion"),
        connect_get_uri: sym!(lib, "virConnectGetURI"),
        node_get_free_memory: sym!(lib, "virNodeGetFreeMemory"),
        node_get_info: sym!(lib, "virNodeGetInfo"),
        connect_get_domain_capabilities: sym!(lib, "virConnectGetDomainCapabilities"),
        domain_lookup_by_name: sym!(lib, "virDomainLookupByName"),
        domain_define_xml: sym!(lib, "virDomainDefineXML"),
        domain_get_uuid_string: sym!(lib, "virDomainGetUUIDString"),
        domain_get_xml_desc: sym!(lib, "virDomainGetXMLDesc"),
        domain_create: sym!(lib, "virDomainCreate"),
        domain_shutdown: sym!(lib, "virDomainShutdown"),
        domain_destroy: sym!(lib, "virDomainDestroy"),
        domain_suspend: sym!(lib, "virDomainSuspend"),
        domain_attach_device_flags: sym!(lib, "virDomainAttachDeviceFlags"),
        domain_detach_device_flags: sym!(lib, "virDomainDetachDeviceFlags"),
        domain_resume: sym!(lib, "virDomainResume"),
        domain_undefine_flags: sym!(lib, "virDomainUndefineFlags"),
        domain_get_state: sym!(lib, "virDomainGetState"),
        domain_free: sym!(lib, "virDomainFree"),
        network_lookup_by_name: sym!(lib, "virNetworkLookupByName"),
        network_is_active: sym!(lib, "virNetworkIsActive"),
        network_get_dhcp_leases: sym!(lib, "virNetworkGetDHCPLeases"),
        network_dhcp_lease_free: sym!(lib, "virNetworkDHCPLeaseFree"),
        network_free: sym!(lib, "virNetworkFree"),
        pool_lookup_by_name: sym!(lib, "virStoragePoolLookupByName"),
        pool_define_xml: sym!(lib, "virStoragePoolDefineXML"),
        pool_build: sym!(lib, "virStoragePoolBuild"),
        pool_create: sym!(lib, "virStoragePoolCreate"),
        pool_is_active: sym!(lib, "virStoragePoolIsActive"),
        pool_refresh: sym!(lib, "virStoragePoolRefresh"),
        pool_free: sym!(lib, "virStoragePoolFree"),
        vol_lookup_by_name: sym!(lib, "virStorageVolLookupByName"),
        vol_create_xml: sym!(lib, "virStorageVolCreateXML"),
        vol_get_path: sym!(lib, "virStorageVolGetPath"),
        vol_get_xml_desc: sym!(lib, "virStorageVolGetXMLDesc"),
        vol_upload: sym!(lib, "virStorageVolUpload"),
        vol_download: sym!(lib, "virStorageVolDownload"),
        vol_delete: sym!(lib, "virStorageVolDelete"),
        vol_get_name: sym!(lib, "virStorageVolGetName"),
        pool_list_all_volumes: sym!(lib, "virStoragePoolListAllVolumes"),
        vol_free: sym!(lib, "virStorageVolFree"),
        snapshot_create_xml: sym!(lib, "virDomainSnapshotCreateXML"),
        snapshot_lookup_by_name: sym!(lib, "virDomainSnapshotLookupByName"),
        snapshot_get_xml_desc: sym!(lib, "virDomainSnapshotGetXMLDesc"),
        snapshot_revert: sym!(lib, "virDomainRevertToSnapshot"),
        snapshot_delete: sym!(lib, "virDomainSnapshotDelete"),
        snapshot_free: sym!(lib, "virDomainSnapshotFree"),
        domain_list_all_snapshots: sym!(lib, "virDomainListAllSnapshots"),
        domain_open_console: sym!(lib, "virDomainOpenConsole"),
        stream_new: sym!(lib, "virStreamNew"),
        stream_send: sym!(lib, "virStreamSend"),
        stream_recv: sym!(lib, "virStreamRecv"),
        stream_finish: sym!(lib, "virStreamFinish"),
        stream_abort: sym!(lib, "virStreamAbort"),
        stream_free: sym!(lib, "virStreamFree"),
        _lib: lib,
    };
    // SAFETY: a null user pointer and a handler that ignores its arguments.
    unsafe { (api.set_error_func)(std::ptr::null_mut(), Some(quiet)) };
    Ok(api)
}

/// The calling thread's last libvirt error, copied.
fn last_error(api: &Api) -> VirtError {
    // SAFETY: virGetLastError returns null or a pointer to this thread's error, valid until
    // the next libvirt call on this thread; both fields are copied before any such call.
    let e = unsafe { (api.get_last_error)() };
    let out = if e.is_null() {
        VirtError {
            code: 0,
            message: "libvirt reported a failure without a message".into(),
        }
    } else {
        // SAFETY: checked non-null above; `message` is null or a NUL-terminated string.
        let (code, msg) = unsafe { ((*e).code, (*e).message) };
        VirtError {
            code,
            message: if msg.is_null() {
                format!("libvirt error {code}")
            } else {
                // SAFETY: non-null, NUL-terminated, owned by libvirt until the next call.
                unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
            },
        }
    };
    // SAFETY: no arguments.
    unsafe { (api.reset_last_error)() };
    out
}

fn cstring(s: &str) -> Result<CString, VirtError> {
    CString::new(s).map_err(|_| VirtError {
        code: 0,
        message: format!("`{}` contains a NUL byte", s.escape_debug()),
    })
}

/// Copies and frees a string libvirt allocated for the caller.
fn take_string(api: &Api, p: *mut c_char) -> Result<String, VirtError> {
    if p.is_null() {
        return Err(last_error(api));
    }
    // SAFETY: non-null and NUL-terminated; libvirt hands ownership to the caller, who frees it
    // with free() (libvirt's documented contract), after the copy.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    // SAFETY: allocated by libvirt with malloc, freed once.
    unsafe { libc::free(p.cast()) };
    Ok(s)
}

fn check(api: &Api, rc: c_int) -> Result<c_int, VirtError> {
    if rc < 0 {
        Err(last_error(api))
    } else {
        Ok(rc)
    }
}

macro_rules! handle {
    ($name:ident, $free:ident) => {
        pub struct $name {
            api: &'static Api,
            ptr: Ptr,
        }
        // SAFETY: libvirt's objects are reference-counted and thread-safe (its documented
        // threading model: an object may be used from any thread).
        unsafe impl Send for $name {}
        // SAFETY: as above.
        unsafe impl Sync for $name {}
        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: `ptr` is a live object this handle owns one reference to.
                unsafe { (self.api.$free)(self.ptr) };
            }
        }
        impl $name {
            fn wrap(api: &'static Api, ptr: Ptr) -> Result<$name, VirtError> {
                if ptr.is_null() {
                    Err(last_error(api))
                } else {
                    Ok($name { api, ptr })
                }
            }
        }
    };
}

handle!(Connection, connect_close);
handle!(Domain, domain_free);
handle!(Network, network_free);
handle!(StoragePool, pool_free);
handle!(StorageVol, vol_free);
handle!(DomainSnapshot, snapshot_free);

/// `VIR_ERR_NO_DOMAIN_SNAPSHOT`.
pub const ERR_NO_DOMAIN_SNAPSHOT: i32 = 72;
/// `VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE`: restore a snapshot's metadata from its saved XML.
pub const SNAPSHOT_CREATE_REDEFINE: u32 = 1;
/// `VIR_DOMAIN_SNAPSHOT_CREATE_CURRENT`: with REDEFINE, make it the current one.
pub const SNAPSHOT_CREATE_CURRENT: u32 = 2;

/// Domain states (`virDomainState`), as nubo needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DomainState {
    NoState,
    Running,
    Blocked,
    Paused,
    ShuttingDown,
    Shutoff,
    Crashed,
    PmSuspended,
}

/// `VIR_DOMAIN_UNDEFINE_*`: managed save, snapshot metadata, NVRAM, checkpoint metadata.
pub const UNDEFINE_ALL: u32 = 1 | 2 | 4 | 16;
/// `VIR_DOMAIN_XML_INACTIVE`: the persistent definition, not the running one.
pub const XML_INACTIVE: u32 = 2;
/// `VIR_DOMAIN_AFFECT_LIVE`: the running domain.
const AFFECT_LIVE: c_uint = 1;

pub struct DhcpLease {
    pub mac: String,
    pub ip: String,
    pub hostname: Option<String>,
}

impl Connection {
    /// Opens `uri`. Never prompts: a URI that needs credentials fails. Only a parsed
    /// [`ConnectUri`] is opened: libvirt runs programs for URIs outside its allowlist.
    pub fn open(uri: &ConnectUri) -> Result<Connection, VirtError> {
        let api = api().map_err(|message| VirtError { code: 0, message })?;
        let c = cstring(uri.as_str())?;
        // SAFETY: a valid NUL-terminated URI.
        Connection::wrap(api, unsafe { (api.connect_open)(c.as_ptr()) })
    }

    /// Whether the connection is still open: a local check (no call to the daemon), false once
    /// a call found the socket closed (the daemon restarted, the network dropped it).
    pub fn is_alive(&self) -> bool {
        // SAFETY: live connection.
        unsafe { (self.api.connect_is_alive)(self.ptr) == 1 }
    }

    /// libvirt's version as `major.minor.micro`, and the hypervisor's.
    pub fn versions(&self) -> Result<(String, String), VirtError> {
        let mut lib: c_ulong = 0;
        let mut hv: c_ulong = 0;
        // SAFETY: live connection, valid out-pointers.
        check(self.api, unsafe {
            (self.api.connect_get_lib_version)(self.ptr, &mut lib)
        })?;
        // SAFETY: as above.
        check(self.api, unsafe { (self.api.connect_get_version)(self.ptr, &mut hv) })?;
        let v = |n: c_ulong| format!("{}.{}.{}", n / 1_000_000, n / 1000 % 1000, n % 1000);
        Ok((v(lib), v(hv)))
    }

    /// The host's free memory and total memory (bytes) and its CPUs.
    pub fn node_resources(&self) -> Result<(u64, u64, u32), VirtError> {
        // SAFETY: live connection. 0 is libvirt's error return (a host with no free byte
        // reads as an error too, which is no loss for a scheduler).
        let free = unsafe { (self.api.node_get_free_memory)(self.ptr) };
        if free == 0 {
            return Err(last_error(self.api));
        }
        // SAFETY: live connection; the out-struct is plain data libvirt fills.
        let mut info: VirNodeInfo = unsafe { std::mem::zeroed() };
        check(self.api, unsafe { (self.api.node_get_info)(self.ptr, &mut info) })?;
        // c_ulong is 32 bits on some targets.
        #[allow(clippy::useless_conversion)]
        let kib = u64::from(info.memory);
        Ok((free, kib.saturating_mul(1024), info.cpus))
    }

    pub fn uri(&self) -> Result<String, VirtError> {
        // SAFETY: live connection.
        take_string(self.api, unsafe { (self.api.connect_get_uri)(self.ptr) })
    }

    /// The QEMU driver's domain capabilities XML for x86_64 KVM (or the default virt type).
    pub fn domain_capabilities(&self, virttype: Option<&str>) -> Result<String, VirtError> {
        let arch = cstring("x86_64")?;
        let vt = virttype.map(cstring).transpose()?;
        // SAFETY: NULLs are allowed for emulator and machine; strings are NUL-terminated.
        take_string(self.api, unsafe {
            (self.api.connect_get_domain_capabilities)(
                self.ptr,
                std::ptr::null(),
                arch.as_ptr(),
                std::ptr::null(),
                vt.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
                0,
            )
        })
    }

    /// The domain named `name`, `None` when there is none.
    pub fn domain(&self, name: &str) -> Result<Option<Domain>, VirtError> {
        let n = cstring(name)?;
        // SAFETY: live connection, NUL-terminated name.
        none_if(
            Domain::wrap(self.api, unsafe {
                (self.api.domain_lookup_by_name)(self.ptr, n.as_ptr())
            }),
            ERR_NO_DOMAIN,
        )
    }

    pub fn define_domain(&self, xml: &str) -> Result<Domain, VirtError> {
        let x = cstring(xml)?;
        // SAFETY: live connection, NUL-terminated XML.
        Domain::wrap(self.api, unsafe { (self.api.domain_define_xml)(self.ptr, x.as_ptr()) })
    }

    pub fn network(&self, name: &str) -> Result<Option<Network>, VirtError> {
        let n = cstring(name)?;
        // SAFETY: live connection, NUL-terminated name.
        none_if(
            Network::wrap(self.api, unsafe {
                (self.api.network_lookup_by_name)(self.ptr, n.as_ptr())
            }),
            ERR_NO_NETWORK,
        )
    }

    pub fn pool(&self, name: &str) -> Result<Option<StoragePool>, VirtError> {
        let n = cstring(name)?;
        // SAFETY: live connection, NUL-terminated name.
        none_if(
            StoragePool::wrap(self.api, unsafe {
                (self.api.pool_lookup_by_name)(self.ptr, n.as_ptr())
            }),
            ERR_NO_STORAGE_POOL,
        )
    }

    /// Defines a persistent pool from `xml`, builds its directory and starts it.
    pub fn define_pool(&self, xml: &str) -> Result<StoragePool, VirtError> {
        let x = cstring(xml)?;
        // SAFETY: live connection, NUL-terminated XML.
        let p = StoragePool::wrap(self.api, unsafe { (self.api.pool_define_xml)(self.ptr, x.as_ptr(), 0) })?;
        // SAFETY: live pool.
        check(self.api, unsafe { (self.api.pool_build)(p.ptr, 0) })?;
        Ok(p)
    }

    /// `dom`'s serial console as a blocking stream (taking it over from another client).
    pub fn open_console(&self, dom: &Domain) -> Result<Stream, VirtError> {
        self.open_console_with(dom, true)
    }

    /// `dom`'s serial console as a blocking stream; without `force`, libvirt refuses while
    /// another client holds it (a recorder yields to `nubo vm console`, which forces).
    pub fn open_console_with(&self, dom: &Domain, force: bool) -> Result<Stream, VirtError> {
        let st = self.new_stream()?;
        // SAFETY: live domain and stream; a NULL device name means the first console;
        // flags 1 = VIR_DOMAIN_CONSOLE_FORCE.
        check(self.api, unsafe {
            (self.api.domain_open_console)(dom.ptr, std::ptr::null(), st.ptr, u32::from(force))
        })?;
        Ok(st)
    }

    fn new_stream(&self) -> Result<Stream, VirtError> {
        // SAFETY: live connection; flags 0 = a blocking stream.
        let ptr = unsafe { (self.api.stream_new)(self.ptr, 0) };
        if ptr.is_null() {
            return Err(last_error(self.api));
        }
        Ok(Stream {
            api: self.api,
            ptr,
            finished: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Uploads `bytes` into `vol` through libvirt's volume upload stream: no temporary file.
    pub fn upload(&self, vol: &StorageVol, bytes: &[u8]) -> Result<(), VirtError> {
        let mut st = self.new_stream()?;
        // SAFETY: live volume and stream; offset 0, the whole length.
        check(self.api, unsafe {
            (self.api.vol_upload)(vol.ptr, st.ptr, 0, bytes.len() as u64, 0)
        })?;
        for chunk in bytes.chunks(256 * 1024) {
            let mut off = 0;
            while off < chunk.len() {
                // SAFETY: the pointer and length describe a live slice.
                let n = check(self.api, unsafe {
                    (self.api.stream_send)(st.ptr, chunk[off..].as_ptr().cast(), chunk.len() - off)
                })?;
                off += n as usize;
            }
        }
        st.finish()
    }

    /// Uploads exactly `len` bytes read from `src` into `vol` through the volume upload
    /// stream, in chunks (a base image of gigabytes is never held in memory). `src` sees every
    /// chunk before it is sent; an error from it, a short source or a libvirt error aborts the
    /// stream, so libvirt never finishes a partial upload.
    pub fn upload_from(&self, vol: &StorageVol, len: u64, src: &mut dyn std::io::Read) -> Result<(), VirtError> {
        let mut st = self.new_stream()?;
        // SAFETY: live volume and stream; offset 0, the whole length.
        check(self.api, unsafe { (self.api.vol_upload)(vol.ptr, st.ptr, 0, len, 0) })?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut left = len;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = match src.read(&mut buf[..want]) {
                Ok(0) => {
                    st.abort();
                    return Err(VirtError {
                        code: 0,
                        message: format!("the source ended {left} bytes early"),
                    });
                }
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    st.abort();
                    return Err(VirtError {
                        code: 0,
                        message: format!("reading the source: {e}"),
                    });
                }
            };
            let mut off = 0;
            while off < n {
                // SAFETY: the pointer and length describe a live slice.
                let sent = unsafe { (self.api.stream_send)(st.ptr, buf[off..n].as_ptr().cast(), n - off) };
                let sent = match check(self.api, sent) {
                    Ok(s) => s,
                    Err(e) => {
                        st.abort();
                        return Err(e);
                    }
                };
                off += sent as usize;
            }
            left -= n as u64;
        }
        st.finish()
    }

    /// Reads all of `vol` through the volume download stream, handing each chunk to `sink`;
    /// returns the byte count. Stops (aborting the stream) past `max` bytes.
    pub fn download_to(&self, vol: &StorageVol, max: u64, sink: &mut dyn FnMut(&[u8])) -> Result<u64, VirtError> {
        let mut st = self.new_stream()?;
        // SAFETY: live volume and stream; offset 0, length 0 = to the end.
        check(self.api, unsafe { (self.api.vol_download)(vol.ptr, st.ptr, 0, 0, 0) })?;
        let mut buf = vec![0u8; 256 * 1024];
        let mut total = 0u64;
        loop {
            // SAFETY: `buf` is a live, writable buffer of its length.
            let n = match check(self.api, unsafe {
                (self.api.stream_recv)(st.ptr, buf.as_mut_ptr().cast(), buf.len())
            }) {
                Ok(n) => n as usize,
                Err(e) => {
                    st.abort();
                    return Err(e);
                }
            };
            if n == 0 {
                break;
            }
            total += n as u64;
            if total > max {
                st.abort();
                return Err(VirtError {
                    code: ERR_OVER_MAX,
                    message: format!("the volume holds more than {max} bytes"),
                });
            }
            sink(&buf[..n]);
        }
        st.finish()?;
        Ok(total)
    }

    /// Downloads at most `max` bytes of `vol` through the volume download stream.
    pub fn download(&self, vol: &StorageVol, max: usize) -> Result<Vec<u8>, VirtError> {
        let mut st = self.new_stream()?;
        // SAFETY: live volume and stream; offset 0, length `max`.
        check(self.api, unsafe {
            (self.api.vol_download)(vol.ptr, st.ptr, 0, max as u64, 0)
        })?;
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: `buf` is a live, writable buffer of its length.
            let n = check(self.api, unsafe {
                (self.api.stream_recv)(st.ptr, buf.as_mut_ptr().cast(), buf.len())
            })?;
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
            if out.len() > max {
                break;
            }
        }
        st.finish()?;
        Ok(out)
    }
}

fn none_if<T>(r: Result<T, VirtError>, absent: i32) -> Result<Option<T>, VirtError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.code == absent => Ok(None),
        Err(e) => Err(e),
    }
}

/// A libvirt stream (volume upload/download, a domain's console).
pub struct Stream {
    api: &'static Api,
    ptr: Ptr,
    finished: std::sync::atomic::AtomicBool,
}

// SAFETY: libvirt's streams are thread-safe objects; the console reads on one thread while
// another writes, which libvirt's RPC client serialises.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    fn finish(&mut self) -> Result<(), VirtError> {
        self.finished.store(true, std::sync::atomic::Ordering::SeqCst);
        // SAFETY: live stream.
        check(self.api, unsafe { (self.api.stream_finish)(self.ptr) }).map(drop)
    }

    /// Blocks for data; `Ok(0)` at the end of the stream.
    pub fn recv(&self, buf: &mut [u8]) -> Result<usize, VirtError> {
        // SAFETY: `buf` is a live, writable buffer of its length.
        check(self.api, unsafe {
            (self.api.stream_recv)(self.ptr, buf.as_mut_ptr().cast(), buf.len())
        })
        .map(|n| n as usize)
    }

    pub fn send(&self, buf: &[u8]) -> Result<usize, VirtError> {
        // SAFETY: the pointer and length describe a live slice.
        check(self.api, unsafe {
            (self.api.stream_send)(self.ptr, buf.as_ptr().cast(), buf.len())
        })
        .map(|n| n as usize)
    }

    /// Ends the transfer at once (a blocked `recv` returns an error); idempotent.
    pub fn abort(&self) {
        if !self.finished.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: live stream, aborted once.
            unsafe { (self.api.stream_abort)(self.ptr) };
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.finished.load(std::sync::atomic::Ordering::SeqCst) {
            // SAFETY: live stream that was not finished: abort it so libvirt drops the transfer.
            unsafe { (self.api.stream_abort)(self.ptr) };
        }
        // SAFETY: frees the one reference this handle owns.
        unsafe { (self.api.stream_free)(self.ptr) };
    }
}

impl Domain {
    pub fn uuid(&self) -> Result<String, VirtError> {
        let mut buf = [0 as c_char; 37];
        // SAFETY: VIR_UUID_STRING_BUFLEN is 37; libvirt writes a NUL-terminated string into it.
        check(self.api, unsafe {
            (self.api.domain_get_uuid_string)(self.ptr, buf.as_mut_ptr())
        })?;
        // SAFETY: NUL-terminated within the buffer (above).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    pub fn xml(&self, flags: u32) -> Result<String, VirtError> {
        // SAFETY: live domain.
        take_string(self.api, unsafe { (self.api.domain_get_xml_desc)(self.ptr, flags) })
    }

    pub fn start(&self) -> Result<(), VirtError> {
        // SAFETY: live domain.
        check(self.api, unsafe { (self.api.domain_create)(self.ptr) }).map(drop)
    }

    pub fn shutdown(&self) -> Result<(), VirtError> {
        // SAFETY: live domain.
        check(self.api, unsafe { (self.api.domain_shutdown)(self.ptr) }).map(drop)
    }

    pub fn destroy(&self) -> Result<(), VirtError> {
        // SAFETY: live domain.
        check(self.api, unsafe { (self.api.domain_destroy)(self.ptr) }).map(drop)
    }

    /// Stops the guest's vCPUs (`virDomainSuspend`); its memory stays.
    pub fn suspend(&self) -> Result<(), VirtError> {
        // SAFETY: live domain.
        check(self.api, unsafe { (self.api.domain_suspend)(self.ptr) }).map(drop)
    }

    /// Adds the device `xml` describes to the running domain (`virDomainAttachDeviceFlags`,
    /// `VIR_DOMAIN_AFFECT_LIVE`).
    pub fn attach_device_live(&self, xml: &str) -> Result<(), VirtError> {
        let x = cstring(xml)?;
        // SAFETY: live domain, NUL-terminated XML.
        check(self.api, unsafe {
            (self.api.domain_attach_device_flags)(self.ptr, x.as_ptr(), AFFECT_LIVE)
        })
        .map(drop)
    }

    /// Asks the running domain to remove the device `xml` describes
    /// (`virDomainDetachDeviceFlags`, `VIR_DOMAIN_AFFECT_LIVE`); the removal completes when the
    /// guest releases the device, possibly after this returns.
    pub fn detach_device_live(&self, xml: &str) -> Result<(), VirtError> {
        let x = cstring(xml)?;
        // SAFETY: live domain, NUL-terminated XML.
        check(self.api, unsafe {
            (self.api.domain_detach_device_flags)(self.ptr, x.as_ptr(), AFFECT_LIVE)
        })
        .map(drop)
    }

    /// Runs a suspended guest again (`virDomainResume`).
    pub fn resume(&self) -> Result<(), VirtError> {
        // SAFETY: live domain.
        check(self.api, unsafe { (self.api.domain_resume)(self.ptr) }).map(drop)
    }

    pub fn undefine(&self, flags: u32) -> Result<(), VirtError> {
        // SAFETY: live domain.
        check(self.api, unsafe { (self.api.domain_undefine_flags)(self.ptr, flags) }).map(drop)
    }

    pub fn state(&self) -> Result<DomainState, VirtError> {
        let mut s: c_int = 0;
        let mut reason: c_int = 0;
        // SAFETY: live domain, valid out-pointers.
        check(self.api, unsafe {
            (self.api.domain_get_state)(self.ptr, &mut s, &mut reason, 0)
        })?;
        Ok(match s {
            1 => DomainState::Running,
            2 => DomainState::Blocked,
            3 => DomainState::Paused,
            4 => DomainState::ShuttingDown,
            5 => DomainState::Shutoff,
            6 => DomainState::Crashed,
            7 => DomainState::PmSuspended,
            _ => DomainState::NoState,
        })
    }
}

impl Domain {
    /// Takes a snapshot described by `xml` (internal, with memory when running).
    pub fn snapshot_create(&self, xml: &str, flags: u32) -> Result<DomainSnapshot, VirtError> {
        let x = cstring(xml)?;
        // SAFETY: live domain, NUL-terminated XML.
        DomainSnapshot::wrap(self.api, unsafe {
            (self.api.snapshot_create_xml)(self.ptr, x.as_ptr(), flags)
        })
    }

    pub fn snapshot(&self, name: &str) -> Result<Option<DomainSnapshot>, VirtError> {
        let n = cstring(name)?;
        // SAFETY: live domain, NUL-terminated name.
        none_if(
            DomainSnapshot::wrap(self.api, unsafe {
                (self.api.snapshot_lookup_by_name)(self.ptr, n.as_ptr(), 0)
            }),
            ERR_NO_DOMAIN_SNAPSHOT,
        )
    }

    /// Every snapshot's XML.
    pub fn snapshots(&self) -> Result<Vec<String>, VirtError> {
        let mut list: *mut Ptr = std::ptr::null_mut();
        // SAFETY: live domain, valid out-pointer.
        let n = check(self.api, unsafe {
            (self.api.domain_list_all_snapshots)(self.ptr, &mut list, 0)
        })?;
        let mut handles = Vec::new();
        for i in 0..n as usize {
            // SAFETY: libvirt returned an array of `n` snapshot pointers, each owned by the caller.
            handles.push(DomainSnapshot {
                api: self.api,
                ptr: unsafe { *list.add(i) },
            });
        }
        if !list.is_null() {
            // SAFETY: the array was malloc'd by libvirt; its elements are now owned by `handles`.
            unsafe { libc::free(list.cast()) };
        }
        handles.iter().map(DomainSnapshot::xml).collect()
    }
}

impl DomainSnapshot {
    pub fn xml(&self) -> Result<String, VirtError> {
        // SAFETY: live snapshot.
        take_string(self.api, unsafe { (self.api.snapshot_get_xml_desc)(self.ptr, 0) })
    }

    pub fn revert(&self, flags: u32) -> Result<(), VirtError> {
        // SAFETY: live snapshot.
        check(self.api, unsafe { (self.api.snapshot_revert)(self.ptr, flags) }).map(drop)
    }

    pub fn delete(&self) -> Result<(), VirtError> {
        // SAFETY: live snapshot; flags 0 = this snapshot only (children are re-parented).
        check(self.api, unsafe { (self.api.snapshot_delete)(self.ptr, 0) }).map(drop)
    }
}

impl Network {
    pub fn is_active(&self) -> Result<bool, VirtError> {
        // SAFETY: live network.
        check(self.api, unsafe { (self.api.network_is_active)(self.ptr) }).map(|r| r == 1)
    }

    /// The network's DHCP leases for `mac`.
    pub fn leases(&self, mac: &str) -> Result<Vec<DhcpLease>, VirtError> {
        let m = cstring(mac)?;
        let mut list: *mut *mut VirDhcpLease = std::ptr::null_mut();
        // SAFETY: live network, NUL-terminated MAC, valid out-pointer.
        let n = check(self.api, unsafe {
            (self.api.network_get_dhcp_leases)(self.ptr, m.as_ptr(), &mut list, 0)
        })?;
        let mut out = Vec::new();
        for i in 0..n as usize {
            // SAFETY: libvirt returned an array of `n` lease pointers.
            let l = unsafe { *list.add(i) };
            let s = |p: *mut c_char| {
                // SAFETY: each field is null or a NUL-terminated string owned by the lease.
                (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            };
            // SAFETY: `l` is a valid lease until freed below.
            let lease = unsafe { &*l };
            out.push(DhcpLease {
                mac: s(lease.mac).unwrap_or_default(),
                ip: s(lease.ipaddr).unwrap_or_default(),
                hostname: s(lease.hostname),
            });
            let _ = (
                lease.iface,
                lease.expirytime,
                lease.kind,
                lease.iaid,
                lease.prefix,
                lease.clientid,
            );
            // SAFETY: each lease is freed once, after its fields were copied.
            unsafe { (self.api.network_dhcp_lease_free)(l) };
        }
        if !list.is_null() {
            // SAFETY: the array itself was malloc'd by libvirt.
            unsafe { libc::free(list.cast()) };
        }
        Ok(out)
    }
}

impl StoragePool {
    pub fn is_active(&self) -> Result<bool, VirtError> {
        // SAFETY: live pool.
        check(self.api, unsafe { (self.api.pool_is_active)(self.ptr) }).map(|r| r == 1)
    }

    pub fn start(&self) -> Result<(), VirtError> {
        // SAFETY: live pool.
        check(self.api, unsafe { (self.api.pool_create)(self.ptr, 0) }).map(drop)
    }

    pub fn refresh(&self) -> Result<(), VirtError> {
        // SAFETY: live pool.
        check(self.api, unsafe { (self.api.pool_refresh)(self.ptr, 0) }).map(drop)
    }

    pub fn volume(&self, name: &str) -> Result<Option<StorageVol>, VirtError> {
        let n = cstring(name)?;
        // SAFETY: live pool, NUL-terminated name.
        none_if(
            StorageVol::wrap(self.api, unsafe { (self.api.vol_lookup_by_name)(self.ptr, n.as_ptr()) }),
            ERR_NO_STORAGE_VOL,
        )
    }

    /// Every volume of the pool.
    pub fn volumes(&self) -> Result<Vec<StorageVol>, VirtError> {
        let mut list: *mut Ptr = std::ptr::null_mut();
        // SAFETY: live pool, valid out-pointer; flags 0.
        let n = check(self.api, unsafe {
            (self.api.pool_list_all_volumes)(self.ptr, &mut list, 0)
        })?;
        let mut out = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            // SAFETY: libvirt returned `n` volume pointers in a malloc'd array.
            let v = unsafe { *list.add(i) };
            if !v.is_null() {
                out.push(StorageVol::wrap(self.api, v)?);
            }
        }
        if !list.is_null() {
            // SAFETY: the array itself was malloc'd by libvirt; its entries are now owned above.
            unsafe { libc::free(list.cast()) };
        }
        Ok(out)
    }

    pub fn create_volume(&self, xml: &str) -> Result<StorageVol, VirtError> {
        let x = cstring(xml)?;
        // SAFETY: live pool, NUL-terminated XML.
        StorageVol::wrap(self.api, unsafe { (self.api.vol_create_xml)(self.ptr, x.as_ptr(), 0) })
    }
}

impl StorageVol {
    pub fn path(&self) -> Result<String, VirtError> {
        // SAFETY: live volume.
        take_string(self.api, unsafe { (self.api.vol_get_path)(self.ptr) })
    }

    pub fn name(&self) -> Result<String, VirtError> {
        // SAFETY: live volume; the string is owned by the volume object, copied at once.
        let p = unsafe { (self.api.vol_get_name)(self.ptr) };
        if p.is_null() {
            return Err(last_error(self.api));
        }
        // SAFETY: non-null, NUL-terminated, valid while the volume lives.
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }

    /// The volume's XML as libvirt describes it (format, capacity, backing store).
    pub fn xml(&self) -> Result<String, VirtError> {
        // SAFETY: live volume; flags 0 (none are defined).
        take_string(self.api, unsafe { (self.api.vol_get_xml_desc)(self.ptr, 0) })
    }

    pub fn delete(&self) -> Result<(), VirtError> {
        // SAFETY: live volume; flags 0 = a plain delete.
        check(self.api, unsafe { (self.api.vol_delete)(self.ptr, 0) }).map(drop)
    }
}
