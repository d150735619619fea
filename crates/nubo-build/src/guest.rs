//! Steps in the build VM over SSH (the same `ssh` command line `nubo vm ssh` uses, with the
//! build's own one-time key), as root through sudo.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command as Process, Stdio};

use crate::context::ContextFile;
use crate::error::{io, BuildError};
use crate::words::shell_quote;
use crate::Command;
use nubo_engine::Event;

pub struct Guest {
    /// `ssh ... -- user@127.0.0.1`, without the remote command.
    pub ssh: Vec<String>,
}

impl Guest {
    /// Runs `script` as root with `env`, its output (stdout and stderr, merged as they come)
    /// passed to `events` as [`Event::Output`] lines. The exit status's text on failure.
    pub fn run(
        &self,
        env: &BTreeMap<String, String>,
        script: &str,
        events: &mut dyn FnMut(Event),
    ) -> Result<(), String> {
        self.run_with(env, script, Stdio::null(), events)
    }

    fn run_with(
        &self,
        env: &BTreeMap<String, String>,
        script: &str,
        stdin: Stdio,
        events: &mut dyn FnMut(Event),
    ) -> Result<(), String> {
        let remote = remote_command(env, script);
        // One pipe for both streams, so lines keep the order the guest wrote them in.
        let stream_err = |e: std::io::Error| format!("cannot stream the step's output ({e})");
        let (reader, writer) = std::io::pipe().map_err(stream_err)?;
        let writer2 = writer.try_clone().map_err(stream_err)?;
        let mut cmd = Process::new(&self.ssh[0]);
        cmd.args(&self.ssh[1..])
            .arg(remote)
            .stdin(stdin)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::from(writer2));
        let spawned = cmd.spawn();
        // Our copies of the pipe's write end go with the command: the read below ends when
        // ssh (and whatever it left behind) closes theirs.
        drop(cmd);
        let mut child = spawned.map_err(|e| format!("cannot run ssh ({e}): install the openssh-client package"))?;
        forward_lines(reader, events);
        let status = child.wait().map_err(|e| format!("cannot wait for ssh ({e})"))?;
        match status.code() {
            Some(0) => Ok(()),
            // ssh's own failures (connection, authentication) exit 255.
            Some(255) => Err("ssh to the build VM failed (exit 255): the guest's sshd stopped answering".into()),
            Some(c) => Err(format!("exit status {c}")),
            None => Err("ssh was killed by a signal".into()),
        }
    }

    /// Copies one host file into the guest as root, creating its directory.
    pub fn put(&self, f: &ContextFile, events: &mut dyn FnMut(Event)) -> Result<(), BuildError> {
        let (file, _) = crate::context::open_regular(&f.host, &f.guest)?;
        let g = shell_quote(&f.guest);
        let script = format!(
            "mkdir -p -- \"$(dirname -- {g})\" && cat > {g}.nubo-tmp && chmod {:o} {g}.nubo-tmp && mv -f -- {g}.nubo-tmp {g}",
            f.mode
        );
        self.run_with(&BTreeMap::new(), &script, Stdio::from(file), events)
            .map_err(|detail| BuildError::Tool {
                what: format!("copying {} to {} in the build VM", f.host.display(), f.guest),
                detail,
            })
    }
}

/// The longest piece of output passed on without a newline: a line longer than this (a
/// progress bar redrawn with `\r`, binary output) is passed on in pieces.
const MAX_LINE: usize = 64 << 10;

/// Reads `from` to its end, passing each line (newline included) to `events` as
/// [`Event::Output`]; what follows the last newline is passed on at the end.
fn forward_lines(mut from: impl Read, events: &mut dyn FnMut(Event)) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = match from.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        buf.extend_from_slice(&chunk[..n]);
        while let Some(end) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=end).collect();
            events(Event::Output(String::from_utf8_lossy(&line).into_owned()));
        }
        if buf.len() >= MAX_LINE {
            events(Event::Output(String::from_utf8_lossy(&buf).into_owned()));
            buf.clear();
        }
    }
    if !buf.is_empty() {
        events(Event::Output(String::from_utf8_lossy(&buf).into_owned()));
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

    fn forwarded(input: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        forward_lines(input, &mut |e| {
            if let Event::Output(s) = e {
                out.push(s);
            }
        });
        out
    }

    #[test]
    fn forward_lines_each_line_with_its_newline_then_the_rest() {
        assert_eq!(forwarded(b"a\nbb\n\ntail"), vec!["a\n", "bb\n", "\n", "tail"]);
    }

    #[test]
    fn forward_lines_long_line_in_pieces_nothing_lost() {
        let long = vec![b'x'; MAX_LINE * 2 + 5];

        let out = forwarded(&long);

        assert!(out.iter().all(|s| s.len() <= MAX_LINE + 8192), "{}", out.len());
        assert_eq!(out.concat().len(), long.len());
    }

    #[test]
    fn guest_run_streams_output_as_events_in_order() {
        // `sh -c` stands in for ssh: the remote command is its last argument.
        let g = Guest {
            ssh: vec![
                "sh".into(),
                "-c".into(),
                "echo out; echo err >&2; echo again".into(),
                "sh".into(),
            ],
        };
        let mut out = Vec::new();

        g.run(&BTreeMap::new(), "ignored", &mut |e| {
            if let Event::Output(s) = e {
                out.push(s);
            }
        })
        .unwrap();

        assert_eq!(out, vec!["out\n", "err\n", "again\n"]);
    }

    #[test]
    fn guest_run_failure_is_exit_status() {
        let g = Guest {
            ssh: vec!["sh".into(), "-c".into(), "exit 3".into(), "sh".into()],
        };

        assert_eq!(g.run(&BTreeMap::new(), "x", &mut |_| {}).unwrap_err(), "exit status 3");
    }

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
