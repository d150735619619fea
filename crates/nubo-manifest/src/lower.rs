//! Documents -> [`VmSpec`]: the same spec `vm create`'s flags produce, so the two paths cannot
//! drift. Relative paths are resolved against the manifest's own directory (`~/` against the
//! home directory); the files a manifest names for their content (user-data, network-config,
//! vendor-data, `@` SSH key files) are read bounded through [`Files`]. Every problem is collected
//! and reported at its key's position; then [`VmSpec::validate`] runs and its field paths are
//! mapped back to the keys the user wrote.

use std::path::{Path, PathBuf};
use std::time::Duration;

use nubo_core::{ByteSize, VmName};
use nubo_spec::{
    CloudInitSpec, DiskSource, Field, FieldError, Firmware, KernelBoot, Machine, Network, Payload, SpecErrors, VmSpec,
};

use crate::error::{ManifestError, ManifestErrors};
use crate::fields::{manifest_paths, manifest_suffix};
use crate::parse::Document;
use crate::restrict::LoadRestrictor;
use crate::types::{CloudInitDoc, Kind, KindSpec, MachineDoc, MicrovmDoc, VirtualMachineSpec, WorkloadSpec};

/// The largest `@file` of SSH keys read: an authorized_keys file with many keys (as `vm create`).
pub const MAX_KEY_FILE: u64 = 1 << 20;

/// Backends a microvm Workload may name: those with a microVM machine.
pub const MICROVM_BACKENDS: &[&str] = &["qemu", "cloud-hypervisor", "ch"];

/// Reads the files a manifest names for their content. [`HostFiles`] reads the host's,
/// bounded and regular files only.
pub trait Files {
    /// The whole file, at most `max` bytes; the error says why not.
    fn read(&self, path: &Path, what: &str, max: u64) -> Result<Vec<u8>, String>;
    /// The directory `~/` stands for, if known.
    fn home(&self) -> Option<PathBuf>;
    /// `path` (absolute), as it is to be opened, when a manifest whose directory is `root` may
    /// name it ([`crate::restrict`]); the default judges the text alone and touches no file.
    fn confine(&self, root: &Path, path: &Path) -> Result<PathBuf, String> {
        crate::restrict::confine_lexical(root, path)
    }
}

/// The host's files through `nubo_core::file::read_bounded` (no FIFO, device or directory),
/// confined to the manifest's directory tree unless `restrictor` is [`LoadRestrictor::None`].
#[derive(Debug, Clone)]
pub struct HostFiles {
    pub home: Option<PathBuf>,
    pub restrictor: LoadRestrictor,
}

impl Files for HostFiles {
    fn read(&self, path: &Path, what: &str, max: u64) -> Result<Vec<u8>, String> {
        nubo_core::file::read_bounded(path, what, max).map_err(|e| e.to_string())
    }

    fn home(&self) -> Option<PathBuf> {
        self.home.clone()
    }

    fn confine(&self, root: &Path, path: &Path) -> Result<PathBuf, String> {
        match self.restrictor {
            LoadRestrictor::RootOnly => crate::restrict::confine(root, path),
            LoadRestrictor::None => Ok(path.to_path_buf()),
        }
    }
}

/// A document lowered to the spec of the VM it describes.
#[derive(Debug, Clone)]
pub struct Lowered {
    pub doc: Document,
    pub spec: VmSpec,
    /// For each of the spec's SSH keys, the manifest entry (and file) it came from.
    key_origin: Vec<KeyOrigin>,
    /// What the lowering decided that the user did not write (a Workload's backend).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone)]
struct KeyOrigin {
    entry: usize,
    file: Option<(PathBuf, usize)>,
}

impl Lowered {
    pub fn kind(&self) -> Kind {
        self.doc.raw.kind
    }

    /// A spec error at the key that sets its field.
    pub fn field_error(&self, e: &FieldError) -> ManifestError {
        let suffix = manifest_suffix(e.field, e.path.strip_prefix(e.field.path()).unwrap_or(""));
        let paths = manifest_paths(self.kind(), e.field);
        let base = paths.iter().find(|p| self.doc.index.has(p)).unwrap_or(&paths[0]);
        let mut message = e.message.clone();
        let mut suffix = suffix.to_owned();
        if e.field == Field::CloudInitSshKeys {
            let i = suffix
                .strip_prefix('[')
                .and_then(|s| s.strip_suffix(']'))
                .and_then(|s| s.parse::<usize>().ok());
            if let Some(origin) = i.and_then(|i| self.key_origin.get(i)) {
                suffix = format!("[{}]", origin.entry);
                if let Some((file, line)) = &origin.file {
                    message = format!("the key on line {line} of {}: {message}", file.display());
                }
            }
        }
        self.doc.error(&format!("{base}{suffix}"), message)
    }

