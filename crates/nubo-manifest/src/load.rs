//! `-f FILE|DIR|-` -> [`Source`]s: a file, every `*.yaml`/`*.yml` of a directory (sorted, not
//! recursive), or standard input. Every read is bounded and regular-only.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{ManifestError, ManifestErrors};
use crate::parse::{Source, MAX_MANIFEST};

/// Files taken from one directory: more is a mistake (the wrong directory), not a deployment.
pub const MAX_FILES: usize = 1000;

fn refused(file: &str, message: String) -> ManifestErrors {
    ManifestErrors::one(ManifestError {
        file: file.to_owned(),
        line: 1,
        column: 1,
        path: None,
        message,
    })
}

/// The sources `arg` names; `stdin` is read (bounded) when `arg` is `-`. `cwd` resolves the
/// relative paths of a manifest read from standard input.
pub fn load(arg: &Path, stdin: &mut dyn Read, cwd: &Path) -> Result<Vec<Source>, ManifestErrors> {
    let shown = arg.display().to_string();
    // A name the kernel would refuse says which limit, not "File name too long (os error 36)".
    if let Err(e) = nubo_core::file::check_path_length(arg, "manifest") {
        return Err(refused(&nubo_core::file::shorten(arg), e.to_string()));
    }
    if arg == Path::new("-") {
        let mut bytes = Vec::new();
        stdin
            .take(MAX_MANIFEST + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| refused("-", format!("reading standard input: {e}")))?;
        if bytes.len() as u64 > MAX_MANIFEST {
            return Err(refused(
                "-",
                format!("standard input is over the {MAX_MANIFEST}-byte limit of a manifest: split it"),
            ));
        }
        return Ok(vec![Source {
            file: "-".into(),
            dir: cwd.to_path_buf(),
            bytes,
        }]);
    }
    let meta = std::fs::metadata(arg).map_err(|e| refused(&shown, format!("cannot read {shown}: {e}")))?;
    if meta.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(arg)
            .map_err(|e| refused(&shown, format!("cannot list {shown}: {e}")))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(refused(
                &shown,
                format!("directory {shown} holds no *.yaml or *.yml file"),
            ));
        }
        if files.len() > MAX_FILES {
            return Err(refused(
                &shown,
                format!(
                    "directory {shown} holds {} manifests, over the limit of {MAX_FILES}",
                    files.len()
                ),
            ));
        }
        return files.iter().map(|f| file(f, cwd)).collect();
    }
    Ok(vec![file(arg, cwd)?])
}

fn file(path: &Path, cwd: &Path) -> Result<Source, ManifestErrors> {
    let shown = path.display().to_string();
    // A regular file, or a pipe (`-f <(generate)`), bounded in size and time.
    let bytes = nubo_core::input::read_small_input(path, "manifest", MAX_MANIFEST)
        .map_err(|e| refused(&shown, e.to_string()))?;
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        cwd.join(path)
    };
    let dir = abs.parent().map_or_else(|| cwd.to_path_buf(), Path::to_path_buf);
    Ok(Source {
        file: shown,
        dir: std::path::absolute(&dir).unwrap_or(dir),
        bytes,
    })
}
