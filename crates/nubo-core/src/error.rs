//! The small set of error kinds callers branch on. Every crate's error enum maps onto one.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    InvalidInput,
    InvalidState,
    Unsupported,
    Unavailable,
    Io,
    Remote,
    Integrity,
}

/// An error and its sources on one line, `: `-joined, as the CLI prints a fatal error and as
/// conditions, notes and tests quote one.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Layer(&'static str, Option<Box<Layer>>);

    impl std::fmt::Display for Layer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Layer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|l| l as _)
        }
    }

    #[test]
    fn chain_joins_every_source_in_order() {
        let e = Layer(
            "pulling x",
            Some(Box::new(Layer("fetching blob", Some(Box::new(Layer("refused", None)))))),
        );

        assert_eq!(chain(&e), "pulling x: fetching blob: refused");
        assert_eq!(chain(&Layer("alone", None)), "alone");
    }
}
