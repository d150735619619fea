//! A backend that does nothing, for registry and selection tests.

use nubo_core::VmState;

use crate::{Backend, BackendError, BootInfo, Capabilities, MachineSpec, Probe, StopMode, VmHandle};

pub struct FakeBackend {
    pub id: &'static str,
    pub aliases: &'static [&'static str],
    pub auto: bool,
}

impl Backend for FakeBackend {
    fn id(&self) -> &'static str {
        self.id
    }
    fn aliases(&self) -> &'static [&'static str] {
        self.aliases
    }
    fn auto_selectable(&self) -> bool {
        self.auto
    }
    fn probe(&self) -> Probe {
        Probe::Available { version: "fake".into() }
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    fn boot(&self, _spec: &MachineSpec) -> Result<BootInfo, BackendError> {
        Err(BackendError::InvalidSpec("fake".into()))
    }
    fn state(&self, _vm: &VmHandle) -> Result<VmState, BackendError> {
        Ok(VmState::Stopped)
    }
    fn stop(&self, _vm: &VmHandle, _mode: StopMode) -> Result<(), BackendError> {
        Ok(())
    }
    fn destroy(&self, _vm: &VmHandle) -> Result<(), BackendError> {
        Ok(())
    }
}
