//! Streaming a download into a partial file in the store's `tmp/`, hashing as the bytes arrive
//! (no second pass). A dropped connection keeps the partial and resumes with `Range`, carrying
//! the hash state over; a partial left by an earlier run is re-hashed once to rebuild that state.
//! A server that ignores `Range` gets a clean restart. A write error (disk full, file size limit)
//! deletes the partial: nothing half-written stays behind.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;
use std::thread;
use std::time::Duration;

use crate::checksum::Algorithm;
use crate::digest::{hash_reader, Digests, StreamHasher};
use crate::error::PullError;
use crate::pull::PullEvent;

/// Streaming buffer: big enough to keep TLS records and hashing efficient.
const BUF: usize = 256 << 10;

/// Pause before reconnecting, doubled each attempt: a flapping link gets a moment to recover.
const BACKOFF: Duration = Duration::from_millis(200);

pub struct Fetch<'a> {
    pub agent: &'a ureq::Agent,
    pub url: &'a str,
    pub verify_with: Option<Algorithm>,
    /// Reconnections allowed after a dropped connection.
    pub retries: u32,
}

/// How one attempt ended, when not with the whole file.
enum Stop {
    /// The connection broke: keep what we have and resume.
    Network(io::Error),
    /// The partial cannot be continued (server ignored or refused the range): start over.
    Restart(String),
    Fatal(PullError),
}

/// Downloads `f.url` into `part` (resuming what is there) and returns the digests and size.
pub fn fetch(f: &Fetch<'_>, part: &Path, progress: &mut dyn FnMut(PullEvent)) -> Result<(Digests, u64), PullError> {
    let write_err = |source| PullError::Write {
        path: part.to_path_buf(),
        source,
    };
    let (mut hasher, mut offset) = rehash_partial(part, f.verify_with).map_err(write_err)?;
    let mut attempt = 0u32;
    loop {
        match attempt_once(f, part, &mut hasher, &mut offset, progress) {
            Ok(()) => {
                let file = File::open(part).map_err(write_err)?;
                file.sync_all().map_err(write_err)?;
                return Ok((hasher.finish(), offset));
            }
            Err(Stop::Network(e)) if attempt < f.retries => {
                attempt += 1;
                progress(PullEvent::Retry {
                    attempt,
                    offset,
                    error: e.to_string(),
                });
                thread::sleep(BACKOFF * 2u32.saturating_pow(attempt - 1));
            }
            Err(Stop::Network(source)) => {
                return Err(PullError::Interrupted {
                    url: f.url.to_owned(),
                    attempts: attempt + 1,
                    source,
                })
            }
            Err(Stop::Restart(reason)) => {
                progress(PullEvent::Restart { reason });
                truncate(part).map_err(write_err)?;
                hasher = StreamHasher::new(f.verify_with);
                offset = 0;
            }
            Err(Stop::Fatal(e)) => {
                let _ = fs::remove_file(part);
                return Err(e);
            }
        }
    }
}

fn truncate(part: &Path) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(part)
        .map(drop)
}

/// Hash state and length of what an earlier run left in `part`.
fn rehash_partial(part: &Path, verify_with: Option<Algorithm>) -> io::Result<(StreamHasher, u64)> {
    let mut hasher = StreamHasher::new(verify_with);
    match File::open(part) {
        Ok(mut f) => {
            let n = hash_reader(&mut f, &mut hasher)?;
            Ok((hasher, n))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok((hasher, 0)),
        Err(e) => Err(e),
    }
}

fn is_network(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_) | ureq::Error::ConnectionFailed | ureq::Error::Timeout(_)
    )
}

fn into_io(e: ureq::Error) -> io::Error {
    match e {
        ureq::Error::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

/// `Content-Range: bytes <start>-<end>/<total|*>` -> (start, total).
fn content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let start = range.split_once('-')?.0.parse().ok()?;
    Some((start, total.parse().ok()))
}

fn attempt_once(
    f: &Fetch<'_>,
    part: &Path,
    hasher: &mut StreamHasher,
    offset: &mut u64,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<(), Stop> {
    let mut req = f.agent.get(f.url);
    if *offset > 0 {
        req = req.header("Range", format!("bytes={offset}-"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(e) if is_network(&e) => return Err(Stop::Network(into_io(e))),
        Err(source) => return Err(Stop::Fatal(crate::error::http_error(f.url, source))),
    };
    let header = |name: &str| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let length: Option<u64> = header("content-length").and_then(|v| v.parse().ok());
    let total = match resp.status().as_u16() {
        200 if *offset > 0 => return Err(Stop::Restart("the server ignored the range request".into())),
        200 => length,
        206 => match header("content-range").as_deref().and_then(content_range) {
            Some((start, total)) if start == *offset => total.or(length.map(|l| l + start)),
            _ => return Err(Stop::Restart("the server answered with another range".into())),
        },
        416 => {
            return Err(Stop::Restart(
                "the server refused to resume the partial download".into(),
            ))
        }
        status => {
            return Err(Stop::Fatal(PullError::Status {
                url: f.url.to_owned(),
                status,
            }))
        }
    };
    progress(PullEvent::Download { offset: *offset, total });

    let write_err = |source| {
        Stop::Fatal(PullError::Write {
            path: part.to_path_buf(),
            source,
        })
    };
    let mut out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .map_err(write_err)?;
    let mut body = resp.into_body().into_reader();
    let mut buf = vec![0u8; BUF];
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Stop::Network(e)),
        };
        out.write_all(&buf[..n]).map_err(write_err)?;
        hasher.update(&buf[..n]);
        *offset += n as u64;
        progress(PullEvent::Progress { done: *offset, total });
    }
    match total {
        Some(t) if *offset < t => Err(Stop::Network(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the server closed the connection at byte {offset} of {t}"),
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_with_total_parses() {
        assert_eq!(content_range("bytes 100-199/200"), Some((100, Some(200))));
    }

    #[test]
    fn content_range_unknown_total_parses() {
        assert_eq!(content_range("bytes 5-9/*"), Some((5, None)));
    }

    #[test]
    fn content_range_garbage_is_none() {
        assert_eq!(content_range("items 1-2/3"), None);
    }

    #[test]
    fn rehash_partial_missing_file_starts_at_zero() {
        let dir = tempfile::tempdir().unwrap();

        let (_, n) = rehash_partial(&dir.path().join("none.part"), None).unwrap();

        assert_eq!(n, 0);
    }
}
