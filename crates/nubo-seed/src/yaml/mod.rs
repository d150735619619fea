//! YAML in nubo: a small emitter for the YAML nubo writes ([`emit`]), and a bounded check for
//! the YAML users give it ([`check_bounded`]), which every YAML nubo parses goes through
//! (user-data `#cloud-config`, network-config, vendor-data, and the manifests).
//!
//! # Why a bounded check, and not a loader
//!
//! A YAML alias (`*a`) stands for the whole node its anchor (`&a`) names. yaml-rust2's
//! `YamlLoader` clones that node for every alias, so nine lines of nine aliases each (the
//! "billion laughs") expand 350 bytes into 9^9 nodes: the user-data check once used 17 GB in a
//! minute on it. Its `Parser::load` also recurses once per nesting level, so 400 KB of `- `
//! overflowed the stack and aborted nubo. The check here pulls the parser's events one at a
//! time (no recursion, no tree), counts what the document would expand to, and stops at the
//! first bound crossed, naming its line and column. cloud-init's own reader (PyYAML) shares
//! aliased nodes rather than copying them, but anything downstream that walks or serialises
//! the config (cloud-init's schema validation, instance-data JSON, a manifest's consumer) pays
//! the expanded size, so that is what is bounded.
//!
//! # The bounds ([`Limits::DEFAULT`])
//!
//! | bound | default | why |
//! |---|---|---|
//! | document size | 16 MiB ([`crate::MAX_FILE_SIZE`]) | the largest file a seed holds |
//! | nesting depth | 128 | PyYAML composes and constructs recursively and fails near 300 levels under Python's default recursion limit; real configs nest under 10 |
//! | nodes, aliases expanded | 1,000,000 | go-yaml and Kubernetes refuse alias-heavy documents around this size; a 16 MiB config of real content has far fewer |
//! | alias uses | 10,000 | a config reuses a few anchors a few times; thousands of aliases is an expansion attack |
//! | scalar bytes, aliases expanded | 64 MiB | four times the largest document: a big anchored block reused a few times passes, a big block reused a thousand times does not |

mod check;
mod emit;

pub(crate) use check::quote;
pub use check::{check_bounded, Limits, TopLevel, YamlError, YamlErrorKind};
pub(crate) use emit::scalar;
