//! Desired against observed, and converging: what `nubo apply` (and a controller's reconcile)
//! asks of the engine. [`Engine::compare`] reads how a VM stands against a spec;
//! [`Engine::plan_apply`] turns that into an [`ApplyPlan`] (the [`Action`], the differences,
//! the create plan) through the dry run's path, writing nothing; [`Engine::converge`] carries
//! the action out. The CLI only renders them and adds its policy (`--recreate`, parallelism).
//! Also a read-only check of everything a spec references, and bounded parallel work.

use std::path::Path;

use nubo_image::ImageStore;
use nubo_spec::{DiskSource, Field, Firmware, VmSpec};
use serde::Serialize;

use crate::record::{self, Phase};
use crate::{Engine, EngineError, Event, Plan};

/// A VM as found, against the spec asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state", content = "differences")]
pub enum Observed {
    /// No VM of that name.
    Missing,
    /// A create of that name was interrupted; creating it again converges.
    Interrupted,
    /// It exists with this spec.
    Same,
    /// It exists with another spec: `path: old -> new` per field.
    Different(Vec<String>),
}

impl Observed {
    /// What converging the VM to the spec takes.
    pub fn action(&self) -> Action {
        match self {
            Observed::Missing => Action::Create,
            Observed::Interrupted => Action::Resume,
            Observed::Same => Action::Unchanged,
            Observed::Different(_) => Action::Recreate,
        }
    }
}

/// What converging one VM to its spec does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Create,
    /// An interrupted create of that name: creating again converges.
    Resume,
    Unchanged,
    /// It exists with another spec: removed (its disk is lost) and created again. Callers
    /// decide whether they allow it (`nubo apply --recreate`).
    Recreate,
}

/// Desired against observed for one VM, and what converging it takes. Made reading only.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyPlan {
    pub action: Action,
    /// `path: old -> new` per field, for [`Action::Recreate`].
    pub differences: Vec<String>,
    /// The create plan (through [`Engine::dry_run`]): absent for an unchanged VM (it keeps
    /// what it was made with) and when the image must be pulled first.
    pub plan: Option<Plan>,
    /// The backend recorded for an unchanged VM, which it keeps.
    pub recorded_backend: Option<String>,
}

/// What [`Engine::converge`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Converged {
    Created,
    /// The VM existed with this spec: nothing was done.
    Unchanged,
    Recreated,
}

impl Converged {
    pub fn as_str(self) -> &'static str {
        match self {
            Converged::Created => "created",
            Converged::Unchanged => "unchanged",
            Converged::Recreated => "recreated",
        }
    }
}

/// What [`Engine::check_references`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct References {
    /// The image must be downloaded before the VM can be planned (a catalog image not in the
    /// store yet, or a URL): a dry run cannot plan it, a create pulls it first.
    pub pull_first: bool,
    pub notes: Vec<String>,
}

impl Engine {
    /// How the VM `spec` names stands against `spec`. Reads the record only.
    pub fn compare(&self, spec: &VmSpec) -> Result<Observed, EngineError> {
        let dir = self.roots.vm_dir(spec.name.as_str());
        Ok(match record::load(&dir)? {
            None => Observed::Missing,
            Some(rec) if rec.phase == Phase::Creating => Observed::Interrupted,
            Some(rec) => {
                let diffs = rec.spec.differences(spec);
                if diffs.is_empty() {
                    Observed::Same
                } else {
                    Observed::Different(diffs)
                }
            }
        })
    }

    /// Desired (`spec`) against observed, and the action that converges them. Reads only: a
    /// dry run and a real apply plan through the same call. `pull_first` (from
    /// [`Engine::check_references`]) skips the create plan, which needs the image in the store.
    /// Capabilities, backend checks and admission are refused here, before anything is made.
    pub fn plan_apply(&self, spec: &VmSpec, pull_first: bool) -> Result<ApplyPlan, EngineError> {
        let observed = self.compare(spec)?;
        let action = observed.action();
        let differences = match observed {
            Observed::Different(d) => d,
            _ => Vec::new(),
        };
        let plan = if pull_first || action == Action::Unchanged {
            None
        } else {
            Some(self.dry_run(spec)?)
        };
        let recorded_backend = if action == Action::Unchanged {
            Some(self.load(spec.name.as_str())?.backend)
        } else {
            None
        };
        Ok(ApplyPlan {
            action,
            differences,
            plan,
            recorded_backend,
        })
    }

