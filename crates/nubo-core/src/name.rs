//! VM names: a DNS label, so the name can also be the guest's hostname, a directory name and
//! part of a socket path without escaping.

use std::fmt;

use serde::{Deserialize, Serialize};

/// RFC 1123 label length limit.
pub const MAX_NAME_LEN: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VmName(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("name is empty: give a name such as `web1`")]
    Empty,
    #[error("name `{name}` is {len} characters long: at most {MAX_NAME_LEN} are allowed (a DNS label)")]
    TooLong { name: String, len: usize },
    #[error("name `{name}` contains {found:?}: use only lowercase letters, digits and `-` (a DNS label)")]
    BadChar { name: String, found: char },
    #[error("name `{name}` must start and end with a lowercase letter or digit (a DNS label)")]
    BadEdge { name: String },
}

impl VmName {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        validate_label(s)?;
        Ok(VmName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Validates a DNS label (lowercase): `[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?`.
pub fn validate_label(s: &str) -> Result<(), NameError> {
    if s.is_empty() {
        return Err(NameError::Empty);
    }
    let len = s.chars().count();
    if len > MAX_NAME_LEN {
        return Err(NameError::TooLong {
            name: s.to_owned(),
            len,
        });
    }
    if let Some(found) = s
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(NameError::BadChar {
            name: s.to_owned(),
            found,
        });
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err(NameError::BadEdge { name: s.to_owned() });
    }
    Ok(())
}

impl fmt::Display for VmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for VmName {
    type Error = NameError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        validate_label(&s)?;
        Ok(VmName(s))
    }
}

impl From<VmName> for String {
    fn from(n: VmName) -> String {
        n.0
    }
}

impl std::str::FromStr for VmName {
    type Err = NameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        VmName::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_plain_label_ok() {
        assert_eq!(VmName::parse("web-1").unwrap().as_str(), "web-1");
    }

    #[test]
    fn parse_slash_rejected() {
        assert!(matches!(
            VmName::parse("a/b"),
            Err(NameError::BadChar { found: '/', .. })
        ));
    }

    #[test]
    fn parse_dotdot_rejected() {
        assert!(matches!(
            VmName::parse(".."),
            Err(NameError::BadChar { found: '.', .. })
        ));
    }

    #[test]
    fn parse_64_chars_rejected() {
        assert!(matches!(
            VmName::parse(&"a".repeat(64)),
            Err(NameError::TooLong { len: 64, .. })
        ));
    }

    #[test]
    fn parse_63_chars_ok() {
        assert!(VmName::parse(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn parse_uppercase_rejected() {
        assert!(matches!(
            VmName::parse("Web"),
            Err(NameError::BadChar { found: 'W', .. })
        ));
    }

    #[test]
    fn parse_leading_dash_rejected() {
        assert!(matches!(VmName::parse("-a"), Err(NameError::BadEdge { .. })));
    }

    #[test]
    fn parse_empty_rejected() {
        assert_eq!(VmName::parse(""), Err(NameError::Empty));
    }
}
