//! The one grammar for the names nubo takes ([`NameKind`]), and [`quote`], the one way an error
//! quotes user input. Every entry point (flags, manifests, VMfiles, records) checks names here,
//! and every message that repeats a name shows it escaped, so nothing a user typed can move the
//! cursor, recolour the terminal or forge a line of output.
//!
//! | kind | grammar | why |
//! |---|---|---|
//! | VM | `[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?` | a DNS label: the default hostname, a directory name, part of a socket path |
//! | snapshot | `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`, not all digits | a QMP tag, a `qemu-img` argument, a record key (QEMU reads all digits as an id) |
//! | tag | `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}` | the OCI distribution spec's tag |
//! | hostname | dot-separated labels of `[A-Za-z0-9-]`, 1 to 63 each, no label starting or ending with `-`, at most 253 | RFC 1123 |
//! | build arg | `[A-Za-z_][A-Za-z0-9_]{0,127}` | a POSIX shell variable |

use std::fmt;

use serde::{Deserialize, Serialize};

/// RFC 1123 label length limit.
pub const MAX_NAME_LEN: usize = 63;
/// Long enough for a dated name and a word; short enough for a table column and a qcow2 tag.
pub const MAX_SNAPSHOT_LEN: usize = 64;
/// The OCI distribution spec's limit.
pub const MAX_TAG_LEN: usize = 128;
/// RFC 1035's limit on a name in its dotted text form.
pub const MAX_HOSTNAME_LEN: usize = 253;
/// Far longer than any real variable name; short enough to quote.
pub const MAX_BUILD_ARG_LEN: usize = 128;
/// How much of untrusted text [`quote`] shows.
const QUOTE_CHARS: usize = 80;

/// Which grammar a name follows (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Vm,
    Snapshot,
    Tag,
    Hostname,
    BuildArg,
}

impl NameKind {
    /// What the name is called in a message.
    pub fn noun(self) -> &'static str {
        match self {
            NameKind::Vm => "VM name",
            NameKind::Snapshot => "snapshot name",
            NameKind::Tag => "tag",
            NameKind::Hostname => "hostname",
            NameKind::BuildArg => "build-arg name",
        }
    }

    /// The grammar, as the fix of every refusal says it.
    pub fn grammar(self) -> &'static str {
        match self {
            NameKind::Vm => "use 1 to 63 lowercase letters, digits and `-`, starting and ending with a letter or digit (a DNS label)",
            NameKind::Snapshot => "use 1 to 64 letters, digits, `.`, `_` or `-`, starting with a letter or digit and not all digits",
            NameKind::Tag => "use 1 to 128 letters, digits, `_`, `.` and `-`, starting with a letter, digit or `_`",
            NameKind::Hostname => "use dot-separated labels of letters, digits and `-` (1 to 63 each, not starting or ending with `-`), at most 253 in all",
            NameKind::BuildArg => "use 1 to 128 letters, digits and `_`, not starting with a digit",
        }
    }

    fn max(self) -> usize {
        match self {
            NameKind::Vm => MAX_NAME_LEN,
            NameKind::Snapshot => MAX_SNAPSHOT_LEN,
            NameKind::Tag => MAX_TAG_LEN,
            NameKind::Hostname => MAX_HOSTNAME_LEN,
            NameKind::BuildArg => MAX_BUILD_ARG_LEN,
        }
    }

    fn first(self, c: char) -> bool {
        match self {
            NameKind::Vm => c.is_ascii_lowercase() || c.is_ascii_digit(),
            NameKind::Snapshot | NameKind::Hostname => c.is_ascii_alphanumeric(),
            NameKind::Tag => c.is_ascii_alphanumeric() || c == '_',
            NameKind::BuildArg => c.is_ascii_alphabetic() || c == '_',
        }
    }

    fn rest(self, c: char) -> bool {
        match self {
            NameKind::Vm => c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-',
            NameKind::Snapshot | NameKind::Tag => c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'),
            NameKind::Hostname => c.is_ascii_alphanumeric() || matches!(c, '.' | '-'),
            NameKind::BuildArg => c.is_ascii_alphanumeric() || c == '_',
        }
    }
}

