//! Error fix texts as data: [`EngineError::fix`] is the remedy an error's message ends with
//! (`...: run X`), so a controller can put the cause and the fix in a condition's message, or
//! show the fix apart, without parsing the CLI's wording. The message itself is unchanged:
//! `diagnostic().message` is `to_string()`, and `cause` + ": " + `fix` rebuilds it where the
//! fix ends it.

use serde::Serialize;

use crate::readiness::{Failure, ReadinessError};
use crate::EngineError;

/// An error as data: the whole message, its cause, and the fix when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnostic {
    /// The message as the CLI prints it.
    pub message: String,
    /// What went wrong: the message without its fix.
    pub cause: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
    /// The error's kind, CamelCase as a condition's reason (`NotFound`, `InvalidState`, ...).
    pub kind: String,
}

impl EngineError {
    /// The remedy the message names, when it names one.
    pub fn fix(&self) -> Option<String> {
        use nubo_backend::BackendError as B;
        Some(match self {
            EngineError::NotFound(_) => "`nubo vm ls` lists the VMs".to_owned(),
            EngineError::Conflict { name, .. } => {
                format!("remove it first (`nubo vm rm --force {name}`) or use another name")
            }
            EngineError::Busy { .. } => "wait for that command to finish and retry".to_owned(),
            EngineError::Cancelled { .. } => "run the command again".to_owned(),
            EngineError::InvalidState { fix, .. } | EngineError::Unavailable { fix, .. } => fix.clone(),
            EngineError::Corrupt { .. } => {
                "remove the VM with `nubo vm rm --force` (its record cannot be trusted)".to_owned()
            }
            EngineError::CorruptSettings { .. } => {
                "delete it (it only holds the default backend) or fix its JSON".to_owned()
            }
            EngineError::SnapshotNotFound { vm, .. } => format!("`nubo vm snapshot ls {vm}` lists them"),
            EngineError::SnapshotExists { vm, snapshot } => {
                format!("pick another name, or remove it first (`nubo vm snapshot rm {vm} {snapshot}`)")
            }
            EngineError::DiskChain { name, base, .. } => format!(
                "put back the base image `{}` the VM was made from, or remove the VM (`nubo vm rm {name}`) and create it again from a disk you trust",
                base.display()
            ),
            EngineError::Readiness(e) => return e.fix(),
            EngineError::Backend(B::Unsupported { alternative, .. }) => format!("use {alternative}"),
            EngineError::Backend(B::PortInUse { fix, .. }) => fix.clone(),
            EngineError::Backend(B::BadState { name, .. }) => {
                format!("remove the VM with `nubo vm rm --force {name}`")
            }
            // Spec and name errors carry a fix per field; the errors of the crates below and
            // any variant added later have none that is apart from their message.
            _ => return None,
        })
    }

    /// The error as data: message, cause, fix and kind.
    pub fn diagnostic(&self) -> Diagnostic {
        diagnostic(self.to_string(), self.fix(), self.kind())
    }
}

impl ReadinessError {
    /// The remedy the message names, when it names one.
    pub fn fix(&self) -> Option<String> {
        let log = self.console_log.display();
        Some(match &self.failure {
            Failure::VmmExited => format!("see the console log {log}"),
            Failure::BootFailed => format!("try `--machine pc`; console log {log}"),
            Failure::SeedNotRead { .. } => format!("`nubo seed inspect` shows what the seed holds; console log {log}"),
            Failure::TimedOut { .. } => format!("see the console log {log}"),
            Failure::AddressNeverAnswered { .. } => {
                format!("check the guest's network-config in its seed and its console log {log}")
            }
            Failure::CloudInitErrors { .. } | Failure::CloudInitFailed | Failure::AddressUnverifiable { .. } => {
                return None
            }
        })
    }
}

