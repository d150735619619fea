//! What an image is built from, and the key that names that recipe.

use nubo_core::size::{GIB, MIB};
use nubo_core::ByteSize;

use crate::error::BootstrapError;

/// Bumped whenever the build steps change what ends up in the image, so every cache keyed on
/// [`Recipe::key`] (the live tests' fixture, a user's store) rebuilds instead of reusing a stale one.
/// 2: every identifier derived from the key, times clamped (reproducible images).
/// 3: boot speed (issue 25): cloud-init trimmed, ed25519 host key only at first boot, a listed-
/// modules initramfs, timestamp-checked .pyc, idle units masked.
/// 4: sshd is not reloaded when the other host keys appear after cloud-init (the reload reset
/// connections made just after cloud-init's closing line).
/// 5: cloud-init imported once per boot: a zygote forks each of the four stages (issue 25).
pub const RECIPE_VERSION: u32 = 5;

/// The packages of every image, on top of `--variant=minbase` (no recommends). Each one is here
/// because a cloud image cannot do without it:
pub const BASE_PACKAGES: &[&str] = &[
    // init and device management; dbus for hostnamectl/timedatectl, which cloud-init calls
    "systemd-sysv",
    "udev",
    "dbus",
    // the kernel built for VMs (virtio, no hardware drivers), and the initramfs that finds root by UUID
    "linux-image-cloud-amd64",
    "initramfs-tools",
    // the personalisation itself; growpart for cloud-init's cc_growpart
    "cloud-init",
    "cloud-guest-utils",
    // cloud-init renders ENI for DHCP on the first NIC; ifupdown needs a DHCP client to do it
    "ifupdown",
    "isc-dhcp-client",
    "iproute2",
    // cloud-init gives the default user sudo; resize2fs for cc_resizefs (not in minbase since bookworm)
    "sudo",
    "e2fsprogs",
    "openssh-server",
    // named explicitly because apt without recommends otherwise leaves cloud-init unable to configure
    "python3-cffi-backend",
];

/// Room the root filesystem needs above the ~450 MiB of packages, so first boot can write logs.
pub const MIN_SIZE: ByteSize = ByteSize(GIB);
pub const DEFAULT_SIZE: ByteSize = ByteSize(2 * GIB);

/// A Debian release nubo knows how to bootstrap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    pub os: &'static str,
    /// The canonical tag (`12`).
    pub version: &'static str,
    pub suite: &'static str,
    /// The release's date (Unix seconds): `SOURCE_DATE_EPOCH` while packages install, and the
    /// floor of the epoch the image's times are clamped to (see `facts::source_date_epoch`).
    pub released: u64,
}

const RELEASES: &[Release] = &[
    Release {
        os: "debian",
        version: "12",
        suite: "bookworm",
        // 2023-06-10
        released: 1_686_355_200,
    },
    Release {
        os: "debian",
        version: "13",
        suite: "trixie",
        // 2025-08-09
        released: 1_754_697_600,
    },
];

impl Release {
    /// `name`/`tag` as an image reference spells them (aliases already canonicalised, but the
    /// code name is accepted too).
    pub fn find(name: &str, tag: &str) -> Result<Release, BootstrapError> {
        RELEASES
            .iter()
            .find(|r| r.os == name && (r.version == tag || r.suite == tag))
            .copied()
            .ok_or_else(|| BootstrapError::UnknownRelease(format!("{name}:{tag}")))
    }
}

/// Everything that decides the bytes of a bootstrapped image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    pub release: Release,
    /// The archive root, e.g. `http://<debian mirror>/debian`.
    pub mirror: String,
    pub size: ByteSize,
    /// `--package` additions, kept in the user's order (apt does not care; the key sorts them).
    pub extra_packages: Vec<String>,
}

impl Recipe {
    pub fn new(
        release: Release,
        mirror: String,
        size: ByteSize,
        extra_packages: Vec<String>,
    ) -> Result<Recipe, BootstrapError> {
        if size < MIN_SIZE {
            return Err(BootstrapError::TooSmall { size, min: MIN_SIZE });
        }
        if let Some(bad) = extra_packages.iter().find(|p| !is_package_spec(p)) {
            return Err(BootstrapError::BadPackage(quote(bad)));
        }
        if let Err(why) = check_mirror(&mirror) {
            return Err(BootstrapError::BadMirror {
                mirror: quote(&mirror),
                why,
            });
        }
        // Whole MiB keep every partition boundary aligned.
        let size = ByteSize(size.bytes() / MIB * MIB);
        Ok(Recipe {
            release,
            mirror: mirror.trim_end_matches('/').to_owned(),
            size,
            extra_packages,
        })
    }

