//! What this host offers QEMU: the accelerator, the binary, firmware. Used by the backend's
//! probe, `nubo doctor` and the live-test skips, so all three agree.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use super::options::Accel;
use crate::BackendError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvmStatus {
    /// `/dev/kvm` opens read-write and `KVM_CREATE_VM` succeeds.
    Usable,
    /// The host's KVM is PVM (`kvm_pvm`): it runs only guest kernels built for PVM, and a stock
    /// distro kernel hangs at boot.
    Pvm,
    NoDevice,
    NoPermission(String),
    Broken(String),
}

impl KvmStatus {
    pub fn describe(&self) -> String {
        match self {
            KvmStatus::Usable => "KVM is usable".into(),
            KvmStatus::Pvm => "/dev/kvm is provided by kvm_pvm (PVM), which cannot run stock distro kernels".into(),
            KvmStatus::NoDevice => "/dev/kvm does not exist (no hardware virtualisation, or the kvm module is not loaded: `modprobe kvm_intel` or `kvm_amd`)".into(),
            KvmStatus::NoPermission(e) => format!("/dev/kvm cannot be opened ({e}): add yourself to the `kvm` group (`sudo adduser $USER kvm`, then log in again)"),
            KvmStatus::Broken(e) => format!("KVM_CREATE_VM failed: {e}"),
        }
    }

    /// What makes KVM usable, for `nubo doctor`; `None` when it is.
    pub fn fix(&self) -> Option<String> {
        match self {
            KvmStatus::Usable => None,
            KvmStatus::Pvm => Some(
                "nothing to do for correctness (guests run under TCG here); for KVM speed, run on a host with hardware KVM (kvm_intel or kvm_amd)".into(),
            ),
            KvmStatus::NoDevice => Some(
                "enable virtualisation (VT-x/AMD-V) in the firmware, or load the module: `modprobe kvm_intel` or `modprobe kvm_amd`".into(),
            ),
            KvmStatus::NoPermission(_) => {
                Some("add yourself to the `kvm` group (`sudo adduser $USER kvm`), then log in again".into())
            }
            KvmStatus::Broken(_) => Some("see the kernel log (`dmesg | grep -i kvm`) for why KVM refuses to create a VM".into()),
        }
    }
}

const KVMIO: u8 = 0xAE;
nix::ioctl_write_int_bad!(kvm_create_vm, nix::request_code_none!(KVMIO, 0x01));

/// Probes KVM the way QEMU will use it: module, device, permission, and creating a VM.
pub fn probe_kvm(sys_module: &Path, dev_kvm: &Path) -> KvmStatus {
    if sys_module.join("kvm_pvm").exists() {
        return KvmStatus::Pvm;
    }
    if !dev_kvm.exists() {
        return KvmStatus::NoDevice;
    }
    let f = match OpenOptions::new().read(true).write(true).open(dev_kvm) {
        Ok(f) => f,
        Err(e) => return KvmStatus::NoPermission(e.to_string()),
    };
    // SAFETY: KVM_CREATE_VM takes an integer machine type (0 = default) and returns a new fd or
    // -1; it reads and writes no memory of ours. The returned fd is closed right away.
    #[allow(unsafe_code)]
    let r = unsafe { kvm_create_vm(f.as_raw_fd(), 0) };
    match r {
        Ok(fd) => {
            let _ = nix::unistd::close(fd);
            KvmStatus::Usable
        }
        Err(e) => KvmStatus::Broken(e.to_string()),
    }
}

/// Resolves `--accel auto|kvm|tcg` against the probe: pure, so the policy is unit-tested.
/// Returns the accelerator and the reason, which `vm create` and `doctor` print.
pub fn resolve_accel(requested: Accel, kvm: &KvmStatus) -> Result<(Accel, String), BackendError> {
    match (requested, kvm) {
        (Accel::Tcg, _) => Ok((
            Accel::Tcg,
            "TCG (software emulation) as requested by --accel tcg".into(),
        )),
        (Accel::Kvm, KvmStatus::Usable) => Ok((Accel::Kvm, "KVM as requested".into())),
        (Accel::Kvm, other) => Err(BackendError::Unavailable {
            backend: "qemu",
            why: format!(
                "--accel kvm was requested but {}; use --accel tcg or --accel auto",
                other.describe()
            ),
        }),
        (Accel::Auto, KvmStatus::Usable) => Ok((Accel::Kvm, "KVM (the host supports it)".into())),
        (Accel::Auto, other) => Ok((
            Accel::Tcg,
            format!("TCG, because {} (guests run 10-50x slower)", other.describe()),
        )),
    }
}

/// The UEFI firmware pair: read-only code and the template of the variable store each VM copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ovmf {
    pub code: PathBuf,
    pub vars: PathBuf,
}

