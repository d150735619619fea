//! Everything a bootstrap can fail with.

use std::io;
use std::path::PathBuf;

use nubo_core::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("cannot bootstrap `{0}`: only debian:12 (bookworm) and debian:13 (trixie) have a recipe")]
    UnknownRelease(String),
    #[error("host tools missing for the bootstrap: {}", .0.iter().map(|(c, p)| format!("`{c}` (install {p})")).collect::<Vec<_>>().join(", "))]
    MissingTools(Vec<(String, String)>),
    #[error("cannot run mmdebstrap as this user: {0}")]
    NoPrivilege(String),
    #[error("no Debian mirror found in the host's apt sources ({0}): pass --mirror URL")]
    NoMirror(String),
    #[error("image size {size} is too small for the bootstrap: use at least {min}")]
    TooSmall {
        size: nubo_core::ByteSize,
        min: nubo_core::ByteSize,
    },
    #[error("package `{0}` is not a Debian package name (lowercase letters, digits, `+`, `-`, `.`), optionally with `=VERSION` or `/SUITE`")]
    BadPackage(String),
    #[error("mirror `{mirror}` is refused: {why}: give the archive's URL, such as http://deb.debian.org/debian")]
    BadMirror { mirror: String, why: String },
    #[error("{stage} failed: `{command}` exited with {status}{}", tail_text(.log_tail))]
    Command {
        stage: &'static str,
        command: String,
        status: String,
        log_tail: String,
    },
    #[error("{stage}: cannot run `{command}`")]
    Spawn {
        stage: &'static str,
        command: String,
        #[source]
        source: io::Error,
    },
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("container image {image} has no kernel: {why}; add one to the image (a VMfile step `RUN apt-get install -y linux-image-amd64`, or the distribution's kernel package in its Containerfile) and build it again")]
    NoKernel { image: String, why: String },
    #[error("container image {image} has no cloud-init (/usr/bin/cloud-init): a VM from it could not be personalised; install cloud-init in the image, or pass --appliance for an image that configures itself")]
    NoCloudInit { image: String },
    #[error("container image {image}: {why}")]
    BadTree { image: String, why: String },
    #[error("the built image is malformed: {0}")]
    Malformed(String),
}

fn tail_text(tail: &str) -> String {
    if tail.is_empty() {
        String::new()
    } else {
        format!("; its last output:\n{tail}")
    }
}

impl BootstrapError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            BootstrapError::UnknownRelease(_) => ErrorKind::NotFound,
            BootstrapError::MissingTools(_) | BootstrapError::NoPrivilege(_) => ErrorKind::Unavailable,
            BootstrapError::NoMirror(_)
            | BootstrapError::TooSmall { .. }
            | BootstrapError::BadPackage(_)
            | BootstrapError::BadMirror { .. }
            | BootstrapError::NoKernel { .. }
            | BootstrapError::NoCloudInit { .. }
            | BootstrapError::BadTree { .. } => ErrorKind::InvalidInput,
            BootstrapError::Command { .. } | BootstrapError::Spawn { .. } | BootstrapError::Io { .. } => ErrorKind::Io,
            BootstrapError::Malformed(_) => ErrorKind::Integrity,
        }
    }
}

pub(crate) fn io_err(what: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> BootstrapError {
    let path = path.into();
    move |source| BootstrapError::Io { what, path, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_names_each_package() {
        let e = BootstrapError::MissingTools(vec![
            ("sfdisk".into(), "fdisk".into()),
            ("mcopy".into(), "mtools".into()),
        ]);

        let msg = e.to_string();

        assert!(
            msg.contains("`sfdisk` (install fdisk)") && msg.contains("`mcopy` (install mtools)"),
            "{msg}"
        );
    }

    #[test]
    fn command_error_includes_log_tail() {
        let e = BootstrapError::Command {
            stage: "packages",
            command: "mmdebstrap".into(),
            status: "exit status: 1".into(),
            log_tail: "E: boom".into(),
        };

        assert!(e.to_string().ends_with("its last output:\nE: boom"));
    }
}
