//! libvirt's TLS client certificates, checked for `nubo doctor --connect qemu+tls://...`.
//!
//! libvirt reads `cacert.pem`, `clientcert.pem` and `clientkey.pem` from the URI's `pkipath`
//! (added by nubo only from `--tls-dir`, [`nubo_spec::ConnectUri::with_pkipath`]); without it,
//! a caller other than root first tries `~/.pki/libvirt/` (all three there), then everyone the
//! system locations `/etc/pki/CA/cacert.pem`, `/etc/pki/libvirt/clientcert.pem` and
//! `/etc/pki/libvirt/private/clientkey.pem`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{CheckStatus, HostCheck};

/// The three files, in libvirt's order: CA certificate, client certificate, client key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFiles {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Where they came from, for the report.
    pub origin: String,
}

/// The files in `dir` (a `--tls-dir`, libvirt's `pkipath` layout).
pub fn in_dir(dir: &Path) -> ClientFiles {
    ClientFiles {
        ca: dir.join("cacert.pem"),
        cert: dir.join("clientcert.pem"),
        key: dir.join("clientkey.pem"),
        origin: format!("--tls-dir {}", dir.display()),
    }
}

/// The files libvirt reads without `pkipath`, for the caller (`home` when not root).
pub fn default_files(root: bool, home: Option<&Path>) -> ClientFiles {
    if !root {
        if let Some(h) = home {
            let user = in_dir(&h.join(".pki/libvirt"));
            if [&user.ca, &user.cert, &user.key].iter().all(|p| p.is_file()) {
                return ClientFiles {
                    origin: format!("{}", h.join(".pki/libvirt").display()),
                    ..user
                };
            }
        }
    }
    ClientFiles {
        ca: "/etc/pki/CA/cacert.pem".into(),
        cert: "/etc/pki/libvirt/clientcert.pem".into(),
        key: "/etc/pki/libvirt/private/clientkey.pem".into(),
        origin: "libvirt's system locations".into(),
    }
}

/// What is wrong with `dir` as a `--tls-dir`, if anything (the CLI refuses it before connecting).
pub fn check_dir(dir: &Path) -> Result<(), String> {
    let f = in_dir(dir);
    for p in [&f.ca, &f.cert, &f.key] {
        file_problem(p).map_err(|why| format!("TLS directory {}: {why}", dir.display()))?;
    }
    Ok(())
}

/// A regular, readable file (never opened if it is a FIFO or device: no hang).
fn file_problem(p: &Path) -> Result<(), String> {
    let md = std::fs::metadata(p).map_err(|e| format!("{} cannot be read ({e})", p.display()))?;
    if !md.is_file() {
        return Err(format!("{} is not a regular file", p.display()));
    }
    std::fs::File::open(p).map_err(|e| format!("{} cannot be read ({e})", p.display()))?;
    Ok(())
}

/// `openssl x509 -checkend 0`: `Some(true)` when the certificate has expired, `None` when
/// openssl is missing or says nothing usable (the check is skipped).
fn expired(cert: &Path) -> Option<bool> {
    let mut child = Command::new("openssl")
        .args(["x509", "-checkend", "0", "-noout", "-in"])
        .arg(cert)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    nubo_core::child::wait_bounded(&mut child, Duration::from_secs(10))?
        .code()
        .map(|c| c == 1)
}

fn check(name: &str, status: CheckStatus, detail: String, fix: Option<String>) -> HostCheck {
    HostCheck {
        name: name.into(),
        status,
        detail,
        fix,
        blocks: None,
    }
}

/// Doctor's checks of `files`: each exists and is readable, the key is not readable by
/// others, the client certificate has not expired (when openssl can tell).
pub fn checks(files: &ClientFiles) -> Vec<HostCheck> {
    let mut out = Vec::new();
    let fix_missing = |what: &str, p: &Path| {
        format!(
            "put the {what} at {} (libvirt's layout: cacert.pem, clientcert.pem, clientkey.pem), or name the directory that holds all three with --tls-dir",
            p.display()
        )
    };
    for (what, p) in [
        ("CA certificate", &files.ca),
        ("client certificate", &files.cert),
        ("client key", &files.key),
    ] {
        match file_problem(p) {
            Ok(()) => out.push(check(
                &format!("libvirt TLS {what}"),
                CheckStatus::Ok,
                format!("{} ({})", p.display(), files.origin),
                None,
            )),
            Err(why) => out.push(check(
                &format!("libvirt TLS {what}"),
                CheckStatus::Broken,
                why,
                Some(fix_missing(what, p)),
            )),
        }
    }
    if let Ok(md) = std::fs::metadata(&files.key) {
        if md.permissions().mode() & 0o004 != 0 {
            out.push(check(
                "libvirt TLS client key mode",
                CheckStatus::Broken,
                format!("{} is readable by every user", files.key.display()),
                Some(format!("chmod 600 {}", files.key.display())),
            ));
        }
    }
    if file_problem(&files.cert).is_ok() {
        match expired(&files.cert) {
            Some(true) => out.push(check(
                "libvirt TLS client certificate validity",
                CheckStatus::Broken,
                format!("{} has expired", files.cert.display()),
                Some("issue a new client certificate from the host's CA (certtool or openssl) and replace it".into()),
            )),
            Some(false) => out.push(check(
                "libvirt TLS client certificate validity",
                CheckStatus::Ok,
                format!("{} has not expired", files.cert.display()),
                None,
            )),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_dir_missing_key_names_the_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("cacert.pem"), "x").unwrap();
        std::fs::write(d.path().join("clientcert.pem"), "x").unwrap();

        let e = check_dir(d.path()).unwrap_err();

        assert!(e.contains("clientkey.pem"), "{e}");
    }

    #[test]
    fn check_dir_fifo_is_refused_without_opening_it() {
        let d = tempfile::tempdir().unwrap();
        for f in ["cacert.pem", "clientcert.pem"] {
            std::fs::write(d.path().join(f), "x").unwrap();
        }
        nix::unistd::mkfifo(&d.path().join("clientkey.pem"), nix::sys::stat::Mode::S_IRWXU).unwrap();

        let e = check_dir(d.path()).unwrap_err();

        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn checks_world_readable_key_is_broken_with_chmod_fix() {
        let d = tempfile::tempdir().unwrap();
        for f in ["cacert.pem", "clientcert.pem", "clientkey.pem"] {
            std::fs::write(d.path().join(f), "x").unwrap();
        }
        std::fs::set_permissions(d.path().join("clientkey.pem"), std::fs::Permissions::from_mode(0o644)).unwrap();

        let c = checks(&in_dir(d.path()));

        let mode = c.iter().find(|c| c.name == "libvirt TLS client key mode").unwrap();
        assert_eq!(mode.status, CheckStatus::Broken);
        assert!(mode.fix.as_deref().unwrap().starts_with("chmod 600"));
    }

    #[test]
    fn default_files_root_are_the_system_locations() {
        let f = default_files(true, Some(Path::new("/home/u")));

        assert_eq!(f.key, PathBuf::from("/etc/pki/libvirt/private/clientkey.pem"));
    }
}
