//! Image references.
//!
//! - [`ImageRef`]: `name:tag` (e.g. `debian:12`, `myimage:v1`), with the distro aliases users
//!   type. Catalog images and everything in the local store are named this way.
//! - [`OciRef`]: an OCI distribution-spec reference (`registry.example:5000/team/repo:tag`,
//!   `registry/repo@sha256:<hex>`), pulled and pushed by [`crate::oci`].
//! - [`AnyRef`]: what the user typed, told apart: a `/` or `@` makes it an OCI reference,
//!   anything else keeps its local/catalog meaning.
//!
//! Both are pure and bounded: a reference is at most [`MAX_COMPONENT`] characters per name or
//! tag, so the store's `refs/<name>/<tag>.json` never hits the file system's name limit.

use std::fmt;

/// Longest name or tag of a local reference (and longest OCI tag, as the distribution spec
/// says). Well under the 255-byte file name limit the store's `<tag>.json` must fit in.
pub const MAX_COMPONENT: usize = 128;

/// Longest OCI repository name including its registry (distribution spec).
pub const MAX_OCI_NAME: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ImageRef {
    pub name: String,
    pub tag: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("image reference `{0}` is not `name:tag`: write e.g. `debian:12` or `myimage:v1`")]
    Malformed(String),
    #[error("image reference `{0}`: name and tag may use only lowercase letters, digits, `.`, `_` and `-`, and must start with a letter or digit")]
    BadChar(String),
    #[error("image reference `{reference}` has a {part} of {len} characters: names and tags are at most {max}; choose a shorter one")]
    TooLong {
        reference: String,
        part: &'static str,
        len: usize,
        max: usize,
    },
    #[error("`{reference}` is not a valid registry reference ({why}): write e.g. `registry.example:5000/team/repo:tag` or `registry.example/repo@sha256:<64 hex digits>`")]
    BadOci { reference: String, why: &'static str },
    #[error("`{0}` is an OCI registry reference, not a local image name: `nubo image pull` it, then use the local name it prints (`nubo image ls`)")]
    Oci(String),
}

impl RefError {
    pub fn kind(&self) -> nubo_core::ErrorKind {
        match self {
            RefError::Oci(_) => nubo_core::ErrorKind::Unsupported,
            _ => nubo_core::ErrorKind::InvalidInput,
        }
    }
}

/// `s` made safe to quote in one line of an error: control characters escaped, long input cut.
fn shown(s: &str) -> String {
    nubo_core::name::quote(s)
}

/// Release code names that mean a numbered release.
const ALIASES: &[(&str, &str, &str)] = &[
    ("debian", "bookworm", "12"),
    ("debian", "trixie", "13"),
    ("ubuntu", "noble", "24.04"),
    ("ubuntu", "jammy", "22.04"),
];

/// `[a-z0-9][a-z0-9._-]*`: safe as one file name (no `/`, never `.` or `..`).
fn local_component_ok(p: &str) -> bool {
    let mut chars = p.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '_' | '-'))
}

impl ImageRef {
    /// Parses `name:tag` (tag defaults to `latest` when absent) and canonicalises release aliases.
    /// A registry reference (with `/` or `@`) is refused as [`RefError::Oci`] when well formed.
    pub fn parse(s: &str) -> Result<Self, RefError> {
        match AnyRef::parse(s)? {
            AnyRef::Local(r) => Ok(r),
            AnyRef::Oci(o) => Err(RefError::Oci(shown(&o.to_string()))),
        }
    }

    fn parse_local(s: &str) -> Result<Self, RefError> {
        let (name, tag) = match s.split_once(':') {
            Some((n, t)) => (n, t),
            None => (s, "latest"),
        };
        if name.is_empty() || tag.is_empty() || tag.contains(':') {
            return Err(RefError::Malformed(shown(s)));
        }
        for (part, text) in [("name", name), ("tag", tag)] {
            if text.chars().count() > MAX_COMPONENT {
                return Err(RefError::TooLong {
                    reference: shown(s),
                    part,
                    len: text.chars().count(),
                    max: MAX_COMPONENT,
                });
            }
        }
        if !local_component_ok(name) || !local_component_ok(tag) {
            return Err(RefError::BadChar(shown(s)));
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

/// An OCI distribution-spec reference: `[registry/]repository[:tag][@algorithm:hex]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OciRef {
    /// `registry.example:5000`, `localhost`; `None` when the first component is not a host.
    pub registry: Option<String>,
    /// `team/repo`: `/`-separated components.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<64 hex>` (or another `algorithm:hex`).
    pub digest: Option<String>,
}

impl OciRef {
    pub fn parse(s: &str) -> Result<Self, RefError> {
        let bad = |why| RefError::BadOci {
            reference: shown(s),
            why,
        };
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d)),
            None => (s, None),
        };
        if let Some(d) = digest {
            check_digest(d).map_err(bad)?;
        }
        // The tag's `:` comes after the last `/`; a `:` before it is the registry's port.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].find(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(t) = tag {
            check_tag(t).map_err(bad)?;
        }
        if name.is_empty() {
            return Err(bad("the repository is empty"));
        }
        if name.len() > MAX_OCI_NAME {
            return Err(bad("the name is longer than 255 characters"));
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path)) if is_registry(first) => (Some(first), path),
            _ => (None, name),
        };
        if let Some(r) = registry {
            check_registry(r).map_err(bad)?;
        }
        for c in repository.split('/') {
            check_path_component(c).map_err(bad)?;
        }
        Ok(OciRef {
            registry: registry.map(str::to_owned),
            repository: repository.to_owned(),
            tag: tag.map(str::to_owned),
            digest: digest.map(str::to_owned),
        })
    }
}

