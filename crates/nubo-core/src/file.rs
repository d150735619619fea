//! Opening files a user named, which are hostile until checked: a FIFO must not hang nubo, a
//! device must not be read as data (`/dev/zero` never ends), and an output path must not turn a
//! device node, a FIFO or a symlink's target into nubo's output.
//!
//! Every input file is opened with `O_NONBLOCK` (an open of a FIFO with no writer would block
//! forever otherwise), checked with `fstat` on the open descriptor (no race between check and
//! use), and refused unless it is a regular file. Reads are bounded.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The OS error's text is part of this message, not a chained source: the many callers
    /// that show a `FileError` with `to_string()` keep the cause, and a chain printed with
    /// `{:#}` shows it once.
    #[error("{what} {}: {error}", path.display())]
    Io {
        what: String,
        path: PathBuf,
        error: io::Error,
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
    #[error("output {path} already exists: pass --force to replace it, or choose another path")]
    OutputExists { path: PathBuf },
    #[error("{what} path {shown} is too long: {why}; choose a shorter path")]
    NameTooLong {
        what: String,
        /// The path, shortened for the message.
        shown: String,
        why: String,
    },
}

/// The longest file name (one path component) Linux filesystems take, in bytes.
pub const NAME_MAX: usize = 255;
/// The longest path the kernel takes, in bytes, without its terminating NUL.
pub const PATH_MAX: usize = 4095;

impl FileError {
    pub fn kind(&self) -> crate::ErrorKind {
        match self {
            FileError::Io { error, .. } if error.kind() == io::ErrorKind::NotFound => crate::ErrorKind::NotFound,
            FileError::Io { .. } => crate::ErrorKind::Io,
            FileError::OutputExists { .. } => crate::ErrorKind::AlreadyExists,
            _ => crate::ErrorKind::InvalidInput,
        }
    }

    /// The OS error behind an [`Io`](FileError::Io) error.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            FileError::Io { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether this is an [`Io`](FileError::Io) error saying the file does not exist.
    pub fn is_not_found(&self) -> bool {
        self.io_error().is_some_and(|e| e.kind() == io::ErrorKind::NotFound)
    }

    /// `error` from an operation (`what`, e.g. "opening user-data") on `path`: a name the
    /// kernel refused as too long (ENAMETOOLONG) says which limit, never a raw "os error 36".
    pub fn io(what: impl Into<String>, path: &Path, error: io::Error) -> FileError {
        let what = what.into();
        if error.raw_os_error() == Some(libc::ENAMETOOLONG) {
            if let Err(e) = check_path_length(path, &what) {
                return e;
            }
            return FileError::NameTooLong {
                what,
                shown: shorten(path),
                why: format!(
                    "the kernel refused it (a file name may have at most {NAME_MAX} bytes, a path at most {PATH_MAX})"
                ),
            };
        }
        FileError::Io {
            what,
            path: path.to_path_buf(),
            error,
        }
    }
}

/// Refuses a path the kernel would refuse as too long (a component over [`NAME_MAX`] bytes or
/// the whole over [`PATH_MAX`]) with a message saying which, before any system call.
pub fn check_path_length(path: &Path, what: &str) -> Result<(), FileError> {
    let total = path.as_os_str().len();
    let longest = path.components().map(|c| c.as_os_str().len()).max().unwrap_or(0);
    let why = if longest > NAME_MAX {
        format!("one of its names is {longest} bytes long, and a file name may have at most {NAME_MAX}")
    } else if total > PATH_MAX {
        format!("it is {total} bytes long, and a path may have at most {PATH_MAX}")
    } else {
        return Ok(());
    };
    Err(FileError::NameTooLong {
        what: what.to_owned(),
        shown: shorten(path),
        why,
    })
}

