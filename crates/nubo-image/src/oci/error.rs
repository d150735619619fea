//! Errors of registry operations. Each names the registry or reference, the cause and the fix;
//! credentials never appear in them.

use std::path::PathBuf;

use nubo_core::ErrorKind;

use super::auth::AuthFileError;
use super::manifest::ManifestError;
use crate::error::PullError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum OciError {
    #[error(transparent)]
    Setup(Box<PullError>),
    #[error("could not connect to registry {registry}: nothing was transferred; check the address and that the registry is up")]
    Unreachable {
        registry: String,
        #[source]
        source: ureq::Error,
    },
    #[error("cannot resolve registry host `{registry}`: check the reference and the network's DNS")]
    Dns {
        registry: String,
        #[source]
        source: ureq::Error,
    },
    #[error("registry {registry} is not trusted: its certificate does not chain to a trusted CA (pass --ca-cert FILE), or it serves plain http (pass --insecure-registry if it is on a trusted network)")]
    Untrusted {
        registry: String,
        #[source]
        source: ureq::Error,
    },
    #[error("registry {registry} did not answer {url} within {secs} s (--timeout): it is stalled or too slow; raise --timeout if it is only slow")]
    Deadline { registry: String, url: String, secs: u64 },
    #[error(
        "registry {registry} was too slow on {url}: {why}; lower --speed-limit or raise --speed-time for a slow link"
    )]
    TooSlow { registry: String, url: String, why: String },
    #[error("talking to registry {registry} ({url})")]
    Transport {
        registry: String,
        url: String,
        #[source]
        source: ureq::Error,
    },
    #[error("registry {registry} requires credentials for {what} (HTTP 401): run `nubo registry login {registry}` (or check the credentials stored for it)")]
    Unauthorized { registry: String, what: String },
    #[error("registry {registry} denied {what} (HTTP 403): the account lacks permission on this repository; log in as one that has it (`nubo registry login {registry}`)")]
    Forbidden { registry: String, what: String },
    #[error("`{reference}` not found (HTTP 404): repository `{repository}` has no {what}; `nubo image ls-remote {registry}/{repository}` lists its tags")]
    NotFound {
        reference: String,
        registry: String,
        repository: String,
        what: String,
    },
    #[error("registry {registry} answered HTTP {status} to {what}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Status {
        registry: String,
        what: String,
        status: u16,
        detail: Option<String>,
    },
    #[error("registry {registry}'s token service answered {why}: check the registry's auth configuration")]
    Token { registry: String, why: String },
    #[error("`{reference}`: the manifest is {size} bytes, more than the {max} a manifest may have: refused unread")]
    ManifestTooBig { reference: String, size: u64, max: u64 },
    #[error("`{reference}`: the manifest the registry sent is {actual}, not the digest asked for: the registry's copy is corrupt or was tampered with; nothing was stored")]
    ManifestMismatch { reference: String, actual: String },
    /// The manifest error completes this sentence; it is not a chained source (printed once).
    #[error("`{reference}` {error}")]
    Manifest { reference: String, error: ManifestError },
    #[error("`{reference}`: the {what} blob {digest} does not match its digest (got {actual}): the registry's copy is corrupt or was tampered with; nothing was stored")]
    BlobMismatch {
        reference: String,
        what: &'static str,
        digest: String,
        actual: String,
    },
    #[error("`{reference}`: the registry sent {got} bytes of the {what} blob {digest} where the manifest says {expected}: the blob is truncated or the manifest's size is wrong; nothing was stored")]
    BlobSize {
        reference: String,
        what: &'static str,
        digest: String,
        expected: u64,
        got: u64,
    },
    #[error("`{reference}`: the compressed disk layer is refused: {why}; nothing was stored")]
    Decompress { reference: String, why: String },
    #[error("`{reference}`: the disk needs {need} bytes in {} and its filesystem has {free} free: free space there (or point NUBO_ROOT at a larger filesystem) and pull again; nothing was downloaded", dir.display())]
    NoRoom {
        reference: String,
        dir: PathBuf,
        need: u64,
        free: u64,
    },
    #[error("`{reference}`: transferring the {what} blob")]
    Transfer {
        reference: String,
        what: &'static str,
        #[source]
        source: Box<PullError>,
    },
    #[error("`{reference}`: the disk is not an image nubo stores (nothing was stored)")]
    Disk {
        reference: String,
        #[source]
        source: nubo_disk::DiskError,
    },
    #[error("`{reference}`: the disk has a backing file: nubo stores only self-contained images; nothing was stored")]
    HasBacking { reference: String },
    #[error("`{reference}`: the manifest says the disk is {annotated} but it is {actual}; nothing was stored")]
    Inconsistent {
        reference: String,
        annotated: String,
        actual: String,
    },
    #[error("push target `{0}` names a digest: push to a tag (`REGISTRY/REPO:TAG`); the pushed digest is printed for pinning")]
    PushToDigest(String),
    #[error("`{0}` names no registry host: write `REGISTRY/REPO[:TAG]`, e.g. `registry.example:5000/team/vm:1` (a host has a `.` or `:`, or is `localhost`)")]
    NoRegistry(String),
    #[error("image `{reference}` is {format}: only qcow2 and raw images can be pushed; `nubo image convert` it to qcow2 and import that")]
    Format { reference: String, format: String },
    #[error("image `{reference}`: the stored {what} {} no longer matches its digest {digest}: the store is damaged; `nubo image rm` it and pull or import it again", path.display())]
    StoreDamaged {
        reference: String,
        what: &'static str,
        path: PathBuf,
        digest: String,
    },
    #[error("writing {}: nothing was stored (is the disk full?)", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("registry {registry} stored the manifest as {got}, not {expected}: it rewrote the manifest; pin {got} if you trust it")]
    PushDigest {
        registry: String,
        expected: String,
        got: String,
    },
    #[error("`{reference}`: {why}")]
    Container { reference: String, why: String },
    #[error("`{0}` names a tag, which can move: pin the image by digest (`REGISTRY/REPO@sha256:<hex>`, `nubo image ls-remote` or `skopeo inspect` gives it) or pass --allow-mutable-tag (the resolved digest is recorded)")]
    MutableTag(String),
    #[error("local name for `{0}` would be longer than 128 characters: give one with --name name:tag")]
    NoLocalName(String),
    #[error(transparent)]
    AuthFile(#[from] AuthFileError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl OciError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            OciError::Setup(e) | OciError::Transfer { source: e, .. } => e.kind(),
            OciError::Unreachable { .. }
            | OciError::Dns { .. }
            | OciError::Untrusted { .. }
            | OciError::Transport { .. }
            | OciError::Deadline { .. }
            | OciError::TooSlow { .. }
            | OciError::Status { .. }
            | OciError::Token { .. }
            | OciError::PushDigest { .. } => ErrorKind::Remote,
            OciError::Unauthorized { .. } | OciError::Forbidden { .. } => ErrorKind::Remote,
            OciError::NotFound { .. } => ErrorKind::NotFound,
            OciError::ManifestTooBig { .. }
            | OciError::ManifestMismatch { .. }
            | OciError::BlobMismatch { .. }
            | OciError::BlobSize { .. }
            | OciError::Decompress { .. }
            | OciError::Inconsistent { .. }
            | OciError::StoreDamaged { .. } => ErrorKind::Integrity,
            OciError::Manifest { error, .. } => error.kind(),
            OciError::Disk { source, .. } => source.kind(),
            OciError::HasBacking { .. } | OciError::Format { .. } => ErrorKind::Unsupported,
            OciError::PushToDigest(_)
            | OciError::NoRegistry(_)
            | OciError::NoLocalName(_)
            | OciError::Container { .. }
            | OciError::MutableTag(_) => ErrorKind::InvalidInput,
            OciError::Io { .. } | OciError::Write { .. } | OciError::NoRoom { .. } => ErrorKind::Io,
            OciError::AuthFile(e) => e.kind(),
            OciError::Store(e) => e.kind(),
        }
    }
}
