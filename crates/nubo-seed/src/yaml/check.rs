//! The bounded check: yaml-rust2's event parser driven one event at a time, counting nodes,
//! depth and alias expansion, never building a tree. See the module above for the bounds.

use std::collections::{HashMap, HashSet};

use nubo_core::file::escape_control;
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// How much a YAML document may hold. [`Limits::DEFAULT`] is what nubo applies everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of the document itself.
    pub max_bytes: u64,
    /// Collections nested in collections (a top-level mapping is depth 1).
    pub max_depth: usize,
    /// Nodes (scalars, sequences, mappings) once every alias is replaced by its anchor's node.
    pub max_nodes: u64,
    /// Uses of aliases (`*name`).
    pub max_aliases: u64,
    /// Bytes of scalars once every alias is replaced by its anchor's node.
    pub max_expanded_bytes: u64,
}

impl Limits {
    pub const DEFAULT: Limits = Limits {
        max_bytes: crate::MAX_FILE_SIZE,
        max_depth: 128,
        max_nodes: 1_000_000,
        max_aliases: 10_000,
        max_expanded_bytes: 64 * 1024 * 1024,
    };
}

impl Default for Limits {
    fn default() -> Limits {
        Limits::DEFAULT
    }
}

/// What a document's top-level node is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopLevel {
    /// An empty document, `~` or `null`.
    Null,
    Scalar,
    Sequence,
    Mapping,
}

/// Why a YAML document was refused, and where (1-based line and column, in characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {kind}")]
pub struct YamlError {
    pub line: usize,
    pub column: usize,
    pub kind: YamlErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum YamlErrorKind {
    /// The parser's own message (already control-escaped).
    #[error("{0}")]
    Syntax(String),
    #[error("the bytes here are not UTF-8")]
    NotUtf8,
    #[error("the document is {size} bytes, over the {max}-byte limit: make it smaller")]
    TooLarge { size: u64, max: u64 },
    #[error("collections nest deeper than {max} levels: flatten the structure")]
    TooDeep { max: usize },
    #[error(
        "aliases expand the document past {max} nodes (an alias bomb?): write the values out or reuse fewer anchors"
    )]
    TooManyNodes { max: u64 },
    #[error("the document uses more than {max} aliases: write the values out or reuse fewer anchors")]
    TooManyAliases { max: u64 },
    #[error(
        "aliases expand the document past {max} bytes of text (an alias bomb?): reuse large anchored values less often"
    )]
    ExpandedTooLarge { max: u64 },
    #[error("an alias refers to the node that contains it, which never ends when expanded: remove the alias")]
    RecursiveAlias,
    #[error("mapping key `{0}` appears twice: keep one (cloud-init would silently drop the first)")]
    DuplicateKey(String),
}

/// How many characters of user text an error quotes.
const QUOTE_CHARS: usize = 40;

/// Checks that `bytes` is YAML within `limits`, without building it: syntax, size, depth, alias
/// expansion and duplicate mapping keys. Returns the kind of each document's top-level node
/// (none for a stream of only comments).
pub fn check_bounded(bytes: &[u8], limits: &Limits) -> Result<Vec<TopLevel>, YamlError> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(YamlError {
            line: 1,
            column: 1,
            kind: YamlErrorKind::TooLarge {
                size: bytes.len() as u64,
                max: limits.max_bytes,
            },
        });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let (line, column) = line_column(bytes, e.valid_up_to());
        YamlError {
            line,
            column,
            kind: YamlErrorKind::NotUtf8,
        }
    })?;
    let mut counter = Counter {
        limits,
        stack: Vec::new(),
        anchors: HashMap::new(),
        nodes: 0,
        bytes: 0,
        aliases: 0,
        documents: Vec::new(),
    };
    let mut parser = Parser::new_from_str(text);
    loop {
        // `next_token`, not `Parser::load`: load recurses once per nesting level.
        let (event, mark) = parser.next_token().map_err(|e| YamlError {
            line: e.marker().line(),
            column: e.marker().col() + 1,
            kind: YamlErrorKind::Syntax(quote(e.info())),
        })?;
        if event == Event::StreamEnd {
            return Ok(counter.documents);
        }
        counter.on_event(event, mark)?;
    }
}