/// `path` for a message: whole when short, else its start and end around the byte count, so a
/// 5000-byte name does not flood the terminal. Control characters are escaped.
pub fn shorten(path: &Path) -> String {
    let text = path.to_string_lossy();
    let chars: Vec<char> = text.chars().collect();
    let shown = if chars.len() <= 80 {
        text.into_owned()
    } else {
        let head: String = chars[..48].iter().collect();
        let tail: String = chars[chars.len() - 24..].iter().collect();
        format!("{head}...{tail} ({} bytes)", path.as_os_str().len())
    };
    escape_control(&shown).replace('\n', "\\n")
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
    check_path_length(path, what)?;
    let io_err = |error| FileError::io(format!("opening {what}"), path, error);
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
    let io_err = |error| FileError::io(format!("reading {what}"), path, error);
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

/// What the output rule does with a regular file already at an output path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Replace it, atomically (`seed build -o`; `image init -f --force`).
    Replace,
    /// Refuse it: the user did not ask for it to be replaced.
    Refuse,
}

/// The one rule for every path nubo writes at a user's request (`seed build -o`,
/// `image convert -o`, `image init -f`, ...): the path may be absent, or an existing regular
/// file (replaced only when `existing` says so). A symlink at the final component is refused,
/// never followed (a dangling one too: nubo never creates its target), and so are device nodes
/// (`/dev/null`), FIFOs (never opened, so nothing blocks), sockets and directories. A path too
/// long for the kernel is refused saying which limit.
pub fn check_output_for(path: &Path, existing: Existing) -> Result<(), FileError> {
    check_path_length(path, "output")?;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() && existing == Existing::Replace => Ok(()),
        Ok(m) if m.file_type().is_file() => Err(FileError::OutputExists {
            path: path.to_path_buf(),
        }),
        Ok(m) => Err(FileError::OutputNotRegular {
            path: path.to_path_buf(),
            kind: describe(&m.file_type()),
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(FileError::io("checking output", path, e)),
    }
}

/// [`check_output_for`] replacing an existing regular file.
pub fn check_output(path: &Path) -> Result<(), FileError> {
    check_output_for(path, Existing::Replace)
}

/// The hidden temporary name beside `path` that nubo writes before renaming or linking into
/// place: `.<name>.tmp.<pid>.<n>` (unique per writer, [`crate::atomic::unique_tag`]), with `<name>` cut short enough that the whole stays within
/// [`NAME_MAX`] (a legal 250-byte output name must not fail as "File name too long").
pub fn temp_beside(path: &Path) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let suffix = format!(".tmp.{}", crate::atomic::unique_tag());
    let name = path.file_name().unwrap_or_default().as_bytes();
    let keep = name.len().min(NAME_MAX - 1 - suffix.len());
    let mut tmp = Vec::with_capacity(NAME_MAX);
    tmp.push(b'.');
    tmp.extend_from_slice(&name[..keep]);
    tmp.extend_from_slice(suffix.as_bytes());
    path.with_file_name(std::ffi::OsStr::from_bytes(&tmp))
}

/// Writes `data` to the output `path` with mode `mode` (exactly, whatever the umask) under
/// [`check_output_for`]: the temp file is created beside it with `O_EXCL | O_NOFOLLOW`, synced,
/// and renamed over it ([`Existing::Replace`]) or linked to it, which never replaces
/// ([`Existing::Refuse`]); so a symlink or device planted at the path meanwhile is replaced by,
/// or refuses, a file nubo wrote, never written through. Nothing is left behind on failure.
pub fn write_output_for(path: &Path, data: &[u8], mode: u32, existing: Existing) -> Result<(), FileError> {
    check_output_for(path, existing)?;
    let io_err = |e| FileError::io("writing output", path, e);
    if path.file_name().is_none() {
        return Err(io_err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the path names no file",
        )));
    }
    let tmp = temp_beside(path);
    let result = (|| {
        use std::io::Write;
        let mut f = crate::fsmode::create_new(&tmp, mode).map_err(io_err)?;
        f.write_all(data).map_err(io_err)?;
        f.sync_all().map_err(io_err)?;
        drop(f);
        // Re-check right before the rename: rename(2) replaces the final component itself
        // (never follows a symlink there), so the worst a racing writer gets is its link gone.
        check_output_for(path, existing)?;
        match existing {
            Existing::Replace => std::fs::rename(&tmp, path).map_err(io_err),
            Existing::Refuse => std::fs::hard_link(&tmp, path).map_err(|e| match e.kind() {
                io::ErrorKind::AlreadyExists => FileError::OutputExists {
                    path: path.to_path_buf(),
                },
                _ => io_err(e),
            }),
        }
    })();
    // After a link the temp name goes too; after a rename it is already gone.
    let _ = std::fs::remove_file(&tmp);
    result
}

