//! Text -> documents. Every document first passes `nubo_seed::yaml::check_bounded` (size, depth,
//! alias expansion, duplicate keys, UTF-8), then serde-saphyr reads it into the kinds' types
//! with YAML 1.2 scalars: `yes`/`no`/`on`/`off` are not booleans and `0777` is not octal, so in
//! a text field they stay the text written, and in a boolean field they are refused.

use std::path::PathBuf;

use nubo_seed::yaml::{check_bounded, Limits, TopLevel};

use crate::error::{ManifestError, ManifestErrors};
use crate::index::{index, DocIndex, Pos};
use crate::suggest::did_you_mean;
use crate::types::RawDocument;

/// A manifest is text a person reviews: 1 MiB is far beyond any real one (large user-data
/// belongs in `userDataFile`, which has the seed's own limit).
pub const MAX_MANIFEST: u64 = 1 << 20;

/// Documents per file: more is generated, not written, and each becomes a VM.
pub const MAX_DOCUMENTS: usize = 1000;

/// The text of one manifest file and where it came from.
#[derive(Debug, Clone)]
pub struct Source {
    /// The file as the user named it (`-` for standard input); errors start with it.
    pub file: String,
    /// The directory relative paths in the manifest are resolved against (absolute): the
    /// file's own directory, or the working directory for standard input.
    pub dir: PathBuf,
    pub bytes: Vec<u8>,
}

/// One parsed document of a manifest file.
#[derive(Debug, Clone)]
pub struct Document {
    pub file: String,
    pub dir: PathBuf,
    pub raw: RawDocument,
    pub index: DocIndex,
}

impl Document {
    /// An error at `path` (a manifest path such as `spec.resources.memory`), positioned at its
    /// key, or at the nearest written ancestor.
    pub fn error(&self, path: &str, message: impl Into<String>) -> ManifestError {
        let pos = self.index.pos(path);
        ManifestError {
            file: self.file.clone(),
            line: pos.line,
            column: pos.column,
            path: Some(path.to_owned()),
            message: message.into(),
        }
    }

    pub fn name(&self) -> &str {
        &self.raw.metadata.name
    }
}

fn options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        strict_booleans: true,
        legacy_octal_numbers: false,
        with_snippet: false,
        duplicate_keys: serde_saphyr::options::DuplicateKeyPolicy::Error,
        // `<<` merges are YAML 1.1; a manifest spells its fields out.
        merge_keys: serde_saphyr::options::MergeKeyPolicy::Error,
    }
}

/// Parses every document of `src`. Pure: reads no file (see [`crate::lower`] for the files a
/// manifest names).
pub fn parse(src: &Source) -> Result<Vec<Document>, ManifestErrors> {
    let at = |pos: Pos, path: Option<String>, message: String| ManifestError {
        file: src.file.clone(),
        line: pos.line,
        column: pos.column,
        path,
        message,
    };
    let limits = Limits {
        max_bytes: MAX_MANIFEST,
        ..Limits::DEFAULT
    };
    let tops = check_bounded(&src.bytes, &limits).map_err(|e| {
        let pos = Pos {
            line: e.line,
            column: e.column,
        };
        // A duplicate key is a field problem: name its path when the text indexes.
        let path = std::str::from_utf8(&src.bytes)
            .ok()
            .filter(|_| matches!(e.kind, nubo_seed::yaml::YamlErrorKind::DuplicateKey(_)))
            .and_then(|t| index(t).into_iter().rev().find(|d| d.start.line <= pos.line))
            .and_then(|d| d.path_at(pos));
        let message = match &e.kind {
            // check_bounded quotes at most 40 characters of the parser's message; a manifest's
            // reader wants all of it, and the hint.
            nubo_seed::yaml::YamlErrorKind::Syntax(_) => {
                explain(&syntax_message(&src.bytes).unwrap_or_else(|| e.kind.to_string()), None)
            }
            _ => e.kind.to_string(),
        };
        at(pos, path, message)
    })?;
    // check_bounded accepted the bytes as UTF-8.
    let text = std::str::from_utf8(&src.bytes).map_err(|_| at(Pos::default(), None, "not UTF-8".into()))?;
    let docs: Vec<DocIndex> = index(text)
        .into_iter()
        .zip(&tops)
        .filter(|(_, top)| **top != TopLevel::Null)
        .map(|(d, _)| d)
        .collect();
    if docs.is_empty() {
        return Err(at(
            Pos { line: 1, column: 1 },
            None,
            "the file holds no document: write a manifest (`nubo manifest schema` describes them)".into(),
        )
        .into());
    }
    if docs.len() > MAX_DOCUMENTS {
        return Err(at(
            docs[MAX_DOCUMENTS].start,
            None,
            format!(
                "the file holds {} documents, over the limit of {MAX_DOCUMENTS}: split it",
                docs.len()
            ),
        )
        .into());
    }
    let mut errors = Vec::new();
    for (top, d) in tops.iter().filter(|t| **t != TopLevel::Null).zip(&docs) {
        if *top != TopLevel::Mapping {
            errors.push(at(
                d.start,
                None,
                "a manifest document is a mapping of apiVersion, kind, metadata and spec".into(),
            ));
        }
    }
    ManifestErrors::check(errors)?;
    let raws: Vec<RawDocument> = serde_saphyr::from_multiple_with_options(text, options()).map_err(|e| {
        let pos = e.location().map_or(Pos { line: 1, column: 1 }, |l| Pos {
            line: usize::try_from(l.line()).unwrap_or(usize::MAX),
            column: usize::try_from(l.column()).unwrap_or(usize::MAX),
        });
        let path = docs
            .iter()
            .rev()
            .find(|d| d.start.line <= pos.line)
            .and_then(|d| d.path_at(pos))
            .map(|p| p.trim_end_matches("#key").to_owned());
        let message = explain(&strip_location(&e.to_string()), path.as_deref());
        at(pos, path.filter(|p| !p.is_empty()), message)
    })?;
    if raws.len() != docs.len() {
        return Err(at(
            Pos { line: 1, column: 1 },
            None,
            format!(
                "read {} documents but indexed {}: the file's document markers confuse nubo's readers; write one `---` line between documents",
                raws.len(),
                docs.len()
            ),
        )
        .into());
    }
    Ok(raws
        .into_iter()
        .zip(docs)
        .map(|(raw, index)| Document {
            file: src.file.clone(),
            dir: src.dir.clone(),
            raw,
            index,
        })
        .collect())
}