impl fmt::Display for OciRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(r) = &self.registry {
            write!(f, "{r}/")?;
        }
        f.write_str(&self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// As the distribution reference library decides: a first component with a `.` or `:`, or
/// `localhost`, or any uppercase letter names a registry host.
fn is_registry(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost" || first.chars().any(|c| c.is_ascii_uppercase())
}

/// `host[:port]`, host = DNS labels `[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?` joined by `.`.
fn check_registry(r: &str) -> Result<(), &'static str> {
    let (host, port) = match r.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (r, None),
    };
    if let Some(p) = port {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err("the registry port is not a number");
        }
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if host.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("the registry host is not a DNS name")
    }
}

/// `[a-z0-9]+(separator[a-z0-9]+)*`, separator = `.`, `_`, `__` or one or more `-`.
fn check_path_component(c: &str) -> Result<(), &'static str> {
    const WHY: &str = "repository components are lowercase letters and digits joined by `.`, `_`, `__` or `-`";
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = c.as_bytes();
    if !bytes.first().is_some_and(|b| alnum(*b)) || !bytes.last().is_some_and(|b| alnum(*b)) {
        return Err(WHY);
    }
    let mut i = 0;
    while i < bytes.len() {
        if alnum(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !alnum(bytes[i]) {
            i += 1;
        }
        match &c[start..i] {
            "." | "_" | "__" => {}
            sep if sep.bytes().all(|b| b == b'-') => {}
            _ => return Err(WHY),
        }
    }
    Ok(())
}

/// Whether `t` is a tag by the distribution spec's grammar (what a registry's tag list may be
/// trusted to hold: anything else is listed escaped, never fetched).
pub fn is_tag(t: &str) -> bool {
    check_tag(t).is_ok()
}

/// [`nubo_core::name::NameKind::Tag`]: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
fn check_tag(t: &str) -> Result<(), &'static str> {
    nubo_core::name::check(nubo_core::name::NameKind::Tag, t)
        .map_err(|_| "a tag is a letter, digit or `_` followed by up to 127 of those, `.` or `-`")
}

/// `algorithm:hex`; sha256 must be 64 lowercase hex digits, sha512 128.
fn check_digest(d: &str) -> Result<(), &'static str> {
    const WHY: &str = "a digest is `sha256:<64 lowercase hex digits>`";
    let (alg, hex) = d.split_once(':').ok_or(WHY)?;
    let alg_ok = !alg.is_empty()
        && alg
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'+' | b'.' | b'_' | b'-'))
        && alg.as_bytes()[0].is_ascii_alphanumeric();
    let hex_ok = |n: Option<usize>| {
        n.is_none_or(|n| hex.len() == n)
            && hex.len() >= 32
            && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    let ok = alg_ok
        && match alg {
            "sha256" => hex_ok(Some(64)),
            "sha512" => hex_ok(Some(128)),
            _ => hex_ok(None),
        };
    if ok {
        Ok(())
    } else {
        Err(WHY)
    }
}

/// A reference as typed: local/catalog `name:tag`, or an OCI registry reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AnyRef {
    Local(ImageRef),
    Oci(OciRef),
}

impl AnyRef {
    /// A `/` or `@` makes `s` an OCI reference; everything else is `name:tag`.
    pub fn parse(s: &str) -> Result<Self, RefError> {
        if s.contains(['/', '@']) {
            OciRef::parse(s).map(AnyRef::Oci)
        } else {
            ImageRef::parse_local(s).map(AnyRef::Local)
        }
    }
}

