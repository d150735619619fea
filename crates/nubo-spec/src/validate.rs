//! [`VmSpec::validate`]: pure checks of every field, collecting every problem at its field path.
//! Nothing here looks at the host: files' existence, the image's contents and the backend's
//! capabilities are the engine's plan.

use std::path::Path;
use std::time::Duration;

use nubo_core::size::MIB;
use nubo_core::ByteSize;

use crate::error::{FieldError, SpecErrors};
use crate::field::Field;
use crate::limits::*;
use crate::payload::{is_hex, Payload};
use crate::spec::{CloudInitSpec, DiskSource, Firmware, KernelBoot, Machine, Network, Resources, VmSpec};
use crate::uri::{ConnectUri, Origin};

impl VmSpec {
    /// Checks every field and returns every problem found, in field order. Pure: the same spec
    /// always gives the same answer. The payloads' sizes are checked; their content (cloud-init
    /// YAML) is checked by [`validate_with`](Self::validate_with), which the engine and the
    /// manifest loader call with the seed codec's checks.
    pub fn validate(&self) -> Result<(), SpecErrors> {
        self.validate_with(&PayloadChecks::NONE)
    }

    /// [`validate`](Self::validate), with each cloud-init payload's content checked by `payloads`
    /// (the same bounded YAML checks `seed build` makes, so an alias bomb is refused on every
    /// path that puts YAML into a seed).
    pub fn validate_with(&self, payloads: &PayloadChecks) -> Result<(), SpecErrors> {
        let mut e = Vec::new();
        source(&self.source, &mut e);
        resources(&self.resources, &mut e);
        boot(&self.firmware, self.boot.as_ref(), self.machine, &mut e);
        overrides(self, &mut e);
        if let Network::Named(name) = &self.network {
            if let Err(why) = word(
                name,
                MAX_NETWORK_NAME,
                |c| c.is_ascii_alphanumeric(),
                |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'),
            ) {
                e.push(FieldError::at(
                    Field::Network,
                    ".named",
                    format!(
                        "network name {why}: use letters, digits, `_`, `.` and `-`, starting with a letter or digit"
                    ),
                ));
            }
        }
        crate::ports::check(&self.ports, &self.network, &mut e);
        cloud_init(&self.cloud_init, payloads, &mut e);
        if let Some(b) = &self.backend {
            if let Err(why) = backend_id(b) {
                e.push(FieldError::new(Field::Backend, why));
            }
        }
        if let Some(u) = &self.ssh_user {
            if let Err(err) = check_ssh_user(u) {
                e.push(err);
            }
        }
        if let Some(t) = self.boot_timeout {
            if let Err(err) = check_boot_timeout(t) {
                e.push(err);
            }
        }
        crate::mount::check(&self.mounts, &mut e);
        SpecErrors::check(e)
    }
}

/// A check of one payload's content: `Err` says why it is refused (`is not a format cloud-init
/// runs: ...`).
pub type PayloadCheck = fn(&[u8]) -> Result<(), String>;

/// The content checks of the cloud-init payloads. They live with the seed codec (`nubo-seed`'s
/// bounded YAML checker), which this crate does not depend on: whoever validates a spec before
/// making a VM (the engine, the manifest loader) passes them in.
#[derive(Debug, Clone, Copy)]
pub struct PayloadChecks {
    pub user_data: PayloadCheck,
    pub network_config: PayloadCheck,
    pub vendor_data: PayloadCheck,
}

impl PayloadChecks {
    /// Sizes only: the content is checked later, when the seed is built.
    pub const NONE: PayloadChecks = PayloadChecks {
        user_data: accept,
        network_config: accept,
        vendor_data: accept,
    };
}

fn accept(_: &[u8]) -> Result<(), String> {
    Ok(())
}

/// Checks a user name for `ssh` (also `vm ssh --user`): POSIX portable,
/// `[A-Za-z_][A-Za-z0-9_.-]{0,31}`. It can never start with `-`, so it can never be read as an
/// option (`-oProxyCommand=...` once reached ssh's argv this way).
pub fn check_ssh_user(user: &str) -> Result<(), FieldError> {
    word(user, MAX_SSH_USER, |c| c.is_ascii_alphabetic() || c == '_', |c| {
        c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')
    })
    .map_err(|why| {
        FieldError::new(
            Field::SshUser,
            format!("user name {why}: a POSIX user name starts with a letter or `_` and has only letters, digits, `_`, `.` and `-`"),
        )
    })
}