/// The YAML parser's whole message for text check_bounded refused as a syntax error.
fn syntax_message(bytes: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    loop {
        match parser.next_token() {
            Err(e) => return Some(nubo_core::file::escape_control(e.info())),
            Ok((yaml_rust2::parser::Event::StreamEnd, _)) => return None,
            Ok(_) => {}
        }
    }
}

/// serde-saphyr appends ` at line L, column C`; the position is printed in front instead.
fn strip_location(msg: &str) -> String {
    if let Some(i) = msg.rfind(" at line ") {
        let tail = &msg[i + " at line ".len()..];
        let ok = tail
            .split_once(", column ")
            .is_some_and(|(l, c)| l.bytes().all(|b| b.is_ascii_digit()) && c.bytes().all(|b| b.is_ascii_digit()));
        if ok {
            return msg[..i].to_owned();
        }
    }
    msg.to_owned()
}

/// serde's and serde-saphyr's messages in nubo's words: what is wrong and what to write.
fn explain(msg: &str, path: Option<&str>) -> String {
    let field = path.and_then(|p| p.rsplit('.').next()).unwrap_or_default();
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((name, expected)) = rest.split_once("`, expected ") {
            let known = known_names(expected);
            return format!(
                "unknown field `{name}`{}: the fields here are {}",
                did_you_mean(name, &known),
                known.join(", ")
            );
        }
        if let Some(name) = rest.strip_suffix("`, there are no fields") {
            return format!("unknown field `{name}`: nothing may be written here");
        }
    }
    if let Some(rest) = msg.strip_prefix("unknown variant `") {
        if let Some((name, expected)) = rest.split_once("`, expected ") {
            let known = known_names(expected);
            let what = if path == Some("spec.type") {
                "unknown workload type"
            } else {
                "unknown value"
            };
            return format!(
                "{what} `{name}`{}: write one of {}",
                did_you_mean(name, &known),
                known.join(", ")
            );
        }
    }
    if msg.starts_with("invalid u32") || msg.starts_with("invalid u64") {
        return "expected a whole number such as `2`".into();
    }
    if msg.starts_with("invalid boolean") {
        return "expected `true` or `false` (YAML 1.2: yes/no/on/off are not booleans)".into();
    }
    if msg.starts_with("expected string scalar") {
        let hint = match field {
            "userData" | "networkConfig" | "vendorData" => {
                format!(": give the content as a block of text (`{field}: |` and the lines below it), or name a file with `{field}File`")
            }
            _ => ": quote the value".into(),
        };
        return format!("expected text{hint}");
    }
    if msg.starts_with("expected sequence start") {
        return "expected a list (`[a, b]`, or one `- a` line per entry)".into();
    }
    if msg.starts_with("expected mapping start") {
        return "expected a mapping of fields (`key: value` lines indented below it)".into();
    }
    if msg.starts_with("mapping values are not allowed") {
        return format!(
            "{msg}: check the indentation (a nested key must be indented under its parent, a sibling aligned with it)"
        );
    }
    msg.to_owned()
}

/// `one of a, b, c` or `` `a` `` -> the names.
fn known_names(expected: &str) -> Vec<&str> {
    let list = expected.strip_prefix("one of ").unwrap_or(expected);
    list.split(", ")
        .map(|s| s.trim_matches('`'))
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strip_location_removes_suffix() {
        assert_eq!(strip_location("invalid u32 at line 3, column 10"), "invalid u32");
    }

    #[test]
    fn strip_location_keeps_other_text() {
        assert_eq!(strip_location("seen at line breaks"), "seen at line breaks");
    }

    #[test]
    fn explain_unknown_field_suggests_nearest() {
        let m = explain(
            "unknown field `sshKey`, expected one of hostname, sshKeys, userData",
            Some("spec.cloudInit.sshKey"),
        );

        assert_eq!(
            m,
            "unknown field `sshKey` (did you mean `sshKeys`?): the fields here are hostname, sshKeys, userData"
        );
    }
}
