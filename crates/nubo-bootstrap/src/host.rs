//! What the build needs from the host, probed once up front so a missing piece is named with
//! the Debian package that provides it before any minute is spent building.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::BootstrapError;

/// Each executable the build runs, and its Debian package.
pub const TOOLS: &[(&str, &str)] = &[
    ("mmdebstrap", "mmdebstrap"),
    ("sfdisk", "fdisk"),
    ("mkfs.ext4", "e2fsprogs"),
    ("e2fsck", "e2fsprogs"),
    ("mkfs.vfat", "dosfstools"),
    ("mmd", "mtools"),
    ("mcopy", "mtools"),
    ("grub-mkimage", "grub-common"),
    ("qemu-img", "qemu-utils"),
];

/// GRUB's platform directories: boot.img and the modules grub-mkimage links in.
pub const GRUB_BIOS_DIR: &str = "/usr/lib/grub/i386-pc";
pub const GRUB_EFI_DIR: &str = "/usr/lib/grub/x86_64-efi";

/// Where tools are looked for besides `PATH`: a non-root user's `PATH` on Debian lacks the sbin
/// directories that hold sfdisk and mkfs.
const SBIN: &[&str] = &["/usr/local/sbin", "/usr/sbin", "/sbin"];

/// How mmdebstrap gets the privileges to make files owned by root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Running as root: mmdebstrap's `root` mode, everything else runs directly.
    Root,
    /// A user with subordinate ids and user namespaces: mmdebstrap's `unshare` mode, and the
    /// steps that read the root tree run under `mmdebstrap --unshare-helper`.
    Unshare,
}

impl Mode {
    pub fn mmdebstrap_mode(self) -> &'static str {
        match self {
            Mode::Root => "root",
            Mode::Unshare => "unshare",
        }
    }
}

/// Absolute paths of every tool, resolved once.
#[derive(Debug, Clone)]
pub struct Host {
    pub mode: Mode,
    tools: Vec<(&'static str, PathBuf)>,
}

impl Host {
    /// [`Host::probe_in`] this process's `$PATH`, read now.
    pub fn probe() -> Result<Host, BootstrapError> {
        Host::probe_in(std::env::var_os("PATH").as_deref())
    }

    /// Probes tools (on `path`, then the sbin directories), GRUB's files and privileges;
    /// every missing thing is reported at once.
    pub fn probe_in(path: Option<&std::ffi::OsStr>) -> Result<Host, BootstrapError> {
        let mut dirs: Vec<PathBuf> = path.map(|p| std::env::split_paths(p).collect()).unwrap_or_default();
        dirs.extend(SBIN.iter().map(PathBuf::from));
        let mut tools = Vec::new();
        let mut missing = Vec::new();
        for (cmd, pkg) in TOOLS {
            match find_in(&dirs, cmd) {
                Some(p) => tools.push((*cmd, p)),
                None => missing.push((cmd.to_string(), pkg.to_string())),
            }
        }
        for (file, pkg) in [
            (format!("{GRUB_BIOS_DIR}/boot.img"), "grub-pc-bin"),
            (format!("{GRUB_EFI_DIR}/linux.mod"), "grub-efi-amd64-bin"),
        ] {
            if !Path::new(&file).is_file() {
                missing.push((file, pkg.to_owned()));
            }
        }
        let mode = match probe_mode(&dirs) {
            Ok(m) => m,
            Err(Privilege::Tools(t)) => {
                missing.extend(t);
                Mode::Unshare
            }
            Err(Privilege::Denied(why)) => {
                if missing.is_empty() {
                    return Err(BootstrapError::NoPrivilege(why));
                }
                Mode::Unshare
            }
        };
        if !missing.is_empty() {
            return Err(BootstrapError::MissingTools(missing));
        }
        Ok(Host { mode, tools })
    }

