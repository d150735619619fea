//! Errors. [`HeaderError`] is what the pure codecs say about bytes; [`DiskError`] adds the file
//! it came from and the I/O around it.

use std::io;
use std::path::PathBuf;

use nubo_core::{ByteSize, ErrorKind};

use crate::inspector::Rejection;
use crate::Format;

/// Why a run of bytes is not an image header nubo accepts. Pure: it names no file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("{format} header is truncated: {need} bytes needed, {got} present")]
    Truncated { format: Format, need: usize, got: usize },
    #[error("no {format} magic at the start: the file is not a {format} image")]
    BadMagic { format: Format },
    #[error("qcow2 version {0} does not exist: only versions 2 and 3 do")]
    Version(u32),
    #[error("qcow2 cluster_bits {0} is outside 9..=21: the header is corrupt")]
    ClusterBits(u32),
    #[error(
        "qcow2 header_length {len} is invalid: it must be a multiple of 8 between 104 and the cluster size {cluster}"
    )]
    HeaderLength { len: u32, cluster: u32 },
    #[error("qcow2 refcount_order {0} is outside 0..=6: the header is corrupt")]
    RefcountOrder(u32),
    #[error("qcow2 backing file name (offset {offset}, {len} bytes) does not fit in the first cluster or exceeds 1023 bytes")]
    BackingName { offset: u64, len: u32 },
    #[error("qcow2 {what} is not NUL-free UTF-8: nubo cannot name it safely")]
    Encoding { what: &'static str },
    #[error("qcow2 header extension {kind:#010x} at offset {offset} ({len} bytes) runs past the header area")]
    Extension { kind: u32, offset: usize, len: u32 },
    #[error("qcow2 header extension {kind:#010x} appears twice: the header is ambiguous")]
    DuplicateExtension { kind: u32 },
    #[error("qcow2 backing format name is {0} bytes long: qemu accepts at most 15")]
    BackingFormatLength(u32),
    #[error("{format} header field {field} is invalid: {why}")]
    Field {
        format: Format,
        field: &'static str,
        why: String,
    },
}

impl HeaderError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            HeaderError::Version(_) => ErrorKind::Unsupported,
            _ => ErrorKind::InvalidInput,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// From the pure codecs, which know no path.
    #[error("malformed image header")]
    Header(#[from] HeaderError),
    #[error("disk image `{path}` has a malformed header")]
    Invalid {
        path: PathBuf,
        #[source]
        source: HeaderError,
    },
    /// The inspector refused the image; the reason says what it is and the fix.
    #[error("disk image `{path}` {reason}")]
    Refused { path: PathBuf, reason: Rejection },
    /// Not a regular file (a FIFO, a device, a directory), or it could not be opened.
    #[error(transparent)]
    File(#[from] nubo_core::FileError),
    #[error("disk image `{path}` is a {format} image, which nubo converts but does not boot: import it with `nubo image import`, which converts it to qcow2")]
    NotBase { path: PathBuf, format: Format },
    #[error("disk image `{0}` does not exist: check the path")]
    NotFound(PathBuf),
    #[error(
        "backing file `{backing}` of disk image `{image}` does not exist: restore it, or the image cannot be used"
    )]
    MissingBacking { image: PathBuf, backing: PathBuf },
    #[error("path `{0}` is not UTF-8: qcow2 cannot record it as a backing file name; rename it")]
    NonUtf8Path(PathBuf),
    #[error("`{0}` already exists: nubo never overwrites a disk; remove it or choose another path")]
    AlreadyExists(PathBuf),
    #[error("cannot {action} `{path}`")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("disk image `{path}` is {found}, not {expected} as stated: fix the recorded format")]
    FormatMismatch {
        path: PathBuf,
        expected: Format,
        found: Format,
    },
    #[error("disk image `{path}` is encrypted: nubo does not open encrypted images")]
    Encrypted { path: PathBuf },
    #[error("backing chain of `{path}` is deeper than {max} images: flatten it with `qemu-img convert -O qcow2`")]
    ChainTooDeep { path: PathBuf, max: u32 },
    #[error("backing chain of `{path}` loops back to `{repeated}`: the chain is corrupt or malicious")]
    ChainLoop { path: PathBuf, repeated: PathBuf },
    #[error("overlay size {requested} is smaller than the base `{base}` ({base_size}): give at least {base_size}")]
    TooSmall {
        base: PathBuf,
        requested: ByteSize,
        base_size: ByteSize,
    },
    #[error("virtual size {0} bytes is not a multiple of 512: give a whole number of sectors")]
    Unaligned(u64),
    #[error("virtual size {0} is too large for a qcow2 image with 64 KiB clusters (at most 2048T)")]
    TooLarge(ByteSize),
    #[error("base path `{0}` is longer than the 1023 bytes qcow2 allows for a backing file name: move the base")]
    BackingPathTooLong(PathBuf),
    /// A VM's overlay no longer names the base nubo made it over (see [`crate::verify_vm_chain`]).
    #[error("overlay `{overlay}` is not the one nubo made: {why}")]
    ChainChanged { overlay: PathBuf, why: String },
    #[error("base image `{path}` is {found} bytes, and it was {recorded} bytes when the VM was made: it was replaced")]
    BaseResized { path: PathBuf, recorded: u64, found: u64 },
}

impl DiskError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            DiskError::Header(e) | DiskError::Invalid { source: e, .. } => e.kind(),
            DiskError::NotFound(_) | DiskError::MissingBacking { .. } => ErrorKind::NotFound,
            DiskError::AlreadyExists(_) => ErrorKind::AlreadyExists,
            DiskError::Io { .. } => ErrorKind::Io,
            DiskError::Refused { reason, .. } => reason.kind(),
            DiskError::File(e) => e.kind(),
            DiskError::Encrypted { .. } | DiskError::NotBase { .. } => ErrorKind::Unsupported,
            DiskError::FormatMismatch { .. }
            | DiskError::ChainTooDeep { .. }
            | DiskError::ChainLoop { .. }
            | DiskError::TooSmall { .. }
            | DiskError::Unaligned(_)
            | DiskError::TooLarge(_)
            | DiskError::BackingPathTooLong(_)
            | DiskError::NonUtf8Path(_) => ErrorKind::InvalidInput,
            DiskError::ChainChanged { .. } | DiskError::BaseResized { .. } => ErrorKind::Integrity,
        }
    }

    /// Maps an I/O error on `path`, keeping "not found" and "exists" as their own variants
    /// because callers branch on them.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        let path = path.into();
        match source.kind() {
            io::ErrorKind::NotFound => DiskError::NotFound(path),
            io::ErrorKind::AlreadyExists => DiskError::AlreadyExists(path),
            _ => DiskError::Io { action, path, source },
        }
    }
}
