//! Manifest errors: every one names the file, the line and column, and (when it concerns a
//! field) the field path, as `vm.yaml:12:7: spec.resources.memory: ...`.

use std::fmt;

use nubo_core::ErrorKind;

/// One problem in one manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The file as the user named it (`-` for standard input).
    pub file: String,
    /// 1-based line of the key (or value) concerned.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
    /// The field path in the manifest (`spec.cloudInit.sshKeys[1]`), when a field is concerned.
    pub path: Option<String>,
    /// What is wrong and how to fix it; lowercase.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if let Some(p) = &self.path {
            write!(f, "{p}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found, one per line; never empty.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct ManifestErrors {
    errors: Vec<ManifestError>,
}

impl ManifestErrors {
    /// `Ok` when `errors` is empty.
    pub fn check(errors: Vec<ManifestError>) -> Result<(), ManifestErrors> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ManifestErrors { errors })
        }
    }

    pub fn one(e: ManifestError) -> ManifestErrors {
        ManifestErrors { errors: vec![e] }
    }

    pub fn errors(&self) -> &[ManifestError] {
        &self.errors
    }

    pub fn into_errors(self) -> Vec<ManifestError> {
        self.errors
    }

    /// A manifest's problems are the user's input; an unreadable file is I/O.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }
}

impl From<ManifestError> for ManifestErrors {
    fn from(e: ManifestError) -> ManifestErrors {
        ManifestErrors::one(e)
    }
}
