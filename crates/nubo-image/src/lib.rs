//! Image references, the content-addressed image store and its JSON records.

pub mod record;
pub mod reference;
pub mod store;

pub use record::{BootFiles, Firmware, ImageRecord, ImageSource, SourceKind};
pub use reference::{ImageRef, RefError};
pub use store::{ImageStore, StoreError};
