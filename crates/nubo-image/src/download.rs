//! Streaming a download into a partial file in the store's `tmp/`, hashing as the bytes arrive
//! (no second pass). A dropped connection keeps the partial and resumes with `Range`, carrying
//! the hash state over; a partial left by an earlier run is re-hashed once to rebuild that state.
//! A server that ignores `Range` gets a clean restart. A write error (disk full, file size limit)
//! deletes the partial: nothing half-written stays behind.
//!
//! Only transient failures are retried: a connection reset or closed mid-body, a timeout, a
//! refused reconnect after bytes arrived, HTTP 5xx and 429. A TLS or certificate failure, a 4xx,
//! a name that does not resolve or a host that never answered fail at once.
//!
//! This module knows nothing of pulls: it reports [`DownloadEvent`]s, which `pull` forwards.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use nubo_core::Cancel;

use crate::checksum::Algorithm;
use crate::digest::{hash_reader, Digests, StreamHasher};
use crate::error::{self, PullError};
use crate::http::{self, SendError};
use crate::pipeline::{self, Ended};

/// Pause before reconnecting, doubled each attempt: a flapping link gets a moment to recover.
const BACKOFF: Duration = Duration::from_millis(200);

pub struct Fetch<'a> {
    pub agent: &'a ureq::Agent,
    pub url: &'a str,
    pub verify_with: Option<Algorithm>,
    /// Reconnections allowed after a transient failure.
    pub retries: u32,
    /// Follow redirects to plain http too.
    pub allow_http: bool,
    /// Plain http to this `host:port` only (an insecure registry).
    pub http_host: Option<&'a str>,
    /// `Authorization` for the URL's own origin (a registry's credentials or token).
    pub auth: Option<&'a str>,
    /// The size the bytes must have (an OCI descriptor's): more is refused as it arrives, so a
    /// lying server cannot fill the disk.
    pub expected_size: Option<u64>,
    /// The deadline for the response and the slowest the body may arrive.
    pub limits: http::Limits,
    /// Ends the transfer between reads (and any pause before a reconnect) once tripped: the
    /// partial file is kept for the next pull to resume.
    pub cancel: Option<&'a Cancel>,
}

/// What a transfer reports as it goes: a download here, an upload in an OCI push. A pull
/// forwards these inside [`crate::PullEvent::Transfer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DownloadEvent {
    /// A transfer starts at `offset` (non-zero when resuming).
    Start {
        offset: u64,
        total: Option<u64>,
    },
    Progress {
        done: u64,
        total: Option<u64>,
    },
    /// A transient failure; reconnecting with Range from `offset`.
    Retry {
        attempt: u32,
        offset: u64,
        error: String,
    },
    /// The partial could not be continued; downloading from the start.
    Restart {
        reason: String,
    },
}

/// How one attempt ended, when not with the whole file.
enum Stop {
    /// A transient failure (the connection broke, a timeout, 5xx, 429): keep what we have and
    /// resume.
    Transient(io::Error),
    /// The partial cannot be continued (server ignored or refused the range): start over.
    Restart(String),
    /// The caller's token was tripped: keep what we have.
    Cancelled,
    Fatal(PullError),
}

