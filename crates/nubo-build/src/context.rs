//! Reading the build context: every file a COPY or CLOUDINIT names must lie inside it. The
//! parser already refuses `..` and absolute paths; here symlinks are resolved and anything that
//! resolves outside the context, or is not a regular file or directory, is refused.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{io, BuildError};

/// More files than this in one build is not what COPY is for: make an archive and RUN tar.
const MAX_FILES: usize = 10_000;
/// How deep a COPYed directory may nest.
const MAX_DEPTH: usize = 64;

/// One regular file to copy: where it is on the host (symlinks resolved, inside the context),
/// where it goes in the guest, its mode and its content hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextFile {
    pub host: PathBuf,
    pub guest: String,
    pub mode: u32,
    pub sha256: String,
    pub len: u64,
}

/// The canonical context directory.
pub fn open(context: &Path) -> Result<PathBuf, BuildError> {
    let c = fs::canonicalize(context).map_err(|e| {
        BuildError::Context(format!(
            "{} cannot be read ({e}): give an existing directory as CONTEXT",
            context.display()
        ))
    })?;
    if !c.is_dir() {
        return Err(BuildError::Context(format!(
            "{} is not a directory: CONTEXT is the directory COPY reads from",
            context.display()
        )));
    }
    Ok(c)
}

/// `rel` inside `root`, symlinks resolved; refused when it resolves outside.
pub fn inside(root: &Path, rel: &str) -> Result<PathBuf, BuildError> {
    let joined = root.join(rel);
    let real = fs::canonicalize(&joined).map_err(|e| {
        BuildError::Context(format!(
            "`{rel}` cannot be read ({e}): it must exist inside the build context {}",
            root.display()
        ))
    })?;
    if !real.starts_with(root) {
        return Err(BuildError::Context(format!(
            "`{rel}` resolves to {}, outside the build context {}: a symlink may not lead out of the context; copy the file in instead",
            real.display(),
            root.display()
        )));
    }
    Ok(real)
}

/// The files `COPY sources... dest` copies. A file goes to `dest` (or into it when `dest` ends
/// with `/` or there are several sources); a directory's contents go into `dest`.
pub fn copy_files(root: &Path, sources: &[String], dest: &str) -> Result<Vec<ContextFile>, BuildError> {
    let into_dir = dest.ends_with('/') || sources.len() > 1;
    let dest = dest.trim_end_matches('/');
    let mut out = Vec::new();
    for s in sources {
        let real = inside(root, s)?;
        let meta = fs::metadata(&real).map_err(io(format!("reading {}", real.display())))?;
        if meta.is_dir() {
            walk(root, &real, dest, 0, &mut out)?;
        } else {
            let name = real
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let guest = if into_dir {
                format!("{dest}/{name}")
            } else if dest.is_empty() {
                "/".into()
            } else {
                dest.to_owned()
            };
            out.push(file(&real, s, guest)?);
        }
        if out.len() > MAX_FILES {
            return Err(BuildError::Context(format!(
                "COPY names more than {MAX_FILES} files: pack them into an archive, COPY that and unpack it with RUN"
            )));
        }
    }
    Ok(out)
}

fn walk(root: &Path, dir: &Path, dest: &str, depth: usize, out: &mut Vec<ContextFile>) -> Result<(), BuildError> {
    if depth > MAX_DEPTH {
        return Err(BuildError::Context(format!(
            "{} nests deeper than {MAX_DEPTH} directories",
            dir.display()
        )));
    }
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(io(format!("listing {}", dir.display())))?
        .collect::<Result<_, _>>()
        .map_err(io(format!("listing {}", dir.display())))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = e
            .path()
            .strip_prefix(root)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| name.clone());
        let real = inside(root, &rel)?;
        let guest = format!("{dest}/{name}");
        let meta = fs::metadata(&real).map_err(io(format!("reading {}", real.display())))?;
        if meta.is_dir() {
            walk(root, &real, &guest, depth + 1, out)?;
        } else {
            out.push(file(&real, &rel, guest)?);
        }
        if out.len() > MAX_FILES {
            return Err(BuildError::Context(format!(
                "COPY names more than {MAX_FILES} files: pack them into an archive, COPY that and unpack it with RUN"
            )));
        }
    }
    Ok(())
}

fn file(real: &Path, rel: &str, guest: String) -> Result<ContextFile, BuildError> {
    if guest.contains('\n') || rel.contains('\n') {
        return Err(BuildError::Context(format!(
            "`{}` has a newline in its name",
            rel.escape_debug()
        )));
    }
    let (f, meta) = open_regular(real, rel)?;
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    let mut r = f.take(meta.len());
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = r.read(&mut buf).map_err(io(format!("reading {}", real.display())))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(ContextFile {
        host: real.to_path_buf(),
        guest,
        mode: meta.mode() & 0o7777,
        sha256: nubo_core::hex(h.finish().as_ref()),
        len: meta.len(),
    })
}

/// Opens a regular file without following a symlink swapped in after the check, and refuses
/// FIFOs, devices and sockets (a FIFO would hang the build).
pub fn open_regular(real: &Path, rel: &str) -> Result<(fs::File, fs::Metadata), BuildError> {
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(real)
        .map_err(|e| BuildError::Context(format!("`{rel}` cannot be opened ({e})")))?;
    let meta = f.metadata().map_err(io(format!("reading {}", real.display())))?;
    if !meta.is_file() {
        return Err(BuildError::Context(format!(
            "`{rel}` is a {}, not a regular file or directory: COPY copies files",
            nubo_core::file::describe(&meta.file_type())
        )));
    }
    Ok((f, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_files_symlink_out_of_context_is_refused() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "x").unwrap();
        let ctx = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ctx.path().join("link")).unwrap();
        let root = open(ctx.path()).unwrap();

        let e = copy_files(&root, &["link".into()], "/x").unwrap_err();

        assert!(e.to_string().contains("outside the build context"), "{e}");
    }

    #[test]
    fn copy_files_symlink_inside_context_ok() {
        let ctx = tempfile::tempdir().unwrap();
        std::fs::write(ctx.path().join("a"), "x").unwrap();
        std::os::unix::fs::symlink("a", ctx.path().join("link")).unwrap();
        let root = open(ctx.path()).unwrap();

        let files = copy_files(&root, &["link".into()], "/etc/").unwrap();

        assert_eq!(files[0].guest, "/etc/a");
        assert_eq!(files[0].len, 1);
    }

    #[test]
    fn copy_files_directory_contents_go_into_dest() {
        let ctx = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ctx.path().join("d/sub")).unwrap();
        std::fs::write(ctx.path().join("d/one"), "1").unwrap();
        std::fs::write(ctx.path().join("d/sub/two"), "2").unwrap();
        let root = open(ctx.path()).unwrap();

        let files = copy_files(&root, &["d".into()], "/opt/app").unwrap();

        let guests: Vec<&str> = files.iter().map(|f| f.guest.as_str()).collect();
        assert_eq!(guests, vec!["/opt/app/one", "/opt/app/sub/two"]);
    }

    #[test]
    fn copy_files_fifo_is_refused() {
        let ctx = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(&ctx.path().join("f"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        let root = open(ctx.path()).unwrap();

        let e = copy_files(&root, &["f".into()], "/x").unwrap_err();

        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
