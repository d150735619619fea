//! Firmware lookup for booting a cloud image through its own boot loader, and the kernel
//! formats Cloud Hypervisor loads. Both pure over what the caller found on the host.
//!
//! The search order: `--firmware PATH`, else `$NUBO_HYPERVISOR_FW`, else the first file that
//! exists of `CLOUDHV.fd` in each of [`DIRS`], then `hypervisor-fw` in the same places. The
//! EDK2 build (`CLOUDHV.fd`) comes first because distro cloud images that boot under EDK2 did
//! not boot under rust-hypervisor-firmware in the engine nubo is built from.

use std::path::{Path, PathBuf};

/// Where firmware is looked for, in order: nubo's own locations (local install, package),
/// then Cloud Hypervisor's.
pub const DIRS: &[&str] = &[
    "/usr/local/share/nubo",
    "/usr/share/nubo",
    "/usr/share/cloud-hypervisor",
];
/// EDK2's Cloud Hypervisor build, then rust-hypervisor-firmware.
pub const NAMES: &[&str] = &["CLOUDHV.fd", "hypervisor-fw"];
/// The environment variable naming a firmware file (read once, by whoever builds the backend).
pub const ENV: &str = "NUBO_HYPERVISOR_FW";

/// Every candidate path, in search order: each name in every directory before the next name.
pub fn candidates() -> Vec<PathBuf> {
    NAMES
        .iter()
        .flat_map(|n| DIRS.iter().map(move |d| Path::new(d).join(n)))
        .collect()
}

/// Where firmware came from, for messages and `nubo doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// `$NUBO_HYPERVISOR_FW`.
    Env(PathBuf),
    /// The search of [`candidates`].
    Search(PathBuf),
}

impl Found {
    pub fn path(&self) -> &Path {
        match self {
            Found::Env(p) | Found::Search(p) => p,
        }
    }

    /// EDK2 (UEFI): what `--firmware efi` asks for. rust-hypervisor-firmware boots some images
    /// but is not UEFI enough for every one.
    pub fn is_edk2(&self) -> bool {
        match self {
            Found::Env(_) => true,
            Found::Search(p) => p.file_name().is_some_and(|n| n == NAMES[0]),
        }
    }
}

/// The search (`--firmware PATH` is handled by the caller, before this). `env` is
/// `$NUBO_HYPERVISOR_FW` as read once; `is_file` tells which candidates exist. An `env` that
/// names no file is returned anyway, so the caller refuses it by name instead of silently
/// using another firmware.
pub fn find(env: Option<&Path>, is_file: impl Fn(&Path) -> bool) -> Option<Found> {
    if let Some(p) = env {
        return Some(Found::Env(p.to_path_buf()));
    }
    candidates().into_iter().find(|p| is_file(p)).map(Found::Search)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// An ELF64 `vmlinux` (booted through its PVH entry note).
    Elf,
    /// A Linux bzImage (`HdrS` boot protocol header).
    BzImage,
}

/// How many leading bytes [`kernel_format`] needs.
pub const KERNEL_HEAD: usize = 0x210;

/// What a kernel file is, from its first [`KERNEL_HEAD`] bytes. Pure.
pub fn kernel_format(head: &[u8]) -> Option<KernelFormat> {
    if head.len() >= 5 && head[..4] == *b"\x7fELF" && head[4] == 2 {
        return Some(KernelFormat::Elf);
    }
    if head.len() >= 0x206 && head[0x1fe..0x200] == [0x55, 0xaa] && head[0x202..0x206] == *b"HdrS" {
        return Some(KernelFormat::BzImage);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_order_is_edk2_first_in_every_place() {
        let c = candidates();

        let want: Vec<PathBuf> = [
            "/usr/local/share/nubo/CLOUDHV.fd",
            "/usr/share/nubo/CLOUDHV.fd",
            "/usr/share/cloud-hypervisor/CLOUDHV.fd",
            "/usr/local/share/nubo/hypervisor-fw",
            "/usr/share/nubo/hypervisor-fw",
            "/usr/share/cloud-hypervisor/hypervisor-fw",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(c, want);
    }

    #[test]
    fn find_edk2_in_last_dir_beats_hypervisor_fw_in_first() {
        let present = [
            "/usr/local/share/nubo/hypervisor-fw",
            "/usr/share/cloud-hypervisor/CLOUDHV.fd",
        ];

        let f = find(None, |p| present.iter().any(|q| Path::new(q) == p)).unwrap();

        assert_eq!(f, Found::Search("/usr/share/cloud-hypervisor/CLOUDHV.fd".into()));
        assert!(f.is_edk2());
    }

    #[test]
    fn find_env_beats_search_even_when_missing() {
        let f = find(Some(Path::new("/nowhere/fw")), |_| true).unwrap();

        assert_eq!(f, Found::Env("/nowhere/fw".into()));
    }

    #[test]
    fn find_hypervisor_fw_alone_is_not_edk2() {
        let f = find(None, |p| p == Path::new("/usr/share/nubo/hypervisor-fw")).unwrap();

        assert!(!f.is_edk2());
    }

    #[test]
    fn find_nothing_is_none() {
        assert_eq!(find(None, |_| false), None);
    }

    #[test]
    fn kernel_format_elf64_is_elf() {
        assert_eq!(kernel_format(b"\x7fELF\x02\x01\x01"), Some(KernelFormat::Elf));
    }

    #[test]
    fn kernel_format_bzimage_header_is_bzimage() {
        let mut head = vec![0u8; KERNEL_HEAD];
        head[0x1fe] = 0x55;
        head[0x1ff] = 0xaa;
        head[0x202..0x206].copy_from_slice(b"HdrS");

        assert_eq!(kernel_format(&head), Some(KernelFormat::BzImage));
    }

    #[test]
    fn kernel_format_elf32_or_text_is_none() {
        assert_eq!(kernel_format(b"\x7fELF\x01\x01\x01"), None);
        assert_eq!(kernel_format(b"#!/bin/sh\necho not a kernel\n"), None);
        assert_eq!(kernel_format(b""), None);
    }
}