/// Checks a boot timeout against [`MIN_BOOT_TIMEOUT`]..=[`MAX_BOOT_TIMEOUT`].
pub fn check_boot_timeout(t: Duration) -> Result<(), FieldError> {
    if (MIN_BOOT_TIMEOUT..=MAX_BOOT_TIMEOUT).contains(&t) {
        return Ok(());
    }
    Err(FieldError::new(
        Field::BootTimeout,
        format!(
            "is {}, outside {} to {}: give e.g. `5m`",
            humantime::format_duration(t),
            humantime::format_duration(MIN_BOOT_TIMEOUT),
            humantime::format_duration(MAX_BOOT_TIMEOUT)
        ),
    ))
}

/// Checks a backend id's syntax, `[a-z][a-z0-9-]{0,31}`; whether it exists is the registry's answer.
fn backend_id(b: &str) -> Result<(), String> {
    word(
        b,
        MAX_BACKEND,
        |c| c.is_ascii_lowercase(),
        |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-',
    )
    .map_err(|why| format!("backend id {why}: use a backend such as `qemu` or `libvirt` (`nubo doctor` lists them)"))
}

/// `s` is non-empty, at most `max` bytes, starts with a `first` character and goes on with `rest`.
fn word(s: &str, max: usize, first: impl Fn(char) -> bool, rest: impl Fn(char) -> bool) -> Result<(), String> {
    let mut chars = s.chars();
    match chars.next() {
        None => Err("is empty".to_owned()),
        Some(_) if s.len() > max => Err(format!("is {} bytes long, over the limit of {max}", s.len())),
        Some(c) if !first(c) => Err(format!("`{}` starts with `{}`", shown(s), c.escape_debug())),
        Some(_) => match chars.find(|c| !rest(*c)) {
            Some(c) => Err(format!("`{}` contains `{}`", shown(s), c.escape_debug())),
            None => Ok(()),
        },
    }
}

/// At most 40 characters of untrusted text, control characters escaped, for quoting in a message.
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(40).flat_map(char::escape_debug).collect();
    if s.chars().nth(40).is_some() {
        out.push('…');
    }
    out
}

fn source(s: &DiskSource, e: &mut Vec<FieldError>) {
    match s {
        DiskSource::Image { reference } => {
            let why = if reference.is_empty() {
                Some("is empty".to_owned())
            } else if reference.len() > MAX_IMAGE_REFERENCE {
                Some(format!(
                    "is {} bytes long, over the limit of {MAX_IMAGE_REFERENCE}",
                    reference.len()
                ))
            } else {
                reference
                    .chars()
                    .find(|c| c.is_whitespace() || c.is_control())
                    .map(|c| format!("`{}` contains `{}`", shown(reference), c.escape_debug()))
            };
            if let Some(why) = why {
                e.push(FieldError::new(
                    Field::SourceImageReference,
                    format!("image reference {why}: write e.g. `debian:12` or `registry.example/repo:tag`"),
                ));
            }
        }
        DiskSource::Disk { path } => check_path(Field::SourceDiskPath, "", path, e),
        DiskSource::Url {
            url,
            checksum,
            insecure_no_checksum,
            allow_http,
        } => {
            if let Some(why) = url_problem(url, *allow_http) {
                e.push(FieldError::new(Field::SourceUrl, why));
            }
            if let Some(c) = checksum {
                if !checksum_ok(c) {
                    e.push(FieldError::new(
                        Field::SourceUrlChecksum,
                        format!("`{}` is not `sha256:<64 hex digits>` or `sha512:<128 hex digits>`: copy it from the image's published checksums", shown(c)),
                    ));
                }
                if *insecure_no_checksum {
                    e.push(FieldError::new(
                        Field::SourceUrlInsecureNoChecksum,
                        "contradicts the checksum given: drop one of them",
                    ));
                }
            }
        }
    }
}

