//! Receiving, hashing and writing on three threads with a bounded pool of buffers between
//! them, so the link (or the decompressor), the hash and the disk each run while the others do.
//! Shared by the HTTPS download ([`crate::download`]) and the OCI pull (blobs, and the
//! decompression of a zstd disk layer).
//!
//! The buffers are page-aligned ([`AlignedBuf`]): the kernel's copy from a buffer 16 bytes past
//! a page (where the allocator puts a large `Vec`) into the page cache was a third of a pull's
//! CPU; from an aligned one it is a twentieth. Direct I/O (`O_DIRECT`) was tried and dropped:
//! it saves that copy, but each write then waits for the disk, and on a quiet host the pull
//! took twice as long as with the page cache and the flushing thread below.

use std::fs::File;
use std::io::{self, Read, Write};
use std::thread;

use crate::digest::{AlignedBuf, StreamHasher};

/// Streaming buffer: big enough to keep TLS records and hashing efficient.
pub const BUF: usize = 256 << 10;

/// Buffers in flight between the receiving, hashing and writing threads: enough to ride out a
/// slow fsync or a burst from the network, small enough to stay a few MiB.
const IN_FLIGHT: usize = 8;

/// Bytes written between two background flushes.
const FLUSH_EVERY: usize = 32 << 20;

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
    let syncer = out.try_clone().ok();
    run_to(body, out, syncer, hasher, start, expected, progress)
}

/// [`run`] into any writer (a sparse one for a decompressed disk); `syncer`, a handle on the
/// same file, is flushed in the background.
pub fn run_to<W: Write + Send>(
    body: &mut dyn Read,
    out: W,
    syncer: Option<File>,
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
        if let Some(file) = syncer {
            s.spawn(move || {
                for () in sync_rx {
                    // An error here is the final fsync's to report.
                    let _ = file.sync_data();
                }
            });
        }
        let writing = s.spawn(move || -> (u64, Option<io::Error>) {
            let mut out = out;
            let mut written = 0u64;
            let mut unflushed = 0usize;
            for (buf, n) in write_rx {
                if let Err(e) = out.write_all(&buf[..n]) {
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

    fn bytes(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 4096) as u8).collect()
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
