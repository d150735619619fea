//! Where nubo keeps state. Resolved once, from values the binary reads from the environment, so
//! that libraries never read it themselves and tests always point at temporary roots.

use std::path::{Path, PathBuf};

/// The environment values root resolution depends on, read once by the binary. `NUBO_ROOT` and
/// `NUBO_RUN_DIR` are passed as read, empty or not: set but empty is an error (it is almost
/// always a script's unset variable, and silently meaning the default root would put VMs and
/// images somewhere the user did not ask for). A relative path is refused as well: nubo's
/// records keep absolute paths, and one resolved against the current directory would change
/// meaning with it.
#[derive(Debug, Clone, Default)]
pub struct RootEnv {
    pub nubo_root: Option<PathBuf>,
    pub nubo_run_dir: Option<PathBuf>,
    pub xdg_data_home: Option<PathBuf>,
    pub xdg_runtime_dir: Option<PathBuf>,
    pub home: Option<PathBuf>,
    pub is_root: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Roots {
    /// `NUBO_ROOT`: images/ and vms/.
    pub root: PathBuf,
    /// `NUBO_RUN_DIR`: sockets and pid files; must be short enough for AF_UNIX paths.
    pub run_dir: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RootsError {
    #[error("cannot place nubo's state: neither NUBO_ROOT, XDG_DATA_HOME nor HOME is set; set NUBO_ROOT")]
    NoDataDir,
    #[error("cannot place nubo's sockets: neither NUBO_RUN_DIR nor XDG_RUNTIME_DIR is set; set NUBO_RUN_DIR (e.g. /tmp/nubo-$UID)")]
    NoRunDir,
    #[error("{var} must be an absolute path, got `{}`: give an absolute path (e.g. `$PWD/{}`)", path.display(), path.display())]
    Relative { var: &'static str, path: PathBuf },
    #[error("{var} is set but empty: unset it (`unset {var}`) to use the default, or set it to an absolute path")]
    Empty { var: &'static str },
}

/// `sun_path` is 108 bytes including the terminating NUL.
pub const MAX_SOCKET_PATH: usize = 107;

impl Roots {
    pub fn resolve(env: &RootEnv) -> Result<Roots, RootsError> {
        let root = match (&env.nubo_root, env.is_root) {
            (Some(p), _) => absolute("NUBO_ROOT", p)?,
            (None, true) => PathBuf::from("/var/lib/nubo"),
            (None, false) => match (&env.xdg_data_home, &env.home) {
                (Some(x), _) if x.is_absolute() => x.join("nubo"),
                (_, Some(h)) => absolute("HOME", h)?.join(".local/share/nubo"),
                _ => return Err(RootsError::NoDataDir),
            },
        };
        let run_dir = match (&env.nubo_run_dir, env.is_root) {
            (Some(p), _) => absolute("NUBO_RUN_DIR", p)?,
            (None, true) => PathBuf::from("/run/nubo"),
            (None, false) => match &env.xdg_runtime_dir {
                Some(x) if x.is_absolute() => x.join("nubo"),
                _ => return Err(RootsError::NoRunDir),
            },
        };
        Ok(Roots { root, run_dir })
    }

    pub fn images(&self) -> PathBuf {
        self.root.join("images")
    }

    pub fn vms(&self) -> PathBuf {
        self.root.join("vms")
    }

    pub fn vm_dir(&self, name: &str) -> PathBuf {
        self.vms().join(name)
    }

    pub fn vm_run_dir(&self, name: &str) -> PathBuf {
        self.run_dir.join(name)
    }

    /// nubo's own files that are not images or VMs: its SSH key, settings.
    pub fn config_file(&self) -> PathBuf {
        self.root.join("settings.json")
    }

    pub fn ssh_dir(&self) -> PathBuf {
        self.root.join("ssh")
    }
}

fn absolute(var: &'static str, p: &Path) -> Result<PathBuf, RootsError> {
    if p.as_os_str().is_empty() {
        Err(RootsError::Empty { var })
    } else if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Err(RootsError::Relative {
            var,
            path: p.to_path_buf(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_root_user_defaults() {
        let env = RootEnv {
            is_root: true,
            ..Default::default()
        };

        let r = Roots::resolve(&env).unwrap();

        assert_eq!(r.root, PathBuf::from("/var/lib/nubo"));
        assert_eq!(r.run_dir, PathBuf::from("/run/nubo"));
    }

    #[test]
    fn resolve_user_xdg_defaults() {
        let env = RootEnv {
            xdg_data_home: Some("/home/u/.local/share".into()),
            xdg_runtime_dir: Some("/run/user/1000".into()),
            ..Default::default()
        };

        let r = Roots::resolve(&env).unwrap();

        assert_eq!(r.root, PathBuf::from("/home/u/.local/share/nubo"));
        assert_eq!(r.run_dir, PathBuf::from("/run/user/1000/nubo"));
    }

    #[test]
    fn resolve_user_home_fallback() {
        let env = RootEnv {
            home: Some("/home/u".into()),
            xdg_runtime_dir: Some("/run/user/1".into()),
            ..Default::default()
        };

        assert_eq!(
            Roots::resolve(&env).unwrap().root,
            PathBuf::from("/home/u/.local/share/nubo")
        );
    }

    #[test]
    fn resolve_overrides_win() {
        let env = RootEnv {
            nubo_root: Some("/tmp/r".into()),
            nubo_run_dir: Some("/tmp/s".into()),
            is_root: true,
            ..Default::default()
        };

        let r = Roots::resolve(&env).unwrap();

        assert_eq!((r.root, r.run_dir), (PathBuf::from("/tmp/r"), PathBuf::from("/tmp/s")));
    }

    #[test]
    fn resolve_relative_override_rejected() {
        let env = RootEnv {
            nubo_root: Some("rel".into()),
            is_root: true,
            ..Default::default()
        };

        assert!(matches!(
            Roots::resolve(&env),
            Err(RootsError::Relative { var: "NUBO_ROOT", .. })
        ));
    }

    #[test]
    fn resolve_empty_nubo_root_names_variable_and_fix() {
        let env = RootEnv {
            nubo_root: Some(PathBuf::new()),
            is_root: true,
            ..Default::default()
        };

        let err = Roots::resolve(&env).unwrap_err();

        assert_eq!(err, RootsError::Empty { var: "NUBO_ROOT" });
        assert!(err.to_string().contains("unset NUBO_ROOT"), "{err}");
    }

    #[test]
    fn resolve_empty_run_dir_rejected() {
        let env = RootEnv {
            nubo_run_dir: Some(PathBuf::new()),
            is_root: true,
            ..Default::default()
        };

        assert_eq!(Roots::resolve(&env), Err(RootsError::Empty { var: "NUBO_RUN_DIR" }));
    }

    #[test]
    fn resolve_user_without_runtime_dir_rejected() {
        let env = RootEnv {
            home: Some("/home/u".into()),
            ..Default::default()
        };

        assert_eq!(Roots::resolve(&env), Err(RootsError::NoRunDir));
    }
}
