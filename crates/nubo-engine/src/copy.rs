//! `vm cp`: the `scp` command line that copies between the host and a running VM over its SSH
//! endpoint, with `vm ssh`'s key and pinned host key.

use std::path::Path;

use nubo_core::VmState;

use crate::ssh::CopyDirection;
use crate::{Engine, EngineError};

impl Engine {
    /// The `scp` argv copying `local` to or from `guest_path` in VM `name`, which must be running.
    pub fn scp_argv(
        &self,
        name: &str,
        recursive: bool,
        direction: CopyDirection,
        local: &Path,
        guest_path: &str,
    ) -> Result<Vec<String>, EngineError> {
        let rec = self.created(name)?;
        let state = self.state(&rec)?;
        if state != VmState::Running {
            let fix = match state {
                VmState::Paused => format!("resume it first: `nubo vm resume {name}`"),
                _ => format!("start it first: `nubo vm start {name}`"),
            };
            return Err(EngineError::InvalidState {
                name: name.to_owned(),
                state: state.to_string(),
                fix,
            });
        }
        let addr = self.reach(&rec)?.ssh.ok_or_else(|| EngineError::InvalidState {
            name: name.to_owned(),
            state: "without an SSH endpoint".into(),
            fix: "recreate it with networking to use `nubo vm cp`".into(),
        })?;
        let (key, _) = self.nubo_key()?;
        let known_hosts = self.roots.vm_dir(name).join("known_hosts");
        crate::ssh::scp_argv(
            &key,
            &known_hosts,
            &rec.uuid,
            &rec.ssh.user,
            addr,
            recursive,
            direction,
            local,
            guest_path,
        )
    }
}
