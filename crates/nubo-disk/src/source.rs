//! Where the inspector's bytes come from: one already-open file, or a slice in memory. The
//! inspector sees only this trait, so by construction it reads the one object it was handed and
//! can open nothing else: no extent, backing file or parent a header names.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Positional reads from one object of known length.
pub trait ReadAt {
    /// The object's length in bytes.
    fn size(&self) -> u64;

    /// Reads into `buf` from `offset`; fewer bytes than asked only at the end.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
}

impl ReadAt for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(self.len());
        let n = buf.len().min(self.len() - start);
        buf[..n].copy_from_slice(&self[start..start + n]);
        Ok(n)
    }
}

/// An open regular file and the length `fstat` gave when it was opened: the bounds every header
/// is checked against.
#[derive(Debug)]
pub struct FileSource {
    file: File,
    len: u64,
}

impl FileSource {
    pub fn new(file: File) -> io::Result<Self> {
        let len = file.metadata()?.len();
        Ok(FileSource { file, len })
    }

    pub fn file(&self) -> &File {
        &self.file
    }

    pub fn into_file(self) -> File {
        self.file
    }
}

impl ReadAt for FileSource {
    fn size(&self) -> u64 {
        self.len
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let want = buf
            .len()
            .min(usize::try_from(self.len.saturating_sub(offset)).unwrap_or(usize::MAX));
        let mut got = 0;
        while got < want {
            match self.file.read_at(&mut buf[got..want], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    }
}

/// Up to `len` bytes from `offset`, clamped to the object's end (and so never more than it
/// holds, whatever a header claims).
pub(crate) fn read_clamped<S: ReadAt + ?Sized>(src: &S, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let avail = src.size().saturating_sub(offset);
    let len = len.min(usize::try_from(avail).unwrap_or(usize::MAX));
    let mut buf = vec![0u8; len];
    let n = src.read_at(&mut buf, offset)?;
    buf.truncate(n);
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_read_at_past_end_reads_nothing() {
        let bytes: &[u8] = b"abc";
        let mut buf = [0u8; 4];

        let n = bytes.read_at(&mut buf, 10).unwrap();

        assert_eq!(n, 0);
    }

    #[test]
    fn read_clamped_stops_at_end() {
        let bytes: &[u8] = b"abcdef";

        let got = read_clamped(bytes, 4, 100).unwrap();

        assert_eq!(got, b"ef");
    }
}
