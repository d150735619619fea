//! Bounds-checked integer reads from untrusted header bytes, generic over byte order: one
//! reader for the little-endian formats (VMDK, VDI, VHDX) and the big-endian ones (VPC,
//! qcow). Out-of-range reads are `None` or a `Truncated` error naming the format, never a panic.

use std::marker::PhantomData;

use crate::error::HeaderError;
use crate::Format;

pub(crate) trait ByteOrder {
    fn u32(b: [u8; 4]) -> u32;
    fn u64(b: [u8; 8]) -> u64;
}

pub(crate) enum Little {}
pub(crate) enum Big {}

impl ByteOrder for Little {
    fn u32(b: [u8; 4]) -> u32 {
        u32::from_le_bytes(b)
    }
    fn u64(b: [u8; 8]) -> u64 {
        u64::from_le_bytes(b)
    }
}

impl ByteOrder for Big {
    fn u32(b: [u8; 4]) -> u32 {
        u32::from_be_bytes(b)
    }
    fn u64(b: [u8; 8]) -> u64 {
        u64::from_be_bytes(b)
    }
}

fn array<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

pub(crate) fn u32_at<O: ByteOrder>(b: &[u8], at: usize) -> Option<u32> {
    array(b, at).map(O::u32)
}

pub(crate) fn u64_at<O: ByteOrder>(b: &[u8], at: usize) -> Option<u64> {
    array(b, at).map(O::u64)
}

/// A header's bytes with the format they claim to be, for errors that name it.
pub(crate) struct Reader<'a, O> {
    bytes: &'a [u8],
    format: Format,
    order: PhantomData<O>,
}

pub(crate) type Le<'a> = Reader<'a, Little>;
pub(crate) type Be<'a> = Reader<'a, Big>;

impl<'a, O: ByteOrder> Reader<'a, O> {
    pub(crate) fn new(bytes: &'a [u8], format: Format) -> Self {
        Reader {
            bytes,
            format,
            order: PhantomData,
        }
    }

    fn truncated(&self, need: usize) -> HeaderError {
        HeaderError::Truncated {
            format: self.format,
            need,
            got: self.bytes.len(),
        }
    }

    pub(crate) fn slice(&self, at: usize, len: usize) -> Result<&'a [u8], HeaderError> {
        let end = at.saturating_add(len);
        self.bytes.get(at..end).ok_or_else(|| self.truncated(end))
    }

    pub(crate) fn u8(&self, at: usize) -> Result<u8, HeaderError> {
        Ok(self.slice(at, 1)?[0])
    }

    pub(crate) fn u32(&self, at: usize) -> Result<u32, HeaderError> {
        u32_at::<O>(self.bytes, at).ok_or_else(|| self.truncated(at.saturating_add(4)))
    }

    pub(crate) fn u64(&self, at: usize) -> Result<u64, HeaderError> {
        u64_at::<O>(self.bytes, at).ok_or_else(|| self.truncated(at.saturating_add(8)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_reads_both_orders() {
        let b = [1, 2, 3, 4, 5, 6, 7, 8];

        assert_eq!(Le::new(&b, Format::Vdi).u32(0).unwrap(), 0x0403_0201);
        assert_eq!(Be::new(&b, Format::Vpc).u32(0).unwrap(), 0x0102_0304);
        assert_eq!(Be::new(&b, Format::Vpc).u64(0).unwrap(), 0x0102_0304_0506_0708);
    }

    #[test]
    fn reader_past_end_is_truncated_naming_format() {
        let err = Le::new(&[0u8; 6], Format::Vhdx).u64(usize::MAX - 2).unwrap_err();

        assert!(
            matches!(
                err,
                HeaderError::Truncated {
                    format: Format::Vhdx,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn u32_at_overflowing_offset_is_none() {
        assert_eq!(u32_at::<Little>(&[0u8; 4], usize::MAX), None);
    }
}