fn url_problem(url: &str, allow_http: bool) -> Option<String> {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    let rest = if lower.starts_with("https://") {
        &url[8..]
    } else if lower.starts_with("http://") {
        if !allow_http {
            return Some(format!(
                "`{}` is plain http, which anyone on the path can alter: use https, or allow http explicitly (--allow-http)",
                shown(url)
            ));
        }
        &url[7..]
    } else {
        return Some(format!("`{}` is not an https:// URL", shown(url)));
    };
    if url.len() > MAX_URL {
        return Some(format!("is {} bytes long, over the limit of {MAX_URL}", url.len()));
    }
    if let Some(c) = url.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Some(format!(
            "`{}` contains `{}`: percent-encode it",
            shown(url),
            c.escape_debug()
        ));
    }
    if rest.is_empty() || rest.starts_with('/') {
        return Some(format!("`{}` names no host", shown(url)));
    }
    None
}

fn checksum_ok(c: &str) -> bool {
    let lower = c.to_ascii_lowercase();
    match lower.split_once(':') {
        Some(("sha256", hex)) => is_hex(hex, 64),
        Some(("sha512", hex)) => is_hex(hex, 128),
        _ => false,
    }
}

fn resources(r: &Resources, e: &mut Vec<FieldError>) {
    match r.vcpus {
        Some(0) => e.push(FieldError::new(Field::ResourcesVcpus, "is 0: give at least 1")),
        Some(n) if n > MAX_VCPUS => e.push(FieldError::new(
            Field::ResourcesVcpus,
            format!("is {n}, over the maximum of {MAX_VCPUS} (QEMU's q35 limit): give fewer"),
        )),
        _ => {}
    }
    if let Some(m) = r.memory {
        let b = m.bytes();
        if b < MIN_MEMORY {
            e.push(FieldError::new(
                Field::ResourcesMemory,
                format!(
                    "is {m}, under the {} a cloud image needs to boot: give e.g. `1G`",
                    ByteSize(MIN_MEMORY)
                ),
            ));
        } else if b > MAX_MEMORY {
            e.push(FieldError::new(
                Field::ResourcesMemory,
                format!(
                    "is {m}, over the limit of {}: check the unit (`2G`, not `2T`)",
                    ByteSize(MAX_MEMORY)
                ),
            ));
        } else if !b.is_multiple_of(MEMORY_ALIGN) {
            e.push(FieldError::new(
                Field::ResourcesMemory,
                format!("is {b} bytes, not a whole number of MiB: give e.g. `{}M`", b / MIB),
            ));
        }
    }
    if let Some(d) = r.disk_size {
        let b = d.bytes();
        if b == 0 {
            e.push(FieldError::new(
                Field::ResourcesDiskSize,
                "is 0: give a size such as `20G`, or leave it out to keep the image's size",
            ));
        } else if b > MAX_DISK_SIZE {
            e.push(FieldError::new(
                Field::ResourcesDiskSize,
                format!(
                    "is {d}, over the limit of {}: check the unit (`20G`, not `20T`)",
                    ByteSize(MAX_DISK_SIZE)
                ),
            ));
        } else if !b.is_multiple_of(DISK_ALIGN) {
            let up = b.div_ceil(DISK_ALIGN).saturating_mul(DISK_ALIGN);
            e.push(FieldError::new(
                Field::ResourcesDiskSize,
                format!("is {b} bytes, not a multiple of {DISK_ALIGN} (a disk sector): give e.g. {up}"),
            ));
        }
    }
}

fn boot(firmware: &Firmware, kernel: Option<&KernelBoot>, machine: Machine, e: &mut Vec<FieldError>) {
    if let Firmware::Path(p) = firmware {
        check_path(Field::Firmware, ".path", p, e);
    }
    let named = match firmware {
        Firmware::Auto => None,
        Firmware::Bios => Some("bios"),
        Firmware::Efi => Some("efi"),
        Firmware::Path(_) => Some("a firmware path"),
    };
    if let (Some(named), Some(_)) = (named, kernel) {
        e.push(FieldError::new(
            Field::Firmware,
            format!("is {named}, but a kernel boots without firmware: drop the firmware, or drop the kernel to boot through the image's boot loader"),
        ));
    }
    if let (Some(named), Machine::Microvm) = (named, machine) {
        e.push(FieldError::new(
            Field::Machine,
            format!("is microvm, which has no firmware, but firmware is {named}: drop the firmware, or use machine `default`"),
        ));
    }
    let Some(k) = kernel else { return };
    check_path(Field::BootKernel, "", &k.kernel, e);
    if let Some(i) = &k.initrd {
        check_path(Field::BootInitrd, "", i, e);
    }
    if let Some(c) = &k.cmdline {
        if c.len() > MAX_CMDLINE {
            e.push(FieldError::new(
                Field::BootCmdline,
                format!(
                    "is {} bytes long, over the {MAX_CMDLINE} a kernel accepts: shorten it",
                    c.len()
                ),
            ));
        } else if let Some(c) = c.chars().find(|c| c.is_control()) {
            e.push(FieldError::new(
                Field::BootCmdline,
                format!(
                    "contains `{}`: a kernel command line is one line of printable text",
                    c.escape_debug()
                ),
            ));
        }
    }
}

