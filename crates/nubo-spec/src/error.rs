//! Validation and admission errors: every problem found, each at a field path.

use std::fmt;

use nubo_core::ErrorKind;

use crate::field::Field;

/// One problem with one field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field, for callers that map it to a flag or a manifest position.
    pub field: Field,
    /// The exact path: [`Field::path`], plus an element suffix where one element is wrong
    /// (`spec.cloudInit.sshKeys[2]`, `spec.overrides.qemu.accel`).
    pub path: String,
    /// What is wrong and how to fix it; lowercase, without the path.
    pub message: String,
}

impl FieldError {
    pub fn new(field: Field, message: impl Into<String>) -> FieldError {
        FieldError {
            field,
            path: field.path().to_owned(),
            message: message.into(),
        }
    }

    /// An error about one element of `field`: `suffix` is appended to its path as is.
    pub fn at(field: Field, suffix: &str, message: impl Into<String>) -> FieldError {
        FieldError {
            field,
            path: format!("{}{suffix}", field.path()),
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// All the problems of a spec, in field order; never empty. Displays one `path: message` per line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", lines(.errors))]
pub struct SpecErrors {
    errors: Vec<FieldError>,
}

fn lines(errors: &[FieldError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
}

impl SpecErrors {
    /// `Ok` when `errors` is empty.
    pub fn check(errors: Vec<FieldError>) -> Result<(), SpecErrors> {
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SpecErrors { errors })
        }
    }

    pub fn errors(&self) -> &[FieldError] {
        &self.errors
    }

    pub fn into_errors(self) -> Vec<FieldError> {
        self.errors
    }

    /// Whether any error concerns `field`.
    pub fn has(&self, field: Field) -> bool {
        self.errors.iter().any(|e| e.field == field)
    }

    /// A spec's problems are always the user's input.
    pub fn kind(&self) -> ErrorKind {
        ErrorKind::InvalidInput
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_errors_display_one_line_per_error() {
        let errors = SpecErrors::check(vec![
            FieldError::new(Field::ResourcesVcpus, "is 0: give at least 1"),
            FieldError::at(Field::CloudInitSshKeys, "[1]", "is empty"),
        ])
        .unwrap_err();

        let shown = errors.to_string();

        assert_eq!(
            shown,
            "spec.resources.vcpus: is 0: give at least 1\nspec.cloudInit.sshKeys[1]: is empty"
        );
    }

    #[test]
    fn spec_errors_check_empty_is_ok() {
        let result = SpecErrors::check(Vec::new());

        assert_eq!(result, Ok(()));
    }
}