/// What is wrong with a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    Empty,
    TooLong {
        len: usize,
        max: usize,
    },
    BadChar(char),
    BadStart(char),
    /// Ends with `-` (a VM name), or a hostname label starts or ends with it.
    BadEdge,
    /// All digits: QEMU would read a snapshot name as an id.
    AllDigits,
    /// A hostname with an empty or over-long label.
    BadLabel,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Empty => f.write_str("it is empty"),
            Problem::TooLong { len, max } => write!(f, "it is {len} characters long, over the limit of {max}"),
            Problem::BadChar(c) => write!(f, "it contains {c:?}"),
            Problem::BadStart(c) => write!(f, "it starts with {c:?}"),
            Problem::BadEdge => f.write_str("it (or one of its labels) starts or ends with `-`"),
            Problem::AllDigits => f.write_str("it is all digits, which QEMU would also read as a snapshot id"),
            Problem::BadLabel => {
                f.write_str("it has an empty label (a leading, trailing or doubled `.`) or one over 63 characters")
            }
        }
    }
}

/// A name refused: its kind, the name [`quote`]d, the problem; the message gives the grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} `{name}` is invalid: {problem}: {}", kind.noun(), kind.grammar())]
pub struct NameError {
    pub kind: NameKind,
    /// The name as given, escaped by [`quote`].
    pub name: String,
    pub problem: Problem,
}

/// Checks `s` against `kind`'s grammar.
pub fn check(kind: NameKind, s: &str) -> Result<(), NameError> {
    problem(kind, s).map_or(Ok(()), |problem| {
        Err(NameError {
            kind,
            name: quote(s),
            problem,
        })
    })
}

fn problem(kind: NameKind, s: &str) -> Option<Problem> {
    let Some(first) = s.chars().next() else {
        return Some(Problem::Empty);
    };
    let len = s.chars().count();
    if len > kind.max() {
        return Some(Problem::TooLong { len, max: kind.max() });
    }
    if let Some(c) = s.chars().find(|c| !kind.rest(*c) && !kind.first(*c)) {
        return Some(Problem::BadChar(c));
    }
    if !kind.first(first) {
        return Some(Problem::BadStart(first));
    }
    match kind {
        NameKind::Vm if s.ends_with('-') => Some(Problem::BadEdge),
        NameKind::Snapshot if s.bytes().all(|b| b.is_ascii_digit()) => Some(Problem::AllDigits),
        NameKind::Hostname => s.split('.').find_map(|l| {
            if l.is_empty() || l.len() > MAX_NAME_LEN {
                Some(Problem::BadLabel)
            } else if l.starts_with('-') || l.ends_with('-') {
                Some(Problem::BadEdge)
            } else {
                None
            }
        }),
        _ => None,
    }
}

/// Checks `h` as an RFC 1123 host name ([`NameKind::Hostname`]) and returns `(quoted name, why)`
/// when it is not one. Non-ASCII names are refused rather than converted: the guest's `hostname`
/// needs the punycode form, and converting silently would make the name the user sees differ
/// from the VM's. Shared by the seed (`meta-data`) and the spec's checks.
pub fn hostname_problem(h: &str) -> Option<(String, String)> {
    if let Some(c) = h.chars().find(|c| !c.is_ascii()) {
        return Some((
            quote(h),
            format!(
                "`{}` is not ASCII: use the name's punycode (xn--) form",
                quote(&c.to_string())
            ),
        ));
    }
    check(NameKind::Hostname, h)
        .err()
        .map(|e| (e.name, format!("{}: {}", e.problem, NameKind::Hostname.grammar())))
}

/// Untrusted text for an error message: at most 80 characters, every control character (newline
/// and tab included), bidirectional override and other invisible formatting character escaped
/// as `{:?}` would, so the text stays on its line and cannot drive the terminal.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len().min(QUOTE_CHARS * 2));
    for c in s.chars().take(QUOTE_CHARS) {
        match c {
            // Printable and unambiguous inside backticks: kept as typed.
            '"' | '\'' | '\\' => out.push(c),
            // Bidirectional overrides reorder what the terminal shows (Trojan Source).
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => out.extend(c.escape_unicode()),
            c => out.extend(c.escape_debug()),
        }
    }
    if s.chars().nth(QUOTE_CHARS).is_some() {
        out.push('…');
    }
    out
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct VmName(String);