/// An open sequence or mapping.
struct Frame {
    anchor: usize,
    nodes: u64,
    bytes: u64,
    /// For a mapping: the scalar keys seen (plain or not, text) and whether a key comes next.
    keys: Option<(HashSet<(bool, String)>, bool)>,
}

/// A finished node, as its parent sees it.
struct Node {
    anchor: usize,
    nodes: u64,
    bytes: u64,
    /// A scalar's (plain, text), for duplicate-key detection.
    key: Option<(bool, String)>,
}

struct Counter<'l> {
    limits: &'l Limits,
    stack: Vec<Frame>,
    /// Expanded (nodes, bytes) of each finished anchored node, by the parser's anchor id.
    anchors: HashMap<usize, (u64, u64)>,
    nodes: u64,
    bytes: u64,
    aliases: u64,
    documents: Vec<TopLevel>,
}

impl Counter<'_> {
    fn on_event(&mut self, event: Event, mark: Marker) -> Result<(), YamlError> {
        let err = |kind| YamlError {
            line: mark.line(),
            column: mark.col() + 1,
            kind,
        };
        match event {
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => Ok(()),
            Event::DocumentStart => {
                self.stack.clear();
                Ok(())
            }
            Event::Scalar(text, style, anchor, tag) => {
                self.count(1, text.len() as u64).map_err(err)?;
                if self.stack.is_empty() {
                    let null =
                        style == TScalarStyle::Plain && tag.is_none() && matches!(text.as_str(), "" | "~" | "null");
                    self.documents
                        .push(if null { TopLevel::Null } else { TopLevel::Scalar });
                }
                let bytes = text.len() as u64;
                self.finish(Node {
                    anchor,
                    nodes: 1,
                    bytes,
                    key: Some((style == TScalarStyle::Plain, text)),
                })
                .map_err(err)
            }
            Event::Alias(id) => {
                self.aliases += 1;
                if self.aliases > self.limits.max_aliases {
                    return Err(err(YamlErrorKind::TooManyAliases {
                        max: self.limits.max_aliases,
                    }));
                }
                // An anchor is registered when its node starts and sized when it ends: an alias
                // to one still open is inside it.
                let &(nodes, bytes) = self
                    .anchors
                    .get(&id)
                    .ok_or_else(|| err(YamlErrorKind::RecursiveAlias))?;
                self.count(nodes, bytes).map_err(err)?;
                self.finish(Node {
                    anchor: 0,
                    nodes,
                    bytes,
                    key: None,
                })
                .map_err(err)
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                let mapping = matches!(event, Event::MappingStart(..));
                if self.stack.len() >= self.limits.max_depth {
                    return Err(err(YamlErrorKind::TooDeep {
                        max: self.limits.max_depth,
                    }));
                }
                self.count(1, 0).map_err(err)?;
                if self.stack.is_empty() {
                    self.documents
                        .push(if mapping { TopLevel::Mapping } else { TopLevel::Sequence });
                }
                self.stack.push(Frame {
                    anchor,
                    nodes: 1,
                    bytes: 0,
                    keys: mapping.then(|| (HashSet::new(), true)),
                });
                Ok(())
            }
            Event::SequenceEnd | Event::MappingEnd => {
                let Some(frame) = self.stack.pop() else {
                    return Ok(());
                };
                self.finish(Node {
                    anchor: frame.anchor,
                    nodes: frame.nodes,
                    bytes: frame.bytes,
                    key: None,
                })
                .map_err(err)
            }
        }
    }

    /// Adds a node's expanded size to the document's totals, refusing past the limits.
    fn count(&mut self, nodes: u64, bytes: u64) -> Result<(), YamlErrorKind> {
        self.nodes = self.nodes.saturating_add(nodes);
        self.bytes = self.bytes.saturating_add(bytes);
        if self.nodes > self.limits.max_nodes {
            return Err(YamlErrorKind::TooManyNodes {
                max: self.limits.max_nodes,
            });
        }
        if self.bytes > self.limits.max_expanded_bytes {
            return Err(YamlErrorKind::ExpandedTooLarge {
                max: self.limits.max_expanded_bytes,
            });
        }
        Ok(())
    }

    /// Records a finished node: its anchor's size, its parent's size, a mapping's keys.
    fn finish(&mut self, node: Node) -> Result<(), YamlErrorKind> {
        if node.anchor > 0 {
            self.anchors.insert(node.anchor, (node.nodes, node.bytes));
        }
        let Some(parent) = self.stack.last_mut() else {
            return Ok(());
        };
        parent.nodes = parent.nodes.saturating_add(node.nodes);
        parent.bytes = parent.bytes.saturating_add(node.bytes);
        if let Some((keys, key_next)) = &mut parent.keys {
            let is_key = *key_next;
            *key_next = !*key_next;
            // `<<` may appear more than once: each merges another mapping in.
            if let Some(key) = node.key.filter(|k| is_key && k.1 != "<<") {
                if !keys.insert(key.clone()) {
                    return Err(YamlErrorKind::DuplicateKey(quote(&key.1)));
                }
            }
        }
        Ok(())
    }
}

