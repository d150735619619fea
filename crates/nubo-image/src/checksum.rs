//! Checksum files as distros publish them, parsed strictly: a line that is not in the expected
//! format, a hash of the wrong length, an unknown algorithm or a file listed twice with different
//! hashes is an error, never skipped, because a lenient parser is how a tampered or truncated
//! checksum file slips through. Pure: text in, entries out.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use nubo_core::ErrorKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    Sha256,
    Sha512,
}

impl Algorithm {
    /// Hex digits in a digest of this algorithm.
    pub fn hex_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 64,
            Algorithm::Sha512 => 128,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        }
    }

    fn from_name(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "sha256" => Some(Algorithm::Sha256),
            "sha512" => Some(Algorithm::Sha512),
            _ => None,
        }
    }
}

/// An expected digest: `sha256:<hex>` or `sha512:<hex>`, hex kept lowercase.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Checksum {
    pub algorithm: Algorithm,
    pub hex: String,
}

impl Checksum {
    /// Validates `hex` against `algorithm` (length, digits) and lowercases it.
    pub fn new(algorithm: Algorithm, hex: &str) -> Result<Self, ChecksumError> {
        if hex.len() != algorithm.hex_len() {
            return Err(ChecksumError::WrongLength {
                algorithm,
                expected: algorithm.hex_len(),
                got: hex.len(),
            });
        }
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ChecksumError::NotHex(hex.to_owned()));
        }
        Ok(Checksum {
            algorithm,
            hex: hex.to_ascii_lowercase(),
        })
    }
}

impl FromStr for Checksum {
    type Err = ChecksumError;

    /// Parses `sha256:<hex>` / `sha512:<hex>` as `--checksum` takes it.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (alg, hex) = s.split_once(':').ok_or_else(|| ChecksumError::Spec(s.to_owned()))?;
        let algorithm = Algorithm::from_name(alg).ok_or_else(|| ChecksumError::UnknownAlgorithm(alg.to_owned()))?;
        Checksum::new(algorithm, hex)
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm.name(), self.hex)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    #[error("checksum `{0}` is not `sha256:<hex>` or `sha512:<hex>`")]
    Spec(String),
    #[error("unknown checksum algorithm `{0}`: nubo verifies sha256 and sha512")]
    UnknownAlgorithm(String),
    #[error("{} hash has {got} hex digits, not {expected}", algorithm.name())]
    WrongLength {
        algorithm: Algorithm,
        expected: usize,
        got: usize,
    },
    #[error("hash `{0}` is not hexadecimal")]
    NotHex(String),
    /// The inner error is part of this message, not a chained source (printed once).
    #[error("line {line}: {error}")]
    Line { line: usize, error: Box<ChecksumError> },
    #[error("line {line} is not in {format} format: `{text}`")]
    Malformed {
        line: usize,
        format: &'static str,
        text: String,
    },
    #[error("`{0}` is listed twice with different hashes")]
    Duplicate(String),
    #[error("`{0}` is not listed")]
    Missing(String),
    #[error("no checksum entry found")]
    Empty,
}

impl ChecksumError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ChecksumError::Spec(_) | ChecksumError::UnknownAlgorithm(_) => ErrorKind::InvalidInput,
            ChecksumError::Line { error, .. } => error.kind(),
            _ => ErrorKind::Integrity,
        }
    }
}

/// The entries of one checksum file: file name -> checksum, with the sizes some formats state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChecksumList {
    entries: BTreeMap<String, Checksum>,
    sizes: BTreeMap<String, u64>,
}

impl ChecksumList {
    fn insert(&mut self, name: &str, sum: Checksum) -> Result<(), ChecksumError> {
        match self.entries.get(name) {
            Some(prev) if *prev != sum => Err(ChecksumError::Duplicate(name.to_owned())),
            Some(_) => Ok(()),
            None => {
                self.entries.insert(name.to_owned(), sum);
                Ok(())
            }
        }
    }

    /// The checksum of exactly `name` (no prefix, case or path matching).
    pub fn get(&self, name: &str) -> Result<&Checksum, ChecksumError> {
        self.entries
            .get(name)
            .ok_or_else(|| ChecksumError::Missing(name.to_owned()))
    }

