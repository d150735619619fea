//! The bounds [`crate::VmSpec::validate`] enforces, each with the reason for its value.

use std::time::Duration;

use nubo_core::size::{MIB, TIB};

/// QEMU's q35 machine accepts at most 288 vCPUs; no backend nubo drives goes further.
pub const MAX_VCPUS: u32 = 288;

/// Below 128 MiB a cloud image's kernel, initramfs and cloud-init do not fit: the guest panics
/// or the OOM killer ends cloud-init, long after `create` said yes.
pub const MIN_MEMORY: u64 = 128 * MIB;

/// Every backend takes memory in MiB (QEMU `-m`, libvirt's domain XML, Cloud Hypervisor
/// `--memory size=`); an unaligned size would be rounded silently, so the VM would not get what
/// its spec says.
pub const MEMORY_ALIGN: u64 = MIB;

/// A typo guard (`99999T`): far above any host nubo runs on. [`crate::admit`] then compares the
/// size with the host's real memory.
pub const MAX_MEMORY: u64 = 16 * TIB;

/// A disk's virtual size is counted in 512-byte sectors (qcow2, raw block devices); `qemu-img`
/// rounds anything else up, so the disk would not have the size its spec says.
pub const DISK_ALIGN: u64 = 512;

/// A typo guard (`20T` meant for `20G`): far above what a VM's overlay needs, and within the
/// limits of qcow2 and of the host filesystems the overlay lives on.
pub const MAX_DISK_SIZE: u64 = 64 * TIB;

/// Shorter than a second is never enough for a guest to boot; a typo, not a wish.
pub const MIN_BOOT_TIMEOUT: Duration = Duration::from_secs(1);

/// A day: beyond it a boot is not slow but stuck, and a wait should say so. Keeps every
/// `Instant + timeout` far from overflow (a `18446744073709551615s` timeout once panicked).
pub const MAX_BOOT_TIMEOUT: Duration = Duration::from_secs(24 * 60 * 60);

/// Each seed file's limit ([`nubo_core::limits::MAX_SEED_FILE_SIZE`], 16 MiB): checked here, before the engine
/// takes the VM's lock or writes its record and overlay, not when the seed is built.
pub const MAX_PAYLOAD: u64 = nubo_core::limits::MAX_SEED_FILE_SIZE;

/// Real key lines (RSA-16384 with a long comment) are under 3 KiB; 16 KiB refuses a pasted file,
/// not a key.
pub const MAX_SSH_KEY: usize = 16 * 1024;

/// Keeps the generated `#cloud-config` (100 keys of [`MAX_SSH_KEY`] = 1.6 MiB) well under
/// [`MAX_PAYLOAD`].
pub const MAX_SSH_KEYS: usize = 100;

/// The key types OpenSSH accepts in `authorized_keys` (certificates use the same prefixes with
/// `-cert-v01@openssh.com`).
pub const SSH_KEY_TYPES: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-dss",
];

/// POSIX user names are at most 32 bytes on Linux (`UT_NAMESIZE`, shadow's `LOGIN_NAME_MAX`).
pub const MAX_SSH_USER: usize = 32;

/// Linux's `COMMAND_LINE_SIZE` is 2048 on x86-64 and arm64 and 4096 on others: 4096 refuses only
/// what no kernel takes; a backend may refuse less.
pub const MAX_CMDLINE: usize = 4096;

/// `PATH_MAX` on Linux.
pub const MAX_PATH: usize = 4096;

/// Docker's and the OCI distribution spec's limit on a reference's name; catalog names are far
/// shorter.
pub const MAX_IMAGE_REFERENCE: usize = 255;

/// Web servers refuse request lines longer than 8 KiB (nginx, Apache defaults).
pub const MAX_URL: usize = 8 * 1024;

/// Backend ids are short words (`qemu`, `cloud-hypervisor`); 32 leaves room for remote ones.
pub const MAX_BACKEND: usize = 32;

/// libvirt network names become file names and bridge labels; 64 covers every real one.
pub const MAX_NETWORK_NAME: usize = 64;

/// Override keys name one backend option (`machine`, `accel`, `cpu`).
pub const MAX_OVERRIDE_KEY: usize = 64;

/// An override value reaches a backend's argv or XML; a CPU model with its flags stays under 1 KiB.
pub const MAX_OVERRIDE_VALUE: usize = 1024;

/// More overrides per backend than any backend has options means a generated or pasted mistake.
pub const MAX_OVERRIDES: usize = 64;
