//! Receiving, hashing and writing on three threads with a bounded pool of buffers between
//! them, so the link (or the decompressor), the hash and the disk each run while the others do.
//! Shared by the HTTPS download ([`crate::download`]) and the OCI pull (blobs, and the
//! decompression of a zstd disk layer).
//!
//! The writer uses direct I/O (`O_DIRECT`) where the filesystem offers it: a profile of a
//! 400 MiB pull showed the copy into the page cache as the most expensive single step (a third
//! of all CPU, more than the TLS decrypt or the hash), and on a 2-core host that CPU is what the
//! link, the hash and the server compete for. The buffers are page-aligned ([`AlignedBuf`]), every write
//! but the last is a whole buffer, so the disk takes them by DMA; the last (unaligned) piece is
//! written after switching the file back to buffered I/O. A filesystem without direct I/O
//! (tmpfs), or a resumed partial at an unaligned offset, is written buffered as before.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::thread;

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::digest::{AlignedBuf, StreamHasher, PAGE as ALIGN};

/// Streaming buffer: big enough to keep TLS records and hashing efficient.
pub const BUF: usize = 256 << 10;

/// Buffers in flight between the receiving, hashing and writing threads: enough to ride out a
/// slow fsync or a burst from the network, small enough to stay a few MiB.
const IN_FLIGHT: usize = 8;

/// Bytes written between two background flushes.
const FLUSH_EVERY: usize = 32 << 20;

/// The writing end: `out` in direct mode while whole aligned buffers arrive, switched back to
/// buffered I/O for a last partial buffer or if the kernel refuses a direct write.
struct Sink {
    out: File,
    direct: bool,
}

impl Sink {
    /// Direct I/O when the file's offset is aligned and its filesystem supports it.
    fn new(out: File, start: u64) -> Sink {
        let direct = start.is_multiple_of(ALIGN as u64) && set_direct(&out, true).is_ok();
        Sink { out, direct }
    }

    fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        if self.direct && data.len().is_multiple_of(ALIGN) {
            while !data.is_empty() {
                match self.out.write(data) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(k) => {
                        data = &data[k..];
                        if !k.is_multiple_of(ALIGN) {
                            break; // a short, unaligned write: the rest goes buffered
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // Direct I/O constraints stricter than a page (rare devices): the rest
                    // goes buffered. A refused direct write transferred nothing.
                    Err(e) if e.raw_os_error() == Some(Errno::EINVAL as i32) => break,
                    Err(e) => return Err(e),
                }
            }
            if data.is_empty() {
                return Ok(());
            }
        }
        if self.direct {
            set_direct(&self.out, false)?;
            self.direct = false;
        }
        self.out.write_all(data)
    }
}

