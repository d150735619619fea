//! ISO9660 with a Joliet supplementary tree: the NoCloud seed format every cloud-init reads.
//!
//! Layout (2048-byte sectors), fixed so the same files always give the same bytes:
//!
//! | sector | contents |
//! |---|---|
//! | 0-15 | system area (zeros) |
//! | 16 | primary volume descriptor |
//! | 17 | Joliet supplementary volume descriptor (UCS-2 level 3, `%/E`) |
//! | 18 | volume descriptor set terminator |
//! | 19, 20 | primary path table, L then M |
//! | 21, 22 | Joliet path table, L then M |
//! | 23.. | primary root directory, then the Joliet root directory |
//! | .. | file data, each file starting on a sector, shared by both trees |
//!
//! No Rock Ridge, no padding beyond the last sector: the image is as small as ISO9660 allows.

mod names;
mod read;
mod write;

pub use read::read_iso;
pub(crate) use write::image_len_hint;
pub use write::{write_iso_files, MAX_FILE_SIZE};

pub(crate) const SECTOR: usize = 2048;
/// Where ISO9660 puts the first volume descriptor (after the 32 KiB system area).
pub(crate) const FIRST_DESCRIPTOR: usize = 16;
pub(crate) const STANDARD_ID: &[u8; 5] = b"CD001";
/// cloud-init finds the NoCloud seed by this filesystem label (it accepts either case).
pub const VOLUME_ID: &str = "CIDATA";
/// Joliet UCS-2 level 3: the escape sequence Linux, Windows and pycdlib all recognise.
pub(crate) const JOLIET_ESCAPES: [&[u8; 3]; 3] = [b"%/@", b"%/C", b"%/E"];

/// Directory record flag bits (ECMA-119 9.1.6).
pub(crate) const FLAG_DIRECTORY: u8 = 0x02;
pub(crate) const FLAG_ASSOCIATED: u8 = 0x04;
pub(crate) const FLAG_MULTI_EXTENT: u8 = 0x80;

pub(crate) fn sectors_for(len: usize) -> usize {
    len.div_ceil(SECTOR)
}
