//! What `nubo apply` needs beyond `plan`/`dry_run`/`create`/`remove`: the observed state of a
//! VM against a desired spec (read-only), a read-only check of everything a spec references,
//! and bounded parallel work.

use std::path::Path;

use nubo_image::ImageStore;
use nubo_spec::{DiskSource, Field, Firmware, VmSpec};
use serde::Serialize;

use crate::record::{self, Phase};
use crate::{Engine, EngineError};

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
    pub fn observe(&self, spec: &VmSpec) -> Result<Observed, EngineError> {
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
