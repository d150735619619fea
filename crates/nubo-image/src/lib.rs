//! Image references, the distro catalog, checksum-file parsers, verified downloads, the
//! content-addressed image store and its JSON records, import and convert.

pub mod catalog;
pub mod checksum;
pub mod convert;
pub mod digest;
mod download;
pub mod error;
pub mod http;
pub mod import;
mod lock;
pub mod pull;
pub mod record;
pub mod reference;
pub mod store;
pub mod usage;

pub use checksum::{Algorithm, Checksum, ChecksumError};
pub use convert::{convert, ConvertError, ConvertSpec};
pub use error::PullError;
pub use http::TlsSettings;
pub use import::{import, ImportError, ImportRequest};
pub use pull::{pull, PullEvent, PullRequest, PullSource};
pub use record::{BootFiles, Firmware, ImageRecord, ImageSource, SourceKind};
pub use reference::{ImageRef, RefError};
pub use store::{ImageStore, StoreError};
pub use usage::vms_using;
