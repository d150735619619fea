//! The backend registry and the selection precedence for new VMs.

use crate::{Backend, BackendError, Capabilities, Capability};

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

    /// The ids of the backends that have `cap`, in registry order.
    pub fn having(&self, cap: Capability) -> Vec<&'static str> {
        self.iter()
            .filter(|b| b.capabilities().has(cap))
            .map(|b| b.id())
            .collect()
    }

    /// The alternative an "unsupported" error names for `cap`: `the qemu or libvirt backend`,
    /// from the backends that have it, or `fallback` when none does.
    pub fn alternative(&self, cap: Capability, fallback: &str) -> String {
        match self.having(cap).as_slice() {
            [] => fallback.to_owned(),
            [one] => format!("the {one} backend"),
            [rest @ .., last] => format!("the {} or {last} backend", rest.join(", ")),
        }
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
    /// A microVM workload: needs [`Capability::Microvm`], prefers [`Capability::MicrovmNative`].
    pub microvm_workload: bool,
    /// Booting with `--kernel` rather than the image's own boot loader.
    pub direct_kernel: bool,
    /// The spec asks for the restricted network: the heuristic passes over backends without
    /// [`Capability::RestrictedNetwork`] rather than pick a refusal.
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
    let (need, prefer) = heuristic(input);
    let runs = |b: &dyn Backend| {
        let caps = b.capabilities();
        caps.has(need) && (!input.restricted_network || caps.has(Capability::RestrictedNetwork))
    };
    let mut candidates: Vec<&dyn Backend> = reg
        .iter()
        .filter(|b| b.auto_selectable() && b.capabilities().has(need))
        .collect();
    // Stable: among equals, registry order decides.
    candidates.sort_by_key(|b| prefer(&b.capabilities()));
    if let Some(b) = candidates
        .iter()
        .copied()
        .find(|b| runs(*b) && input.available.contains(&b.id()))
    {
        return Ok(Selection {
            id: b.id(),
            source: Source::Heuristic,
        });
    }
    let wanted: Vec<&str> = candidates.iter().map(|b| b.id()).collect();
    let no_restricted: Vec<&str> = candidates
        .iter()
        .copied()
        .filter(|b| input.restricted_network && !runs(*b) && input.available.contains(&b.id()))
        .map(|b| b.id())
        .collect();
    Err(BackendError::Unavailable {
        backend: "any",
        why: format!(
            "no backend is available for this VM (wanted one of {}){}: run `nubo doctor` to see what is missing",
            wanted.join(", "),
            if no_restricted.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} {} installed but {} no restricted network (use --network none or forward on it)",
                    no_restricted.join(", "),
                    if no_restricted.len() == 1 { "is" } else { "are" },
                    if no_restricted.len() == 1 { "has" } else { "have" },
                )
            }
        ),
    })
}

/// A sort key over a backend's capabilities: lower is preferred.
type Preference = fn(&Capabilities) -> (bool, bool);

/// The capability the workload needs, and the preference among the backends that have it
/// (lower first), all from capabilities: a new backend takes part by declaring them.
/// - microVM workloads: a VMM built for microVMs first, else a general VMM's microvm machine;
/// - a kernel boot: a backend that reaches the guest without privileges (port forwards), the
///   daemonless one first (nothing to set up for a quick loop);
/// - a cloud image through its own boot loader (BIOS): a supervised backend (libvirtd) first.
fn heuristic(input: &SelectionInput<'_>) -> (Capability, Preference) {
    if input.microvm_workload {
        (Capability::Microvm, |c| (!c.has(Capability::MicrovmNative), false))
    } else if input.direct_kernel {
        (Capability::DirectKernel, |c| {
            (!c.has(Capability::PortForwards), c.has(Capability::Supervised))
        })
    } else {
        (Capability::Bios, |c| (!c.has(Capability::Supervised), false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeBackend;

    use Capability as C;

    /// Fakes declaring the built-in backends' capabilities, in the built-in registry's order.
    fn reg() -> Registry {
        let caps = |c: &[Capability]| Capabilities::new(c, &[]);
        Registry::new(vec![
            Box::new(FakeBackend::new("qemu").with_caps(caps(&[
                C::DirectKernel,
                C::Bios,
                C::Microvm,
                C::PortForwards,
                C::RestrictedNetwork,
            ]))),
            Box::new(
                FakeBackend::new("cloud-hypervisor")
                    .with_aliases(&["ch"])
                    .with_caps(caps(&[C::DirectKernel, C::Microvm, C::MicrovmNative])),
            ),
            Box::new(FakeBackend::new("libvirt").with_caps(caps(&[
                C::DirectKernel,
                C::Bios,
                C::Supervised,
                C::PortForwards,
                C::RestrictedNetwork,
            ]))),
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
    fn select_heuristic_new_backend_takes_part_by_capabilities_alone() {
        let mut backends: Vec<Box<dyn Backend>> = vec![Box::new(
            FakeBackend::new("proxmox").with_caps(Capabilities::new(&[C::Bios, C::Supervised], &[])),
        )];
        backends.push(Box::new(
            FakeBackend::new("qemu").with_caps(Capabilities::new(&[C::Bios, C::DirectKernel], &[])),
        ));
        let reg = Registry::new(backends);
        let input = SelectionInput {
            available: &["qemu", "proxmox"],
            ..Default::default()
        };

        assert_eq!(select(&reg, &input).unwrap().id, "proxmox");
    }

    #[test]
    fn alternative_names_backends_having_the_capability() {
        assert_eq!(reg().alternative(C::Bios, "x"), "the qemu or libvirt backend");
        assert_eq!(reg().alternative(C::MicrovmNative, "x"), "the cloud-hypervisor backend");
        assert_eq!(reg().alternative(C::FreezeDiskLayer, "none"), "none");
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
