use std::path::PathBuf;

use nubo_core::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("vm `{0}` does not exist: `nubo vm ls` lists the VMs")]
    NotFound(String),
    #[error("vm `{name}` already exists with a different spec ({}): remove it first (`nubo vm rm --force {name}`) or use another name", differences.join("; "))]
    Conflict { name: String, differences: Vec<String> },
    /// `holder` says who: "`start` holds it in this process", "held by pid N (`nubo vm start`)".
    #[error("vm `{name}` is busy: {holder}; wait for that command to finish and retry")]
    Busy { name: String, holder: String },
    /// The caller's cancellation token was cancelled while the engine waited.
    #[error("cancelled while {what}: nothing more was done; run the command again")]
    Cancelled { what: String },
    #[error("vm `{name}` is {state}: {fix}")]
    InvalidState { name: String, state: String, fix: String },
    /// The spec is invalid; each problem names its field path.
    #[error(transparent)]
    Spec(#[from] nubo_spec::SpecErrors),
    #[error("vm `{name}`: {what}")]
    Io {
        name: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("vm record {} is corrupt ({detail}): remove the VM with `nubo vm rm --force` (its record cannot be trusted)", path.display())]
    Corrupt { path: PathBuf, detail: String },
    #[error("nubo's settings file {} is corrupt ({detail}): delete it (it only holds the default backend) or fix its JSON", path.display())]
    CorruptSettings { path: PathBuf, detail: String },
    #[error("snapshot description is invalid: {0}")]
    SnapshotDescription(String),
    #[error("vm `{vm}` has no snapshot `{snapshot}`: `nubo vm snapshot ls {vm}` lists them")]
    SnapshotNotFound { vm: String, snapshot: String },
    #[error("vm `{vm}` already has a snapshot `{snapshot}`: pick another name, or remove it first (`nubo vm snapshot rm {vm} {snapshot}`)")]
    SnapshotExists { vm: String, snapshot: String },
    #[error("snapshot `{snapshot}` of vm `{vm}` cannot be restored: {why}")]
    SnapshotRefused { vm: String, snapshot: String, why: String },
    /// The disk chain is no longer the one nubo made (see `chain.rs`); nothing was started.
    #[error("vm `{name}`: its disk chain is no longer the one nubo made, so nothing was started: {detail}; put back the base image `{}` the VM was made from, or remove the VM (`nubo vm rm {name}`) and create it again from a disk you trust", base.display())]
    DiskChain {
        name: String,
        base: PathBuf,
        detail: String,
    },
    #[error("{what} is not possible here: {fix}")]
    Unavailable { what: String, fix: String },
    #[error("pulling {what}")]
    Pull {
        what: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Name(#[from] nubo_core::NameError),
    #[error(transparent)]
    Image(#[from] nubo_image::StoreError),
    #[error(transparent)]
    Disk(#[from] nubo_disk::DiskError),
    #[error(transparent)]
    Seed(#[from] nubo_seed::SeedError),
    #[error(transparent)]
    Backend(#[from] nubo_backend::BackendError),
    #[error(transparent)]
    Readiness(#[from] crate::readiness::ReadinessError),
}

impl EngineError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::NotFound(_) => ErrorKind::NotFound,
            EngineError::Conflict { .. } => ErrorKind::AlreadyExists,
            EngineError::Busy { .. } | EngineError::InvalidState { .. } | EngineError::Cancelled { .. } => {
                ErrorKind::InvalidState
            }
            EngineError::Spec(_) | EngineError::Name(_) | EngineError::SnapshotDescription(_) => {
                ErrorKind::InvalidInput
            }
            EngineError::SnapshotNotFound { .. } => ErrorKind::NotFound,
            EngineError::SnapshotExists { .. } => ErrorKind::AlreadyExists,
            EngineError::SnapshotRefused { .. } => ErrorKind::InvalidState,
            EngineError::Io { .. } => ErrorKind::Io,
            EngineError::Corrupt { .. } | EngineError::CorruptSettings { .. } | EngineError::DiskChain { .. } => {
                ErrorKind::Integrity
            }
            EngineError::Unavailable { .. } => ErrorKind::Unavailable,
            EngineError::Pull { .. } => ErrorKind::Remote,
            EngineError::Image(e) => e.kind(),
            EngineError::Disk(e) => e.kind(),
            EngineError::Seed(e) => e.kind(),
            EngineError::Backend(e) => e.kind(),
            EngineError::Readiness(_) => ErrorKind::Remote,
        }
    }

    pub fn io(name: &str, what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EngineError {
        let (name, what) = (name.to_owned(), what.into());
        move |source| EngineError::Io { name, what, source }
    }

    /// One invalid field.
    pub fn spec(field: nubo_spec::Field, message: impl Into<String>) -> EngineError {
        EngineError::spec_at(field, "", message)
    }

    /// One invalid element of a field (`suffix` like `.qemu.machine` or `[1]`).
    pub fn spec_at(field: nubo_spec::Field, suffix: &str, message: impl Into<String>) -> EngineError {
        let e = nubo_spec::FieldError::at(field, suffix, message);
        match nubo_spec::SpecErrors::check(vec![e]) {
            Err(e) => EngineError::Spec(e),
            Ok(()) => unreachable!("one error was given"),
        }
    }
}
