//! The backend registry and the selection precedence for new VMs.

use crate::{Backend, BackendError};

/// Built-in backends, by id. Ids and aliases are unique across the registry (checked in
/// [`Registry::new`]).
pub struct Registry {
    backends: Vec<Box<dyn Backend>>,
}

impl Registry {
    /// Panics when two backends share an id or alias: that is a programming error caught by the
    /// registry's unit test, never a user's.
    pub fn new(backends: Vec<Box<dyn Backend>>) -> Registry {
        let mut seen: Vec<&'static str> = Vec::new();
        for b in &backends {
            for name in std::iter::once(b.id()).chain(b.aliases().iter().copied()) {
                assert!(!seen.contains(&name), "backend name `{name}` registered twice");
                seen.push(name);
            }
        }
        Registry { backends }
    }

    /// The id `name` refers to (an id or an alias), or an error listing the known ones.
    pub fn resolve(&self, name: &str) -> Result<&dyn Backend, BackendError> {
        self.backends
            .iter()
            .find(|b| b.id() == name || b.aliases().contains(&name))
            .map(|b| b.as_ref())
            .ok_or_else(|| BackendError::UnknownBackend {
                name: name.to_owned(),
                known: self.names().join(", "),
            })
    }

    pub fn names(&self) -> Vec<&'static str> {
        self.backends.iter().map(|b| b.id()).collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn Backend> {
        self.backends.iter().map(|b| b.as_ref())
    }
}

/// Where the backend choice came from, highest precedence first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Flag,
    Image,
    Env,
    Default,
    Heuristic,
}

impl Source {
    pub fn describe(self) -> &'static str {
        match self {
            Source::Flag => "--backend",
            Source::Image => "the image's recorded hypervisor",
            Source::Env => "NUBO_VM_BACKEND",
            Source::Default => "`nubo vm default-backend`",
            Source::Heuristic => "the built-in heuristic",
        }
    }
}

/// What selection looks at, gathered by the caller.
#[derive(Debug, Clone, Default)]
pub struct SelectionInput<'a> {
    pub flag: Option<&'a str>,
    pub image: Option<&'a str>,
    pub env: Option<&'a str>,
    pub default: Option<&'a str>,
    /// Ids of auto-selectable backends whose probe said Available, in preference order.
    pub available: &'a [&'a str],
    /// A microVM workload (cloud-hypervisor, else QEMU's microvm machine).
    pub microvm_workload: bool,
    /// Booting with `--kernel` rather than the image's own boot loader.
    pub direct_kernel: bool,
    /// The spec asks for the restricted network, which cloud-hypervisor refuses (its guests
    /// sit on a host bridge): the heuristic passes it over rather than pick a refusal.
    pub restricted_network: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub id: &'static str,
    pub source: Source,
}

