//! Image references, the distro catalog, checksum-file parsers, verified downloads, the
//! content-addressed image store and its JSON records, import and convert.
//!
//! Imports inside the crate go one way: `pull` -> `download` -> (`http`, `pipeline`) -> `error`;
//! `download` reports its own `DownloadEvent`s and knows nothing of pulls.

pub mod catalog;
pub mod checksum;
pub mod convert;
pub mod digest;
mod download;
pub mod error;
pub mod http;
pub mod import;
mod lock;
pub mod oci;
mod pipeline;
pub mod pull;
pub mod record;
pub mod reference;
pub mod store;

pub use checksum::{Algorithm, Checksum, ChecksumError};
pub use convert::{convert, ConvertError, ConvertSpec};
pub use download::DownloadEvent;
pub use error::PullError;
pub use http::TlsSettings;
pub use import::{import, ImportError, ImportRequest};
pub use pull::{pull, PullConfig, PullEvent, PullRequest, PullSource};
pub use record::{BootFiles, BuildProvenance, BuildStep, Firmware, ImageRecord, ImageSource, SourceKind};
pub use reference::{AnyRef, ImageRef, OciRef, RefError};
pub use store::{Added, ImageStore, Overwrite, PruneReport, Pruned, StoreError, TagChange};
