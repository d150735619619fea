//! Disk layers frozen under a running VM, for `nubo image build`: the build asks the engine,
//! the engine asks the VM's backend ([`Backend::freeze_disk_layer`]), and no caller reads a
//! backend's state or speaks its protocol.

use std::path::Path;

use nubo_backend::{BackendError, Capability};

use crate::{Engine, EngineError, VmRecord};

impl Engine {
    /// The first backend in the registry that can freeze a running VM's disk layer: the one a
    /// build boots its VM with (qemu among the built-in ones).
    pub fn layer_backend(&self) -> Result<&'static str, EngineError> {
        self.registry
            .having(Capability::FreezeDiskLayer)
            .first()
            .copied()
            .ok_or_else(|| {
                BackendError::Unavailable {
                    backend: "any",
                    why: format!(
                        "no backend can freeze a disk layer, which image builds need (known backends: {})",
                        self.registry.names().join(", ")
                    ),
                }
                .into()
            })
    }

    /// Freezes the running VM's active disk layer: from now on the VM writes to `new_top`,
    /// a new qcow2 over the old top, which is written no more. `frozen` is how many layers
    /// this boot froze before. Refused, before anything is touched, when the VM's backend
    /// lacks [`Capability::FreezeDiskLayer`].
    pub fn freeze_disk_layer(&self, rec: &VmRecord, frozen: usize, new_top: &Path) -> Result<(), EngineError> {
        let backend = self.backend_of(rec)?;
        if !backend.capabilities().has(Capability::FreezeDiskLayer) {
            let alt = self
                .registry
                .alternative(Capability::FreezeDiskLayer, "another backend");
            return Err(BackendError::unsupported(backend.id(), "freezing a disk layer (image build)", alt).into());
        }
        let dir = self.roots.vm_dir(&rec.name);
        Ok(backend.freeze_disk_layer(&rec.vm_ref(&dir), frozen, new_top)?)
    }
}

#[cfg(test)]
mod tests {
    use nubo_backend::fake::FakeBackend;

    use crate::tests::{engine_with, quiet, spec};

    #[test]
    fn freeze_disk_layer_backend_without_capability_is_unsupported_before_any_call() {
        let t = engine_with(FakeBackend::new("qemu"));
        let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();
        let calls = t.fake.calls().len();

        let err = t
            .engine
            .freeze_disk_layer(&c.record, 0, std::path::Path::new("/nonexistent/layer.qcow2"))
            .unwrap_err();

        assert!(err.to_string().contains("unsupported by the qemu backend"), "{err}");
        assert_eq!(t.fake.calls().len(), calls);
    }

    #[test]
    fn freeze_disk_layer_backend_with_capability_is_asked() {
        let mut b = FakeBackend::new("qemu");
        b.caps.insert(nubo_backend::Capability::FreezeDiskLayer);
        let t = engine_with(b);
        let c = t.engine.create(&spec(&t, "web"), &mut quiet()).unwrap();

        t.engine
            .freeze_disk_layer(&c.record, 1, std::path::Path::new("/w/layer-2.qcow2"))
            .unwrap();

        assert!(t
            .fake
            .calls()
            .contains(&"freeze-disk-layer web 1 /w/layer-2.qcow2".to_owned()));
    }

    #[test]
    fn layer_backend_none_able_names_none() {
        let t = engine_with(FakeBackend::new("qemu"));

        let err = t.engine.layer_backend().unwrap_err();

        assert!(err.to_string().contains("no backend can freeze a disk layer"), "{err}");
    }
}
