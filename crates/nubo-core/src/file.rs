//! Opening files a user named, which are hostile until checked: a FIFO must not hang nubo, a
//! device must not be read as data (`/dev/zero` never ends), and an output path must not turn a
//! device node, a FIFO or a symlink's target into nubo's output.
//!
//! Every input file is opened with `O_NONBLOCK` (an open of a FIFO with no writer would block
//! forever otherwise), checked with `fstat` on the open descriptor (no race between check and
//! use), and refused unless it is a regular file. Reads are bounded.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{what} {path}: {source}")]
    Io {
        what: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what} {path} is {kind}, not a regular file: give the path of a regular file")]
    NotRegular {
        what: String,
        path: PathBuf,
        kind: &'static str,
    },
    #[error("{what} {path} is larger than the {max} bytes nubo reads for it: give a smaller file")]
    TooLarge { what: String, path: PathBuf, max: u64 },
    #[error("output {path} exists and is {kind}: nubo only replaces regular files; remove it or choose another path")]
    OutputNotRegular { path: PathBuf, kind: &'static str },
}

impl FileError {
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            FileError::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => crate::ErrorKind::NotFound,
            FileError::Io { .. } => crate::ErrorKind::Io,
            _ => crate::ErrorKind::InvalidInput,
        }
    }
}

/// What a non-regular file is, in words for an error message.
pub fn describe(ft: &std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "not a file"
    }
}

/// Opens `path` for reading, refusing anything that is not a regular file without blocking on
/// it. `what` names the object in errors (`user-data`, `disk image`, ...). Symlinks are
/// followed (a user may name a link to their file); what they lead to must be a regular file.
pub fn open_regular(path: &Path, what: &str) -> Result<File, FileError> {
    let io_err = |source| FileError::Io {
        what: format!("opening {what}"),
        path: path.to_path_buf(),
        source,
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)
        .map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if !meta.file_type().is_file() {
        return Err(FileError::NotRegular {
            what: what.to_owned(),
            path: path.to_path_buf(),
            kind: describe(&meta.file_type()),
        });
    }
    Ok(file)
}

/// Reads the whole of regular file `path`, refusing it when it is larger than `max` bytes
/// (checked against its size and again while reading, in case it grows).
pub fn read_bounded(path: &Path, what: &str, max: u64) -> Result<Vec<u8>, FileError> {
    let file = open_regular(path, what)?;
    let io_err = |source| FileError::Io {
        what: format!("reading {what}"),
        path: path.to_path_buf(),
        source,
    };
    let len = file.metadata().map_err(io_err)?.len();
    let too_large = || FileError::TooLarge {
        what: what.to_owned(),
        path: path.to_path_buf(),
        max,
    };
    if len > max {
        return Err(too_large());
    }
    let mut buf = Vec::with_capacity(len as usize);
    file.take(max + 1).read_to_end(&mut buf).map_err(io_err)?;
    if buf.len() as u64 > max {
        return Err(too_large());
    }
    Ok(buf)
}

/// Checks that an output path may be written: absent, or an existing regular file (which is
/// then replaced). A symlink at the final component is refused, never followed, and so are
/// device nodes, FIFOs, sockets and directories.
pub fn check_output(path: &Path) -> Result<(), FileError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => Ok(()),
        Ok(m) => Err(FileError::OutputNotRegular {
            path: path.to_path_buf(),
            kind: describe(&m.file_type()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(FileError::Io {
            what: "checking output".into(),
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `data` to the output `path` atomically with mode `mode` after [`check_output`]: the
/// temp file is created beside it with `O_EXCL | O_NOFOLLOW` and renamed over it, so a
/// symlink or device planted at the path is replaced by nothing nubo wrote through it.
pub fn write_output(path: &Path, data: &[u8], mode: u32) -> Result<(), FileError> {
    check_output(path)?;
    let io_err = |source| FileError::Io {
        what: "writing output".into(),
        path: path.to_path_buf(),
        source,
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io_err(io::Error::new(io::ErrorKind::InvalidInput, "path has no file name")))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = dir.join(tmp_name);
    let result = (|| {
        use std::io::Write;
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        // The umask may have narrowed `mode`, never widened it; set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        // Re-check right before the rename: rename(2) replaces the final component itself
        // (never follows a symlink there), so the worst a racing writer gets is its link gone.
        check_output(path).map_err(|e| io::Error::new(io::ErrorKind::AlreadyExists, e.to_string()))?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(io_err)
}

/// `text` with control characters (other than newline and tab) escaped, so untrusted bytes
/// (a file's contents, a bad user-data line quoted in an error) cannot drive the terminal.
pub fn escape_control(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' | '\t' => out.push(c),
            c if c.is_control() => out.extend(c.escape_default()),
            // Bidirectional overrides reorder what the terminal shows (Trojan Source).
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_regular_fifo_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0);

        let err = open_regular(&p, "user-data").unwrap_err();

        assert!(err.to_string().contains("FIFO"), "{err}");
    }

    #[test]
    fn open_regular_char_device_refused() {
        let err = open_regular(Path::new("/dev/zero"), "disk image").unwrap_err();

        assert!(err.to_string().contains("character device"), "{err}");
    }

    #[test]
    fn open_regular_directory_refused() {
        let dir = tempfile::tempdir().unwrap();

        let err = open_regular(dir.path(), "user-data").unwrap_err();

        assert!(err.to_string().contains("a directory"), "{err}");
    }

    #[test]
    fn read_bounded_over_limit_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![b'a'; 11]).unwrap();

        let err = read_bounded(&p, "user-data", 10).unwrap_err();

        assert!(matches!(err, FileError::TooLarge { max: 10, .. }), "{err}");
    }

    #[test]
    fn read_bounded_within_limit_reads_all() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789").unwrap();

        assert_eq!(read_bounded(&p, "user-data", 10).unwrap(), b"0123456789");
    }

    #[test]
    fn write_output_symlink_refused_and_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, b"keep").unwrap();
        let link = dir.path().join("out");
        std::os::unix::fs::symlink(&target, &link).unwrap();

        let err = write_output(&link, b"seed", 0o600).unwrap_err();

        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }

    #[test]
    fn write_output_device_refused() {
        let err = write_output(Path::new("/dev/null"), b"seed", 0o600).unwrap_err();

        assert!(err.to_string().contains("character device"), "{err}");
    }

    #[test]
    fn write_output_regular_replaced_with_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("seed.iso");
        std::fs::write(&p, b"old").unwrap();

        write_output(&p, b"new", 0o600).unwrap();

        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn escape_control_escapes_escape_sequences() {
        assert_eq!(escape_control("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\n");
    }
}
