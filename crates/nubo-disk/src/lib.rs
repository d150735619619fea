//! nubo-disk: what a disk image is, without asking qemu-img. A pure qcow2 header codec and
//! format sniffer (fuzzed: they face downloaded bytes), header readers for the formats nubo
//! imports, backing-chain inspection with a depth bound, and in-process creation of empty qcow2
//! images and thin overlays that record their backing format so qemu never probes a base.

mod create;
pub mod error;
pub mod foreign;
mod format;
mod inspect;
pub mod layout;
pub mod qcow2;

pub use create::{create_overlay, create_qcow2};
pub use error::{DiskError, HeaderError};
pub use format::{sniff, Format, UnknownFormat, SNIFF_LEN};
pub use inspect::{inspect, inspect_as, Backing, DiskInfo, MAX_BACKING_DEPTH};
pub use qcow2::{CryptMethod, Qcow2Header};

/// Parses a qcow2 header from the start of an image (see [`qcow2::parse_qcow2_header`]: the
/// first cluster always holds everything it reads). Pure; never panics on any input.
pub fn parse_qcow2_header(bytes: &[u8]) -> Result<Qcow2Header, DiskError> {
    Ok(qcow2::parse_qcow2_header(bytes)?)
}