/// Downloads `f.url` into `part` (resuming what is there) and returns the digests and size.
pub fn fetch(f: &Fetch<'_>, part: &Path, progress: &mut dyn FnMut(DownloadEvent)) -> Result<(Digests, u64), PullError> {
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
            Err(Stop::Transient(e)) if attempt < f.retries => {
                attempt += 1;
                progress(DownloadEvent::Retry {
                    attempt,
                    offset,
                    error: e.to_string(),
                });
                pause(BACKOFF * 2u32.saturating_pow(attempt - 1), f.cancel);
            }
            Err(Stop::Cancelled) => {
                if offset == 0 {
                    let _ = fs::remove_file(part);
                }
                return Err(PullError::Cancelled {
                    url: f.url.to_owned(),
                    kept: offset,
                });
            }
            Err(Stop::Transient(source)) => {
                if offset == 0 {
                    // An empty partial is no progress to keep.
                    let _ = fs::remove_file(part);
                }
                return Err(PullError::Interrupted {
                    url: f.url.to_owned(),
                    attempts: attempt + 1,
                    kept: offset,
                    source,
                });
            }
            Err(Stop::Restart(reason)) => {
                progress(DownloadEvent::Restart { reason });
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

/// Sleeps `d`, or less when `cancel` is tripped meanwhile (the next attempt then sees it).
fn pause(d: Duration, cancel: Option<&Cancel>) {
    let end = Instant::now() + d;
    while let Some(left) = end.checked_duration_since(Instant::now()).filter(|l| !l.is_zero()) {
        if cancel.is_some_and(Cancel::is_cancelled) {
            return;
        }
        thread::sleep(left.min(Duration::from_millis(50)));
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

/// I/O error kinds a reconnect can cure.
fn transient_io(e: &io::Error) -> bool {
    let tls = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<ureq::Error>())
        .is_some_and(error::is_tls);
    !tls && matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::TimedOut
            | io::ErrorKind::WouldBlock
            | io::ErrorKind::NotConnected
    )
}

/// Classifies a failed request: transient ones are retried, the rest end the download. A host
/// that refuses the very first connection is down (or the URL is wrong), not flapping; once bytes
/// have arrived, a refused reconnect is a restarting server and worth waiting for.
fn request_failed(f: &Fetch<'_>, e: SendError, offset: u64) -> Stop {
    let e = match e {
        SendError::Refused(e) => return Stop::Fatal(e),
        SendError::Transport(e) => e,
    };
    let transient = match &e {
        // The user's --timeout is the most a request may take: not retried.
        ureq::Error::Timeout(_) if error::is_deadline(&e) => false,
        ureq::Error::Timeout(_) => offset > 0 || !error::is_connect(&e),
        ureq::Error::Io(io) => transient_io(io) || (offset > 0 && error::is_connect(&e)),
        ureq::Error::ConnectionFailed => offset > 0,
        _ => false,
    };
    if transient {
        Stop::Transient(e.into_io())
    } else {
        Stop::Fatal(error::http_error(f.url, e))
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
    progress: &mut dyn FnMut(DownloadEvent),
) -> Result<(), Stop> {
    if f.cancel.is_some_and(Cancel::is_cancelled) {
        return Err(Stop::Cancelled);
    }
    let range = (*offset > 0).then_some(*offset);
    let opts = http::SendOptions {
        allow_http: f.allow_http,
        http_host: f.http_host,
        auth: f.auth,
        bulk: Some(f.limits),
    };
    let resp = http::send_with(f.agent, f.url, range, &opts).map_err(|e| request_failed(f, e, *offset))?;
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
        status @ (429 | 500..=599) => {
            return Err(Stop::Transient(io::Error::other(format!(
                "{} answered HTTP {status}",
                f.url
            ))))
        }
        status => {
            return Err(Stop::Fatal(PullError::Status {
                url: f.url.to_owned(),
                status,
            }))
        }
    };
    progress(DownloadEvent::Start { offset: *offset, total });

    let write_err = |source| {
        Stop::Fatal(PullError::Write {
            path: part.to_path_buf(),
            source,
        })
    };
    let out = OpenOptions::new()
        .create(true)
        .append(true)
        .open(part)
        .map_err(write_err)?;
    let mut body = http::RateGuard::new(resp.into_body().into_reader(), f.limits).cancellable(f.cancel);
    let received = pipeline::run(&mut body, out, hasher, *offset, f.expected_size, &mut |done| {
        progress(DownloadEvent::Progress { done, total })
    });
    *offset += received.bytes;
    match received.stop {
        None => {}
        Some(Ended::Write(e)) => return Err(write_err(e)),
        Some(Ended::Read(e)) if http::is_cancelled(&e) => return Err(Stop::Cancelled),
        Some(Ended::Read(e)) if http::too_slow(&e).is_some() => {
            return Err(Stop::Fatal(PullError::TooSlow {
                url: f.url.to_owned(),
                why: e.to_string(),
            }))
        }
        Some(Ended::Read(e)) if transient_io(&e) => return Err(Stop::Transient(e)),
        Some(Ended::Read(e)) => return Err(Stop::Fatal(error::http_error(f.url, ureq::Error::Io(e)))),
        Some(Ended::TooLong(expected)) => {
            return Err(Stop::Fatal(PullError::SizeMismatch {
                url: f.url.to_owned(),
                expected,
                got: *offset,
            }))
        }
    }
    match total {
        Some(t) if *offset < t => Err(Stop::Transient(io::Error::new(
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
