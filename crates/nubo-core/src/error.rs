//! The small set of error kinds callers branch on. Every crate's error enum maps onto one.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    InvalidInput,
    InvalidState,
    Unsupported,
    Unavailable,
    Io,
    Remote,
    Integrity,
}