/// DESIGN.md's precedence, first match wins: `--backend` > image > `NUBO_VM_BACKEND` >
/// `nubo vm default-backend` > heuristic. Pure: the caller probes. An unknown name at any level
/// is an error naming where it came from, never a silent fall-through.
pub fn select(reg: &Registry, input: &SelectionInput<'_>) -> Result<Selection, BackendError> {
    let explicit = [
        (input.flag, Source::Flag),
        (input.image, Source::Image),
        (input.env, Source::Env),
        (input.default, Source::Default),
    ];
    for (name, source) in explicit {
        if let Some(name) = name {
            let b = reg
                .resolve(name)
                .map_err(|e| BackendError::InvalidSpec(format!("{} names {e}", source.describe())))?;
            return Ok(Selection { id: b.id(), source });
        }
    }
    // microVM workloads go to Cloud Hypervisor, else to QEMU's own microvm machine; a kernel
    // boot goes to it only where neither QEMU nor libvirt is installed; a cloud image booted
    // through its boot loader never (it has no BIOS, and EDK2 for it is rarely installed).
    let prefer: &[&str] = if input.microvm_workload {
        &["cloud-hypervisor", "qemu"]
    } else if input.direct_kernel {
        &["qemu", "libvirt", "cloud-hypervisor"]
    } else {
        &["libvirt", "qemu"]
    };
    let can_run = |id: &str| !(input.restricted_network && id == "cloud-hypervisor");
    prefer
        .iter()
        .find(|id| {
            can_run(id) && input.available.contains(id) && reg.resolve(id).is_ok_and(|b| b.auto_selectable())
        })
        .map(|id| Selection {
            id: reg.resolve(id).expect("checked above").id(),
            source: Source::Heuristic,
        })
        .ok_or_else(|| BackendError::Unavailable {
            backend: "any",
            why: format!(
                "no backend is available for this VM (wanted one of {}){}: run `nubo doctor` to see what is missing",
                prefer.join(", "),
                if input.restricted_network && input.available.contains(&"cloud-hypervisor") {
                    "; cloud-hypervisor is installed but has no restricted network (use --network none or forward on it)"
                } else {
                    ""
                }
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeBackend;

    fn reg() -> Registry {
        Registry::new(vec![
            Box::new(FakeBackend::new("qemu")),
            Box::new(FakeBackend::new("libvirt")),
            Box::new(FakeBackend::new("cloud-hypervisor").with_aliases(&["ch"])),
        ])
    }

    #[test]
    fn select_flag_beats_everything() {
        let input = SelectionInput {
            flag: Some("ch"),
            image: Some("libvirt"),
            env: Some("qemu"),
            ..Default::default()
        };

        let s = select(&reg(), &input).unwrap();

        assert_eq!(
            s,
            Selection {
                id: "cloud-hypervisor",
                source: Source::Flag
            }
        );
    }

    #[test]
    fn select_image_beats_env_and_default() {
        let input = SelectionInput {
            image: Some("libvirt"),
            env: Some("qemu"),
            default: Some("qemu"),
            ..Default::default()
        };

        assert_eq!(select(&reg(), &input).unwrap().source, Source::Image);
    }

    #[test]
    fn select_env_beats_default() {
        let input = SelectionInput {
            env: Some("qemu"),
            default: Some("libvirt"),
            ..Default::default()
        };

        assert_eq!(
            select(&reg(), &input).unwrap(),
            Selection {
                id: "qemu",
                source: Source::Env
            }
        );
    }

    #[test]
    fn select_default_used_when_nothing_else() {
        let input = SelectionInput {
            default: Some("libvirt"),
            available: &["qemu"],
            ..Default::default()
        };

        assert_eq!(
            select(&reg(), &input).unwrap(),
            Selection {
                id: "libvirt",
                source: Source::Default
            }
        );
    }

    #[test]
    fn select_heuristic_prefers_libvirt_for_cloud_images() {
        let input = SelectionInput {
            available: &["qemu", "libvirt"],
            ..Default::default()
        };

        assert_eq!(
            select(&reg(), &input).unwrap(),
            Selection {
                id: "libvirt",
                source: Source::Heuristic
            }
        );
    }

    #[test]
    fn select_heuristic_falls_back_to_qemu() {
        let input = SelectionInput {
            available: &["qemu"],
            ..Default::default()
        };

        assert_eq!(select(&reg(), &input).unwrap().id, "qemu");
    }

    #[test]
    fn select_heuristic_direct_kernel_prefers_qemu() {
        let input = SelectionInput {
            available: &["qemu", "libvirt"],
            direct_kernel: true,
            ..Default::default()
        };

        assert_eq!(select(&reg(), &input).unwrap().id, "qemu");
    }

    #[test]
    fn select_microvm_workload_prefers_cloud_hypervisor() {
        let input = SelectionInput {
            available: &["qemu", "libvirt", "cloud-hypervisor"],
            microvm_workload: true,
            direct_kernel: true,
            ..Default::default()
        };

        assert_eq!(select(&reg(), &input).unwrap().id, "cloud-hypervisor");
    }

    #[test]
    fn select_microvm_workload_restricted_network_passes_cloud_hypervisor_over() {
        let input = SelectionInput {
            available: &["qemu", "cloud-hypervisor"],
            microvm_workload: true,
            restricted_network: true,
            ..Default::default()
        };

        assert_eq!(select(&reg(), &input).unwrap().id, "qemu");
    }

    #[test]
    fn select_microvm_workload_restricted_network_only_cloud_hypervisor_is_unavailable() {
        let input = SelectionInput {
            available: &["cloud-hypervisor"],
            microvm_workload: true,
            restricted_network: true,
            ..Default::default()
        };

        let err = select(&reg(), &input).unwrap_err();

        assert!(matches!(err, BackendError::Unavailable { .. }));
        assert!(err.to_string().contains("--network none"), "{err}");
    }

    #[test]
    fn select_microvm_workload_without_cloud_hypervisor_is_qemu_microvm() {
        let input = SelectionInput {
            available: &["qemu"],
            microvm_workload: true,
            ..Default::default()
        };

        assert_eq!(select(&reg(), &input).unwrap().id, "qemu");
    }

    #[test]
    fn select_microvm_workload_with_only_libvirt_is_unavailable() {
        let input = SelectionInput {
            available: &["libvirt"],
            microvm_workload: true,
            ..Default::default()
        };

        assert!(matches!(select(&reg(), &input), Err(BackendError::Unavailable { .. })));
    }

    #[test]
    fn select_cloud_image_never_picks_cloud_hypervisor() {
        let input = SelectionInput {
            available: &["cloud-hypervisor"],
            ..Default::default()
        };

        assert!(matches!(select(&reg(), &input), Err(BackendError::Unavailable { .. })));
    }

    #[test]
    fn select_kernel_boot_picks_cloud_hypervisor_only_without_qemu_or_libvirt() {
        let both = SelectionInput {
            available: &["cloud-hypervisor", "qemu"],
            direct_kernel: true,
            ..Default::default()
        };
        let alone = SelectionInput {
            available: &["cloud-hypervisor"],
            direct_kernel: true,
            ..Default::default()
        };

        assert_eq!(select(&reg(), &both).unwrap().id, "qemu");
        assert_eq!(select(&reg(), &alone).unwrap().id, "cloud-hypervisor");
    }

    #[test]
    fn select_unknown_env_name_is_error_naming_source() {
        let input = SelectionInput {
            env: Some("vbox"),
            available: &["qemu"],
            ..Default::default()
        };

        let err = select(&reg(), &input).unwrap_err().to_string();

        assert!(err.contains("NUBO_VM_BACKEND") && err.contains("`vbox`"), "{err}");
    }

    #[test]
    #[should_panic(expected = "registered twice")]
    fn registry_duplicate_alias_panics() {
        Registry::new(vec![
            Box::new(FakeBackend::new("qemu").with_aliases(&["q"])),
            Box::new(FakeBackend::new("other").with_aliases(&["q"]).auto(false)),
        ]);
    }
}
