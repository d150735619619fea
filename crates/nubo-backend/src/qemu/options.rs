//! The qemu backend's own options (a spec's `overrides.qemu`): QEMU vocabulary the neutral
//! spec does not speak.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{BackendError, MachineKind};

pub const KEYS: &[&str] = &["machine", "accel"];

/// QEMU's machine type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Machine {
    Pc,
    Q35,
    Microvm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// KVM where a probe shows it runs stock kernels, else TCG (and the reason is said).
    #[default]
    Auto,
    Kvm,
    Tcg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QemuOptions {
    pub machine: Machine,
    pub accel: Accel,
}

/// Parses `overrides.qemu` for a machine of `kind`. Pure.
pub fn parse(kind: MachineKind, options: &BTreeMap<String, String>) -> Result<QemuOptions, BackendError> {
    let mut o = QemuOptions {
        machine: match kind {
            MachineKind::Default => Machine::Pc,
            MachineKind::Microvm => Machine::Microvm,
        },
        accel: Accel::Auto,
    };
    for (k, v) in options {
        match (k.as_str(), v.as_str()) {
            ("machine", "pc") if kind == MachineKind::Default => o.machine = Machine::Pc,
            ("machine", "q35") if kind == MachineKind::Default => o.machine = Machine::Q35,
            ("machine", "microvm") => o.machine = Machine::Microvm,
            ("machine", other) => {
                return Err(BackendError::InvalidSpec(format!(
                    "qemu machine `{other}` does not fit a {kind:?} machine: use pc or q35 (or machine microvm)"
                )))
            }
            ("accel", "auto") => o.accel = Accel::Auto,
            ("accel", "kvm") => o.accel = Accel::Kvm,
            ("accel", "tcg") => o.accel = Accel::Tcg,
            ("accel", other) => {
                return Err(BackendError::InvalidSpec(format!(
                    "qemu accel `{other}` is unknown: use auto, kvm or tcg"
                )))
            }
            (other, _) => {
                return Err(BackendError::InvalidSpec(format!(
                    "qemu option `{other}` is unknown: the qemu backend takes {}",
                    KEYS.join(", ")
                )))
            }
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn parse_defaults_pc_auto() {
        let o = parse(MachineKind::Default, &BTreeMap::new()).unwrap();

        assert_eq!(
            o,
            QemuOptions {
                machine: Machine::Pc,
                accel: Accel::Auto
            }
        );
    }

    #[test]
    fn parse_q35_tcg() {
        let o = parse(MachineKind::Default, &opts(&[("machine", "q35"), ("accel", "tcg")])).unwrap();

        assert_eq!((o.machine, o.accel), (Machine::Q35, Accel::Tcg));
    }

    #[test]
    fn parse_microvm_kind_refuses_q35() {
        assert!(parse(MachineKind::Microvm, &opts(&[("machine", "q35")])).is_err());
    }

    #[test]
    fn parse_unknown_key_names_known_ones() {
        let err = parse(MachineKind::Default, &opts(&[("smp", "2")]))
            .unwrap_err()
            .to_string();

        assert!(err.contains("machine, accel"), "{err}");
    }
}
