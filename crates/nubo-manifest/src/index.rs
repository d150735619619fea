//! Where each key of a document is: a map from field path (`spec.cloudInit.sshKeys[1]`) to the
//! 1-based line and column of its key (for a sequence entry: of the entry). Built from
//! yaml-rust2's event stream after `check_bounded` accepted the text, so it is bounded too.
//! Validation errors name a field path; this turns it into `file:line:col`.

use std::collections::BTreeMap;

use yaml_rust2::parser::{Event, Parser};

/// A 1-based line and column (columns count characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    pub line: usize,
    pub column: usize,
}

/// The positions in one YAML document.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DocIndex {
    /// Where the document's content starts.
    pub start: Pos,
    /// Path -> position of its key (sequence entries: of the entry).
    keys: BTreeMap<String, Pos>,
    /// Path -> position of its value.
    values: BTreeMap<String, Pos>,
}

impl DocIndex {
    /// The position of `path`'s key, or of its nearest ancestor that is written, or the
    /// document's start.
    pub fn pos(&self, path: &str) -> Pos {
        let mut p = path;
        loop {
            if let Some(pos) = self.keys.get(p) {
                return *pos;
            }
            match parent(p) {
                Some(up) => p = up,
                None => return self.start,
            }
        }
    }

    /// Whether `path` is written in the document.
    pub fn has(&self, path: &str) -> bool {
        self.keys.contains_key(path)
    }

    /// The path of the key or value at `pos`, else of the last key before it.
    pub fn path_at(&self, pos: Pos) -> Option<String> {
        let exact = |m: &BTreeMap<String, Pos>| m.iter().find(|(_, p)| **p == pos).map(|(k, _)| k.clone());
        exact(&self.keys).or_else(|| exact(&self.values)).or_else(|| {
            self.keys
                .iter()
                .filter(|(_, p)| **p <= pos)
                .max_by_key(|(_, p)| **p)
                .map(|(k, _)| k.clone())
        })
    }
}

/// `a.b[2]` -> `a.b`, `a.b` -> `a`, `a` -> none.
fn parent(path: &str) -> Option<&str> {
    let cut = path.rfind(['.', '['])?;
    Some(&path[..cut])
}

enum Frame {
    Map {
        path: String,
        /// The key whose value comes next; `None` when a key comes next.
        key: Option<String>,
    },
    Seq {
        path: String,
        next: usize,
    },
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// Indexes every document of `text`. Text that does not parse yields what was indexed before
/// the error (the caller has already refused it through `check_bounded`).
pub fn index(text: &str) -> Vec<DocIndex> {
    let mut docs: Vec<DocIndex> = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut parser = Parser::new_from_str(text);
    while let Ok((event, mark)) = parser.next_token() {
        let pos = Pos {
            line: mark.line(),
            column: mark.col() + 1,
        };
        let node = match &event {
            Event::StreamEnd => break,
            Event::DocumentStart => {
                stack.clear();
                docs.push(DocIndex::default());
                continue;
            }
            Event::Scalar(..) | Event::Alias(_) | Event::SequenceStart(..) | Event::MappingStart(..) => true,
            Event::SequenceEnd | Event::MappingEnd => {
                stack.pop();
                false
            }
            _ => false,
        };
        if !node {
            continue;
        }
        let Some(doc) = docs.last_mut() else { continue };
        // The path of this node, recording key and value positions on the way.
        let path = match stack.last_mut() {
            None => {
                doc.start = pos;
                String::new()
            }
            Some(Frame::Seq { path, next }) => {
                let p = format!("{path}[{next}]");
                *next += 1;
                doc.keys.insert(p.clone(), pos);
                doc.values.insert(p.clone(), pos);
                p
            }
            Some(Frame::Map { path, key }) => match key.take() {
                None => {
                    // A key. Only scalar keys name fields; a complex key gets a path no field has.
                    let name = match &event {
                        Event::Scalar(text, ..) => text.clone(),
                        _ => "?".to_owned(),
                    };
                    let p = join(path, &name);
                    doc.keys.entry(p.clone()).or_insert(pos);
                    *key = Some(name);
                    format!("{p}#key")
                }
                Some(name) => {
                    let p = join(path, &name);
                    doc.values.entry(p.clone()).or_insert(pos);
                    p
                }
            },
        };
        match event {
            Event::SequenceStart(..) => stack.push(Frame::Seq { path, next: 0 }),
            Event::MappingStart(..) => stack.push(Frame::Map { path, key: None }),
            _ => {}
        }
    }
    docs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_nested_keys_and_entries_have_positions() {
        let text = "kind: VirtualMachine\nspec:\n  cloudInit:\n    sshKeys:\n      - a\n      - b\n";

        let docs = index(text);

        assert_eq!(docs.len(), 1);
        assert_eq!(docs[0].pos("spec.cloudInit.sshKeys"), Pos { line: 4, column: 5 });
        assert_eq!(docs[0].pos("spec.cloudInit.sshKeys[1]"), Pos { line: 6, column: 9 });
        assert_eq!(docs[0].pos("kind"), Pos { line: 1, column: 1 });
    }

    #[test]
    fn index_missing_path_falls_back_to_ancestor() {
        let docs = index("spec:\n  resources:\n    vcpus: 2\n");

        let pos = docs[0].pos("spec.resources.memory");

        assert_eq!(pos, Pos { line: 2, column: 3 });
    }

    #[test]
    fn index_multi_document_positions_are_file_global() {
        let docs = index("a: 1\n---\nb:\n  c: 2\n");

        assert_eq!(docs.len(), 2);
        assert_eq!(docs[1].pos("b.c"), Pos { line: 4, column: 3 });
        assert_eq!(docs[1].start.line, 3);
    }

    #[test]
    fn index_path_at_value_finds_its_key() {
        let docs = index("spec:\n  vcpus: two\n");

        let path = docs[0].path_at(Pos { line: 2, column: 10 });

        assert_eq!(path.as_deref(), Some("spec.vcpus"));
    }
}