    /// Carries out `action` for `spec`: a recreate removes the VM first (forced: its disk is
    /// lost), then every action but unchanged creates, which converges an interrupted create
    /// and is a no-op for a VM that meanwhile appeared with this spec.
    pub fn converge(
        &self,
        spec: &VmSpec,
        action: Action,
        events: &mut dyn FnMut(Event),
    ) -> Result<Converged, EngineError> {
        if action == Action::Unchanged {
            return Ok(Converged::Unchanged);
        }
        if action == Action::Recreate {
            self.remove(spec.name.as_str(), true, events)?;
        }
        let created = self.create(spec, events)?;
        Ok(match (action, created.existed) {
            (Action::Recreate, _) => Converged::Recreated,
            (_, true) => Converged::Unchanged,
            _ => Converged::Created,
        })
    }

    /// Checks, reading only, that what `spec` references is there: the image is in the store
    /// or a catalog reference nubo can pull, a disk is a self-contained image nubo may boot,
    /// and the kernel, initrd, firmware and own seed are regular files. Returns notes (an image
    /// that a create would pull first). Problems are spec errors at their field.
    pub fn check_references(&self, spec: &VmSpec) -> Result<References, EngineError> {
        let mut notes = Vec::new();
        let mut pull_first = false;
        match &spec.source {
            DiskSource::Image { reference } => {
                let r = match nubo_image::AnyRef::parse(reference) {
                    Ok(nubo_image::AnyRef::Local(r)) => r,
                    Ok(nubo_image::AnyRef::Oci(o)) => {
                        return Err(EngineError::spec(
                            Field::SourceImageReference,
                            format!("`{o}` is an OCI reference, which nubo cannot boot yet: import the image with `nubo image import` and use its local name"),
                        ))
                    }
                    Err(e) => return Err(EngineError::spec(Field::SourceImageReference, e.to_string())),
                };
                let store = ImageStore::open_read_only(&self.roots.images());
                match store.get(&r) {
                    Ok(Some(_)) => {}
                    Ok(None) if nubo_image::catalog::lookup(&r).is_some() => {
                        notes.push(format!("image `{r}` is not in the store: apply pulls it first"));
                        pull_first = true;
                    }
                    Ok(None) => {
                        return Err(EngineError::spec(
                            Field::SourceImageReference,
                            format!("image `{r}` is not in the store and is no catalog image nubo can pull: `nubo image ls` lists the local ones"),
                        ))
                    }
                    Err(e) => return Err(EngineError::spec(Field::SourceImageReference, e.to_string())),
                }
            }
            DiskSource::Disk { path } => {
                nubo_disk::inspect_base(path).map_err(|e| EngineError::spec(Field::SourceDiskPath, e.to_string()))?;
            }
            DiskSource::Url { url, .. } => {
                notes.push(format!("{url} is downloaded and verified by its checksum when applied"));
                pull_first = true;
            }
        }
        let regular = |field: Field, what: &str, p: &Path| {
            nubo_core::file::open_regular(p, what)
                .map(drop)
                .map_err(|e| EngineError::spec(field, e.to_string()))
        };
        if let Some(k) = &spec.boot {
            regular(Field::BootKernel, "kernel", &k.kernel)?;
            if let Some(i) = &k.initrd {
                regular(Field::BootInitrd, "initrd", i)?;
            }
        }
        if let Firmware::Path(p) = &spec.firmware {
            regular(Field::Firmware, "firmware", p)?;
        }
        if let Some(s) = &spec.cloud_init.seed {
            regular(Field::CloudInitSeed, "seed", s)?;
        }
        Ok(References { pull_first, notes })
    }
}

