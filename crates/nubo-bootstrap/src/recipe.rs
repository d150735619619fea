//! What an image is built from, and the key that names that recipe.

use nubo_core::size::{GIB, MIB};
use nubo_core::ByteSize;

use crate::error::BootstrapError;

/// Bumped whenever the build steps change what ends up in the image, so every cache keyed on
/// [`Recipe::key`] (the live tests' fixture, a user's store) rebuilds instead of reusing a stale one.
pub const RECIPE_VERSION: u32 = 1;

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
}

const RELEASES: &[Release] = &[
    Release {
        os: "debian",
        version: "12",
        suite: "bookworm",
    },
    Release {
        os: "debian",
        version: "13",
        suite: "trixie",
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
        if let Some(bad) = extra_packages.iter().find(|p| !is_package_name(p)) {
            return Err(BootstrapError::BadPackage(bad.clone()));
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

/// Debian policy §5.6.1: lowercase alphanumerics and `+ - .`, at least two characters, starting
/// alphanumeric. Checked because the names reach mmdebstrap's command line.
fn is_package_name(p: &str) -> bool {
    p.len() >= 2
        && p.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && p.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '+' | '-' | '.'))
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