fn set_direct(f: &File, on: bool) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(f.as_raw_fd(), FcntlArg::F_GETFL)?);
    let flags = if on {
        flags | OFlag::O_DIRECT
    } else {
        flags - OFlag::O_DIRECT
    };
    fcntl(f.as_raw_fd(), FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// Why [`run`] stopped before the end of the body.
pub enum Ended {
    Read(io::Error),
    Write(io::Error),
    /// More bytes than the expected size arrived.
    TooLong(u64),
}

pub struct Received {
    /// Bytes hashed and written (the partial file and the hash state agree on them).
    pub bytes: u64,
    pub stop: Option<Ended>,
}

/// Receives `body` on this thread, hashes on a second and writes `out` on a third, with a
/// bounded pool of [`BUF`]-sized buffers between them: reader -> hasher -> writer -> reader.
/// One sequential pass left the link idle while the hash or the disk ran; now each runs while
/// the others do. Returns only when every received byte is hashed and written (or the writer
/// failed), so a resumed download continues from a consistent partial and hash state.
pub fn run(
    body: &mut dyn Read,
    out: File,
    hasher: &mut StreamHasher,
    start: u64,
    expected: Option<u64>,
    progress: &mut dyn FnMut(u64),
) -> Received {
    use std::sync::mpsc::{channel, sync_channel};
    let (free_tx, free_rx) = channel::<AlignedBuf>();
    for _ in 0..IN_FLIGHT {
        let _ = free_tx.send(AlignedBuf::new(BUF));
    }
    let (hash_tx, hash_rx) = sync_channel::<(AlignedBuf, usize)>(IN_FLIGHT);
    let (write_tx, write_rx) = sync_channel::<(AlignedBuf, usize)>(IN_FLIGHT);
    thread::scope(|s| {
        let hashing = s.spawn(move || {
            for (buf, n) in hash_rx {
                hasher.update(&buf[..n]);
                if write_tx.send((buf, n)).is_err() {
                    break;
                }
            }
        });
        // Writeback while the bytes still arrive: a fourth thread flushes what is written so
        // far every FLUSH_EVERY bytes, so the caller's one fsync at the end finds little left
        // (it was most of the gap to `curl -o`, which leaves its bytes in the page cache).
        let (sync_tx, sync_rx) = sync_channel::<()>(1);
        let syncer = out.try_clone().ok();
        if let Some(file) = syncer {
            s.spawn(move || {
                for () in sync_rx {
                    // An error here is the final fsync's to report.
                    let _ = file.sync_data();
                }
            });
        }
        let writing = s.spawn(move || -> (u64, Option<io::Error>) {
            let mut out = Sink::new(out, start);
            let mut written = 0u64;
            let mut unflushed = 0usize;
            for (buf, n) in write_rx {
                if let Err(e) = out.write(&buf[..n]) {
                    return (written, Some(e));
                }
                written += n as u64;
                unflushed += n;
                if unflushed >= FLUSH_EVERY {
                    // Never waits: a flush still running takes these bytes along.
                    let _ = sync_tx.try_send(());
                    unflushed = 0;
                }
                let _ = free_tx.send(buf);
            }
            (written, None)
        });

        let mut received = start;
        let mut stop = None;
        'receive: while let Ok(mut buf) = free_rx.recv() {
            // Fill the buffer (TLS hands over a record at a time) so each hand-off is worth it.
            let mut n = 0;
            let mut eof = false;
            while n < BUF {
                match body.read(&mut buf[n..]) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(k) => n += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        stop = Some(Ended::Read(e));
                        break;
                    }
                }
            }
            if let Some(limit) = expected.filter(|l| received + n as u64 > *l) {
                // Keep what fits; the rest is the server lying about the blob.
                n = (limit - received.min(limit)) as usize;
                stop = Some(Ended::TooLong(limit));
            }
            received += n as u64;
            if n > 0 && hash_tx.send((buf, n)).is_err() {
                break 'receive;
            }
            if n > 0 {
                progress(received);
            }
            if eof || stop.is_some() {
                break;
            }
        }
        drop(hash_tx);
        let _ = hashing.join();
        let (written, write_error) = writing.join().unwrap_or((0, None));
        match write_error {
            Some(e) => Received {
                bytes: written,
                stop: Some(Ended::Write(e)),
            },
            None => Received { bytes: written, stop },
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    fn flags(f: &File) -> OFlag {
        OFlag::from_bits_truncate(fcntl(f.as_raw_fd(), FcntlArg::F_GETFL).unwrap())
    }

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    /// Whole aligned buffers go direct; the unaligned tail switches the file to buffered I/O,
    /// and the file holds every byte in order.
    #[test]
    fn sink_writes_direct_then_buffered_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        let file = OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let probe = file.try_clone().unwrap();
        let mut sink = Sink::new(file, 0);
        if !sink.direct {
            eprintln!("skipped: {} does not support O_DIRECT", dir.path().display());
            return;
        }
        let data = bytes(3 * ALIGN + 100);
        let mut buf = AlignedBuf::new(BUF);
        buf[..2 * ALIGN].copy_from_slice(&data[..2 * ALIGN]);

        sink.write(&buf[..2 * ALIGN]).unwrap();
        let direct_after_whole = flags(&probe).contains(OFlag::O_DIRECT);
        buf[..ALIGN + 100].copy_from_slice(&data[2 * ALIGN..]);
        sink.write(&buf[..ALIGN + 100]).unwrap();

        assert!(direct_after_whole, "aligned buffers are written with O_DIRECT");
        assert!(!flags(&probe).contains(OFlag::O_DIRECT), "the tail is written buffered");
        assert_eq!(std::fs::read(&path).unwrap(), data);
    }

    /// A resumed partial at an unaligned offset is never written direct.
    #[test]
    fn sink_at_unaligned_offset_stays_buffered() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("blob")).unwrap();

        let sink = Sink::new(file, 123);

        assert!(!sink.direct);
    }

    /// The whole pipeline: a body of a few buffers plus an odd tail arrives intact, hashed.
    #[test]
    fn run_writes_and_hashes_every_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        let data = bytes(3 * BUF + 12345);
        let out = OpenOptions::new().create(true).append(true).open(&path).unwrap();
        let mut hasher = StreamHasher::new(None);

        let got = run(
            &mut &data[..],
            out,
            &mut hasher,
            0,
            Some(data.len() as u64),
            &mut |_| {},
        );

        assert!(got.stop.is_none());
        assert_eq!(got.bytes, data.len() as u64);
        assert_eq!(std::fs::read(&path).unwrap(), data);
        assert_eq!(hasher.finish().sha256.to_string(), crate::digest::sha256_bytes(&data));
    }

    /// More bytes than expected: what fits is kept, the rest refused.
    #[test]
    fn run_stops_at_the_expected_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("blob");
        let data = bytes(BUF + 5000);
        let out = File::create(&path).unwrap();
        let mut hasher = StreamHasher::new(None);

        let got = run(&mut &data[..], out, &mut hasher, 0, Some(BUF as u64 + 10), &mut |_| {});

        assert!(matches!(got.stop, Some(Ended::TooLong(l)) if l == BUF as u64 + 10));
        assert_eq!(std::fs::read(&path).unwrap(), data[..BUF + 10]);
    }
}
