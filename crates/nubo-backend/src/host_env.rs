//! What the backends would otherwise read from the process environment deep inside: read
//! once by whoever builds the registry ([`HostEnv::from_process`] in the CLI), or filled in
//! its own way by a daemon, so nothing below looks at process-wide state.

use std::ffi::OsString;
use std::path::PathBuf;

/// The host-side settings the built-in backends take from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostEnv {
    /// The directories searched for the VMM binaries, virtiofsd and `ip` (`$PATH`); `None`
    /// finds nothing by bare name.
    pub path: Option<OsString>,
    /// Cloud Hypervisor's firmware (`$NUBO_HYPERVISOR_FW`), ahead of the usual places.
    pub hypervisor_fw: Option<PathBuf>,
}

impl HostEnv {
    /// `$PATH` and `$NUBO_HYPERVISOR_FW` of this process (an empty value is unset), read now.
    pub fn from_process() -> HostEnv {
        HostEnv {
            path: std::env::var_os("PATH"),
            hypervisor_fw: std::env::var_os(crate::cloud_hypervisor::firmware::ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        }
    }

    /// The executable `cmd` on [`HostEnv::path`].
    pub fn which(&self, cmd: &str) -> Option<PathBuf> {
        crate::host::which(cmd, self.path.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_no_path_finds_nothing() {
        assert_eq!(HostEnv::default().which("sh"), None);
    }

    #[test]
    fn which_given_path_finds_executable_there() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let tool = d.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env = HostEnv {
            path: Some(d.path().as_os_str().to_owned()),
            hypervisor_fw: None,
        };

        assert_eq!(env.which("tool"), Some(tool));
    }
}
