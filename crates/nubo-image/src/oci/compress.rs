//! zstd for disk layers (`nubo image push --compress`): compress a stored disk into a temporary
//! file whose sha256 and size become the layer's descriptor, and decompress a pulled layer into
//! the disk, hashing it on the way and refusing to write more than the size the manifest
//! annotates (a decompression bomb stops there).

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Write};
use std::path::Path;

use crate::digest::StreamHasher;
use crate::pipeline::{self, Ended};

/// zstd level 1, not the default 3: on the bootstrapped Debian qcow2 (477 MiB) level 1 gives
/// 167 MiB in 1.4 s and level 3 150 MiB in 4.0 s (2 cores, loaded): 11% more bytes for 2.7x less
/// time, which wins on any link faster than ~50 MiB/s and the compression still runs first.
const LEVEL: i32 = 1;
/// Compression workers: both cores of a small host (libzstd's own threads).
const WORKERS: u32 = 2;

/// Compresses `src` into `dst` (created, truncated); returns the sha256 and size of what was
/// written.
pub fn compress(src: &Path, dst: &Path) -> io::Result<(String, u64)> {
    let input = File::open(src)?;
    let out = OpenOptions::new().write(true).create(true).truncate(true).open(dst)?;
    let sink = Hashed {
        inner: io::BufWriter::with_capacity(pipeline::BUF, out),
        hasher: StreamHasher::new(None),
        written: 0,
    };
    let mut enc = zstd::stream::write::Encoder::new(sink, LEVEL)?;
    // A libzstd built without threads says so here; one thread is still right, just slower.
    let _ = enc.multithread(WORKERS);
    enc.include_checksum(true)?;
    io::copy(&mut BufReader::with_capacity(pipeline::BUF, input), &mut enc)?;
    let mut sink = enc.finish()?;
    sink.inner.flush()?;
    Ok((sink.hasher.finish().sha256.to_string(), sink.written))
}

struct Hashed<W> {
    inner: W,
    hasher: StreamHasher,
    written: u64,
}

impl<W: Write> Write for Hashed<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Why a decompression failed.
#[derive(Debug)]
pub enum DecompressError {
    /// Not a zstd stream, or a damaged one.
    Corrupt(io::Error),
    Write(io::Error),
    /// It decompresses to more than `limit` bytes.
    TooBig {
        limit: u64,
    },
    /// More than `max` of its bytes are data (not zero runs): more than a real disk's content
    /// compresses from this many bytes ([`max_data`]).
    TooDense {
        max: u64,
    },
}

/// Holes are made per block of this size: the page and filesystem block size, so a hole is
/// a hole on every Linux filesystem.
const HOLE_BLOCK: usize = 4096;

/// The most data (non-zero blocks) a decompressed disk may hold for `compressed` bytes of
/// layer: 64 MiB + 64x. Zero runs are written as holes and cost no space, so only data is
/// bounded. A disk's data is binaries, packages and text, which zstd level 1 shrinks 2-5x
/// (the bootstrapped Debian qcow2: 477 MiB to 167 MiB, 2.9x); past 64x it is fill patterns,
/// not content. The 64 MiB covers small images, whose headers and tables are most of them.
pub fn max_data(compressed: u64) -> u64 {
    (64u64 << 20).saturating_add(compressed.saturating_mul(64))
}

/// The most bytes, holes included, a decompressed disk may have for `compressed` bytes of
/// layer: 1 GiB + 1024x. It bounds the time a layer of zeros can make the pull spend hashing
/// them; a real sparse raw disk is at least a thousandth data (a 20 GiB disk with a 1 GiB
/// system is 20x), and a disk emptier than that is pushed as qcow2, which stores no zeros.
pub fn max_apparent(compressed: u64) -> u64 {
    (1u64 << 30).saturating_add(compressed.saturating_mul(1024))
}

/// The marker a [`Sparse`] write fails with when the data passes its bound.
#[derive(Debug)]
struct Dense(u64);

impl std::fmt::Display for Dense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "more than {} bytes of data", self.0)
    }
}

impl std::error::Error for Dense {}

/// Writes at increasing offsets, skipping all-zero blocks (holes, made real by the caller's
/// `set_len`) and refusing once more than `max_data` bytes of data were written.
struct Sparse {
    file: File,
    pos: u64,
    data: u64,
    max_data: u64,
}

impl Sparse {
    fn put(&mut self, run: &[u8], at: u64) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        if run.is_empty() {
            return Ok(());
        }
        if self.data + run.len() as u64 > self.max_data {
            return Err(io::Error::other(Dense(self.max_data)));
        }
        self.file.write_all_at(run, at)?;
        self.data += run.len() as u64;
        Ok(())
    }
}

fn is_zero(block: &[u8]) -> bool {
    // Data blocks mostly show it in their first or last byte; the fold vectorises.
    block.first() == Some(&0) && block.last() == Some(&0) && block.iter().fold(0u8, |a, b| a | b) == 0
}

