//! Small text inputs a user names on the command line (user-data, network-config, an SSH key
//! file, a manifest, a password): a regular file, a pipe or FIFO (`<(generate)`), or `-` for
//! standard input. Every read is bounded in size (refused past the bound, which the error names)
//! and in time: a FIFO nobody writes to must not hang nubo, and neither must a writer that never
//! finishes. Only one input per process may be `-`: two would silently split one stream.
//!
//! Disk images are not small inputs: they stay regular files only ([`crate::file::open_regular`]).

use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long a FIFO or pipe may stay silent before its first byte: long enough for a generator
/// such as `<(curl ...)` or `<(jq ...)` to start, short enough that a FIFO with no writer is
/// refused instead of hanging.
pub const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(5);

/// The whole read of a pipe, FIFO or standard input: a small input arrives in well under this;
/// a writer that trickles forever is refused.
pub const READ_DEADLINE: Duration = Duration::from_secs(60);

/// What reads standard input in this process (the first input given as `-`).
static STDIN_TAKEN: OnceLock<String> = OnceLock::new();

#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{what} {path}: {error}")]
    Io {
        what: String,
        path: PathBuf,
        error: io::Error,
    },
    #[error("{what} {path} is {kind}: give a regular file, a pipe or `-` for standard input")]
    NotInput {
        what: String,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("{what} {path} is larger than the {max} bytes nubo reads for it: give a smaller input")]
    TooLarge { what: String, path: PathBuf, max: u64 },
    #[error("{what} {path}: {why} within {secs} s: check the program writing it")]
    TimedOut {
        what: String,
        path: PathBuf,
        why: &'static str,
        secs: u64,
    },
    #[error("{what} is `-`, but standard input is already read for {first}: only one input per command can be `-`; give the other as a file or `<(...)`")]
    StdinTwice { what: String, first: String },
    #[error(
        "{what} is `-`, but standard input is a terminal: pipe or redirect the input (`... | nubo ...`, `< file`)"
    )]
    StdinTerminal { what: String },
    /// A path the kernel refused as too long, and the other file errors, said once.
    #[error(transparent)]
    File(crate::FileError),
}

impl InputError {
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            InputError::Io { error, .. } if error.kind() == io::ErrorKind::NotFound => crate::ErrorKind::NotFound,
            InputError::Io { .. } | InputError::TimedOut { .. } => crate::ErrorKind::Io,
            InputError::File(e) => e.kind(),
            _ => crate::ErrorKind::InvalidInput,
        }
    }
}

/// Reads the small input `path` names (`-` is standard input), at most `max` bytes. `what`
/// names the object in errors (`--user-data`, `manifest`, ...).
pub fn read_small_input(path: &Path, what: &str, max: u64) -> Result<Vec<u8>, InputError> {
    if path == Path::new("-") {
        return read_stdin(what, max);
    }
    let io_err = |error| match crate::FileError::io(what, path, error) {
        crate::FileError::Io { what, path, error } => InputError::Io { what, path, error },
        other => InputError::File(other),
    };
    // O_NONBLOCK: opening a FIFO for reading would otherwise block until a writer appears.
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(io_err)?;
    let ft = file.metadata().map_err(io_err)?.file_type();
    if ft.is_file() {
        return crate::file::read_bounded(path, what, max).map_err(|e| match e {
            crate::FileError::TooLarge { what, path, max } => InputError::TooLarge { what, path, max },
            crate::FileError::Io { error, .. } => io_err(error),
            other => InputError::File(other),
        });
    }
    if !ft.is_fifo() {
        return Err(InputError::NotInput {
            what: what.to_owned(),
            path: path.to_path_buf(),
            kind: crate::file::describe(&ft),
        });
    }
    read_stream(file.as_raw_fd(), what, path, max)
}

/// Whether standard input has been claimed by an input given as `-` in this process.
pub fn stdin_taken() -> Option<&'static str> {
    STDIN_TAKEN.get().map(String::as_str)
}

fn read_stdin(what: &str, max: u64) -> Result<Vec<u8>, InputError> {
    if STDIN_TAKEN.set(what.to_owned()).is_err() {
        return Err(InputError::StdinTwice {
            what: what.to_owned(),
            first: stdin_taken().unwrap_or("another input").to_owned(),
        });
    }
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        return Err(InputError::StdinTerminal { what: what.to_owned() });
    }
    read_stream(libc::STDIN_FILENO, what, Path::new("(standard input)"), max)
}

