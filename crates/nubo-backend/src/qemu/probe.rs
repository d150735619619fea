//! What this host offers QEMU: the accelerator, the binary, firmware. Used by the backend's
//! probe, `nubo doctor` and the live-test skips, so all three agree.

use std::path::PathBuf;

use super::options::Accel;
use crate::BackendError;

// Shared with the other backends; kept here under their old paths.
pub use crate::host::{parse_version, probe_kvm, which, KvmStatus};

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

#[cfg(test)]
mod tests {
    use std::path::Path;

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
