//! Runs the build's external commands: output kept in the build log, stderr lines streamed to
//! the caller's progress, and a failure reported with the command's last lines.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nubo_core::file::escape_control;

use crate::error::{io_err, BootstrapError};
use crate::stage::{Progress, Stage};

/// How many lines of a failed command's output the error carries.
const TAIL_LINES: usize = 25;

pub struct Runner<'a> {
    pub log: PathBuf,
    pub progress: &'a mut dyn Progress,
}

impl Runner<'_> {
    /// Runs `cmd` to completion, feeding `stdin` if given.
    pub fn run(&mut self, stage: Stage, mut cmd: Command, stdin: Option<&str>) -> Result<(), BootstrapError> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io_err("cannot write build log", &self.log))?;
        let start = log
            .seek(SeekFrom::End(0))
            .map_err(io_err("cannot write build log", &self.log))?;
        let shown = display(&cmd);
        writeln!(log, "$ {shown}").map_err(io_err("cannot write build log", &self.log))?;
        let out = log.try_clone().map_err(io_err("cannot write build log", &self.log))?;
        cmd.stdout(Stdio::from(out)).stderr(Stdio::piped());
        cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().map_err(|source| BootstrapError::Spawn {
            stage: stage.label(),
            command: shown.clone(),
            source,
        })?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A tool that exits early closes the pipe; its exit status then says why.
            let _ = pipe.write_all(text.as_bytes());
        }
        if let Some(err) = child.stderr.take() {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = writeln!(log, "{line}");
                self.progress.detail(stage, &escape_control(&line));
            }
        }
        let status = child.wait().map_err(|source| BootstrapError::Spawn {
            stage: stage.label(),
            command: shown.clone(),
            source,
        })?;
        if status.success() {
            return Ok(());
        }
        Err(BootstrapError::Command {
            stage: stage.label(),
            command: shown,
            status: status.to_string(),
            // The tools' output carries text from the mirror: never raw to a terminal.
            log_tail: escape_control(&tail(&self.log, start)),
        })
    }

    /// Runs `cmd` with its stdout written to `dest` (how a file is read out of a root tree that
    /// only the user namespace can read).
    pub fn run_to_file(&mut self, stage: Stage, mut cmd: Command, dest: &Path) -> Result<(), BootstrapError> {
        let f = File::create(dest).map_err(io_err("cannot create", dest))?;
        let shown = display(&cmd);
        cmd.stdout(Stdio::from(f)).stderr(Stdio::piped()).stdin(Stdio::null());
        let out = cmd.output().map_err(|source| BootstrapError::Spawn {
            stage: stage.label(),
            command: shown.clone(),
            source,
        })?;
        if out.status.success() {
            return Ok(());
        }
        Err(BootstrapError::Command {
            stage: stage.label(),
            command: shown,
            status: out.status.to_string(),
            log_tail: escape_control(String::from_utf8_lossy(&out.stderr).trim_end()),
        })
    }
}

fn display(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last lines the log gained since byte `from`.
fn tail(log: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(log) {
        let _ = f.seek(SeekFrom::Start(from));
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lines(Vec<String>);

    impl Progress for Lines {
        fn started(&mut self, _stage: Stage) {}
        fn detail(&mut self, _stage: Stage, line: &str) {
            self.0.push(line.to_owned());
        }
        fn finished(&mut self, _stage: Stage, _elapsed: std::time::Duration) {}
    }

    #[test]
    fn run_tool_output_reaches_progress_and_error_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines = Lines(Vec::new());
        let mut runner = Runner {
            log: dir.path().join("log"),
            progress: &mut lines,
        };
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "printf 'E: \\033[2Jgone\\n' >&2; exit 3"]);

        let err = runner.run(Stage::Packages, cmd, None).unwrap_err();

        assert!(
            !err.to_string().contains('\x1b') && err.to_string().contains("\\u{1b}[2Jgone"),
            "{err}"
        );
        assert_eq!(lines.0, ["E: \\u{1b}[2Jgone"]);
    }

    #[test]
    fn tail_keeps_last_lines_after_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("log");
        let body: String = (0..40).map(|i| format!("l{i}\n")).collect();
        std::fs::write(&p, format!("old\n{body}")).unwrap();

        let t = tail(&p, 4);

        assert!(t.starts_with("l15\n") && t.ends_with("l39"), "{t}");
    }
}