    /// Every spec error, each at its key.
    pub fn spec_errors(&self, e: &SpecErrors) -> ManifestErrors {
        let errors = e.errors().iter().map(|fe| self.field_error(fe)).collect();
        match ManifestErrors::check(errors) {
            Err(e) => e,
            Ok(()) => ManifestErrors::one(self.error("the spec is invalid")),
        }
    }

    /// An error about the document as a whole, at its `metadata.name`.
    pub fn error(&self, message: impl Into<String>) -> ManifestError {
        let mut e = self.doc.error("metadata.name", message);
        e.path = None;
        e
    }
}

/// The seed codec's content checks of cloud-init payloads (the engine passes the same).
const SEED_CHECKS: nubo_spec::PayloadChecks = nubo_spec::PayloadChecks {
    user_data: |b| nubo_seed::validate_user_data(b).map_err(|e| e.to_string()),
    network_config: |b| nubo_seed::validate_network_config(b).map_err(|e| e.to_string()),
    vendor_data: |b| nubo_seed::validate_vendor_data(b).map_err(|e| e.to_string()),
};

/// Lowers `doc` to a [`VmSpec`] and validates it; every problem is returned, each at its key.
pub fn lower(doc: Document, files: &dyn Files) -> Result<Lowered, ManifestErrors> {
    let mut cx = Cx {
        doc: &doc,
        files,
        errors: Vec::new(),
        key_origin: Vec::new(),
    };
    let name = VmName::parse(doc.name()).map_err(|e| cx.err("metadata.name", e.to_string()));
    let (built, notes) = match &doc.raw.spec {
        KindSpec::VirtualMachine(s) => (cx.virtual_machine(s), Vec::new()),
        KindSpec::Workload(w) => cx.workload(w),
    };
    let (errors, key_origin) = (cx.errors, cx.key_origin);
    ManifestErrors::check(errors)?;
    let (Ok(name), Some(built)) = (name, built) else {
        return Err(ManifestErrors::one(
            doc.error("metadata.name", "the document could not be read"),
        ));
    };
    let mut spec = built;
    spec.name = name;
    let lowered = Lowered {
        doc,
        spec,
        key_origin,
        notes,
    };
    lowered
        .spec
        .validate_with(&SEED_CHECKS)
        .map_err(|e| lowered.spec_errors(&e))?;
    Ok(lowered)
}

struct Cx<'a> {
    doc: &'a Document,
    files: &'a dyn Files,
    errors: Vec<ManifestError>,
    key_origin: Vec<KeyOrigin>,
}

/// The source fields both kinds share.
struct SourceDoc<'a> {
    image: &'a Option<String>,
    disk: &'a Option<String>,
    url: &'a Option<String>,
    checksum: &'a Option<String>,
    insecure_no_checksum: Option<bool>,
    allow_http: Option<bool>,
}

