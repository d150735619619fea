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
    #[error("{url} did not answer within the deadline (--timeout): the server is stalled or too slow; raise --timeout if it is only slow")]
    Deadline { url: String },
    #[error("{url} was too slow: {why}; the partial download is kept (pull again to resume), or lower --speed-limit or raise --speed-time for a slow link")]
    TooSlow { url: String, why: String },
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
    #[error("{url}: the transfer failed {attempts} time{}; {}", plural(*attempts), kept_note(*kept))]
    Interrupted {
        url: String,
        attempts: u32,
        /// Bytes kept in the partial file for the next pull to resume.
        kept: u64,
        #[source]
        source: io::Error,
    },
    #[error("{url}: the pull was cancelled; {}", kept_note(*kept))]
    Cancelled {
        url: String,
        /// Bytes kept in the partial file for the next pull to resume.
        kept: u64,
    },
    #[error("could not connect to {addr} (fetching {url}): nothing was downloaded; check the URL and that the server is up, or use a reachable mirror (--mirror, NUBO_MIRROR_<DISTRO>)")]
    Connect {
        addr: String,
        url: String,
        #[source]
        source: ureq::Error,
    },
    #[error("cannot resolve host `{host}` (fetching {url}): check the URL and the network's DNS, or set NUBO_MIRROR_<DISTRO> (or --mirror) to a reachable mirror")]
    Dns {
        host: String,
        url: String,
        #[source]
        source: ureq::Error,
    },
    #[error("refused redirect from {from} to {to}: only https (and http with --allow-http) are followed")]
    RedirectRefused { from: String, to: String },
    #[error("{url} redirected more than {max} times: check the URL or use another mirror")]
    TooManyRedirects { url: String, max: u32 },
    #[error("`{0}` is an OCI registry reference: pull it with `nubo image pull` (the registry client), not as a URL or catalog image")]
    OciUnsupported(String),
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

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn kept_note(kept: u64) -> String {
    if kept == 0 {
        "nothing was downloaded".to_owned()
    } else {
        format!("{kept} bytes are kept and the next pull resumes from there (`nubo image prune` removes them)")
    }
}

/// A transport error for `url`, told apart when the user can act on it: a name that does not
/// resolve, a host that does not answer, a certificate the client does not trust.
pub fn http_error(url: &str, source: ureq::Error) -> PullError {
    let url = url.to_owned();
    if is_dns(&source) {
        PullError::Dns {
            host: crate::http::host(&url),
            url,
            source,
        }
    } else if is_deadline(&source) {
        PullError::Deadline { url }
    } else if is_connect(&source) {
        PullError::Connect {
            addr: crate::http::host_port(&url),
            url,
            source,
        }
    } else if is_tls(&source) {
        PullError::Untrusted { url, source }
    } else {
        PullError::Http { url, source }
    }
}

/// Whether `e` is the whole request's deadline (`--timeout`) running out.
pub fn is_deadline(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Timeout(ureq::Timeout::Global | ureq::Timeout::PerCall | ureq::Timeout::RecvResponse)
    )
}

/// getaddrinfo failures reach ureq's resolver as plain I/O errors.
fn is_dns(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::HostNotFound => true,
        ureq::Error::Io(io) => io.to_string().contains("failed to lookup address"),
        _ => false,
    }
}

/// Nothing accepted the connection (refused, unreachable, connect timeout).
pub fn is_connect(e: &ureq::Error) -> bool {
    match e {
        ureq::Error::ConnectionFailed => true,
        ureq::Error::Timeout(t) => matches!(t, ureq::Timeout::Connect | ureq::Timeout::Resolve),
        ureq::Error::Io(io) => matches!(
            io.kind(),
            io::ErrorKind::ConnectionRefused | io::ErrorKind::NetworkUnreachable | io::ErrorKind::HostUnreachable
        ),
        _ => false,
    }
}

/// A certificate problem: never transient, fixable with --ca-cert.
pub fn is_tls(e: &ureq::Error) -> bool {
    matches!(e, ureq::Error::Rustls(_) | ureq::Error::Tls(_)) || e.to_string().contains("certificate")
}

impl PullError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            PullError::HttpRefused(_)
            | PullError::BadUrl(_)
            | PullError::NoName(_)
            | PullError::CaEmpty { .. }
            | PullError::RedirectRefused { .. } => ErrorKind::InvalidInput,
            PullError::OciUnsupported(_) => ErrorKind::Unsupported,
            PullError::NotInCatalog { .. } => ErrorKind::NotFound,
            PullError::NoSystemCa { .. } => ErrorKind::Unavailable,
            PullError::Http { .. }
            | PullError::Deadline { .. }
            | PullError::TooSlow { .. }
            | PullError::Untrusted { .. }
            | PullError::Status { .. }
            | PullError::Interrupted { .. }
            | PullError::Cancelled { .. }
            | PullError::Connect { .. }
            | PullError::Dns { .. }
            | PullError::TooManyRedirects { .. } => ErrorKind::Remote,
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
