//! The seed crate's errors. Each names the object, the cause and, where there is one, the fix.

use nubo_core::ErrorKind;

use crate::yaml::{YamlError, YamlErrorKind};

#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    #[error("hostname `{hostname}` is invalid: {why}")]
    InvalidHostname { hostname: String, why: String },

    #[error("instance-id `{id}` is invalid: {why}")]
    InvalidInstanceId { id: String, why: String },

    #[error("{what} is not a format cloud-init runs: {why}")]
    UnsupportedUserData { what: &'static str, why: String },

    #[error("{what} is not YAML nubo accepts (line {line}, column {column}): {kind}")]
    InvalidYaml {
        what: &'static str,
        line: usize,
        column: usize,
        kind: YamlErrorKind,
    },

    #[error("network-config is not one cloud-init reads: {why}")]
    InvalidNetworkConfig { why: String },

    #[error("MAC address `{mac}` is invalid: write six hex pairs such as 52:54:00:12:34:56")]
    InvalidMac { mac: String },

    #[error("address `{address}` is invalid: write an IPv4 address with a prefix such as 10.237.0.2/16, and a gateway such as 10.237.0.1")]
    InvalidAddress { address: String },

    #[error("seed file `{name}` is {size} bytes, over the {max}-byte limit of a seed: move large payloads into the image or fetch them at boot")]
    FileTooLarge { name: String, size: u64, max: u64 },

    #[error("seed file name `{name}` is invalid: {why}")]
    InvalidFileName { name: String, why: String },

    #[error("seed file `{name}` is listed twice")]
    DuplicateFile { name: String },

    #[error("seed image is not ISO9660 or VFAT: {why}")]
    UnknownImage { why: String },

    #[error("seed image is malformed: {why}")]
    Malformed { why: String },

    #[error("seed image uses {what}, which nubo's reader does not support")]
    UnsupportedImage { what: String },

    #[error("writing the seed image")]
    Write(#[source] std::io::Error),

    #[error("building the VFAT seed image")]
    Vfat(#[source] std::io::Error),
}

impl SeedError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            SeedError::InvalidHostname { .. }
            | SeedError::InvalidInstanceId { .. }
            | SeedError::InvalidMac { .. }
            | SeedError::InvalidAddress { .. }
            | SeedError::UnsupportedUserData { .. }
            | SeedError::InvalidYaml { .. }
            | SeedError::InvalidNetworkConfig { .. }
            | SeedError::FileTooLarge { .. }
            | SeedError::InvalidFileName { .. }
            | SeedError::DuplicateFile { .. }
            | SeedError::UnknownImage { .. } => ErrorKind::InvalidInput,
            SeedError::Malformed { .. } => ErrorKind::Integrity,
            SeedError::UnsupportedImage { .. } => ErrorKind::Unsupported,
            SeedError::Write(_) | SeedError::Vfat(_) => ErrorKind::Io,
        }
    }

    /// `what` (`network-config`, ...) refused by the bounded YAML check.
    pub(crate) fn yaml(what: &'static str, e: YamlError) -> SeedError {
        SeedError::InvalidYaml {
            what,
            line: e.line,
            column: e.column,
            kind: e.kind,
        }
    }

    pub(crate) fn malformed(why: impl Into<String>) -> SeedError {
        SeedError::Malformed { why: why.into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_invalid_hostname_is_invalid_input() {
        let e = SeedError::InvalidHostname {
            hostname: "a_b".into(),
            why: "x".into(),
        };

        let kind = e.kind();

        assert_eq!(kind, ErrorKind::InvalidInput);
    }

    #[test]
    fn kind_malformed_image_is_integrity() {
        let e = SeedError::malformed("truncated");

        let kind = e.kind();

        assert_eq!(kind, ErrorKind::Integrity);
    }

    #[test]
    fn display_file_too_large_names_file_and_fix() {
        let e = SeedError::FileTooLarge {
            name: "user-data".into(),
            size: 20,
            max: 10,
        };

        let msg = e.to_string();

        assert!(
            msg.contains("`user-data`") && msg.contains("move large payloads"),
            "{msg}"
        );
    }
}
