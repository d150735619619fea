//! Manifests are untrusted text (`nubo apply -f -` reads anything): parsing and lowering must
//! return an error, never panic, loop or allocate without bound. Lowering reads files through
//! a `Files` that answers from memory, so the fuzzer never opens a host file, and asserts that
//! no path outside the manifest's directory (`/m`) is ever asked for.
#![no_main]

use std::path::{Path, PathBuf};

use libfuzzer_sys::fuzz_target;
use nubo_manifest::{Files, Source};

struct NoFiles;

impl Files for NoFiles {
    fn read(&self, path: &Path, _what: &str, _max: u64) -> Result<Vec<u8>, String> {
        // The load restriction (issue 21.3): nothing outside the manifest's directory is read.
        assert!(
            path.starts_with("/m") && !path.components().any(|c| c == std::path::Component::ParentDir),
            "read outside the manifest's tree: {}",
            path.display()
        );
        if path.ends_with("keys.pub") {
            return Ok(b"ssh-ed25519 AAAA fuzz\n".to_vec());
        }
        Err("no files while fuzzing".into())
    }

    fn home(&self) -> Option<PathBuf> {
        Some(PathBuf::from("/home/fuzz"))
    }
}

fuzz_target!(|data: &[u8]| {
    let src = Source {
        file: "fuzz.yaml".into(),
        dir: PathBuf::from("/m"),
        bytes: data.to_vec(),
    };
    if let Err(e) = nubo_manifest::read_all(&[src], &NoFiles) {
        // Every error renders, with a position.
        for err in e.errors() {
            assert!(err.line >= 1 && err.column >= 1, "{err}");
            let _ = err.to_string();
        }
    }
});