/// Reads `fd` to its end within [`READ_DEADLINE`], waiting at most [`FIRST_BYTE_TIMEOUT`] for
/// the first byte; more than `max` bytes is refused. Standard input is never switched to
/// non-blocking mode (that flag is shared with the shell that started nubo): every read follows
/// a `poll` that said data (or the end) is there.
fn read_stream(fd: RawFd, what: &str, path: &Path, max: u64) -> Result<Vec<u8>, InputError> {
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let timed_out = |why, limit: Duration| InputError::TimedOut {
        what: what.to_owned(),
        path: path.to_path_buf(),
        why,
        secs: limit.as_secs(),
    };
    loop {
        let (limit, why) = if out.is_empty() {
            (FIRST_BYTE_TIMEOUT, "nothing was written")
        } else {
            (READ_DEADLINE, "the input did not end")
        };
        let left = limit.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(timed_out(why, limit));
        }
        if !poll_readable(fd, left).map_err(|error| InputError::Io {
            what: what.to_owned(),
            path: path.to_path_buf(),
            error,
        })? {
            return Err(timed_out(why, limit));
        }
        let room = usize::try_from(max + 1 - out.len() as u64)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        // SAFETY: `buf` is valid for `room <= buf.len()` bytes; `fd` is open for the call.
        #[allow(unsafe_code)]
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), room) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock => continue,
                _ => {
                    return Err(InputError::Io {
                        what: what.to_owned(),
                        path: path.to_path_buf(),
                        error: e,
                    })
                }
            }
        }
        if n == 0 {
            return Ok(out);
        }
        out.extend_from_slice(&buf[..n as usize]);
        if out.len() as u64 > max {
            return Err(InputError::TooLarge {
                what: what.to_owned(),
                path: path.to_path_buf(),
                max,
            });
        }
    }
}

/// Waits up to `timeout` for `fd` to be readable (or at its end); false when the time ran out.
fn poll_readable(fd: RawFd, timeout: Duration) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(timeout.as_millis().max(1)).unwrap_or(i32::MAX);
    loop {
        // SAFETY: one valid pollfd, count 1.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(rc > 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn mkfifo(p: &Path) {
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0);
    }

    #[test]
    fn read_small_input_regular_file_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ud");
        std::fs::write(&p, b"#cloud-config\n").unwrap();

        assert_eq!(read_small_input(&p, "--user-data", 100).unwrap(), b"#cloud-config\n");
    }

    #[test]
    fn read_small_input_regular_over_bound_refused_naming_bound() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ud");
        std::fs::write(&p, [b'a'; 11]).unwrap();

        let err = read_small_input(&p, "--user-data", 10).unwrap_err();

        assert!(err.to_string().contains("10 bytes"), "{err}");
    }

    #[test]
    fn read_small_input_fifo_with_writer_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        mkfifo(&p);
        let w = p.clone();
        let writer = std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().write(true).open(w).unwrap();
            f.write_all(b"version: 2\n").unwrap();
        });

        let got = read_small_input(&p, "--network-config", 100).unwrap();

        writer.join().unwrap();
        assert_eq!(got, b"version: 2\n");
    }

    #[test]
    fn read_small_input_fifo_without_writer_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        mkfifo(&p);
        let start = Instant::now();

        let err = read_small_input(&p, "--user-data", 100).unwrap_err();

        assert!(matches!(err, InputError::TimedOut { .. }), "{err}");
        assert!(start.elapsed() < FIRST_BYTE_TIMEOUT + Duration::from_secs(3));
    }

    #[test]
    fn read_small_input_endless_fifo_refused_at_bound() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        mkfifo(&p);
        let w = p.clone();
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().write(true).open(w).unwrap();
            while f.write_all(&[0u8; 4096]).is_ok() {}
        });

        let err = read_small_input(&p, "--password-stdin", 4096).unwrap_err();

        assert!(err.to_string().contains("4096 bytes"), "{err}");
    }

    #[test]
    fn read_small_input_char_device_refused() {
        let err = read_small_input(Path::new("/dev/zero"), "--user-data", 100).unwrap_err();

        assert!(err.to_string().contains("character device"), "{err}");
    }

    #[test]
    fn read_small_input_directory_refused() {
        let dir = tempfile::tempdir().unwrap();

        let err = read_small_input(dir.path(), "--user-data", 100).unwrap_err();

        assert!(err.to_string().contains("a directory"), "{err}");
    }

    #[test]
    fn read_small_input_second_stdin_refused_by_name() {
        // The first claim may fail for a terminal or read an empty stdin; either way it claims.
        let _ = read_small_input(Path::new("-"), "--user-data", 10);

        let err = read_small_input(Path::new("-"), "--network-config", 10).unwrap_err();

        assert!(err.to_string().contains("already read for --user-data"), "{err}");
    }
}
