//! [`ConnectUri`]: a libvirt connection URI nubo accepts, parsed against an allowlist.
//!
//! libvirt runs a host program for several transports and URI parameters (`qemu+ext` runs
//! `?command=`, `qemu+ssh` honours `command`, `netcat`, `keyfile`, `known_hosts`, `proxy`),
//! so a URI from a manifest is code. Only these forms are accepted; everything else is refused:
//!
//! | form | query parameters |
//! |---|---|
//! | `qemu:///system`, `qemu:///session` | `socket`, `mode` |
//! | `qemu+unix:///system`, `qemu+unix:///session` | `socket`, `mode` |
//! | `qemu+tls://HOST[:PORT]/system` | none |
//! | `qemu+ssh://[USER@]HOST[:PORT]/system` | `mode`, `no_tty` |
//!
//! `socket=` is a clean absolute path; from a manifest or `--connect` ([`Origin::Spec`]) it must
//! lie under `/run/libvirt`, `/var/run/libvirt` or `/run/user/<uid>/libvirt`. Percent-escapes,
//! fragments, passwords in the user part, repeated parameters and control characters are
//! refused whatever the origin. HOST is a DNS name (labels of letters, digits and inner `-`), an
//! IPv4 address or a bracketed IPv6 address; USER a POSIX user name (never starting with `-`).

mod host;

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

pub use host::Host;

/// Longer than any real URI (a 253-byte host, a user, a 108-byte socket path).
pub const MAX_URI: usize = 1024;
/// AF_UNIX's `sun_path` holds 108 bytes, NUL included.
const MAX_SOCKET: usize = 107;
/// The directories a socket named by a manifest may be in (libvirtd's and the session daemon's).
const SPEC_SOCKET_DIRS: &str = "/run/libvirt, /var/run/libvirt or /run/user/<uid>/libvirt";

/// What every refusal tells the user to write instead.
pub const ACCEPTED: &str = "use qemu:///system, qemu:///session, qemu+unix:///system|session (only `socket=` and `mode=`), qemu+tls://HOST[:PORT]/system (no parameters) or qemu+ssh://[USER@]HOST[:PORT]/system (only `mode=` and `no_tty=`)";

/// Where a URI came from, which decides how far its `socket=` is trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A manifest or `vm create --connect`: files people download and share.
    Spec,
    /// `NUBO_LIBVIRT_URI`, set by the user running nubo.
    Env,
    /// A VM record nubo wrote (from one of the two above).
    Record,
}

impl Origin {
    fn trusts_any_socket(self) -> bool {
        !matches!(self, Origin::Spec)
    }
}

/// How the client reaches libvirtd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `qemu://` (no transport named: the local AF_UNIX socket).
    Local,
    /// `qemu+unix://`.
    Unix,
    /// `qemu+tls://`: mutual TLS with the certificates in libvirt's default locations.
    Tls,
    /// `qemu+ssh://`: libvirt runs `ssh` with nubo's fixed options, never a URI's.
    Ssh,
}

/// Which QEMU driver instance: the system-wide daemon or the caller's session daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Instance {
    System,
    Session,
}

/// An allowlisted query parameter and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// `socket=PATH`: the daemon's AF_UNIX socket (local transports).
    Socket(PathBuf),
    /// `mode=auto|legacy|direct`: which daemon to talk to (monolithic or modular).
    Mode(String),
    /// `no_tty=0|1`: ssh never asks on a terminal (ssh transport).
    NoTty(bool),
    /// `pkipath=DIR`: the directory of the TLS client certificates (tls transport). Never from
    /// a spec: only nubo adds it ([`ConnectUri::with_pkipath`], from `--tls-dir`), and a record
    /// or `NUBO_LIBVIRT_URI` may carry it.
    PkiPath(PathBuf),
}

/// A libvirt connection URI that passed the allowlist. The only way to build one is
/// [`ConnectUri::parse`] (or the two local defaults), and the libvirt backend opens nothing
/// else. Displays, and serialises, as the text it was parsed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectUri {
    text: String,
    transport: Transport,
    user: Option<String>,
    host: Option<Host>,
    port: Option<u16>,
    instance: Instance,
    params: Vec<Param>,
}