/// [`write_output_for`] replacing an existing regular file.
pub fn write_output(path: &Path, data: &[u8], mode: u32) -> Result<(), FileError> {
    write_output_for(path, data, mode, Existing::Replace)
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
        assert_eq!(crate::fsmode::mode_of(&p).unwrap(), 0o600);
    }

    #[test]
    fn write_output_dangling_symlink_refused_and_target_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("absent");
        let link = dir.path().join("out");
        std::os::unix::fs::symlink(&target, &link).unwrap();

        let err = write_output(&link, b"x", 0o600).unwrap_err();

        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert!(!target.exists());
    }

    #[test]
    fn write_output_fifo_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fifo");
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path; mkfifo touches nothing else.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0);

        let err = write_output(&p, b"x", 0o600).unwrap_err();

        assert!(err.to_string().contains("FIFO"), "{err}");
    }

    #[test]
    fn write_output_for_refuse_existing_regular_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("VMfile");
        std::fs::write(&p, b"mine").unwrap();

        let err = write_output_for(&p, b"new", 0o644, Existing::Refuse).unwrap_err();

        assert!(matches!(err, FileError::OutputExists { .. }), "{err}");
        assert_eq!(std::fs::read(&p).unwrap(), b"mine");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn write_output_for_refuse_absent_writes_exact_mode() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("VMfile");

        write_output_for(&p, b"FROM x\n", 0o644, Existing::Refuse).unwrap();

        assert_eq!(std::fs::read(&p).unwrap(), b"FROM x\n");
        assert_eq!(crate::fsmode::mode_of(&p).unwrap(), 0o644);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn write_output_name_of_250_bytes_written() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a".repeat(250));

        write_output(&p, b"x", 0o600).unwrap();

        assert_eq!(std::fs::read(&p).unwrap(), b"x");
    }

    #[test]
    fn write_output_name_too_long_says_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a".repeat(300));

        let err = write_output(&p, b"x", 0o600).unwrap_err().to_string();

        assert!(err.contains("at most 255"), "{err}");
        assert!(!err.contains("os error"), "{err}");
        assert!(err.len() < 400, "{err}");
    }

    #[test]
    fn read_bounded_path_too_long_says_the_limit() {
        let p = PathBuf::from(format!("/{}", "d/".repeat(2100)));

        let err = read_bounded(&p, "user-data file", 10).unwrap_err().to_string();

        assert!(err.contains("at most 4095"), "{err}");
    }

    #[test]
    fn file_error_io_enametoolong_is_name_too_long() {
        let err = FileError::io(
            "opening manifest",
            Path::new("x"),
            io::Error::from_raw_os_error(libc::ENAMETOOLONG),
        );

        assert!(matches!(err, FileError::NameTooLong { .. }), "{err}");
    }

    #[test]
    fn temp_beside_long_name_fits_name_max() {
        let tmp = temp_beside(&Path::new("/d").join("n".repeat(255)));

        assert!(tmp.file_name().unwrap().len() <= NAME_MAX);
        assert_eq!(tmp.parent().unwrap(), Path::new("/d"));
    }

    #[test]
    fn escape_control_escapes_escape_sequences() {
        assert_eq!(escape_control("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\n");
    }
}
