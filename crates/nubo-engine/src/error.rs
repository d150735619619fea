use std::path::PathBuf;

use nubo_core::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("vm `{0}` does not exist: `nubo vm ls` lists the VMs")]
    NotFound(String),
    #[error("vm `{name}` already exists with a different spec ({}): remove it first (`nubo vm rm --force {name}`) or use another name", differences.join("; "))]
    Conflict { name: String, differences: Vec<String> },
    #[error("vm `{name}` is busy: another nubo command ({holder}) is working on it; wait for it to finish and retry")]
    Busy { name: String, holder: String },
    #[error("vm `{name}` is {state}: {fix}")]
    InvalidState { name: String, state: String, fix: String },
    #[error("{0}")]
    InvalidInput(String),
    #[error("vm `{name}`: {what}")]
    Io {
        name: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("vm record {} is corrupt: fix or remove it (`nubo vm rm --force`)", path.display())]
    Corrupt {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
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
    #[error("{0}")]
    Readiness(String),
}

impl EngineError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            EngineError::NotFound(_) => ErrorKind::NotFound,
            EngineError::Conflict { .. } => ErrorKind::AlreadyExists,
            EngineError::Busy { .. } | EngineError::InvalidState { .. } => ErrorKind::InvalidState,
            EngineError::InvalidInput(_) | EngineError::Name(_) => ErrorKind::InvalidInput,
            EngineError::Io { .. } => ErrorKind::Io,
            EngineError::Corrupt { .. } => ErrorKind::Integrity,
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
}