impl Cx<'_> {
    fn err(&mut self, path: &str, message: impl Into<String>) {
        let e = self.doc.error(path, message);
        self.errors.push(e);
    }

    fn virtual_machine(&mut self, s: &VirtualMachineSpec) -> Option<VmSpec> {
        let source = self.source(
            "spec",
            &SourceDoc {
                image: &s.image,
                disk: &s.disk,
                url: &s.url,
                checksum: &s.checksum,
                insecure_no_checksum: s.insecure_no_checksum,
                allow_http: s.allow_http,
            },
        );
        let r = s.resources.clone().unwrap_or_default();
        let memory = self.size("spec.resources.memory", r.memory.as_deref());
        let disk_size = self.size("spec.resources.diskSize", r.disk_size.as_deref());
        let firmware = match s.firmware.as_deref() {
            None | Some("auto") => Firmware::Auto,
            Some("bios") => Firmware::Bios,
            Some("efi") => Firmware::Efi,
            Some(p) => Firmware::Path(self.path("spec.firmware", p)),
        };
        let boot = s.boot.as_ref().map(|b| KernelBoot {
            kernel: self.path("spec.boot.kernel", &b.kernel),
            initrd: b.initrd.as_deref().map(|i| self.path("spec.boot.initrd", i)),
            cmdline: b.cmdline.clone(),
        });
        let cloud_init = self.cloud_init("spec.cloudInit", s.cloud_init.as_ref());
        let boot_timeout = self.duration("spec.bootTimeout", s.boot_timeout.as_deref());
        let mut spec = VmSpec::new(placeholder(), source?);
        spec.resources.vcpus = r.vcpus;
        spec.resources.memory = memory;
        spec.resources.disk_size = disk_size;
        spec.firmware = firmware;
        spec.boot = boot;
        spec.machine = match s.machine {
            None | Some(MachineDoc::Default) => Machine::Default,
            Some(MachineDoc::Microvm) => Machine::Microvm,
        };
        spec.overrides = s.overrides.clone().unwrap_or_default();
        spec.network = network(s.network.as_deref());
        spec.ports = self.ports("spec.ports", s.ports.as_deref());
        spec.cloud_init = cloud_init;
        spec.backend = s.backend.clone();
        spec.ssh_user = s.ssh_user.clone();
        spec.boot_timeout = boot_timeout;
        spec.mounts = self.mounts(s.mounts.as_deref().unwrap_or_default());
        Some(spec)
    }

    /// `mounts:` entries, `HOST_DIR[:GUEST_DIR][:ro]` each, host directories made absolute
    /// against the manifest's directory.
    fn mounts(&mut self, list: &[String]) -> Vec<nubo_spec::MountSpec> {
        let mut out = Vec::new();
        for (i, text) in list.iter().enumerate() {
            let at = format!("spec.mounts[{i}]");
            match nubo_spec::MountSpec::parse(text) {
                Ok(mut m) => {
                    let host = m.host_path.to_string_lossy().into_owned();
                    m.host_path = self.path(&at, &host);
                    out.push(m);
                }
                Err(why) => self.err(&at, why),
            }
        }
        out
    }

    fn workload(&mut self, w: &WorkloadSpec) -> (Option<VmSpec>, Vec<String>) {
        let mut notes = Vec::new();
        let backend = match w.backend.as_deref() {
            // Left to nubo's selection precedence (the image's hypervisor, NUBO_VM_BACKEND,
            // `vm default-backend`, then the heuristic: cloud-hypervisor for a microVM where it
            // is installed and can run the spec, else QEMU's microvm machine).
            None => {
                notes.push(
                    "backend: chosen by nubo's selection precedence (a microvm runs on cloud-hypervisor where it is installed, else on QEMU's microvm machine); name `backend:` to fix it"
                        .to_owned(),
                );
                None
            }
            Some(b) if MICROVM_BACKENDS.contains(&b) => Some(b.to_owned()),
            Some("libvirt") => {
                self.err(
                    "spec.backend",
                    "the libvirt backend cannot run a microvm workload (nubo's libvirt backend has no microVM machine): use `qemu` (QEMU's microvm machine) or `cloud-hypervisor`, or leave backend out for nubo to choose",
                );
                None
            }
            Some(other) => {
                self.err(
                    "spec.backend",
                    format!(
                        "`{}` cannot run a microvm workload{}: use one of qemu, cloud-hypervisor",
                        nubo_core::file::escape_control(other),
                        crate::suggest::did_you_mean(other, MICROVM_BACKENDS)
                    ),
                );
                None
            }
        };
        let Some(m) = &w.microvm else {
            self.err(
                "spec",
                "a microvm workload needs `microvm:` with its disk (image, disk or url) and resources",
            );
            return (None, notes);
        };
        (self.microvm(m, backend), notes)
    }

    fn microvm(&mut self, m: &MicrovmDoc, backend: Option<String>) -> Option<VmSpec> {
        const AT: &str = "spec.microvm";
        let source = self.source(
            AT,
            &SourceDoc {
                image: &m.image,
                disk: &m.disk,
                url: &m.url,
                checksum: &m.checksum,
                insecure_no_checksum: m.insecure_no_checksum,
                allow_http: m.allow_http,
            },
        );
        let memory = self.size("spec.microvm.memory", m.memory.as_deref());
        let disk_size = self.size("spec.microvm.diskSize", m.disk_size.as_deref());
        let boot = match (&m.kernel, &m.initrd, &m.cmdline) {
            (Some(k), initrd, cmdline) => Some(KernelBoot {
                kernel: self.path("spec.microvm.kernel", k),
                initrd: initrd.as_deref().map(|i| self.path("spec.microvm.initrd", i)),
                cmdline: cmdline.clone(),
            }),
            (None, None, None) => None,
            (None, i, _) => {
                let at = if i.is_some() {
                    "spec.microvm.initrd"
                } else {
                    "spec.microvm.cmdline"
                };
                self.err(at, "needs `kernel`: without one the image's own recorded kernel boots with its own initrd and command line");
                None
            }
        };
        let cloud_init = self.cloud_init("spec.microvm.cloudInit", m.cloud_init.as_ref());
        let boot_timeout = self.duration("spec.microvm.bootTimeout", m.boot_timeout.as_deref());
        let mut spec = VmSpec::new(placeholder(), source?);
        spec.resources.vcpus = m.vcpus;
        spec.resources.memory = memory;
        spec.resources.disk_size = disk_size;
        spec.boot = boot;
        spec.machine = Machine::Microvm;
        spec.overrides = m.overrides.clone().unwrap_or_default();
        spec.network = network(m.network.as_deref());
        spec.cloud_init = cloud_init;
        spec.backend = backend;
        spec.ssh_user = m.ssh_user.clone();
        spec.boot_timeout = boot_timeout;
        Some(spec)
    }

    fn source(&mut self, at: &str, s: &SourceDoc<'_>) -> Option<DiskSource> {
        let url_only = [
            ("checksum", s.checksum.is_some()),
            ("insecureNoChecksum", s.insecure_no_checksum.is_some()),
            ("allowHttp", s.allow_http.is_some()),
        ];
        if s.url.is_none() {
            for (key, set) in url_only {
                if set {
                    self.err(
                        &format!("{at}.{key}"),
                        "applies only to `url`: remove it, or give the image as `url`",
                    );
                }
            }
        }
        match (s.image, s.disk, s.url) {
            (Some(r), None, None) => Some(DiskSource::Image { reference: r.clone() }),
            (None, Some(p), None) => Some(DiskSource::Disk {
                path: self.path(&format!("{at}.disk"), p),
            }),
            (None, None, Some(url)) => Some(DiskSource::Url {
                url: url.clone(),
                checksum: s.checksum.clone(),
                insecure_no_checksum: s.insecure_no_checksum.unwrap_or(false),
                allow_http: s.allow_http.unwrap_or(false),
            }),
            (None, None, None) => {
                self.err(
                    at,
                    "names no disk: give `image: debian:12` (see `nubo image ls`), `disk: ./path.qcow2` or `url:` with `checksum:`",
                );
                None
            }
            _ => {
                let second = if s.image.is_some() && s.disk.is_some() {
                    "disk"
                } else {
                    "url"
                };
                self.err(
                    &format!("{at}.{second}"),
                    "give one of image, disk and url, not several",
                );
                None
            }
        }
    }

    /// A path as the manifest writes it, made absolute against the manifest's directory, and
    /// refused (an error at `at`) when the load restriction forbids it.
    fn path(&mut self, at: &str, text: &str) -> PathBuf {
        self.resolve(at, text).0
    }

    /// The path as written, made absolute, and the path to open (after symlinks, when the load
    /// restriction resolved them), or `None` when it is refused (the error is recorded).
    fn resolve(&mut self, at: &str, text: &str) -> (PathBuf, Option<PathBuf>) {
        let joined = if text == "~" || text.starts_with("~/") {
            match self.files.home() {
                Some(h) => h.join(text.trim_start_matches('~').trim_start_matches('/')),
                None => {
                    self.err(
                        at,
                        "uses `~`, but no home directory is known (HOME is unset): write the path in full",
                    );
                    return (PathBuf::from(text), None);
                }
            }
        } else {
            self.doc.dir.join(text)
        };
        // Only `.` components are dropped (symlinks are not resolved); an empty text stays empty
        // for the spec's own check to name.
        if text.is_empty() {
            return (PathBuf::new(), Some(PathBuf::new()));
        }
        let abs = std::path::absolute(&joined).unwrap_or(joined);
        match self.files.confine(&self.doc.dir, &abs) {
            Ok(open) => (abs, Some(open)),
            Err(e) => {
                self.err(at, e);
                (abs, None)
            }
        }
    }

    /// Each forward parsed strictly, as `vm create --publish` parses it; a bad one is reported
    /// at its entry.
    fn ports(&mut self, at: &str, entries: Option<&[String]>) -> Vec<nubo_core::PortForward> {
        let mut out = Vec::new();
        for (i, text) in entries.unwrap_or_default().iter().enumerate() {
            match nubo_core::PortForward::parse(text) {
                Ok(p) => out.push(p),
                Err(e) => self.err(&format!("{at}[{i}]"), e.to_string()),
            }
        }
        out
    }

    fn size(&mut self, at: &str, text: Option<&str>) -> Option<ByteSize> {
        let t = text?.trim();
        let shown = nubo_core::file::escape_control(t);
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
            self.err(at, format!("`{shown}` has no unit: write e.g. `{shown}M` or `2G`"));
            return None;
        }
        match ByteSize::parse(t) {
            Ok(s) => Some(s),
            Err(_) => {
                self.err(at, format!("\"{shown}\" is not a size (use 512M, 2G, ...)"));
                None
            }
        }
    }

    fn duration(&mut self, at: &str, text: Option<&str>) -> Option<Duration> {
        let t = text?;
        match humantime::parse_duration(t) {
            Ok(d) => Some(d),
            Err(_) => {
                self.err(
                    at,
                    format!(
                        "`{}` is not a duration: write e.g. `90s` or `5m`",
                        nubo_core::file::escape_control(t)
                    ),
                );
                None
            }
        }
    }

    fn cloud_init(&mut self, at: &str, c: Option<&CloudInitDoc>) -> CloudInitSpec {
        let Some(c) = c else {
            return CloudInitSpec::default();
        };
        let mut ssh_keys = Vec::new();
        for (i, entry) in c.ssh_keys.iter().flatten().enumerate() {
            let entry_at = format!("{at}.sshKeys[{i}]");
            match entry.strip_prefix('@') {
                None => {
                    ssh_keys.push(entry.trim().to_owned());
                    self.key_origin.push(KeyOrigin { entry: i, file: None });
                }
                Some(p) => {
                    let (path, open) = self.resolve(&entry_at, p);
                    let Some(open) = open else { continue };
                    let text = match self.files.read(&open, "SSH public key file", MAX_KEY_FILE) {
                        Ok(bytes) => String::from_utf8(bytes)
                            .map_err(|_| format!("{} is not text: give the `.pub` file", path.display())),
                        Err(e) => Err(e),
                    };
                    match text {
                        Err(e) => self.err(&entry_at, e),
                        Ok(text) => {
                            let before = ssh_keys.len();
                            for (n, line) in text.lines().enumerate() {
                                let line = line.trim();
                                if line.is_empty() || line.starts_with('#') {
                                    continue;
                                }
                                ssh_keys.push(line.to_owned());
                                self.key_origin.push(KeyOrigin {
                                    entry: i,
                                    file: Some((path.clone(), n + 1)),
                                });
                            }
                            if ssh_keys.len() == before {
                                self.err(
                                    &entry_at,
                                    format!("{} holds no key: give the `.pub` file", path.display()),
                                );
                            }
                        }
                    }
                }
            }
        }
        CloudInitSpec {
            hostname: c.hostname.clone(),
            ssh_keys,
            user_data: self.payload(at, "userData", &c.user_data, &c.user_data_file, "user-data"),
            network_config: self.payload(
                at,
                "networkConfig",
                &c.network_config,
                &c.network_config_file,
                "network-config",
            ),
            vendor_data: self.payload(at, "vendorData", &c.vendor_data, &c.vendor_data_file, "vendor-data"),
            seed: c.seed.as_deref().map(|s| self.path(&format!("{at}.seed"), s)),
        }
    }

    fn payload(
        &mut self,
        at: &str,
        key: &str,
        inline: &Option<String>,
        file: &Option<String>,
        what: &str,
    ) -> Option<Payload> {
        match (inline, file) {
            (Some(text), None) => Some(Payload::new(text.as_bytes().to_vec())),
            (None, Some(f)) => {
                let file_at = format!("{at}.{key}File");
                let (_, open) = self.resolve(&file_at, f);
                match self.files.read(&open?, what, nubo_spec::limits::MAX_PAYLOAD) {
                    Ok(bytes) => Some(Payload::new(bytes)),
                    Err(e) => {
                        self.err(&file_at, e);
                        None
                    }
                }
            }
            (Some(_), Some(_)) => {
                self.err(
                    &format!("{at}.{key}File"),
                    format!("give `{key}` or `{key}File`, not both"),
                );
                None
            }
            (None, None) => None,
        }
    }
}

fn network(text: Option<&str>) -> Network {
    match text {
        None | Some("forward") => Network::Forward,
        Some("restricted") => Network::Restricted,
        Some("none") => Network::None,
        Some(name) => Network::Named(name.to_owned()),
    }
}

/// Replaced by the document's name once every field is read.
fn placeholder() -> VmName {
    VmName::parse("x").expect("`x` is a DNS label")
}