    /// Base and extra packages, sorted and deduplicated.
    pub fn packages(&self) -> Vec<String> {
        let mut all: Vec<String> = BASE_PACKAGES
            .iter()
            .map(|s| s.to_string())
            .chain(self.extra_packages.clone())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// The canonical text the key hashes: one `field=value` a line.
    pub fn canonical(&self) -> String {
        format!(
            "nubo-bootstrap recipe {RECIPE_VERSION}\nos={}\nsuite={}\narch=amd64\nmirror={}\nsize={}\npackages={}\n",
            self.release.os,
            self.release.suite,
            self.mirror,
            self.size.bytes(),
            self.packages().join(",")
        )
    }

    /// `sha256:<hex>` of [`canonical`](Self::canonical): what the image record's `recipe` holds.
    pub fn key(&self) -> String {
        format!("sha256:{}", crate::digest::hex(self.canonical().as_bytes()))
    }
}

/// A package as apt takes it: `NAME`, `NAME=VERSION` or `NAME/SUITE`. Checked because it reaches
/// mmdebstrap's command line (`--include=a,b`): no character here can start an option, end
/// the list or leave the argument.
fn is_package_spec(p: &str) -> bool {
    if let Some((name, version)) = p.split_once('=') {
        is_package_name(name) && is_version(version)
    } else if let Some((name, suite)) = p.split_once('/') {
        is_package_name(name) && is_suite(suite)
    } else {
        is_package_name(p)
    }
}

/// Debian policy §5.6.1: lowercase alphanumerics and `+ - .`, at least two characters, starting
/// alphanumeric.
pub(crate) fn is_package_name(p: &str) -> bool {
    p.len() >= 2
        && p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && p.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '-' | '.'))
}

/// Debian policy §5.6.12: `[epoch:]upstream[-revision]`, alphanumerics and `. + ~ : -`; the
/// upstream part starts with a digit (so does an epoch).
fn is_version(v: &str) -> bool {
    v.starts_with(|c: char| c.is_ascii_digit())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '~' | ':' | '-'))
}

/// A suite or code name as apt's `pkg/suite` takes it (`bookworm-backports`, `stable`).
fn is_suite(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-'))
}

/// URL schemes mmdebstrap is given: the archive over HTTP(S), or a local mirror on disk.
const MIRROR_SCHEMES: &[&str] = &["http://", "https://", "file:/"];

/// Why `m` is not a Debian archive URL nubo passes to mmdebstrap, or `Ok`. mmdebstrap also
/// takes a mirror argument that is a file of apt sources, `-` for stdin or a whole `deb ...`
/// line: only a URL with a scheme is accepted, with nothing that would split it into words.
fn check_mirror(m: &str) -> Result<(), String> {
    let Some(scheme) = MIRROR_SCHEMES.iter().find(|s| m.starts_with(**s)) else {
        return Err("it is not an http://, https:// or file:/ URL".into());
    };
    if let Some(c) = m
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '\'' | '"' | '`' | '\\' | '<' | '>' | '{' | '}' | '|' | '^'))
    {
        return Err(format!(
            "`{}` is not allowed in a URL (percent-encode it; write an international host name in its xn-- form)",
            c.escape_default()
        ));
    }
    if m.len() == scheme.len() {
        return Err("it has no host or path".into());
    }
    Ok(())
}