impl fmt::Display for AnyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnyRef::Local(r) => r.fmt(f),
            AnyRef::Oci(r) => r.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
        assert!(ImageRef::parse("x:.hidden").is_err());
    }

    #[test]
    fn parse_uppercase_rejected() {
        assert!(matches!(ImageRef::parse("Debian:12"), Err(RefError::BadChar(_))));
    }

    #[test]
    fn parse_300_char_name_too_long_names_limit() {
        let s = format!("{}:1", "a".repeat(300));

        let err = ImageRef::parse(&s).unwrap_err();

        assert!(matches!(err, RefError::TooLong { len: 300, max: 128, .. }), "{err:?}");
        assert!(err.to_string().contains("at most 128"), "{err}");
        assert!(err.to_string().chars().count() < 400, "{err}");
    }

    #[test]
    fn parse_128_char_tag_accepted() {
        let s = format!("a:{}", "b".repeat(128));

        assert_eq!(ImageRef::parse(&s).unwrap().tag.len(), 128);
    }

    #[test]
    fn parse_control_chars_escaped_in_error() {
        let err = ImageRef::parse("a\u{1b}[2J:1").unwrap_err();

        assert!(!err.to_string().contains('\u{1b}'), "{err}");
    }

    #[test]
    fn parse_oci_ref_in_local_context_says_pull_not_bad_char() {
        let err = ImageRef::parse("registry.example:5000/team/repo:tag").unwrap_err();

        assert!(matches!(err, RefError::Oci(_)), "{err:?}");
        assert!(err.to_string().contains("nubo image pull"), "{err}");
        assert_eq!(err.kind(), nubo_core::ErrorKind::Unsupported);
    }

    #[test]
    fn oci_parse_registry_port_repo_tag() {
        let r = OciRef::parse("registry.example:5000/team/repo:tag").unwrap();

        assert_eq!(r.registry.as_deref(), Some("registry.example:5000"));
        assert_eq!(r.repository, "team/repo");
        assert_eq!(r.tag.as_deref(), Some("tag"));
        assert_eq!(r.digest, None);
    }

    #[test]
    fn oci_parse_digest() {
        let s = format!("registry/repo@sha256:{}", "a".repeat(64));

        let r = OciRef::parse(&s).unwrap();

        assert_eq!(r.registry, None);
        assert_eq!(r.repository, "registry/repo");
        assert_eq!(r.digest, Some(format!("sha256:{}", "a".repeat(64))));
    }

    #[test]
    fn oci_parse_localhost_is_registry() {
        assert_eq!(
            OciRef::parse("localhost/x:1").unwrap().registry.as_deref(),
            Some("localhost")
        );
    }

    #[test]
    fn oci_parse_short_digest_rejected() {
        assert!(OciRef::parse("r.io/x@sha256:abc").is_err());
    }

    #[test]
    fn oci_parse_uppercase_repo_rejected() {
        assert!(OciRef::parse("r.io/Team/x").is_err());
    }

    #[test]
    fn oci_parse_double_slash_rejected() {
        assert!(OciRef::parse("r.io//x").is_err());
    }

    #[test]
    fn any_ref_plain_name_tag_is_local() {
        assert_eq!(
            AnyRef::parse("debian:12").unwrap(),
            AnyRef::Local(ImageRef::parse("debian:12").unwrap())
        );
    }

    fn component() -> impl Strategy<Value = String> {
        "[a-z0-9]{1,5}(([._]|__|-{1,2})[a-z0-9]{1,5}){0,2}"
    }

    fn oci_ref() -> impl Strategy<Value = OciRef> {
        (
            proptest::option::of("[a-z0-9]{1,8}\\.[a-z]{2,4}(:[0-9]{1,5})?"),
            proptest::collection::vec(component(), 1..4),
            proptest::option::of("[A-Za-z0-9_][A-Za-z0-9._-]{0,20}"),
            proptest::option::of("[0-9a-f]{64}"),
        )
            .prop_map(|(registry, path, tag, hex)| OciRef {
                registry,
                repository: path.join("/"),
                tag,
                digest: hex.map(|h| format!("sha256:{h}")),
            })
            // Without a registry, a one-component repository has no `/`; it needs `@` to be OCI.
            .prop_filter("needs a `/` or `@`", |r| {
                r.registry.is_some() || r.repository.contains('/') || r.digest.is_some()
            })
            // The first path component must not look like a host when there is no registry.
            .prop_filter("first component is not a host", |r| {
                r.registry.is_some() || !is_registry(r.repository.split('/').next().unwrap_or(""))
            })
    }

    proptest! {
        #[test]
        fn oci_display_round_trips(r in oci_ref()) {
            let text = r.to_string();

            let parsed = AnyRef::parse(&text);

            prop_assert_eq!(parsed, Ok(AnyRef::Oci(r)));
        }

        #[test]
        fn local_display_round_trips(name in "[a-z0-9][a-z0-9._-]{0,40}", tag in "[a-z0-9][a-z0-9._-]{0,40}") {
            let r = ImageRef { name, tag };
            prop_assume!(!ALIASES.iter().any(|(n, a, _)| *n == r.name && *a == r.tag));

            prop_assert_eq!(ImageRef::parse(&r.to_string()), Ok(r));
        }

        #[test]
        fn any_ref_parse_never_panics(s in "\\PC{0,300}") {
            let _ = AnyRef::parse(&s);
        }

        #[test]
        fn any_ref_parse_bytes_never_panics(s in "[a-zA-Z0-9:/@._ -]{0,80}") {
            let _ = AnyRef::parse(&s);
        }

        #[test]
        fn local_parse_result_is_a_safe_file_name(s in "\\PC{0,200}") {
            if let Ok(AnyRef::Local(r)) = AnyRef::parse(&s) {
                prop_assert!(r.name.len() <= MAX_COMPONENT && r.tag.len() <= MAX_COMPONENT);
                prop_assert!(!r.name.contains('/') && !r.tag.contains('/'));
                prop_assert!(!r.name.starts_with('.') && !r.tag.starts_with('.'));
            }
        }
    }
}