/// A URI refused: which one (quoted, control characters escaped), why, and what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("libvirt URI `{uri}` {why}: {ACCEPTED}")]
pub struct UriError {
    pub uri: String,
    pub why: String,
}

impl ConnectUri {
    /// `qemu:///system`.
    pub fn system() -> ConnectUri {
        Self::local(Instance::System)
    }

    /// `qemu:///session`.
    pub fn session() -> ConnectUri {
        Self::local(Instance::Session)
    }

    fn local(instance: Instance) -> ConnectUri {
        let path = match instance {
            Instance::System => "system",
            Instance::Session => "session",
        };
        ConnectUri {
            text: format!("qemu:///{path}"),
            transport: Transport::Local,
            user: None,
            host: None,
            port: None,
            instance,
            params: Vec::new(),
        }
    }

    /// Parses `s`, refusing anything outside the allowlist (see the module documentation).
    pub fn parse(s: &str, origin: Origin) -> Result<ConnectUri, UriError> {
        parse(s, origin).map_err(|why| UriError {
            uri: nubo_core::name::quote(s),
            why,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn transport(&self) -> Transport {
        self.transport
    }

    pub fn instance(&self) -> Instance {
        self.instance
    }

    pub fn host(&self) -> Option<&Host> {
        self.host.as_ref()
    }

    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    pub fn port(&self) -> Option<u16> {
        self.port
    }

    pub fn params(&self) -> &[Param] {
        &self.params
    }

    /// `self` with `pkipath=dir`: libvirt then reads `cacert.pem`, `clientcert.pem` and
    /// `clientkey.pem` from `dir` only. Only a `qemu+tls` URI without one takes it; `dir` is a
    /// clean absolute path the caller has checked (`--tls-dir`).
    pub fn with_pkipath(&self, dir: &Path) -> Result<ConnectUri, UriError> {
        let refuse = |why: String| UriError {
            uri: nubo_core::name::quote(&self.text),
            why,
        };
        if self.transport != Transport::Tls {
            return Err(refuse("is not a qemu+tls URI, so it takes no TLS directory".into()));
        }
        if self.params.iter().any(|p| matches!(p, Param::PkiPath(_))) {
            return Err(refuse("already names a TLS directory".into()));
        }
        let value = dir
            .to_str()
            .ok_or_else(|| refuse("gets a TLS directory that is not UTF-8".into()))?;
        let path = clean_abs(value, "TLS directory")?;
        let text = format!(
            "{}{}pkipath={value}",
            self.text,
            if self.text.contains('?') { '&' } else { '?' }
        );
        let mut out = self.clone();
        out.text = text;
        out.params.push(Param::PkiPath(path));
        // What a record holding it will parse back to.
        ConnectUri::parse(&out.text, Origin::Record)?;
        Ok(out)
    }

    /// The TLS client certificate directory nubo added (`--tls-dir`), if any.
    pub fn pkipath(&self) -> Option<&Path> {
        self.params.iter().find_map(|p| match p {
            Param::PkiPath(d) => Some(d.as_path()),
            _ => None,
        })
    }

    /// Whether the URI names a daemon on this host (no network transport).
    pub fn is_local(&self) -> bool {
        matches!(self.transport, Transport::Local | Transport::Unix)
    }

    /// The AF_UNIX socket a local URI talks to (`socket=`, else libvirt's default for the
    /// instance and `uid`); `None` for a remote one.
    pub fn socket(&self, uid: u32) -> Option<PathBuf> {
        if !self.is_local() {
            return None;
        }
        let given = self.params.iter().find_map(|p| match p {
            Param::Socket(s) => Some(s.clone()),
            _ => None,
        });
        Some(given.unwrap_or_else(|| match self.instance {
            Instance::System => PathBuf::from("/run/libvirt/libvirt-sock"),
            Instance::Session => PathBuf::from(format!("/run/user/{uid}/libvirt/libvirt-sock")),
        }))
    }
}

impl fmt::Display for ConnectUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Serialize for ConnectUri {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

/// Deserialising is reading a record nubo wrote: [`Origin::Record`]. A record edited to hold a
/// URI outside the allowlist is refused, not opened.
impl<'de> Deserialize<'de> for ConnectUri {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ConnectUri, D::Error> {
        let s = String::deserialize(d)?;
        ConnectUri::parse(&s, Origin::Record).map_err(serde::de::Error::custom)
    }
}

fn parse(s: &str, origin: Origin) -> Result<ConnectUri, String> {
    if s.is_empty() {
        return Err("is empty".into());
    }
    if s.len() > MAX_URI {
        return Err(format!("is {} bytes long, over the limit of {MAX_URI}", s.len()));
    }
    if let Some(c) = s.chars().find(|c| c.is_control() || c.is_whitespace() || !c.is_ascii()) {
        return Err(format!("contains `{}`, which no accepted URI holds", c.escape_debug()));
    }
    if s.contains('%') {
        return Err("holds a percent-escape: write every character plainly".into());
    }
    if s.contains('#') {
        return Err("has a fragment (`#`), which libvirt URIs do not use".into());
    }
    let Some((scheme, rest)) = s.split_once("://") else {
        return Err("is not a URI of the form `driver[+transport]://[host]/path`".into());
    };
    let transport = match scheme {
        "qemu" => Transport::Local,
        "qemu+unix" => Transport::Unix,
        "qemu+tls" => Transport::Tls,
        "qemu+ssh" => Transport::Ssh,
        other => return Err(scheme_problem(other)),
    };
    let (hier, query) = match rest.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match hier.find('/') {
        Some(i) => hier.split_at(i),
        None => return Err("has no path: end it with `/system` or `/session`".into()),
    };
    let instance = match path {
        "/system" => Instance::System,
        "/session" if matches!(transport, Transport::Local | Transport::Unix) => Instance::Session,
        "/session" => return Err("names `/session` on a remote host: remote hosts are reached at `/system`".into()),
        _ => {
            return Err(format!(
                "has the path `{}`: the QEMU driver is `/system` or `/session`",
                path.escape_debug()
            ))
        }
    };
    let (user, host, port) = match transport {
        Transport::Local | Transport::Unix => {
            if !authority.is_empty() {
                return Err(format!(
                    "names the host `{}` on a local transport: write `qemu:///` with three slashes, or use qemu+tls or qemu+ssh for a remote host",
                    authority.escape_debug()
                ));
            }
            (None, None, None)
        }
        Transport::Tls | Transport::Ssh => {
            let (user, hostport) = match authority.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, authority),
            };
            if let Some(u) = user {
                if transport == Transport::Tls {
                    return Err("names a user on qemu+tls, which authenticates by certificate: drop `USER@`".into());
                }
                host::check_user(u)?;
            }
            let (host, port) = host::parse_host_port(hostport)?;
            (user.map(str::to_owned), Some(host), port)
        }
    };
    let params = match query {
        None => Vec::new(),
        Some(q) => params(q, transport, origin)?,
    };
    Ok(ConnectUri {
        text: s.to_owned(),
        transport,
        user,
        host,
        port,
        instance,
        params,
    })
}

fn scheme_problem(scheme: &str) -> String {
    let (driver, transport) = scheme.split_once('+').unwrap_or((scheme, ""));
    if driver.is_empty() {
        return "has no scheme".into();
    }
    if driver != "qemu" {
        return format!(
            "names the driver `{}`: nubo drives QEMU (`qemu`) only",
            driver.escape_debug()
        );
    }
    match transport {
        "ext" => "uses the transport `ext`, which makes libvirt run the program `command=` names".into(),
        "libssh" | "libssh2" => {
            format!("uses the transport `{transport}`, which reads the key and known-hosts files the URI names")
        }
        t => format!("uses the transport `{}`, which nubo does not accept", t.escape_debug()),
    }
}

/// The query: `key=value` pairs joined by `&`, each key allowlisted for the transport, none twice.
fn params(q: &str, transport: Transport, origin: Origin) -> Result<Vec<Param>, String> {
    if q.is_empty() {
        return Err("ends in `?` with no parameters".into());
    }
    let allowed: &[&str] = match transport {
        Transport::Local | Transport::Unix => &["socket", "mode"],
        Transport::Ssh => &["mode", "no_tty"],
        Transport::Tls if origin.trusts_any_socket() => &["pkipath"],
        Transport::Tls => &[],
    };
    let mut out: Vec<Param> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for pair in q.split('&') {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(format!("has the parameter `{}` without `=value`", pair.escape_debug()));
        };
        if !allowed.contains(&key) {
            let why = match key {
                "command" | "netcat" | "proxy" => " (it makes libvirt run a program)",
                "keyfile" | "known_hosts" | "pkipath" | "sshauth" => " (it makes libvirt read a file it names)",
                "no_verify" => " (it turns off certificate checks)",
                _ => "",
            };
            let list = if allowed.is_empty() {
                "none".to_owned()
            } else {
                allowed.join(", ")
            };
            return Err(format!(
                "has the parameter `{}`{why}; this transport accepts {list}",
                key.escape_debug()
            ));
        }
        if seen.contains(&key) {
            return Err(format!("gives the parameter `{key}` twice"));
        }
        seen.push(key);
        out.push(match key {
            "socket" => Param::Socket(socket(value, origin)?),
            "pkipath" => Param::PkiPath(clean_abs(value, "TLS directory").map_err(|e| e.why)?),
            "mode" => match value {
                "auto" | "legacy" | "direct" => Param::Mode(value.to_owned()),
                _ => {
                    return Err(format!(
                        "has `mode={}`: mode is auto, legacy or direct",
                        value.escape_debug()
                    ))
                }
            },
            _ => match value {
                "0" => Param::NoTty(false),
                "1" => Param::NoTty(true),
                _ => return Err(format!("has `no_tty={}`: no_tty is 0 or 1", value.escape_debug())),
            },
        });
    }
    Ok(out)
}

/// `value` as a clean absolute path (no `.`, `..`, `//`, trailing `/`, `&` or `?`).
fn clean_abs(value: &str, what: &str) -> Result<PathBuf, UriError> {
    let refuse = |why: String| UriError {
        uri: nubo_core::name::quote(value),
        why,
    };
    let p = Path::new(value);
    let clean = value.starts_with('/')
        && !value.ends_with('/')
        && !value.contains("//")
        && !value.contains(['&', '?', '#', '%', '\0'])
        && !value.chars().any(char::is_control)
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !clean {
        return Err(refuse(format!(
            "has the {what} `{}`, which is not a plain absolute path: give one without `.`, `..`, `//`, `&`, `?`, `%` or a trailing `/`",
            value.escape_debug()
        )));
    }
    Ok(p.to_path_buf())
}

/// A clean absolute socket path; from a spec, one under libvirt's run directories.
fn socket(value: &str, origin: Origin) -> Result<PathBuf, String> {
    let shown = value.escape_debug();
    if value.is_empty() {
        return Err("has an empty `socket=`".into());
    }
    if value.len() > MAX_SOCKET {
        return Err(format!(
            "has a socket path of {} bytes, over AF_UNIX's {MAX_SOCKET}",
            value.len()
        ));
    }
    if !value.starts_with('/') {
        return Err(format!("has the relative socket path `{shown}`: give an absolute path"));
    }
    let p = Path::new(value);
    let clean = !value.ends_with('/')
        && !value.contains("//")
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !clean {
        return Err(format!(
            "has the socket path `{shown}`, which holds `.`, `..`, `//` or a trailing `/`: give the plain path"
        ));
    }
    if !origin.trusts_any_socket() && !under_libvirt_run_dir(value) {
        return Err(format!(
            "has the socket path `{shown}`, outside {SPEC_SOCKET_DIRS} (a manifest or --connect may name only libvirt's own sockets; NUBO_LIBVIRT_URI may name another)"
        ));
    }
    Ok(p.to_path_buf())
}

fn under_libvirt_run_dir(path: &str) -> bool {
    if let Some(rest) = path
        .strip_prefix("/run/libvirt/")
        .or_else(|| path.strip_prefix("/var/run/libvirt/"))
    {
        return !rest.is_empty();
    }
    let Some(rest) = path.strip_prefix("/run/user/") else {
        return false;
    };
    let Some((uid, rest)) = rest.split_once('/') else {
        return false;
    };
    let uid_ok = !uid.is_empty() && uid.len() <= 10 && uid.bytes().all(|b| b.is_ascii_digit());
    uid_ok && rest.strip_prefix("libvirt/").is_some_and(|r| !r.is_empty())
}

#[cfg(test)]
mod tests;
