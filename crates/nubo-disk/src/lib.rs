//! nubo-disk: what a disk image is, without asking qemu-img. A pure qcow2 header codec, the
//! image inspector every untrusted image goes through (pure over [`ReadAt`] and fuzzed: it faces
//! downloaded bytes, identifies every format QEMU could probe and accepts only self-contained
//! ones), the file-level entry points that open only regular files, and in-process creation of
//! empty qcow2 images and thin overlays that record their backing format so qemu never probes
//! a base.

mod bytes;
mod chain;
mod create;
pub mod error;
pub mod foreign;
mod format;
mod inspect;
pub mod inspector;
pub mod layout;
pub mod qcow2;
pub mod snapshots;
pub mod source;

pub use chain::{verify_vm_chain, ExpectedBase, VerifiedChain};
pub use create::{create_overlay, create_qcow2, overlay_base, OverlayBase};
pub use error::{DiskError, HeaderError};
pub use format::{sniff, Format, UnknownFormat, SNIFF_LEN};
pub use inspect::{
    inspect, inspect_as, inspect_base, inspect_overlay_chain, open_inspected, Backing, DiskInfo, MAX_BACKING_DEPTH,
};
pub use inspector::{identify, inspect_image, Detected, InspectError, Inspection, Rejection, Usage, MAX_VIRTUAL_SIZE};
pub use qcow2::{CryptMethod, Qcow2Header};
pub use snapshots::{read_snapshot_table, SnapshotEntry, SnapshotTableError};
pub use source::ReadAt;

/// Parses a qcow2 header from the start of an image (see [`qcow2::parse_qcow2_header`]: the
/// first cluster always holds everything it reads). Pure; never panics on any input.
pub fn parse_qcow2_header(bytes: &[u8]) -> Result<Qcow2Header, DiskError> {
    Ok(qcow2::parse_qcow2_header(bytes)?)
}

/// Untrusted text from a header, made safe to print: control characters escaped, at most 256
/// characters.
pub(crate) fn escape(text: &str) -> String {
    const MAX: usize = 256;
    let mut s = nubo_core::file::escape_control(text)
        .replace('\n', "\\n")
        .replace('\t', "\\t");
    if let Some((cut, _)) = s.char_indices().nth(MAX) {
        s.truncate(cut);
        s.push_str("...");
    }
    s
}
