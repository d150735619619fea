//! Shared folders: `--mount HOST_DIR[:GUEST_DIR][:ro]` and a manifest's `mounts:`.
//!
//! A host directory shown to the guest, read-write or read-only. The guest directory defaults to
//! the host's own path, as Lima and `multipass mount` do, so paths printed on one side work on
//! the other. Pure: whether the host directory exists is the engine's check; here only the
//! shape of both paths is checked.

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::FieldError;
use crate::field::Field;

/// More shared folders than this is a typo or a script gone wrong: each is a PCI device and,
/// with virtio-fs, a `virtiofsd` process.
pub const MAX_MOUNTS: usize = 16;

/// fstab and QEMU both read paths as text; 1 KiB is far beyond any real directory.
pub const MAX_MOUNT_PATH: usize = 1024;

/// Guest directories a shared folder must not hide: the guest would not boot, or nubo could not
/// log in (`/home`), or they are not directories of files at all.
const GUEST_RESERVED: &[&str] = &[
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/proc", "/root", "/run", "/sbin",
    "/sys", "/tmp", "/usr", "/var",
];

/// Guest trees where nothing may be mounted over.
const GUEST_FORBIDDEN_TREES: &[&str] = &["/proc", "/sys", "/dev", "/run", "/boot", "/etc"];

/// One shared folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MountSpec {
    /// The host directory, absolute (callers resolve a relative one against the cwd or the
    /// manifest's directory).
    pub host_path: PathBuf,
    /// Where the guest mounts it; `None` is the host path itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_path: Option<PathBuf>,
    /// Read-only, enforced by the device (virtiofsd `--readonly`, 9p `readonly=on`), not the guest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

impl MountSpec {
    /// Parses `HOST_DIR[:GUEST_DIR][:ro|rw]`. The host path is returned as written (the caller
    /// makes it absolute). A path holding `:` cannot be written this way: use a manifest.
    pub fn parse(text: &str) -> Result<MountSpec, String> {
        let mut parts: Vec<&str> = text.split(':').collect();
        let read_only = match parts.last() {
            Some(&"ro") if parts.len() > 1 => {
                parts.pop();
                true
            }
            Some(&"rw") if parts.len() > 1 => {
                parts.pop();
                false
            }
            _ => false,
        };
        let (host, guest) = match parts.as_slice() {
            [host] => (*host, None),
            [host, guest] => (*host, Some(*guest)),
            _ => {
                return Err(format!(
                    "`{}` is not HOST_DIR[:GUEST_DIR][:ro]: a path with `:` in it can only be given in a manifest's `mounts:`",
                    shown(text)
                ))
            }
        };
        if host.is_empty() {
            return Err(format!(
                "`{}` names no host directory: write HOST_DIR[:GUEST_DIR][:ro]",
                shown(text)
            ));
        }
        if guest == Some("") {
            return Err(format!(
                "`{}` has an empty guest directory: write HOST_DIR[:GUEST_DIR][:ro]",
                shown(text)
            ));
        }
        Ok(MountSpec {
            host_path: PathBuf::from(host),
            guest_path: guest.map(PathBuf::from),
            read_only,
        })
    }

    /// The directory the guest mounts it on.
    pub fn guest(&self) -> &Path {
        self.guest_path.as_deref().unwrap_or(&self.host_path)
    }
}

/// [`check`] on its own, for `vm mount` (a spec read back from a record cannot be validated
/// whole: its payloads are digests).
pub fn check_mounts(mounts: &[MountSpec]) -> Result<(), crate::SpecErrors> {
    let mut e = Vec::new();
    check(mounts, &mut e);
    crate::SpecErrors::check(e)
}

/// Checks every mount: both paths absolute, printable, of bounded length; guest paths
/// normal (no `.` or `..`), outside the guest's system directories, and distinct.
pub(crate) fn check(mounts: &[MountSpec], e: &mut Vec<FieldError>) {
    if mounts.len() > MAX_MOUNTS {
        e.push(FieldError::new(
            Field::Mounts,
            format!(
                "has {} entries, over the limit of {MAX_MOUNTS}: share a common parent directory instead",
                mounts.len()
            ),
        ));
        return;
    }
    for (i, m) in mounts.iter().enumerate() {
        let at = format!("[{i}]");
        if let Err(why) = path_text(&m.host_path) {
            e.push(FieldError::at(
                Field::Mounts,
                &format!("{at}.hostPath"),
                format!("host directory {why}"),
            ));
            continue;
        }
        if let Err(why) = path_text(m.guest()) {
            e.push(FieldError::at(
                Field::Mounts,
                &format!("{at}.guestPath"),
                format!("guest directory {why}"),
            ));
            continue;
        }
        if let Err(why) = guest_place(m.guest()) {
            let field = if m.guest_path.is_some() {
                "guestPath"
            } else {
                "hostPath"
            };
            e.push(FieldError::at(
                Field::Mounts,
                &format!("{at}.{field}"),
                format!("guest directory {why}: give another one, as in HOST_DIR:/mnt/NAME"),
            ));
            continue;
        }
        if mounts[..i].iter().any(|o| o.guest() == m.guest()) {
            e.push(FieldError::at(
                Field::Mounts,
                &at,
                format!(
                    "guest directory {} is already used by another mount: give each its own",
                    m.guest().display()
                ),
            ));
        }
    }
}