fn check_path(field: Field, suffix: &str, path: &Path, e: &mut Vec<FieldError>) {
    let bytes = path.as_os_str().as_encoded_bytes();
    let why = if bytes.is_empty() {
        "is empty: give an absolute path".to_owned()
    } else if bytes.contains(&0) {
        "contains a NUL byte, which no file name can hold".to_owned()
    } else if bytes.len() > MAX_PATH {
        format!("is {} bytes long, over PATH_MAX ({MAX_PATH})", bytes.len())
    } else if path.to_str().is_none() {
        "is not UTF-8, so the VM's record cannot hold it: rename the file or link to it from a UTF-8 path".to_owned()
    } else if !path.is_absolute() {
        format!(
            "`{}` is relative: give an absolute path",
            shown(&path.to_string_lossy())
        )
    } else {
        return;
    };
    e.push(FieldError::at(field, suffix, why));
}

fn overrides(spec: &VmSpec, e: &mut Vec<FieldError>) {
    for (backend, options) in &spec.overrides {
        let at = format!(".{}", shown(backend));
        if let Err(why) = backend_id(backend) {
            e.push(FieldError::at(Field::Overrides, &at, why));
        }
        if options.len() > MAX_OVERRIDES {
            e.push(FieldError::at(
                Field::Overrides,
                &at,
                format!("has {} options, over the limit of {MAX_OVERRIDES}", options.len()),
            ));
        }
        for (key, value) in options {
            let at = format!("{at}.{}", shown(key));
            let key_ok = word(
                key,
                MAX_OVERRIDE_KEY,
                |c| c.is_ascii_alphanumeric(),
                |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'),
            );
            if let Err(why) = key_ok {
                e.push(FieldError::at(
                    Field::Overrides,
                    &at,
                    format!("option name {why}: use letters, digits, `_`, `.` and `-`"),
                ));
            }
            if value.len() > MAX_OVERRIDE_VALUE {
                e.push(FieldError::at(
                    Field::Overrides,
                    &at,
                    format!(
                        "value is {} bytes long, over the limit of {MAX_OVERRIDE_VALUE}",
                        value.len()
                    ),
                ));
            } else if let Some(c) = value.chars().find(|c| c.is_control()) {
                e.push(FieldError::at(
                    Field::Overrides,
                    &at,
                    format!("value contains `{}`: give printable text", c.escape_debug()),
                ));
            } else if matches!(backend.as_str(), "libvirt" | "virt") && key == "uri" {
                // libvirt runs programs for some URIs: only the allowlisted forms pass.
                if let Err(err) = ConnectUri::parse(value, Origin::Spec) {
                    e.push(FieldError::at(Field::Overrides, &at, err.to_string()));
                }
            }
        }
    }
}

