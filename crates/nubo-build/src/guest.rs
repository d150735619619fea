//! Steps in the build VM over SSH (the same `ssh` command line `nubo vm ssh` uses, with the
//! build's own one-time key), as root through sudo.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::process::{Command as Process, Stdio};

use crate::context::ContextFile;
use crate::error::{io, BuildError};
use crate::words::shell_quote;
use crate::Command;

pub struct Guest {
    /// `ssh ... -- user@127.0.0.1`, without the remote command.
    pub ssh: Vec<String>,
}

impl Guest {
    /// Runs `script` as root with `env`, its output streamed to our stderr. The exit status's
    /// text on failure.
    pub fn run(&self, env: &BTreeMap<String, String>, script: &str) -> Result<(), String> {
        self.run_with(env, script, Stdio::null())
    }

    fn run_with(&self, env: &BTreeMap<String, String>, script: &str, stdin: Stdio) -> Result<(), String> {
        let remote = remote_command(env, script);
        // The guest's output goes to nubo's stderr as it comes: stdout is for results.
        let out = std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| format!("cannot stream the step's output ({e})"))?;
        let status = Process::new(&self.ssh[0])
            .args(&self.ssh[1..])
            .arg(remote)
            .stdin(stdin)
            .stdout(Stdio::from(out))
            .stderr(Stdio::inherit())
            .status()
            .map_err(|e| format!("cannot run ssh ({e}): install the openssh-client package"))?;
        match status.code() {
            Some(0) => Ok(()),
            // ssh's own failures (connection, authentication) exit 255.
            Some(255) => Err("ssh to the build VM failed (exit 255): the guest's sshd stopped answering".into()),
            Some(c) => Err(format!("exit status {c}")),
            None => Err("ssh was killed by a signal".into()),
        }
    }

    /// Copies one host file into the guest as root, creating its directory.
    pub fn put(&self, f: &ContextFile) -> Result<(), BuildError> {
        let (file, _) = crate::context::open_regular(&f.host, &f.guest)?;
        let g = shell_quote(&f.guest);
        let script = format!(
            "mkdir -p -- \"$(dirname -- {g})\" && cat > {g}.nubo-tmp && chmod {:o} {g}.nubo-tmp && mv -f -- {g}.nubo-tmp {g}",
            f.mode
        );
        self.run_with(&BTreeMap::new(), &script, Stdio::from(file))
            .map_err(|detail| BuildError::Tool {
                what: format!("copying {} to {} in the build VM", f.host.display(), f.guest),
                detail,
            })
    }
}

/// The remote command: `sudo -n env K=V... sh -c SCRIPT`, every word quoted, so nothing in
/// the VMfile is re-split by the remote login shell.
pub fn remote_command(env: &BTreeMap<String, String>, script: &str) -> String {
    let mut w = vec!["sudo".to_owned(), "-n".into(), "env".into()];
    for (k, v) in env {
        w.push(shell_quote(&format!("{k}={v}")));
    }
    w.extend(["sh".into(), "-c".into(), shell_quote(script)]);
    w.join(" ")
}

/// A RUN command as a shell script: shell form as written; exec form quoted word by word.
pub fn script(c: &Command) -> String {
    match c {
        Command::Shell(s) => s.clone(),
        Command::Exec(argv) => {
            let words: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
            format!("exec {}", words.join(" "))
        }
    }
}

/// A one-time SSH key for one build, in `dir` (removed with it).
pub fn build_key(dir: &std::path::Path, id: &str) -> Result<(PathBuf, String), BuildError> {
    let key = dir.join("build_key");
    let out = Process::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C"])
        .arg(format!("nubo-build-{id}"))
        .arg("-f")
        .arg(&key)
        .output()
        .map_err(|e| BuildError::Tool {
            what: "making the build's SSH key".into(),
            detail: format!("ssh-keygen: {e}: install the openssh-client package"),
        })?;
    if !out.status.success() {
        return Err(BuildError::Tool {
            what: "making the build's SSH key".into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let public = std::fs::read_to_string(key.with_extension("pub")).map_err(io("reading the build's public key"))?;
    let _ = File::open(&key).map_err(io("reading the build's key"))?;
    Ok((key, public.trim().to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_command_quotes_env_and_script() {
        let env = BTreeMap::from([("A".to_owned(), "x y".to_owned())]);

        let c = remote_command(&env, "echo 'hi' > /m");

        assert_eq!(c, r"sudo -n env 'A=x y' sh -c 'echo '\''hi'\'' > /m'");
    }

    #[test]
    fn script_exec_form_is_quoted() {
        let s = script(&Command::Exec(vec!["touch".into(), "/a b".into()]));

        assert_eq!(s, "exec touch '/a b'");
    }
}
