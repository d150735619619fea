//! The load restriction (kustomize's `--load-restrictor`): a manifest is a file people download
//! and share, so by default every file it names (user-data, network-config, vendor-data, `@`
//! SSH key files, disks, kernels, firmware, seeds) must resolve, after symlinks, inside the
//! manifest's own directory tree. A manifest read from standard input has the working directory
//! as its root. `--load-restrictor none` lifts the rule for manifests the user trusts; paths
//! given as command-line flags are never restricted.

use std::path::{Component, Path, PathBuf};

/// kustomize's two values, under their names and kustomize's own spellings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LoadRestrictor {
    /// Every file must resolve inside the manifest's directory tree.
    #[default]
    RootOnly,
    /// Any file the host lets the caller read.
    None,
}

impl LoadRestrictor {
    /// The accepted spellings: `root-only`/`none`, or kustomize's `LoadRestrictionsRootOnly`/
    /// `LoadRestrictionsNone`.
    pub const VALUES: &'static [&'static str] =
        &["root-only", "none", "LoadRestrictionsRootOnly", "LoadRestrictionsNone"];

    pub fn parse(text: &str) -> Result<LoadRestrictor, String> {
        match text {
            "root-only" | "rootOnly" | "LoadRestrictionsRootOnly" => Ok(LoadRestrictor::RootOnly),
            "none" | "LoadRestrictionsNone" => Ok(LoadRestrictor::None),
            other => Err(format!(
                "`{}` is not a load restrictor: use root-only (the default) or none",
                nubo_core::file::escape_control(other)
            )),
        }
    }
}

/// `path` (absolute) resolved after symlinks when it lies inside `root`; otherwise why not. A
/// path that does not exist (yet) is judged by its existing ancestor, so `../` cannot escape
/// through a missing component either. The resolved path is returned, so the later open follows
/// no link the check did not see.
pub fn confine(root: &Path, path: &Path) -> Result<PathBuf, String> {
    let root_real = std::fs::canonicalize(root).unwrap_or_else(|_| lexical(root));
    let resolved = resolve(path);
    if resolved.starts_with(&root_real) {
        return Ok(resolved);
    }
    let via = if resolved == lexical(path) {
        String::new()
    } else {
        format!(" (it resolves to {})", resolved.display())
    };
    Err(format!(
        "{}{via} is outside {}, the manifest's directory tree: a manifest may only name files beside or below it; copy the file there, or pass `--load-restrictor none` if you trust this manifest",
        path.display(),
        root_real.display()
    ))
}

/// The lexical check fakes use ([`crate::Files::confine`]'s default): no filesystem access.
pub fn confine_lexical(root: &Path, path: &Path) -> Result<PathBuf, String> {
    let p = lexical(path);
    if p.starts_with(lexical(root)) {
        Ok(p)
    } else {
        Err(format!(
            "{} is outside {}, the manifest's directory tree: copy the file there, or pass `--load-restrictor none` if you trust this manifest",
            path.display(),
            root.display()
        ))
    }
}

/// The canonical form of the longest existing ancestor of `path`, with the rest appended
/// lexically.
fn resolve(path: &Path) -> PathBuf {
    let path = lexical(path);
    let mut existing = path.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(existing) {
            let mut out = real;
            for c in rest.iter().rev() {
                out.push(c);
            }
            return out;
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_owned());
                existing = parent;
            }
            _ => return path,
        }
    }
}

/// `path` with `.` dropped and `..` applied to the components before it (symlinks are not
/// resolved here; [`resolve`] does that for what exists).
fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_restrictor_parse_kustomize_spellings_accepted() {
        assert_eq!(
            LoadRestrictor::parse("LoadRestrictionsNone").unwrap(),
            LoadRestrictor::None
        );
        assert_eq!(
            LoadRestrictor::parse("LoadRestrictionsRootOnly").unwrap(),
            LoadRestrictor::RootOnly
        );
    }

    #[test]
    fn load_restrictor_parse_unknown_refused() {
        assert!(LoadRestrictor::parse("off").is_err());
    }

    #[test]
    fn confine_file_below_root_accepted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("files")).unwrap();
        std::fs::write(dir.path().join("files/ud"), b"x").unwrap();

        let got = confine(dir.path(), &dir.path().join("files/./ud")).unwrap();

        assert_eq!(got, std::fs::canonicalize(dir.path().join("files/ud")).unwrap());
    }

    #[test]
    fn confine_dotdot_escape_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("m")).unwrap();

        let err = confine(&dir.path().join("m"), &dir.path().join("m/../../../etc/shadow")).unwrap_err();

        assert!(err.contains("outside"), "{err}");
    }

    #[test]
    fn confine_symlink_to_outside_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/etc", dir.path().join("etc")).unwrap();

        let err = confine(dir.path(), &dir.path().join("etc/hostname")).unwrap_err();

        assert!(err.contains("resolves to /etc/hostname"), "{err}");
    }

    #[test]
    fn confine_missing_file_under_escaping_link_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("/tmp", dir.path().join("t")).unwrap();

        let err = confine(dir.path(), &dir.path().join("t/nubo-no-such-dir/x")).unwrap_err();

        assert!(err.contains("outside"), "{err}");
    }

    #[test]
    fn confine_lexical_dotdot_refused() {
        assert!(confine_lexical(Path::new("/m"), Path::new("/m/../etc/shadow")).is_err());
    }
}