fn diagnostic(message: String, fix: Option<String>, kind: nubo_core::ErrorKind) -> Diagnostic {
    // The cause is what precedes the fix; a fix inside the message (not at its end) leaves
    // the whole message as the cause.
    let cause = fix
        .as_deref()
        .and_then(|f| message.find(f).map(|i| &message[..i]))
        .map(|c| c.trim_end_matches([' ', ':', ';']).to_owned())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| message.clone());
    Diagnostic {
        cause,
        fix,
        kind: format!("{kind:?}"),
        message,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::readiness::{Phase, WaitFor};

    fn readiness(failure: Failure) -> EngineError {
        EngineError::Readiness(ReadinessError {
            failure,
            last_phase: Some(Phase::KernelBooting),
            evidence: Some("Kernel panic - not syncing".into()),
            console_log: PathBuf::from("/vms/web/console.log"),
        })
    }

    /// Every error that names a fix, with the fix its message ends with.
    fn with_fixes() -> Vec<EngineError> {
        vec![
            EngineError::NotFound("web".into()),
            EngineError::Conflict {
                name: "web".into(),
                differences: vec!["spec.resources.vcpus: 1 -> 2".into()],
            },
            EngineError::Busy {
                name: "web".into(),
                holder: "pid 42".into(),
            },
            EngineError::Cancelled {
                what: "waiting for vm `web`'s lock".into(),
            },
            EngineError::InvalidState {
                name: "web".into(),
                state: "stopped".into(),
                fix: "start it first: `nubo vm start web`".into(),
            },
            EngineError::Corrupt {
                path: "/vms/web/vm.json".into(),
                detail: "EOF".into(),
            },
            EngineError::CorruptSettings {
                path: "/nubo/settings.json".into(),
                detail: "EOF".into(),
            },
            EngineError::SnapshotNotFound {
                vm: "web".into(),
                snapshot: "s1".into(),
            },
            EngineError::SnapshotExists {
                vm: "web".into(),
                snapshot: "s1".into(),
            },
            EngineError::DiskChain {
                name: "web".into(),
                base: "/images/base.qcow2".into(),
                detail: "its backing file changed".into(),
            },
            EngineError::Unavailable {
                what: "KVM".into(),
                fix: "add yourself to the kvm group".into(),
            },
            EngineError::Backend(nubo_backend::BackendError::unsupported(
                "libvirt",
                "pause",
                "the qemu backend",
            )),
            EngineError::Backend(nubo_backend::BackendError::BadState {
                name: "web".into(),
                detail: "bad JSON".into(),
            }),
            readiness(Failure::BootFailed),
            readiness(Failure::SeedNotRead {
                datasource: "DataSourceNone".into(),
            }),
            readiness(Failure::TimedOut {
                after_secs: 60,
                target: WaitFor::CloudInit,
            }),
            readiness(Failure::VmmExited),
            readiness(Failure::AddressNeverAnswered {
                address: "10.0.0.9".into(),
                after_secs: 60,
            }),
        ]
    }

    #[test]
    fn fix_each_error_with_one_is_the_end_of_its_message() {
        for e in with_fixes() {
            let (message, fix) = (e.to_string(), e.fix());

            let fix = fix.unwrap_or_else(|| panic!("no fix for: {message}"));
            assert!(message.ends_with(&fix), "{message:?} does not end with {fix:?}");
        }
    }

    #[test]
    fn diagnostic_each_error_cause_and_fix_rebuild_the_message() {
        for e in with_fixes() {
            let d = e.diagnostic();

            assert_eq!(d.message, e.to_string());
            let fix = d.fix.clone().unwrap();
            assert!(!d.cause.is_empty() && !d.cause.contains(&fix), "{d:?}");
            assert!(d.message.starts_with(&d.cause), "{d:?}");
        }
    }

    #[test]
    fn diagnostic_error_without_fix_is_its_message_as_cause() {
        let e = EngineError::SnapshotDescription("too long".into());

        let d = e.diagnostic();

        assert_eq!((d.fix, d.cause), (None, e.to_string()));
    }

    #[test]
    fn diagnostic_not_found_serialises_camel_case_with_kind() {
        let d = EngineError::NotFound("web".into()).diagnostic();

        let v = serde_json::to_value(&d).unwrap();

        assert_eq!(v["cause"], "vm `web` does not exist");
        assert_eq!(v["fix"], "`nubo vm ls` lists the VMs");
        assert_eq!(v["kind"], "NotFound");
    }
}