impl VmName {
    pub fn parse(s: &str) -> Result<Self, NameError> {
        validate_label(s)?;
        Ok(VmName(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Validates a VM name: [`NameKind::Vm`].
pub fn validate_label(s: &str) -> Result<(), NameError> {
    check(NameKind::Vm, s)
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
        assert_eq!(VmName::parse("a/b").unwrap_err().problem, Problem::BadChar('/'));
    }

    #[test]
    fn parse_dotdot_rejected() {
        assert_eq!(VmName::parse("..").unwrap_err().problem, Problem::BadChar('.'));
    }

    #[test]
    fn parse_64_chars_rejected() {
        assert_eq!(
            VmName::parse(&"a".repeat(64)).unwrap_err().problem,
            Problem::TooLong { len: 64, max: 63 }
        );
    }

    #[test]
    fn parse_63_chars_ok() {
        assert!(VmName::parse(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn parse_uppercase_rejected() {
        assert_eq!(VmName::parse("Web").unwrap_err().problem, Problem::BadChar('W'));
    }

    #[test]
    fn parse_leading_dash_rejected() {
        assert_eq!(VmName::parse("-a").unwrap_err().problem, Problem::BadStart('-'));
    }

    #[test]
    fn quote_escape_sequence_and_newline_are_escaped() {
        assert_eq!(quote("m1\x1b[31mX\nfoo\t"), "m1\\u{1b}[31mX\\nfoo\\t");
    }

    #[test]
    fn quote_bidi_override_is_escaped() {
        assert_eq!(quote("a\u{202e}b"), "a\\u{202e}b");
    }

    #[test]
    fn quote_quotes_and_unicode_are_kept() {
        assert_eq!(quote("it's \"café\""), "it's \"café\"");
    }

    #[test]
    fn quote_long_text_is_cut() {
        assert_eq!(quote(&"x".repeat(100)), format!("{}…", "x".repeat(80)));
    }

    #[test]
    fn check_vm_name_error_escapes_and_gives_grammar() {
        let e = check(NameKind::Vm, "a\x1b[31mb\nc").unwrap_err();

        let shown = e.to_string();
        assert!(!shown.contains('\x1b') && !shown.contains('\n'), "{shown}");
        assert!(
            shown.starts_with("VM name `a\\u{1b}[31mb\\nc` is invalid: it contains '\\u{1b}'"),
            "{shown}"
        );
    }

    #[test]
    fn check_snapshot_all_digits_is_refused() {
        assert_eq!(check(NameKind::Snapshot, "42").unwrap_err().problem, Problem::AllDigits);
    }

    #[test]
    fn check_snapshot_dotdot_is_refused() {
        assert_eq!(
            check(NameKind::Snapshot, "..").unwrap_err().problem,
            Problem::BadStart('.')
        );
    }

    #[test]
    fn check_tag_underscore_start_is_accepted() {
        assert_eq!(check(NameKind::Tag, "_v1.2-rc"), Ok(()));
    }

    #[test]
    fn check_hostname_doubled_dot_is_refused() {
        assert_eq!(
            check(NameKind::Hostname, "a..b").unwrap_err().problem,
            Problem::BadLabel
        );
    }

    #[test]
    fn check_hostname_label_edge_dash_is_refused() {
        assert_eq!(check(NameKind::Hostname, "a.-b").unwrap_err().problem, Problem::BadEdge);
    }

    #[test]
    fn check_hostname_fqdn_is_accepted() {
        assert_eq!(check(NameKind::Hostname, "Web-1.example.org"), Ok(()));
    }

    #[test]
    fn check_build_arg_digit_start_is_refused() {
        assert_eq!(
            check(NameKind::BuildArg, "1X").unwrap_err().problem,
            Problem::BadStart('1')
        );
    }

    #[test]
    fn check_vm_trailing_dash_is_refused() {
        assert_eq!(check(NameKind::Vm, "a-").unwrap_err().problem, Problem::BadEdge);
    }

    proptest::proptest! {
        #[test]
        fn check_error_never_holds_control_characters(kind in 0usize..5, s in "\\PC{0,40}|[\\x00-\\x7f]{0,40}") {
            let kind = [NameKind::Vm, NameKind::Snapshot, NameKind::Tag, NameKind::Hostname, NameKind::BuildArg][kind];
            if let Err(e) = check(kind, &s) {
                let shown = e.to_string();
                proptest::prop_assert!(!shown.chars().any(char::is_control), "{:?}", shown);
            }
        }
    }

    #[test]
    fn parse_empty_rejected() {
        assert_eq!(VmName::parse("").unwrap_err().problem, Problem::Empty);
    }

    #[test]
    fn hostname_problem_fqdn_is_none() {
        assert_eq!(hostname_problem("web-1.example.org"), None);
    }

    #[test]
    fn hostname_problem_non_ascii_names_punycode() {
        let (_, why) = hostname_problem("café").unwrap();

        assert!(why.contains("punycode"), "{why}");
    }
}