/// At most 60 characters of user text, control characters escaped, for an error message.
fn quote(text: &str) -> String {
    let shown: String = text.chars().take(60).collect();
    let cut = if shown.len() < text.len() { "..." } else { "" };
    format!("{}{cut}", nubo_core::file::escape_control(&shown))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bookworm() -> Release {
        Release::find("debian", "12").unwrap()
    }

    #[test]
    fn find_code_name_is_same_release() {
        assert_eq!(Release::find("debian", "bookworm").unwrap(), bookworm());
    }

    #[test]
    fn find_ubuntu_is_unknown() {
        assert!(matches!(
            Release::find("ubuntu", "24.04"),
            Err(BootstrapError::UnknownRelease(_))
        ));
    }

    #[test]
    fn key_ignores_package_order_and_duplicates() {
        let a = Recipe::new(
            bookworm(),
            "http://m/debian".into(),
            DEFAULT_SIZE,
            vec!["vim".into(), "curl".into()],
        );
        let b = Recipe::new(
            bookworm(),
            "http://m/debian/".into(),
            DEFAULT_SIZE,
            vec!["curl".into(), "vim".into(), "sudo".into()],
        );

        assert_eq!(a.unwrap().key(), b.unwrap().key());
    }

    #[test]
    fn key_changes_with_size() {
        let a = Recipe::new(bookworm(), "http://m/debian".into(), DEFAULT_SIZE, vec![]).unwrap();
        let b = Recipe::new(bookworm(), "http://m/debian".into(), ByteSize(3 * GIB), vec![]).unwrap();

        assert_ne!(a.key(), b.key());
    }

    #[test]
    fn new_too_small_refused() {
        let r = Recipe::new(bookworm(), "http://m/debian".into(), ByteSize(512 * MIB), vec![]);

        assert!(matches!(r, Err(BootstrapError::TooSmall { .. })));
    }

    #[test]
    fn new_shell_metacharacter_package_refused() {
        let r = Recipe::new(
            bookworm(),
            "http://m/debian".into(),
            DEFAULT_SIZE,
            vec!["vim;reboot".into()],
        );

        assert!(matches!(r, Err(BootstrapError::BadPackage(_))));
    }

    fn with_packages(p: &[&str]) -> Result<Recipe, BootstrapError> {
        Recipe::new(
            bookworm(),
            "http://m/debian".into(),
            DEFAULT_SIZE,
            p.iter().map(|s| s.to_string()).collect(),
        )
    }

    fn with_mirror(m: &str) -> Result<Recipe, BootstrapError> {
        Recipe::new(bookworm(), m.into(), DEFAULT_SIZE, vec![])
    }

    #[test]
    fn new_option_shaped_packages_refused() {
        for p in [
            "-x",
            "--customize-hook=touch /tmp/x",
            "-oProxyCommand=x",
            "vim,--customize-hook=x",
        ] {
            let r = with_packages(&[p]);

            assert!(matches!(r, Err(BootstrapError::BadPackage(_))), "{p}: {r:?}");
        }
    }

    #[test]
    fn new_version_and_suite_pins_accepted() {
        let r = with_packages(&["vim=2:9.0.1378-2", "curl/bookworm-backports", "g++"]);

        assert!(r.is_ok(), "{r:?}");
    }

    #[test]
    fn new_bad_version_or_suite_refused() {
        for p in ["vim=", "vim=abc", "vim=1 x", "vim/", "vim/-x", "vim=1=2", "vim/a/b"] {
            let r = with_packages(&[p]);

            assert!(matches!(r, Err(BootstrapError::BadPackage(_))), "{p}: {r:?}");
        }
    }

    #[test]
    fn new_bad_package_error_escapes_control_characters() {
        let e = with_packages(&["\x1b[2Jvim"]).unwrap_err();

        assert!(
            !e.to_string().contains('\x1b') && e.to_string().contains("\\u{1b}"),
            "{e}"
        );
    }

    #[test]
    fn new_option_shaped_or_non_url_mirrors_refused() {
        for m in [
            "--customize-hook=touch /tmp/x",
            "-x",
            "-",
            "/etc/apt/sources.list",
            "deb http://m/debian bookworm main",
            "http://m/debian extra",
            "http://m/debian\ndeb http://evil/ x main",
            "http://",
            "ftp://m/debian",
            "http://m/debian'$(touch /tmp/x)'",
        ] {
            let r = with_mirror(m);

            assert!(matches!(r, Err(BootstrapError::BadMirror { .. })), "{m}: {r:?}");
        }
    }

    #[test]
    fn new_mirror_urls_accepted() {
        for m in [
            "http://deb.debian.org/debian",
            "https://m.example:8443/debian/",
            "file:///srv/mirror/debian",
            "file:/srv/mirror/debian",
        ] {
            assert!(with_mirror(m).is_ok(), "{m}");
        }
    }

    #[test]
    fn canonical_lists_base_packages() {
        let r = Recipe::new(bookworm(), "http://m/debian".into(), DEFAULT_SIZE, vec![]).unwrap();

        assert!(
            r.canonical().contains("cloud-guest-utils,cloud-init,dbus"),
            "{}",
            r.canonical()
        );
    }
}