impl Write for Sparse {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Runs of data blocks go out in one write each; zero blocks only move the offset.
        let mut run_start = 0;
        let mut at = 0;
        for block in buf.chunks(HOLE_BLOCK) {
            if is_zero(block) {
                self.put(&buf[run_start..at], self.pos + run_start as u64)?;
                run_start = at + block.len();
            }
            at += block.len();
        }
        self.put(&buf[run_start..], self.pos + run_start as u64)?;
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Decompresses `src` into `dst` (created, truncated), decompressing, hashing and writing on
/// three threads; zero blocks become holes. At most `limit` bytes are produced, of which at
/// most [`max_data`] of `src`'s size may be data: past either it stops there. Returns the
/// sha256 and size written; on an error the caller removes `dst`.
pub fn decompress(
    src: &Path,
    dst: &Path,
    limit: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(String, u64), DecompressError> {
    let input = File::open(src).map_err(DecompressError::Corrupt)?;
    let compressed = input.metadata().map_err(DecompressError::Corrupt)?.len();
    let out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(dst)
        .map_err(DecompressError::Write)?;
    let handle = out.try_clone().map_err(DecompressError::Write)?;
    let syncer = out.try_clone().ok();
    let sink = Sparse {
        file: out,
        pos: 0,
        data: 0,
        max_data: max_data(compressed),
    };
    let mut dec = zstd::stream::read::Decoder::new(input).map_err(DecompressError::Corrupt)?;
    let mut hasher = StreamHasher::new(None);
    let got = pipeline::run_to(&mut dec, sink, syncer, &mut hasher, 0, Some(limit), progress);
    match got.stop {
        None => {
            // The trailing zero run is a hole up to the end.
            handle.set_len(got.bytes).map_err(DecompressError::Write)?;
            Ok((hasher.finish().sha256.to_string(), got.bytes))
        }
        Some(Ended::Read(e)) => Err(DecompressError::Corrupt(e)),
        Some(Ended::Write(e)) => match e.get_ref().and_then(|i| i.downcast_ref::<Dense>()) {
            Some(Dense(max)) => Err(DecompressError::TooDense { max: *max }),
            None => Err(DecompressError::Write(e)),
        },
        Some(Ended::TooLong(limit)) => Err(DecompressError::TooBig { limit }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(b: &[u8]) -> String {
        let mut h = StreamHasher::new(None);
        h.update(b);
        h.finish().sha256.to_string()
    }

    #[test]
    fn compress_then_decompress_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("d"), &data).unwrap();

        let (zdigest, zsize) = compress(&dir.path().join("d"), &dir.path().join("d.zst")).unwrap();
        let (digest, size) = decompress(
            &dir.path().join("d.zst"),
            &dir.path().join("out"),
            3_000_000,
            &mut |_| {},
        )
        .unwrap();

        let z = std::fs::read(dir.path().join("d.zst")).unwrap();
        assert_eq!((zdigest, zsize), (sha(&z), z.len() as u64));
        assert_eq!((digest, size), (sha(&data), 3_000_000));
        assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), data);
    }

    #[test]
    fn decompress_bomb_stops_at_limit() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("d"), vec![0u8; 50 << 20]).unwrap();
        compress(&dir.path().join("d"), &dir.path().join("d.zst")).unwrap();

        let r = decompress(&dir.path().join("d.zst"), &dir.path().join("out"), 1 << 20, &mut |_| {});

        assert!(matches!(r, Err(DecompressError::TooBig { limit }) if limit == 1 << 20));
        assert!(std::fs::metadata(dir.path().join("out")).unwrap().len() <= 1 << 20);
    }

    #[test]
    fn decompress_zero_runs_are_holes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        // 1 MiB of data between 40 MiB of zeros, and 24 MiB of zeros at the end.
        let mut data = vec![0u8; 40 << 20];
        data.extend((0..1u32 << 20).map(|i| (i % 253) as u8 | 1));
        data.extend(vec![0u8; 24 << 20]);
        std::fs::write(dir.path().join("d"), &data).unwrap();
        compress(&dir.path().join("d"), &dir.path().join("d.zst")).unwrap();

        let (digest, size) = decompress(
            &dir.path().join("d.zst"),
            &dir.path().join("out"),
            data.len() as u64,
            &mut |_| {},
        )
        .unwrap();

        let meta = std::fs::metadata(dir.path().join("out")).unwrap();
        assert_eq!(
            (digest, size, meta.len()),
            (sha(&data), data.len() as u64, data.len() as u64)
        );
        assert!(meta.blocks() * 512 < 8 << 20, "{} bytes allocated", meta.blocks() * 512);
        assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), data);
    }

    #[test]
    fn decompress_dense_fill_past_ratio_stops() {
        let dir = tempfile::tempdir().unwrap();
        // 0xff compresses as well as zeros but is data: 80 MiB of it from a few KiB of layer.
        std::fs::write(dir.path().join("d"), vec![0xffu8; 80 << 20]).unwrap();
        compress(&dir.path().join("d"), &dir.path().join("d.zst")).unwrap();

        let r = decompress(
            &dir.path().join("d.zst"),
            &dir.path().join("out"),
            80 << 20,
            &mut |_| {},
        );

        let allocated = std::fs::metadata(dir.path().join("out")).unwrap().len();
        assert!(
            matches!(r, Err(DecompressError::TooDense { max }) if max < 65 << 20),
            "{r:?}"
        );
        assert!(allocated <= 65 << 20, "{allocated}");
    }

    #[test]
    fn decompress_garbage_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("z"), b"not zstd at all").unwrap();

        let r = decompress(&dir.path().join("z"), &dir.path().join("out"), 1 << 20, &mut |_| {});

        assert!(matches!(r, Err(DecompressError::Corrupt(_))));
    }
}
