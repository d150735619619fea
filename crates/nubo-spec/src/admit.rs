//! Admission: the resolved resources against what the host has, before any file is written.
//! Pure: the caller gathers [`HostFacts`] once (`/proc/meminfo`, `available_parallelism`).

use nubo_core::size::MIB;
use nubo_core::ByteSize;

use crate::error::{FieldError, SpecErrors};
use crate::field::Field;

/// What the host has, as the caller measured it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFacts {
    /// Total physical memory in bytes (`MemTotal`).
    pub memory_bytes: u64,
    /// CPUs this process may run on.
    pub cpus: u32,
}

/// The resources a VM will actually get, after the spec's `None`s took the image's or the
/// engine's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResolvedResources {
    pub vcpus: u32,
    /// Guest memory in bytes.
    pub memory: u64,
}

/// Refuses memory beyond the host's total (the guest could never get it, and the host would
/// swap or kill); returns notes for what runs but slower (more vCPUs than host CPUs).
pub fn admit(resolved: &ResolvedResources, host: &HostFacts) -> Result<Vec<String>, SpecErrors> {
    let mut errors = Vec::new();
    if resolved.memory > host.memory_bytes {
        errors.push(FieldError::new(
            Field::ResourcesMemory,
            format!(
                "is {}, more than the host's {} of memory: give less, e.g. `{}`",
                ByteSize(resolved.memory),
                ByteSize(host.memory_bytes),
                ByteSize(host.memory_bytes / 2 / MIB * MIB),
            ),
        ));
    }
    SpecErrors::check(errors)?;
    let mut notes = Vec::new();
    if resolved.vcpus > host.cpus {
        notes.push(format!(
            "vcpus {} exceed the host's {} CPUs: the guest will run, slower",
            resolved.vcpus, host.cpus
        ));
    }
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nubo_core::size::{GIB, TIB};

    const HOST: HostFacts = HostFacts {
        memory_bytes: 8 * GIB,
        cpus: 2,
    };

    #[test]
    fn admit_memory_over_host_names_both_numbers() {
        let r = ResolvedResources {
            vcpus: 1,
            memory: 99999 * TIB,
        };

        let err = admit(&r, &HOST).unwrap_err();

        let msg = err.to_string();
        assert!(
            msg.starts_with("spec.resources.memory: is 99999T, more than the host's 8G"),
            "{msg}"
        );
        assert!(msg.contains("e.g. `4G`"), "{msg}");
    }

    #[test]
    fn admit_vcpus_over_host_cpus_is_a_note() {
        let r = ResolvedResources { vcpus: 8, memory: GIB };

        let notes = admit(&r, &HOST).unwrap();

        assert_eq!(
            notes,
            vec!["vcpus 8 exceed the host's 2 CPUs: the guest will run, slower".to_owned()]
        );
    }

    #[test]
    fn admit_within_host_has_no_notes() {
        let r = ResolvedResources {
            vcpus: 2,
            memory: 8 * GIB,
        };

        let notes = admit(&r, &HOST).unwrap();

        assert!(notes.is_empty());
    }
}