    /// The size a `# <name>: N bytes` comment states, when the file has one.
    pub fn size(&self, name: &str) -> Option<u64> {
        self.sizes.get(name).copied()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn at(line: usize) -> impl FnOnce(ChecksumError) -> ChecksumError {
    move |e| ChecksumError::Line {
        line,
        error: Box::new(e),
    }
}

/// Splits a GNU coreutils line, `<hex>  name` (text mode) or `<hex> *name` (binary mode).
fn split_gnu(text: &str) -> Option<(&str, &str)> {
    let (hex, rest) = text.split_once(' ')?;
    let name = rest.strip_prefix(' ').or_else(|| rest.strip_prefix('*'))?;
    (!hex.is_empty() && !name.is_empty()).then_some((hex, name))
}

/// GNU coreutils format (`sha256sum`/`sha512sum` output: Ubuntu's SHA256SUMS, Debian's
/// SHA512SUMS). The algorithm comes from the file's name, so every hash must have its length.
pub fn parse_gnu(text: &str, algorithm: Algorithm) -> Result<ChecksumList, ChecksumError> {
    let mut list = ChecksumList::default();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let (hex, name) = split_gnu(raw).ok_or_else(|| ChecksumError::Malformed {
            line,
            format: "GNU `<hex>  name`",
            text: raw.to_owned(),
        })?;
        let sum = Checksum::new(algorithm, hex).map_err(at(line))?;
        list.insert(name, sum).map_err(at(line))?;
    }
    if list.is_empty() {
        return Err(ChecksumError::Empty);
    }
    Ok(list)
}

/// BSD tagged format (`sha256sum --tag`: Rocky's `.CHECKSUM`), `SHA256 (name) = <hex>`, with
/// `# name: N bytes` comment lines whose size is kept.
pub fn parse_bsd(text: &str) -> Result<ChecksumList, ChecksumError> {
    let mut list = ChecksumList::default();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            if let Some((name, n)) = size_comment(comment) {
                list.sizes.insert(name.to_owned(), n);
            }
            continue;
        }
        let malformed = || ChecksumError::Malformed {
            line,
            format: "BSD `SHA256 (name) = <hex>`",
            text: raw.to_owned(),
        };
        let (alg, rest) = trimmed.split_once(" (").ok_or_else(malformed)?;
        let (name, hex) = rest.rsplit_once(") = ").ok_or_else(malformed)?;
        if name.is_empty() {
            return Err(malformed());
        }
        let algorithm =
            Algorithm::from_name(alg).ok_or_else(|| at(line)(ChecksumError::UnknownAlgorithm(alg.to_owned())))?;
        let sum = Checksum::new(algorithm, hex).map_err(at(line))?;
        list.insert(name, sum).map_err(at(line))?;
    }
    if list.is_empty() {
        return Err(ChecksumError::Empty);
    }
    Ok(list)
}

/// `# name: 614137856 bytes`.
fn size_comment(comment: &str) -> Option<(&str, u64)> {
    let (name, rest) = comment.trim().rsplit_once(": ")?;
    let n = rest.strip_suffix(" bytes")?.parse().ok()?;
    Some((name, n))
}