fn cloud_init(c: &CloudInitSpec, payloads: &PayloadChecks, e: &mut Vec<FieldError>) {
    if c.seed.is_some() {
        let given: Vec<&str> = [
            (c.hostname.is_some(), "hostname"),
            (!c.ssh_keys.is_empty(), "sshKeys"),
            (c.user_data.is_some(), "userData"),
            (c.network_config.is_some(), "networkConfig"),
            (c.vendor_data.is_some(), "vendorData"),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect();
        if !given.is_empty() {
            e.push(FieldError::new(
                Field::CloudInitSeed,
                format!(
                    "is attached as is, so {} cannot be added to it: put them in the seed image, or drop the seed",
                    given.join(", ")
                ),
            ));
        }
    }
    if let Some(seed) = &c.seed {
        check_path(Field::CloudInitSeed, "", seed, e);
    }
    if let Some(h) = &c.hostname {
        if let Some((hostname, why)) = nubo_core::name::hostname_problem(h) {
            e.push(FieldError::new(
                Field::CloudInitHostname,
                format!("hostname `{hostname}` is invalid: {why}"),
            ));
        }
    }
    if c.ssh_keys.len() > MAX_SSH_KEYS {
        e.push(FieldError::new(
            Field::CloudInitSshKeys,
            format!("has {} keys, over the limit of {MAX_SSH_KEYS}", c.ssh_keys.len()),
        ));
    }
    for (i, key) in c.ssh_keys.iter().enumerate() {
        if let Some(why) = ssh_key_problem(key) {
            e.push(FieldError::at(Field::CloudInitSshKeys, &format!("[{i}]"), why));
        }
    }
    if let Some(p) = &c.user_data {
        if let Some(bytes) = payload(Field::CloudInitUserData, p, e) {
            if let Err(why) = (payloads.user_data)(bytes) {
                e.push(FieldError::new(Field::CloudInitUserData, why));
            }
        }
    }
    // The same bounded YAML checks `seed build` makes, so an alias bomb is refused on every
    // path that puts YAML into a seed (flags, manifests, inline or from a file).
    if let Some(p) = &c.network_config {
        if let Some(bytes) = payload(Field::CloudInitNetworkConfig, p, e) {
            if let Err(why) = (payloads.network_config)(bytes) {
                e.push(FieldError::new(Field::CloudInitNetworkConfig, why));
            }
        }
    }
    if let Some(p) = &c.vendor_data {
        if let Some(bytes) = payload(Field::CloudInitVendorData, p, e) {
            if let Err(why) = (payloads.vendor_data)(bytes) {
                e.push(FieldError::new(Field::CloudInitVendorData, why));
            }
        }
    }
}

/// Checks what every payload needs; returns its bytes when they are there to check further.
fn payload<'a>(field: Field, p: &'a Payload, e: &mut Vec<FieldError>) -> Option<&'a [u8]> {
    if p.len() > MAX_PAYLOAD {
        e.push(FieldError::new(
            field,
            format!(
                "is {} bytes, over the seed's {} limit per file: move large payloads into the image or fetch them at boot",
                p.len(),
                ByteSize(MAX_PAYLOAD)
            ),
        ));
        return None;
    }
    let content = p.content();
    if content.is_none() {
        e.push(FieldError::new(
            field,
            "holds only a digest (it was read back from a record or a dry run): give the content itself",
        ));
    }
    content
}

fn ssh_key_problem(key: &str) -> Option<String> {
    let key = key.trim_end_matches(['\n', '\r']);
    if key.trim().is_empty() {
        return Some("is empty: give a public key line such as the contents of `~/.ssh/id_ed25519.pub`".into());
    }
    if key.len() > MAX_SSH_KEY {
        return Some(format!(
            "is {} bytes long, over the {MAX_SSH_KEY} of any real key line: give one public key, not a file of them",
            key.len()
        ));
    }
    if key.contains('\n') {
        return Some("holds several lines: give each key separately".into());
    }
    if let Some(c) = key.chars().find(|c| c.is_control() && *c != '\t') {
        return Some(format!("contains `{}`: a key line is printable text", c.escape_debug()));
    }
    let kind = key.split_whitespace().next().unwrap_or_default();
    let known = SSH_KEY_TYPES
        .iter()
        .any(|t| kind == *t || kind.strip_prefix(t) == Some("-cert-v01@openssh.com"));
    if !known {
        let hint = if key.contains("PRIVATE KEY") {
            "this is a private key: give the `.pub` file instead"
        } else {
            "give a public key line (the `.pub` file)"
        };
        // Never quoted: a line that is not a key may be a secret (`@/etc/shadow`, a private key).
        return Some(format!(
            "is not a public key line: it does not start with a key type ({}): {hint}",
            SSH_KEY_TYPES.join(", ")
        ));
    }
    if key.split_whitespace().nth(1).is_none() {
        return Some(format!(
            "has the key type `{kind}` but no key after it: give the whole line"
        ));
    }
    None
}
