//! VM lifecycle over nubo's ports: the image store, seed, disk and backend crates. The engine
//! turns a [`nubo_spec::VmSpec`] into a plan (facts, then a pure decision), makes and manages
//! VMs through the [`nubo_backend::Backend`] trait, owns the VM records and locks, and proves
//! readiness from the guest's own console.

pub mod apply;
mod chain;
pub mod console_record;
pub mod copy;
pub mod create;
pub mod default_image;
pub mod diagnostic;
pub mod error;
pub mod fetch;
mod guest_status;
pub mod host;
mod layer;
pub mod lifecycle;
pub mod lock;
mod mounts;
pub mod observe;
pub mod plan;
pub mod readiness;
pub mod record;
pub mod snapshot;
pub mod ssh;
pub mod ssh_jump;
pub mod usage;

use std::sync::Arc;
use std::time::Duration;

use nubo_backend::Registry;
use nubo_core::Roots;
use nubo_image::{ImageRecord, ImageRef};
use serde::{Deserialize, Serialize};

pub use console_record::ConsoleRecorder;
pub use create::Created;
pub use diagnostic::Diagnostic;
pub use error::EngineError;
pub use lifecycle::{LaunchSource, LaunchView, VmSummary};
pub use observe::{Condition, ConditionStatus, ConditionType, VmStatus};
pub use plan::Plan;
pub use readiness::{Failure, Outcome, Phase, Readiness, ReadinessError, Step, WaitFor};
pub use record::VmRecord;

/// Progress a command reports as it goes.
#[derive(Debug, Clone)]
pub enum Event {
    Step(String),
    /// Something the user should know about their request.
    Note(String),
    /// A readiness phase reached, with the time since the command started.
    Phase(Phase, Duration),
    /// Output a guest printed (a build step's stdout and stderr, merged): one line with its
    /// newline, or the unterminated rest. The CLI copies it to stderr as is.
    Output(String),
}

/// An image the engine needs and the store does not have yet.
#[derive(Debug, Clone)]
pub enum Fetch {
    /// An official reference (`debian:12`).
    Catalog(ImageRef),
    /// A URL, verified by checksum.
    Url {
        url: String,
        checksum: Option<String>,
        insecure_no_checksum: bool,
        allow_http: bool,
    },
    /// A registry reference (`registry.example:5000/team/vm:1`, `...@sha256:<hex>`): the
    /// fetcher returns the image already pulled from it or pulls it.
    Oci(nubo_image::OciRef),
}

/// Pulls images into the store for the engine. The binary implements it (mirrors, TLS roots
/// and progress display are its settings), so `vm create`, `apply` and a controller pull the
/// same way through the engine.
pub trait ImageFetcher: Send + Sync {
    /// A download ends between reads once `cancel` (the calling handle's token) is tripped,
    /// keeping its partial file for the next pull to resume.
    fn fetch(
        &self,
        what: &Fetch,
        cancel: &nubo_core::Cancel,
        events: &mut dyn FnMut(Event),
    ) -> Result<ImageRecord, EngineError>;
}

/// Cheap to share: [`Engine::with_cancel`] makes a handle over the same registry and fetcher
/// with its own cancellation token, one per call of a daemon.
pub struct Engine {
    pub roots: Roots,
    pub registry: Arc<Registry>,
    /// `NUBO_VM_BACKEND`, read by the binary.
    pub env_backend: Option<String>,
    pub fetcher: Option<Arc<dyn ImageFetcher>>,
    /// How long a command waits for another command on the same VM ([`LOCK_WAIT`]).
    pub lock_wait: Duration,
    /// Ends the engine's waits (a VM's lock, a create's steps, readiness, the SSH key's lock)
    /// early when cancelled, with [`EngineError::Cancelled`]: a daemon gives each call its own
    /// token ([`Engine::with_cancel`]) and trips it when the caller goes away or at shutdown;
    /// the CLI trips its one token on SIGINT/SIGTERM.
    pub cancel: nubo_core::Cancel,
    /// Replace `${vm.uuid}` in user-data with the VM's UUID (its instance-id) when the seed is
    /// built: the Kubernetes controller's placeholder. The CLI passes user-data byte for byte.
    pub user_data_uuid: bool,
}

/// nubo's persisted settings (`$NUBO_ROOT/settings.json`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct StoredSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_backend: Option<String>,
    /// `nubo image default --set REF`: what `vm create NAME` boots without a source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_image: Option<String>,
}