/// The path as text a fstab line, QEMU's option syntax and libvirt's XML can carry once escaped:
/// absolute, UTF-8, no control characters or whitespace (fstab separates fields by whitespace),
/// bounded.
fn path_text(p: &Path) -> Result<(), String> {
    let Some(s) = p.to_str() else {
        return Err(format!("`{}` is not UTF-8: rename it", shown(&p.to_string_lossy())));
    };
    if s.len() > MAX_MOUNT_PATH {
        return Err(format!("is {} bytes long, over the limit of {MAX_MOUNT_PATH}", s.len()));
    }
    if !p.is_absolute() {
        return Err(format!("`{}` is not absolute: give an absolute path", shown(s)));
    }
    if let Some(c) = s.chars().find(|c| c.is_control() || c.is_whitespace()) {
        return Err(format!(
            "`{}` contains `{}`: rename it, or share its parent directory",
            shown(s),
            c.escape_debug()
        ));
    }
    Ok(())
}

fn guest_place(p: &Path) -> Result<(), String> {
    if p.components()
        .any(|c| matches!(c, Component::CurDir | Component::ParentDir))
    {
        return Err(format!(
            "`{}` has a `.` or `..` component",
            shown(&p.display().to_string())
        ));
    }
    let text = p.to_str().unwrap_or_default().trim_end_matches('/');
    let text = if text.is_empty() { "/" } else { text };
    if GUEST_RESERVED.contains(&text) {
        return Err(format!("`{text}` would hide a system directory of the guest"));
    }
    if let Some(tree) = GUEST_FORBIDDEN_TREES.iter().find(|t| p.starts_with(t)) {
        return Err(format!("`{text}` is under `{tree}`, which the guest's system owns"));
    }
    Ok(())
}

fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(60).flat_map(char::escape_debug).collect();
    if s.chars().nth(60).is_some() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn errors(mounts: &[MountSpec]) -> Vec<FieldError> {
        let mut e = Vec::new();
        check(mounts, &mut e);
        e
    }

    fn m(host: &str, guest: Option<&str>) -> MountSpec {
        MountSpec {
            host_path: host.into(),
            guest_path: guest.map(PathBuf::from),
            read_only: false,
        }
    }

    #[test]
    fn parse_host_only_guest_defaults_to_host() {
        let got = MountSpec::parse("/srv/data").unwrap();

        assert_eq!(got.guest(), Path::new("/srv/data"));
        assert!(!got.read_only);
    }

    #[test]
    fn parse_host_guest_ro_all_set() {
        let got = MountSpec::parse("/srv/data:/mnt/data:ro").unwrap();

        assert_eq!(
            got,
            MountSpec {
                host_path: "/srv/data".into(),
                guest_path: Some("/mnt/data".into()),
                read_only: true
            }
        );
    }

    #[test]
    fn parse_host_ro_guest_defaults() {
        let got = MountSpec::parse("./data:ro").unwrap();

        assert_eq!(
            got,
            MountSpec {
                host_path: "./data".into(),
                guest_path: None,
                read_only: true
            }
        );
    }

    #[test]
    fn parse_too_many_colons_names_manifest() {
        let err = MountSpec::parse("/a:/b:/c:ro").unwrap_err();

        assert!(err.contains("manifest"), "{err}");
    }

    #[test]
    fn parse_empty_guest_refused() {
        let err = MountSpec::parse("/a::ro").unwrap_err();

        assert!(err.contains("empty guest directory"), "{err}");
    }

    #[test]
    fn check_valid_mounts_no_errors() {
        let e = errors(&[m("/srv/a", None), m("/srv/b", Some("/mnt/b,x=y"))]);

        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn check_control_character_in_host_refused() {
        let e = errors(&[m("/srv/a\nb", None)]);

        assert_eq!(e[0].path, "spec.mounts[0].hostPath");
        assert!(e[0].message.contains("\\n"), "{}", e[0].message);
    }

    #[test]
    fn check_space_in_guest_refused() {
        let e = errors(&[m("/srv/a", Some("/mnt/a b"))]);

        assert_eq!(e[0].path, "spec.mounts[0].guestPath");
    }

    #[test]
    fn check_relative_guest_refused() {
        let e = errors(&[m("/srv/a", Some("mnt/a"))]);

        assert!(e[0].message.contains("not absolute"), "{}", e[0].message);
    }

    #[test]
    fn check_system_guest_dir_refused() {
        let e = errors(&[
            m("/home", None),
            m("/srv/a", Some("/etc/ssh")),
            m("/srv/b", Some("/usr/")),
        ]);

        assert_eq!(e.len(), 3, "{e:?}");
        assert_eq!(e[0].path, "spec.mounts[0].hostPath");
    }

    #[test]
    fn check_dotdot_guest_refused() {
        let e = errors(&[m("/srv/a", Some("/mnt/../etc"))]);

        assert!(e[0].message.contains(".."), "{}", e[0].message);
    }

    #[test]
    fn check_duplicate_guest_refused() {
        let e = errors(&[m("/srv/a", Some("/mnt/x")), m("/srv/b", Some("/mnt/x"))]);

        assert_eq!(e[0].path, "spec.mounts[1]");
    }

    #[test]
    fn check_too_many_refused() {
        let many: Vec<MountSpec> = (0..=MAX_MOUNTS).map(|i| m(&format!("/srv/{i}"), None)).collect();

        let e = errors(&many);

        assert!(e[0].message.contains("limit"), "{}", e[0].message);
    }
}