/// How many creates run at once: one per host CPU this process may use.
pub fn host_parallelism() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Runs `job` on every item, at most `limit` at a time, and returns the results in the
/// items' order.
pub fn parallel<T: Sync, R: Send>(items: &[T], limit: usize, job: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> = items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..limit.clamp(1, items.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(item) = items.get(i) else { break };
                let r = job(item);
                if let Ok(mut slot) = results[i].lock() {
                    *slot = Some(r);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .ok()
                .flatten()
                .expect("every item was run by a worker that did not panic")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    use crate::tests::{fake, quiet, spec};

    #[test]
    fn plan_apply_missing_vm_create_with_plan() {
        let t = fake();

        let p = t.engine.plan_apply(&spec(&t, "web"), false).unwrap();

        assert_eq!(p.action, Action::Create);
        assert_eq!(p.plan.map(|p| p.name), Some("web".to_owned()));
        assert_eq!(p.recorded_backend, None);
    }

    #[test]
    fn plan_apply_same_spec_unchanged_keeps_recorded_backend() {
        let t = fake();
        t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

        let p = t.engine.plan_apply(&spec(&t, "web"), false).unwrap();

        assert_eq!((p.action, p.plan.is_none()), (Action::Unchanged, true));
        assert_eq!(p.recorded_backend.as_deref(), Some("qemu"));
    }

    #[test]
    fn plan_apply_changed_spec_recreate_with_differences() {
        let t = fake();
        t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
        let mut changed = spec(&t, "web");
        changed.resources.vcpus = Some(2);

        let p = t.engine.plan_apply(&changed, false).unwrap();

        assert_eq!(p.action, Action::Recreate);
        assert_eq!(p.differences, vec!["spec.resources.vcpus: unset -> 2".to_owned()]);
        assert!(p.plan.is_some());
    }

    #[test]
    fn plan_apply_interrupted_create_resume() {
        let t = fake();
        let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
        let mut rec = c.record;
        rec.phase = Phase::Creating;
        record::save(&t.engine.roots.vm_dir("web"), &rec).unwrap();

        let p = t.engine.plan_apply(&spec(&t, "web"), false).unwrap();

        assert_eq!(p.action, Action::Resume);
    }

    #[test]
    fn plan_apply_pull_first_has_no_plan() {
        let t = fake();

        let p = t.engine.plan_apply(&spec(&t, "web"), true).unwrap();

        assert_eq!((p.action, p.plan.is_none()), (Action::Create, true));
    }

    #[test]
    fn converge_recreate_replaces_vm_with_new_uuid() {
        let t = fake();
        let old = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap().record.uuid;
        let mut changed = spec(&t, "web");
        changed.resources.vcpus = Some(2);
        let action = t.engine.plan_apply(&changed, false).unwrap().action;

        let done = t.engine.converge(&changed, action, &mut quiet()).unwrap();

        let rec = t.engine.load("web").unwrap();
        assert_eq!(done, Converged::Recreated);
        assert_ne!(rec.uuid, old);
        assert_eq!(rec.spec.resources.vcpus, Some(2));
    }

    #[test]
    fn converge_unchanged_calls_no_backend() {
        let t = fake();
        t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
        let before = t.fake.calls();

        let done = t
            .engine
            .converge(&spec(&t, "web"), Action::Unchanged, &mut quiet())
            .unwrap();

        assert_eq!((done, t.fake.calls()), (Converged::Unchanged, before));
    }

    #[test]
    fn converge_create_then_again_is_unchanged() {
        let t = fake();

        let first = t
            .engine
            .converge(&spec(&t, "web"), Action::Create, &mut quiet())
            .unwrap();
        let again = t
            .engine
            .converge(&spec(&t, "web"), Action::Create, &mut quiet())
            .unwrap();

        assert_eq!((first, again), (Converged::Created, Converged::Unchanged));
    }

    #[test]
    fn parallel_keeps_order() {
        let out = parallel(&[3, 1, 2], 2, |x| x * 10);

        assert_eq!(out, vec![30, 10, 20]);
    }

    #[test]
    fn parallel_never_exceeds_limit() {
        let (running, peak) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let items: Vec<u32> = (0..8).collect();

        parallel(&items, 3, |_| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            running.fetch_sub(1, Ordering::SeqCst);
        });

        assert!(peak.load(Ordering::SeqCst) <= 3);
        assert!(peak.load(Ordering::SeqCst) >= 2, "work ran in parallel");
    }
}