    /// The resolved path of `cmd`, one of [`TOOLS`].
    pub fn tool(&self, cmd: &str) -> &Path {
        self.tools
            .iter()
            .find(|(c, _)| *c == cmd)
            .map(|(_, p)| p.as_path())
            .expect("every tool the build runs is listed in TOOLS and was found by probe")
    }
}

enum Privilege {
    Tools(Vec<(String, String)>),
    Denied(String),
}

fn probe_mode(dirs: &[PathBuf]) -> Result<Mode, Privilege> {
    // /proc/self belongs to the effective uid: no libc call needed.
    let uid = fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(u32::MAX);
    if uid == 0 {
        return Ok(Mode::Root);
    }
    let missing: Vec<_> = ["newuidmap", "newgidmap"]
        .iter()
        .filter(|c| find_in(dirs, c).is_none())
        .map(|c| (c.to_string(), "uidmap".to_owned()))
        .collect();
    if !missing.is_empty() {
        return Err(Privilege::Tools(missing));
    }
    let read = |p: &str| fs::read_to_string(p).ok().map(|s| s.trim().to_owned());
    let user = user_name(uid);
    unshare_denial(
        read("/proc/sys/kernel/unprivileged_userns_clone").as_deref(),
        read("/proc/sys/user/max_user_namespaces").as_deref(),
        read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref(),
        &fs::read_to_string("/etc/subuid").unwrap_or_default(),
        uid,
        user.as_deref(),
    )
    .map_or(Ok(Mode::Unshare), |why| Err(Privilege::Denied(why)))
}

/// Why this host refuses mmdebstrap's unshare mode to `uid`, or `None` when it allows it.
fn unshare_denial(
    userns_clone: Option<&str>,
    max_userns: Option<&str>,
    apparmor_restrict: Option<&str>,
    subuid: &str,
    uid: u32,
    user: Option<&str>,
) -> Option<String> {
    if userns_clone == Some("0") {
        return Some(
            "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0): run as root, or `sysctl -w kernel.unprivileged_userns_clone=1`".into(),
        );
    }
    if max_userns == Some("0") {
        return Some(
            "user namespaces are disabled (user.max_user_namespaces=0): run as root, or raise that sysctl".into(),
        );
    }
    if apparmor_restrict == Some("1") {
        return Some("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1): run as root".into());
    }
    let has_range = subuid.lines().any(|l| {
        let owner = l.split(':').next().unwrap_or("");
        owner == uid.to_string() || Some(owner) == user
    });
    if !has_range {
        let who = user.map_or(uid.to_string(), str::to_owned);
        return Some(format!("user `{who}` has no subordinate ids in /etc/subuid: run as root, or `usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {who}`"));
    }
    None
}

fn user_name(uid: u32) -> Option<String> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 2 && f[2] == uid.to_string()).then(|| f[0].to_owned())
    })
}

/// `cmd` on this process's `PATH`, then in the sbin directories: for tools only some outputs
/// need (the ISO's), probed when asked for.
pub fn find_tool(cmd: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(SBIN.iter().map(PathBuf::from));
    find_in(&dirs, cmd)
}

fn find_in(dirs: &[PathBuf], cmd: &str) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(cmd)).find(|p| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unshare_denial_allowed_with_subuid_range() {
        assert_eq!(
            unshare_denial(
                Some("1"),
                Some("1000"),
                None,
                "alice:100000:65536\n",
                1000,
                Some("alice")
            ),
            None
        );
    }

    #[test]
    fn unshare_denial_sysctl_off_names_sysctl() {
        let why = unshare_denial(Some("0"), None, None, "", 1000, Some("alice")).unwrap();

        assert!(why.contains("kernel.unprivileged_userns_clone"), "{why}");
    }

    #[test]
    fn unshare_denial_no_subuid_names_usermod() {
        let why = unshare_denial(None, Some("1000"), None, "bob:100000:65536\n", 1000, Some("alice")).unwrap();

        assert!(why.contains("usermod --add-subuids") && why.contains("alice"), "{why}");
    }

    #[test]
    fn find_in_skips_non_executable() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("tool"), "x").unwrap();

        assert_eq!(find_in(&[dir.path().to_path_buf()], "tool"), None);
    }
}
