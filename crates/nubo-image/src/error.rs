//! Errors of pulls, imports and conversions. Each names the object (URL, path, reference), the
//! cause, and what to do about it.

use std::io;
use std::path::PathBuf;

use nubo_core::ErrorKind;

use crate::checksum::ChecksumError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("`{0}` is plain http, which lets anyone on the path swap the image: use https, or pass --allow-http if this mirror is trusted")]
    HttpRefused(String),
    #[error("`{0}` is not an http(s) URL")]
    BadUrl(String),
    #[error("`{reference}` is not in nubo's catalog: known are {}", known.join(", "))]
    NotInCatalog { reference: String, known: Vec<String> },
    #[error("cannot name an image after `{0}`: give one with --name name:tag")]
    NoName(String),
    #[error("cannot read CA certificates from {}", path.display())]
    CaFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} holds no PEM certificate: give a PEM CA bundle", path.display())]
    CaEmpty { path: PathBuf },
    #[error("no system CA store found (tried {}): install ca-certificates, or set SSL_CERT_FILE or --ca-cert", tried.join(", "))]
    NoSystemCa { tried: Vec<String> },
    #[error("fetching {url}")]
    Http {
        url: String,
        #[source]
        source: ureq::Error,
    },
    #[error("{url} is not trusted: its certificate does not chain to a trusted CA; for a private mirror pass --ca-cert FILE (or set SSL_CERT_FILE)")]
    Untrusted {
        url: String,
        #[source]
        source: ureq::Error,
    },
    #[error("{url} answered HTTP {status}")]
    Status { url: String, status: u16 },
    #[error("checksum file {url} is not usable: fix the mirror or pass --checksum")]
    Checksum {
        url: String,
        #[source]
        source: ChecksumError,
    },
    #[error("{url} has no checksum (no --checksum given and {url}.sha256 does not exist): only TLS vouches for these bytes; pass --checksum sha256:<hex>, or --insecure-no-checksum to accept that")]
    NoChecksum { url: String },
    #[error("{url} does not match its checksum: expected {expected}, got {actual}; the partial file was deleted (if the mirror just published a new build, pull again)")]
    Mismatch {
        url: String,
        expected: String,
        actual: String,
    },
    #[error("{url} is {got} bytes, but its checksum file says {expected}; the partial file was deleted")]
    SizeMismatch { url: String, expected: u64, got: u64 },
    #[error(
        "{url}: the connection failed {attempts} times; the partial download is kept and the next pull resumes it"
    )]
    Interrupted {
        url: String,
        attempts: u32,
        #[source]
        source: io::Error,
    },
    #[error("writing {} failed and the partial file was deleted: free space in the image store (or raise the file size limit) and pull again", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot lock {}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("inspecting downloaded image from {url}")]
    Disk {
        url: String,
        #[source]
        source: nubo_disk::DiskError,
    },
    #[error("{url} is an overlay with a backing file: nubo stores only self-contained images; flatten it with `qemu-img convert` and import it")]
    HasBacking { url: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A transport error for `url`, told apart when it is a certificate the client does not trust
/// (the one users can fix with a flag).
pub fn http_error(url: &str, source: ureq::Error) -> PullError {
    let url = url.to_owned();
    if source.to_string().contains("certificate") {
        PullError::Untrusted { url, source }
    } else {
        PullError::Http { url, source }
    }
}

impl PullError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            PullError::HttpRefused(_) | PullError::BadUrl(_) | PullError::NoName(_) | PullError::CaEmpty { .. } => {
                ErrorKind::InvalidInput
            }
            PullError::NotInCatalog { .. } => ErrorKind::NotFound,
            PullError::NoSystemCa { .. } => ErrorKind::Unavailable,
            PullError::Http { .. }
            | PullError::Untrusted { .. }
            | PullError::Status { .. }
            | PullError::Interrupted { .. } => ErrorKind::Remote,
            PullError::Checksum { .. }
            | PullError::NoChecksum { .. }
            | PullError::Mismatch { .. }
            | PullError::SizeMismatch { .. } => ErrorKind::Integrity,
            PullError::CaFile { .. } | PullError::Write { .. } | PullError::Lock { .. } => ErrorKind::Io,
            PullError::Disk { source, .. } => source.kind(),
            PullError::HasBacking { .. } => ErrorKind::Unsupported,
            PullError::Store(e) => e.kind(),
        }
    }
}