/// At most [`QUOTE_CHARS`] characters of `text`, control characters escaped: safe to print.
pub(crate) fn quote(text: &str) -> String {
    let mut shown: String = text.chars().take(QUOTE_CHARS).collect();
    if shown.len() < text.len() {
        shown.push_str("...");
    }
    escape_control(&shown)
}

/// 1-based line and column (in characters) of byte `offset`.
fn line_column(bytes: &[u8], offset: usize) -> (usize, usize) {
    let before = &bytes[..offset.min(bytes.len())];
    let line_start = before.iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let column = String::from_utf8_lossy(&before[line_start..]).chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(text: &str) -> YamlErrorKind {
        check_bounded(text.as_bytes(), &Limits::DEFAULT).unwrap_err().kind
    }

    /// Nine anchors of nine aliases each: 9^9 nodes once expanded, from a few hundred bytes.
    fn billion_laughs() -> String {
        let mut s = String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
        for w in names.windows(2) {
            let refs = vec![format!("*{}", w[0]); 9].join(",");
            s.push_str(&format!("{}: &{} [{}]\n", w[1], w[1], refs));
        }
        s
    }

    #[test]
    fn check_bounded_mapping_returns_top_level() {
        let docs = check_bounded(b"runcmd:\n  - [touch, /x]\nmode: 0644\n", &Limits::DEFAULT).unwrap();

        assert_eq!(docs, [TopLevel::Mapping]);
    }

    #[test]
    fn check_bounded_comments_only_has_no_documents() {
        let docs = check_bounded(b"#cloud-config\n", &Limits::DEFAULT).unwrap();

        assert!(docs.is_empty());
    }

    #[test]
    fn check_bounded_documents_are_listed_in_order() {
        let docs = check_bounded(b"--- a\n--- ~\n--- [1]\n", &Limits::DEFAULT).unwrap();

        assert_eq!(docs, [TopLevel::Scalar, TopLevel::Null, TopLevel::Sequence]);
    }

    #[test]
    fn check_bounded_moderate_alias_reuse_is_accepted() {
        let text = "base: &b {user: a, shell: /bin/sh}\nx:\n  <<: *b\n  <<: *b\ny: *b\nz: [*b, *b]\n";

        assert!(check_bounded(text.as_bytes(), &Limits::DEFAULT).is_ok());
    }

    /// Regression: the 373-byte user-data of issue 9 took 17 GB through YamlLoader.
    #[test]
    fn check_bounded_billion_laughs_is_refused_quickly() {
        let bomb = billion_laughs();
        let t = std::time::Instant::now();

        let err = check_bounded(bomb.as_bytes(), &Limits::DEFAULT).unwrap_err();

        assert_eq!(err.kind, YamlErrorKind::TooManyNodes { max: 1_000_000 });
        assert!(err.line <= 9, "{err}");
        assert!(t.elapsed() < std::time::Duration::from_secs(2), "{:?}", t.elapsed());
    }

    #[test]
    fn check_bounded_expansion_just_under_limit_is_accepted() {
        let limits = Limits {
            // mapping, `a`, the sequence and its 3, `b`, and the alias expanded to 4 again
            max_nodes: 11,
            ..Limits::DEFAULT
        };

        assert!(check_bounded(b"a: &a [x, y, z]\nb: *a\n", &limits).is_ok());
    }

    #[test]
    fn check_bounded_expansion_one_over_limit_is_refused() {
        let limits = Limits {
            max_nodes: 10,
            ..Limits::DEFAULT
        };

        let err = check_bounded(b"a: &a [x, y, z]\nb: *a\n", &limits).unwrap_err();

        assert_eq!(
            (err.kind, err.line, err.column),
            (YamlErrorKind::TooManyNodes { max: 10 }, 2, 4)
        );
    }

    #[test]
    fn check_bounded_large_scalar_reused_is_refused() {
        let big = "x".repeat(1024 * 1024);
        let text = format!("a: &a {big}\nb: [{}]\n", vec!["*a"; 70].join(", "));

        assert_eq!(kind(&text), YamlErrorKind::ExpandedTooLarge { max: 64 * 1024 * 1024 });
    }

    #[test]
    fn check_bounded_many_aliases_are_refused() {
        let text = format!("a: &a x\nb: [{}]\n", vec!["*a"; 10_001].join(", "));

        assert_eq!(kind(&text), YamlErrorKind::TooManyAliases { max: 10_000 });
    }

    #[test]
    fn check_bounded_recursive_alias_is_refused() {
        assert_eq!(kind("a: &a [1, *a]\n"), YamlErrorKind::RecursiveAlias);
    }

    /// Regression: 400 KB of `- ` overflowed the stack in yaml-rust2's recursive `Parser::load`
    /// and aborted nubo.
    #[test]
    fn check_bounded_deep_block_nesting_is_refused_without_overflow() {
        let text = format!("a:\n{}x\n", "- ".repeat(200_000));

        let err = check_bounded(text.as_bytes(), &Limits::DEFAULT).unwrap_err();

        assert_eq!(err.kind, YamlErrorKind::TooDeep { max: 128 });
        assert_eq!(err.line, 2);
    }

    #[test]
    fn check_bounded_depth_at_limit_is_accepted() {
        let limits = Limits {
            max_depth: 3,
            ..Limits::DEFAULT
        };

        assert!(check_bounded(b"a: [[x]]\n", &limits).is_ok());
    }

    #[test]
    fn check_bounded_depth_over_limit_is_refused() {
        let limits = Limits {
            max_depth: 3,
            ..Limits::DEFAULT
        };

        let err = check_bounded(b"a: [[[x]]]\n", &limits).unwrap_err();

        assert_eq!(
            (err.kind, err.line, err.column),
            (YamlErrorKind::TooDeep { max: 3 }, 1, 6)
        );
    }

    #[test]
    fn check_bounded_too_large_is_refused_before_parsing() {
        let limits = Limits {
            max_bytes: 4,
            ..Limits::DEFAULT
        };

        let err = check_bounded(b"a: bc", &limits).unwrap_err();

        assert_eq!(err.kind, YamlErrorKind::TooLarge { size: 5, max: 4 });
    }

    #[test]
    fn check_bounded_duplicate_key_is_refused_naming_it() {
        let err = check_bounded(b"runcmd: [a]\nx: 1\nruncmd: [b]\n", &Limits::DEFAULT).unwrap_err();

        assert_eq!(err.kind, YamlErrorKind::DuplicateKey("runcmd".into()));
        assert_eq!(err.line, 3);
    }

    #[test]
    fn check_bounded_same_text_plain_and_quoted_keys_are_distinct() {
        assert!(check_bounded(b"1: a\n\"1\": b\n", &Limits::DEFAULT).is_ok());
    }

    #[test]
    fn check_bounded_duplicate_key_with_escape_is_quoted_escaped() {
        let err = check_bounded(b"\"a\\e[2J\": 1\n\"a\\e[2J\": 2\n", &Limits::DEFAULT).unwrap_err();

        assert!(!err.to_string().contains('\x1b'), "{err}");
        assert!(err.to_string().contains("a\\u{1b}[2J"), "{err}");
    }

    #[test]
    fn check_bounded_unknown_alias_is_syntax_error() {
        assert!(matches!(kind("a: *nope\n"), YamlErrorKind::Syntax(_)));
    }

    #[test]
    fn check_bounded_non_utf8_names_position() {
        let err = check_bounded(b"ab: \xff\n", &Limits::DEFAULT).unwrap_err();

        assert_eq!((err.kind, err.line, err.column), (YamlErrorKind::NotUtf8, 1, 5));
    }

    #[test]
    fn line_column_second_line_counts_characters() {
        assert_eq!(line_column("a\né x".as_bytes(), 5), (2, 3));
    }

    #[test]
    fn quote_long_text_is_cut_and_escaped() {
        let q = quote(&format!("\x07{}", "x".repeat(100)));

        assert!(q.starts_with("\\u{7}x") && q.ends_with("...") && q.len() < 60, "{q}");
    }
}
