use std::path::PathBuf;

use crate::ParseError;

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The parse error is part of this message, not a chained source: printed once.
    #[error("{}: {error}", file.display())]
    Parse { file: PathBuf, error: ParseError },
    /// A file of the build context that cannot be used.
    #[error("build context: {0}")]
    Context(String),
    #[error("step {index}/{total} (VMfile line {line}: `{instruction}`) failed: {detail}")]
    Step {
        index: usize,
        total: usize,
        line: usize,
        instruction: String,
        detail: String,
    },
    #[error("{what}: {detail}")]
    Tool { what: String, detail: String },
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Engine(#[from] nubo_engine::EngineError),
    #[error(transparent)]
    Store(#[from] nubo_image::StoreError),
    #[error(transparent)]
    Disk(#[from] nubo_disk::DiskError),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> BuildError {
    let what = what.into();
    move |source| BuildError::Io { what, source }
}