/// A `<url>.sha256` side file: one bare `<hex>`, or one GNU line that must name `file_name`.
pub fn parse_sidecar(text: &str, algorithm: Algorithm, file_name: &str) -> Result<Checksum, ChecksumError> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end()))
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    match lines.as_slice() {
        [] => Err(ChecksumError::Empty),
        [(line, only)] if !only.trim().contains(' ') => Checksum::new(algorithm, only.trim()).map_err(at(*line)),
        _ => parse_gnu(text, algorithm)?.get(file_name).cloned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H256: &str = "8c2a5ea8d2c1b8bb1dbb8d0b9d4a1b3a6b8e45d54e1c8f1a5e9f76c46c7c3a21";
    const H512: &str = "0cf2b4a1ff5e0d18eb6d1dd5a52b6f5d0b4c1c6a3b3b1d8d13f8f6f7c0b2a9e3\
                        5d4a2b8c1e9f0a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b";

    fn ubuntu_sums() -> String {
        format!(
            "{H256} *ubuntu-24.04-server-cloudimg-amd64-root.tar.xz\n\
             {} *ubuntu-24.04-server-cloudimg-amd64.img\n\
             {} *ubuntu-24.04-server-cloudimg-amd64.manifest\n",
            H256.replace('8', "9"),
            H256.replace('a', "b"),
        )
    }

    fn debian_sums() -> String {
        format!(
            "{H512}  debian-12-genericcloud-amd64.json\n{}  debian-12-genericcloud-amd64.qcow2\n",
            H512.replace('0', "1")
        )
    }

    fn rocky_checksum() -> String {
        format!(
            "# Rocky-9-GenericCloud-Base-9.6-20250531.0.x86_64.qcow2: 614137856 bytes\n\
             SHA256 (Rocky-9-GenericCloud-Base-9.6-20250531.0.x86_64.qcow2) = {H256}\n"
        )
    }

    #[test]
    fn parse_gnu_ubuntu_binary_mode_finds_exact_name() {
        let text = ubuntu_sums();

        let list = parse_gnu(&text, Algorithm::Sha256).unwrap();

        assert_eq!(list.len(), 3);
        assert_eq!(
            list.get("ubuntu-24.04-server-cloudimg-amd64.img").unwrap().hex,
            H256.replace('8', "9")
        );
    }

    #[test]
    fn parse_gnu_prefix_of_name_is_missing() {
        let list = parse_gnu(&ubuntu_sums(), Algorithm::Sha256).unwrap();

        let err = list.get("ubuntu-24.04-server-cloudimg-amd64").unwrap_err();

        assert_eq!(err, ChecksumError::Missing("ubuntu-24.04-server-cloudimg-amd64".into()));
    }

    #[test]
    fn parse_gnu_debian_sha512_text_mode_parses() {
        let list = parse_gnu(&debian_sums(), Algorithm::Sha512).unwrap();

        let sum = list.get("debian-12-genericcloud-amd64.qcow2").unwrap();

        assert_eq!(sum.to_string(), format!("sha512:{}", H512.replace('0', "1")));
    }

    #[test]
    fn parse_gnu_sha256_hash_in_sha512_file_is_wrong_length() {
        let text = format!("{H256}  debian-12-genericcloud-amd64.qcow2\n");

        let err = parse_gnu(&text, Algorithm::Sha512).unwrap_err();

        assert!(
            matches!(err, ChecksumError::Line { line: 1, ref error } if matches!(**error, ChecksumError::WrongLength { got: 64, .. }))
        );
    }

    #[test]
    fn parse_gnu_duplicate_with_other_hash_is_error() {
        let text = format!("{H256}  a.img\n{}  a.img\n", H256.replace('8', "7"));

        let err = parse_gnu(&text, Algorithm::Sha256).unwrap_err();

        assert_eq!(err.to_string(), "line 2: `a.img` is listed twice with different hashes");
    }

    #[test]
    fn parse_gnu_duplicate_with_same_hash_is_accepted() {
        let text = format!("{H256}  a.img\n{}  a.img\n", H256.to_uppercase());

        let list = parse_gnu(&text, Algorithm::Sha256).unwrap();

        assert_eq!(list.len(), 1);
    }

    #[test]
    fn parse_gnu_single_space_is_malformed() {
        let text = format!("{H256} a.img\n");

        let err = parse_gnu(&text, Algorithm::Sha256).unwrap_err();

        assert!(matches!(err, ChecksumError::Malformed { line: 1, .. }));
    }

    #[test]
    fn parse_gnu_non_hex_is_error() {
        let text = format!("{}  a.img\n", H256.replace('8', "g"));

        let err = parse_gnu(&text, Algorithm::Sha256).unwrap_err();

        assert!(matches!(err, ChecksumError::Line { error, .. } if matches!(*error, ChecksumError::NotHex(_))));
    }

    #[test]
    fn parse_gnu_html_error_page_is_malformed() {
        let err = parse_gnu("<html><body>404 Not Found</body></html>\n", Algorithm::Sha256).unwrap_err();

        assert!(matches!(err, ChecksumError::Malformed { line: 1, .. }));
    }

    #[test]
    fn parse_gnu_empty_file_is_error() {
        assert_eq!(parse_gnu("\n\n", Algorithm::Sha256).unwrap_err(), ChecksumError::Empty);
    }

    #[test]
    fn parse_bsd_rocky_keeps_size_comment() {
        let list = parse_bsd(&rocky_checksum()).unwrap();

        let name = "Rocky-9-GenericCloud-Base-9.6-20250531.0.x86_64.qcow2";

        assert_eq!(list.get(name).unwrap().hex, H256);
        assert_eq!(list.size(name), Some(614137856));
    }

    #[test]
    fn parse_bsd_unknown_algorithm_is_error() {
        let text = "MD5 (a.qcow2) = d41d8cd98f00b204e9800998ecf8427e\n";

        let err = parse_bsd(text).unwrap_err();

        assert_eq!(
            err.to_string(),
            "line 1: unknown checksum algorithm `MD5`: nubo verifies sha256 and sha512"
        );
    }

    #[test]
    fn parse_bsd_sha512_tag_checks_length() {
        let text = format!("SHA512 (a.qcow2) = {H256}\n");

        let err = parse_bsd(&text).unwrap_err();

        assert!(
            matches!(err, ChecksumError::Line { error, .. } if matches!(*error, ChecksumError::WrongLength { expected: 128, .. }))
        );
    }

    #[test]
    fn parse_bsd_gnu_line_is_malformed() {
        let text = format!("{H256}  a.qcow2\n");

        let err = parse_bsd(&text).unwrap_err();

        assert!(matches!(err, ChecksumError::Malformed { line: 1, .. }));
    }

    #[test]
    fn parse_bsd_name_with_parentheses_parses() {
        let text = format!("SHA256 (a (copy).qcow2) = {H256}\n");

        let list = parse_bsd(&text).unwrap();

        assert!(list.get("a (copy).qcow2").is_ok());
    }

    #[test]
    fn parse_sidecar_bare_hex_parses() {
        let sum = parse_sidecar(&format!("{H256}\n"), Algorithm::Sha256, "x.qcow2").unwrap();

        assert_eq!(sum.hex, H256);
    }

    #[test]
    fn parse_sidecar_gnu_line_must_name_file() {
        let text = format!("{H256}  other.qcow2\n");

        let err = parse_sidecar(&text, Algorithm::Sha256, "x.qcow2").unwrap_err();

        assert_eq!(err, ChecksumError::Missing("x.qcow2".into()));
    }

    #[test]
    fn parse_sidecar_gnu_line_naming_file_parses() {
        let text = format!("{H256}  x.qcow2\n");

        let sum = parse_sidecar(&text, Algorithm::Sha256, "x.qcow2").unwrap();

        assert_eq!(sum.hex, H256);
    }

    #[test]
    fn parse_sidecar_short_hash_is_wrong_length() {
        let err = parse_sidecar("abc123\n", Algorithm::Sha256, "x.qcow2").unwrap_err();

        assert!(
            matches!(err, ChecksumError::Line { error, .. } if matches!(*error, ChecksumError::WrongLength { got: 6, .. }))
        );
    }

    #[test]
    fn checksum_from_str_round_trips() {
        let s = format!("sha256:{H256}");

        let sum: Checksum = s.parse().unwrap();

        assert_eq!(sum.to_string(), s);
    }

    #[test]
    fn checksum_from_str_md5_is_unknown_algorithm() {
        let err = "md5:d41d8cd98f00b204e9800998ecf8427e".parse::<Checksum>().unwrap_err();

        assert_eq!(err, ChecksumError::UnknownAlgorithm("md5".into()));
    }

    #[test]
    fn checksum_from_str_without_algorithm_is_spec_error() {
        assert!(matches!(H256.parse::<Checksum>(), Err(ChecksumError::Spec(_))));
    }

    proptest::proptest! {
        #[test]
        fn parsers_arbitrary_text_never_panic(text in "\\PC{0,300}") {
            let _ = parse_gnu(&text, Algorithm::Sha256);
            let _ = parse_bsd(&text);
            let _ = parse_sidecar(&text, Algorithm::Sha512, "x");
        }

        #[test]
        fn parse_gnu_written_entries_round_trip(
            entries in proptest::collection::btree_map("[a-zA-Z0-9._-]{1,40}", "[0-9a-f]{64}", 1..20),
            binary in proptest::bool::ANY,
        ) {
            let sep = if binary { " *" } else { "  " };
            let text: String = entries.iter().map(|(n, h)| format!("{h}{sep}{n}\n")).collect();

            let list = parse_gnu(&text, Algorithm::Sha256).unwrap();

            for (n, h) in &entries {
                proptest::prop_assert_eq!(&list.get(n).unwrap().hex, h);
            }
        }
    }
}