/// Where Debian (`ovmf`), Fedora/RHEL (`edk2-ovmf`) and Arch (`edk2-ovmf`) put OVMF.
const OVMF_CANDIDATES: &[(&str, &str)] = &[
    ("/usr/share/OVMF/OVMF_CODE_4M.fd", "/usr/share/OVMF/OVMF_VARS_4M.fd"),
    ("/usr/share/OVMF/OVMF_CODE.fd", "/usr/share/OVMF/OVMF_VARS.fd"),
    ("/usr/share/edk2/ovmf/OVMF_CODE.fd", "/usr/share/edk2/ovmf/OVMF_VARS.fd"),
    (
        "/usr/share/edk2/x64/OVMF_CODE.4m.fd",
        "/usr/share/edk2/x64/OVMF_VARS.4m.fd",
    ),
];

pub fn find_ovmf() -> Option<Ovmf> {
    OVMF_CANDIDATES
        .iter()
        .map(|(c, v)| Ovmf {
            code: PathBuf::from(c),
            vars: PathBuf::from(v),
        })
        .find(|o| o.code.is_file() && o.vars.is_file())
}

/// SeaBIOS, which QEMU loads itself for the pc and q35 machines.
pub const SEABIOS: &str = "/usr/share/seabios/bios-256k.bin";

/// An executable on `PATH`.
pub fn which(cmd: &str, path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(path_var?).map(|d| d.join(cmd)).find(|p| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The host's TSC frequency in kHz, measured against the monotonic clock (median of three
/// 20 ms windows: within about 50 ppm, far inside what the guest kernel tolerates). `None` off
/// x86_64.
pub fn host_tsc_khz() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut samples: Vec<u64> = (0..3)
            .filter_map(|_| {
                let t0 = std::time::Instant::now();
                // SAFETY: RDTSC has no preconditions and touches no memory.
                #[allow(unsafe_code)]
                let c0 = unsafe { core::arch::x86_64::_rdtsc() };
                std::thread::sleep(std::time::Duration::from_millis(20));
                #[allow(unsafe_code)]
                // SAFETY: as above.
                let c1 = unsafe { core::arch::x86_64::_rdtsc() };
                let us = t0.elapsed().as_micros() as u64;
                (us > 0 && c1 > c0).then(|| (c1 - c0) * 1000 / us)
            })
            .collect();
        samples.sort_unstable();
        samples.get(1).copied()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// `QEMU emulator version 10.0.2 (Debian ...)` -> `10.0.2`.
pub fn parse_version(output: &str) -> Option<String> {
    let rest = output.split("version ").nth(1)?;
    let v: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    (!v.is_empty()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// doctor's fix is a fix, not the cause again: every unusable KVM has one of its own.
    #[test]
    fn every_unusable_kvm_has_a_fix_that_is_not_its_description() {
        assert_eq!(KvmStatus::Usable.fix(), None);
        for k in [
            KvmStatus::Pvm,
            KvmStatus::NoDevice,
            KvmStatus::NoPermission("Permission denied".into()),
            KvmStatus::Broken("EINVAL".into()),
        ] {
            let fix = k.fix().unwrap();
            assert_ne!(fix, k.describe());
            assert!(!k.describe().contains(&fix), "{fix}");
        }
    }

    #[test]
    fn resolve_accel_auto_on_pvm_is_tcg_with_reason() {
        let (a, why) = resolve_accel(Accel::Auto, &KvmStatus::Pvm).unwrap();

        assert_eq!(a, Accel::Tcg);
        assert!(why.contains("kvm_pvm"), "{why}");
    }

    #[test]
    fn resolve_accel_auto_usable_is_kvm() {
        assert_eq!(resolve_accel(Accel::Auto, &KvmStatus::Usable).unwrap().0, Accel::Kvm);
    }

    #[test]
    fn resolve_accel_kvm_forced_without_device_is_error() {
        let err = resolve_accel(Accel::Kvm, &KvmStatus::NoDevice).unwrap_err();

        assert!(err.to_string().contains("--accel tcg"), "{err}");
    }

    #[test]
    fn resolve_accel_tcg_always_tcg() {
        assert_eq!(resolve_accel(Accel::Tcg, &KvmStatus::Usable).unwrap().0, Accel::Tcg);
    }

    #[test]
    fn probe_kvm_pvm_module_detected() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("kvm_pvm")).unwrap();

        assert_eq!(probe_kvm(dir.path(), Path::new("/nonexistent")), KvmStatus::Pvm);
    }

    #[test]
    fn probe_kvm_missing_device() {
        let dir = tempfile::tempdir().unwrap();

        assert_eq!(probe_kvm(dir.path(), &dir.path().join("kvm")), KvmStatus::NoDevice);
    }

    #[test]
    fn host_tsc_khz_is_plausible() {
        let khz = host_tsc_khz().unwrap();

        assert!((100_000..10_000_000).contains(&khz), "{khz}");
    }

    #[test]
    fn parse_version_debian_banner() {
        let out = "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright";

        assert_eq!(parse_version(out).as_deref(), Some("10.0.2"));
    }
}