/// How long a command waits for another command on the same VM before saying it is busy:
/// longer than any step that holds the lock (a create up to the VMM's start, a memory
/// snapshot), short enough that a stuck holder is reported.
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// How late a sleeping wait ([`Engine::sleep`]) sees its cancellation at most.
pub const CANCEL_SLICE: Duration = Duration::from_millis(100);

/// settings.json is a few bytes; a bigger one is not nubo's.
const MAX_SETTINGS: u64 = 1 << 20;

impl Engine {
    pub fn new(roots: Roots, registry: Registry, env_backend: Option<String>) -> Engine {
        Engine {
            roots,
            registry: Arc::new(registry),
            env_backend,
            fetcher: None,
            lock_wait: LOCK_WAIT,
            cancel: nubo_core::Cancel::new(),
            user_data_uuid: false,
        }
    }

    pub fn with_fetcher(mut self, f: Box<dyn ImageFetcher>) -> Engine {
        self.fetcher = Some(Arc::from(f));
        self
    }

    /// A handle on the same engine (roots, registry, fetcher, lock wait: shared, not copied)
    /// whose waits end when `cancel` is cancelled: what a daemon makes per call, so cancelling
    /// one request leaves the others running. The per-VM locks are the process's, so handles
    /// exclude each other as one engine does.
    pub fn with_cancel(&self, cancel: nubo_core::Cancel) -> Engine {
        Engine {
            roots: self.roots.clone(),
            registry: Arc::clone(&self.registry),
            env_backend: self.env_backend.clone(),
            fetcher: self.fetcher.clone(),
            lock_wait: self.lock_wait,
            cancel,
            user_data_uuid: self.user_data_uuid,
        }
    }

    /// [`EngineError::Cancelled`] saying the engine stopped while `what`, when this handle's
    /// token is cancelled: checked between the steps of a create and of every wait.
    pub fn check_cancel(&self, what: &str) -> Result<(), EngineError> {
        if self.cancel.is_cancelled() {
            return Err(EngineError::Cancelled { what: what.to_owned() });
        }
        Ok(())
    }

    /// Sleeps `d` (a [`Step::PollAfter`] of a readiness machine, say) in slices short enough
    /// to see a cancellation within [`CANCEL_SLICE`]; cancelled is
    /// [`EngineError::Cancelled`] naming `what` the caller waited for.
    pub fn sleep(&self, d: Duration, what: &str) -> Result<(), EngineError> {
        let deadline = nubo_core::Deadline::after(d);
        loop {
            self.check_cancel(what)?;
            if deadline.passed() {
                return Ok(());
            }
            std::thread::sleep(deadline.slice(CANCEL_SLICE));
        }
    }

    /// The VM's lock for the verb `op`, waiting up to [`Engine::lock_wait`] for another
    /// command on it, or until [`Engine::cancel`].
    pub(crate) fn lock(&self, name: &str, op: &'static str) -> Result<lock::VmLock, EngineError> {
        let deadline = nubo_core::Deadline::after(self.lock_wait);
        lock::VmLock::acquire(&self.roots.run_dir.join("locks"), name, op, deadline, &self.cancel)
    }

    /// nubo's SSH key pair ([`ssh::ensure_key`]), made once, waiting for another maker up to
    /// [`Engine::lock_wait`] or until [`Engine::cancel`].
    pub fn nubo_key(&self) -> Result<(std::path::PathBuf, String), EngineError> {
        let deadline = nubo_core::Deadline::after(self.lock_wait);
        ssh::ensure_key_within(&self.roots.ssh_dir(), deadline, &self.cancel)
    }

    pub fn settings(&self) -> Result<StoredSettings, EngineError> {
        let path = self.roots.config_file();
        let corrupt = |detail: String| EngineError::CorruptSettings {
            path: path.clone(),
            detail,
        };
        match nubo_core::file::read_bounded(&path, "settings", MAX_SETTINGS) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| corrupt(e.to_string())),
            Err(e) if e.is_not_found() => Ok(StoredSettings::default()),
            Err(e) => Err(corrupt(e.to_string())),
        }
    }

    pub fn default_backend(&self) -> Result<Option<String>, EngineError> {
        Ok(self.settings()?.default_backend)
    }

    /// Sets (`Some`) or clears (`None`) the default backend for new VMs; the name must be known.
    pub fn set_default_backend(&self, name: Option<&str>) -> Result<Option<&'static str>, EngineError> {
        let id = name.map(|n| self.registry.resolve(n).map(|b| b.id())).transpose()?;
        // Setting or clearing the default replaces a corrupt file (its other settings are
        // lost with it: they could not be read anyway).
        self.update_settings(true, |s| s.default_backend = id.map(str::to_owned))?;
        Ok(id)
    }
}
#[cfg(test)]
mod tests;
