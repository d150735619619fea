//! VM lifecycle over nubo's ports: the image store, seed, disk and backend crates. The engine
//! owns the VM records and locks; backends own the VMM processes; readiness is proven from the
//! guest's own console.

pub mod create;
pub mod error;
pub mod lifecycle;
pub mod lock;
pub mod readiness;
pub mod record;
pub mod ssh;

use std::time::Duration;

use nubo_backend::Registry;
use nubo_core::Roots;
use serde::{Deserialize, Serialize};

pub use create::{CreateRequest, Created};
pub use error::EngineError;
pub use lifecycle::VmStatus;
pub use readiness::{Phase, WaitFor};
pub use record::VmRecord;

/// Progress a command reports as it goes.
#[derive(Debug, Clone)]
pub enum Event {
    Step(String),
    /// Something the user should know about their request.
    Note(String),
    /// A readiness phase reached, with the time since the command started.
    Phase(Phase, Duration),
}

pub struct Engine {
    pub roots: Roots,
    pub registry: Registry,
    /// `NUBO_VM_BACKEND`, read by the binary.
    pub env_backend: Option<String>,
}

/// nubo's persisted settings (`$NUBO_ROOT/settings.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StoredSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_backend: Option<String>,
}

impl Engine {
    pub fn new(roots: Roots, registry: Registry, env_backend: Option<String>) -> Engine {
        Engine {
            roots,
            registry,
            env_backend,
        }
    }

    pub(crate) fn lock(&self, name: &str) -> Result<lock::VmLock, EngineError> {
        lock::VmLock::try_acquire(&self.roots.run_dir.join("locks"), name)
    }

    pub fn settings(&self) -> Result<StoredSettings, EngineError> {
        let path = self.roots.config_file();
        match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b).map_err(|source| EngineError::Corrupt { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StoredSettings::default()),
            Err(e) => Err(EngineError::Io {
                name: String::new(),
                what: format!("reading {}", path.display()),
                source: e,
            }),
        }
    }

    pub fn default_backend(&self) -> Result<Option<String>, EngineError> {
        Ok(self.settings()?.default_backend)
    }

    /// Sets (`Some`) or clears (`None`) the default backend for new VMs; the name must be known.
    pub fn set_default_backend(&self, name: Option<&str>) -> Result<Option<&'static str>, EngineError> {
        let id = name.map(|n| self.registry.resolve(n).map(|b| b.id())).transpose()?;
        let mut s = self.settings()?;
        s.default_backend = id.map(str::to_owned);
        let path = self.roots.config_file();
        std::fs::create_dir_all(&self.roots.root)
            .map_err(EngineError::io("", format!("creating {}", self.roots.root.display())))?;
        nubo_core::write_json_atomic(&path, &s).map_err(EngineError::io("", format!("writing {}", path.display())))?;
        Ok(id)
    }
}
