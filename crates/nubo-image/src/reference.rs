//! Image references: `name:tag` (e.g. `debian:12`), with the distro aliases users type.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef {
    pub name: String,
    pub tag: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("image reference `{0}` is not `name:tag`: write e.g. `debian:12` or `myimage:v1`")]
    Malformed(String),
    #[error("image reference `{0}`: name and tag may use only lowercase letters, digits, `.`, `_` and `-`")]
    BadChar(String),
}

/// Release code names that mean a numbered release.
const ALIASES: &[(&str, &str, &str)] = &[
    ("debian", "bookworm", "12"),
    ("debian", "trixie", "13"),
    ("ubuntu", "noble", "24.04"),
    ("ubuntu", "jammy", "22.04"),
];

impl ImageRef {
    /// Parses `name:tag` (tag defaults to `latest` when absent) and canonicalises release aliases.
    pub fn parse(s: &str) -> Result<Self, RefError> {
        let (name, tag) = match s.split_once(':') {
            Some((n, t)) => (n, t),
            None => (s, "latest"),
        };
        if name.is_empty() || tag.is_empty() || tag.contains(':') {
            return Err(RefError::Malformed(s.to_owned()));
        }
        let ok = |p: &str| {
            p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
                && !p.starts_with('.')
        };
        if !ok(name) || !ok(tag) {
            return Err(RefError::BadChar(s.to_owned()));
        }
        let tag = ALIASES
            .iter()
            .find(|(n, alias, _)| *n == name && *alias == tag)
            .map_or(tag, |(_, _, canonical)| canonical);
        Ok(ImageRef {
            name: name.to_owned(),
            tag: tag.to_owned(),
        })
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_alias_canonicalised() {
        assert_eq!(ImageRef::parse("debian:bookworm").unwrap().to_string(), "debian:12");
    }

    #[test]
    fn parse_missing_tag_is_latest() {
        assert_eq!(ImageRef::parse("foo").unwrap().tag, "latest");
    }

    #[test]
    fn parse_path_traversal_rejected() {
        assert!(ImageRef::parse("../x:1").is_err());
        assert!(ImageRef::parse("x:..").is_err());
    }

    #[test]
    fn parse_uppercase_rejected() {
        assert!(matches!(ImageRef::parse("Debian:12"), Err(RefError::BadChar(_))));
    }
}
