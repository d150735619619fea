//! Issue 21 item 14: errors print each cause once. Variants that put their source's text in
//! their message and also chained it printed it twice under `{:#}` ("No such file or directory
//! (os error 2): No such file or directory (os error 2)", every VMfile parse error); a name too
//! long for the kernel printed a raw "File name too long (os error 36)". The class is pinned
//! two ways: every error the CLI prints here is checked for a repeated cause, and every
//! `thiserror` variant in the workspace is checked not to both format and chain its source.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

fn nubo(dir: &Path, args: &[&str]) -> Output {
    support::nubo(dir, args, Duration::from_secs(60))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `: `-separated parts of an error line that carry an OS error, each at most once.
fn assert_no_repeated_cause(args: &[&str], err: &str) {
    let parts: Vec<&str> = err.trim_end().split(": ").collect();
    for (i, p) in parts.iter().enumerate() {
        assert!(
            !parts[i + 1..].contains(p) || p.len() < 8,
            "{args:?} repeats `{p}`: {err}"
        );
    }
    assert!(
        err.matches("(os error").count() <= 1,
        "{args:?} prints an OS error more than once: {err}"
    );
}

#[test]
fn missing_files_on_every_input_flag_name_the_os_error_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: &[&[&str]] = &[
        &["seed", "build", "-o", "s.iso", "--user-data", "/nonexistent/u"],
        &["seed", "build", "-o", "s.iso", "--network-config", "/nonexistent/n"],
        &["seed", "build", "-o", "s.iso", "--ssh-key", "@/nonexistent/k"],
        &["seed", "build", "-o", "/nonexistent/dir/s.iso", "--hostname", "h"],
        &["seed", "inspect", "/nonexistent/s.iso"],
        &["image", "build", "-f", "/nonexistent/VMfile", "."],
        &["image", "init", "-f", "/nonexistent/dir/VMfile"],
        &["image", "hash", "/nonexistent/x"],
        &["manifest", "validate", "-f", "/nonexistent/m.yaml"],
    ];

    for args in cases {
        let o = nubo(d, args);

        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("No such file or directory"), "{args:?}: {err}");
        assert_no_repeated_cause(args, &err);
    }
}

#[test]
fn name_too_long_on_every_path_flag_says_the_limit_not_os_error_36() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let long = "n".repeat(300);
    nubo_disk::create_qcow2(&d.join("src.qcow2"), 1 << 20).unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["seed", "build", "-o", &long, "--hostname", "h"],
        vec!["seed", "build", "-o", "s.iso", "--user-data", &long],
        vec!["image", "convert", "src.qcow2", "--to", "qcow2", "-o", &long],
        vec!["image", "init", "-f", &long],
        vec!["image", "build", "-f", &long, "."],
        vec!["manifest", "validate", "-f", &long],
        vec!["apply", "-f", &long, "--dry-run"],
    ];

    for args in &cases {
        let o = nubo(d, args);

        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("at most 255"), "{args:?}: {err}");
        assert!(!err.contains("os error 36"), "{args:?}: {err}");
        assert!(!err.contains(&long), "{args:?} prints the whole 300-byte name: {err}");
        assert_no_repeated_cause(args, &err);
    }
}

/// A name that is legal (250 bytes) must not fail because nubo's temporary name beside it is
/// longer than 255.
#[test]
fn output_name_of_250_bytes_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let name = "n".repeat(250);

    let seed = nubo(d, &["seed", "build", "-o", &name, "--hostname", "h"]);

    assert!(seed.status.success(), "{}", stderr(&seed));
    assert!(d.join(&name).is_file());
}

#[test]
fn vmfile_parse_error_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("VMfile"), "FROM debian:12\nBOGUS x\n").unwrap();

    let o = nubo(d, &["image", "build", "."]);

    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("unknown instruction").count(), 1, "{err}");
    assert!(err.contains("line 2"), "{err}");
}

#[test]
fn vmfile_doubling_bomb_refused_with_line_and_bound_fast() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let mut text = String::from("FROM debian:12\nENV X0=0123456789abcdef\n");
    for n in 1..=40 {
        text.push_str(&format!("ENV X{n}=${{X{}}}${{X{}}}\n", n - 1, n - 1));
    }
    std::fs::write(d.join("VMfile"), text).unwrap();
    let t = std::time::Instant::now();

    let o = nubo(d, &["image", "build", "."]);

    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("line 14") && err.contains("32768 bytes"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
}

/// Every `.rs` file under a `src/` directory below `dir` (tests hold fixtures of the bug).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && p.file_name().is_some_and(|n| n != "target") {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") && p.components().any(|c| c.as_os_str() == "src") {
            out.push(p);
        }
    }
}

/// The text from `open` (an index just past an opening bracket) to its matching close.
fn bracketed(s: &str, open: usize) -> &str {
    let mut depth = 1;
    let mut in_str = false;
    let mut escaped = false;
    for (i, c) in s[open..].char_indices() {
        if in_str {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_str = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return &s[open..open + i];
                }
            }
            _ => {}
        }
    }
    &s[open..]
}

/// `(variant, message)` for every `#[error("...")]` whose message formats a field that is also
/// the error's source (`#[source]`, `#[from]`, or named `source`).
fn doubling_variants(src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (at, _) in src.match_indices("#[error(") {
        let attr = bracketed(src, at + "#[error(".len());
        if attr.trim() == "transparent" {
            continue;
        }
        // The variant follows the attribute (and any other attributes or doc comments).
        let mut rest = &src[at + "#[error(".len() + attr.len()..];
        rest = rest.trim_start_matches([')', ']']);
        loop {
            rest = rest.trim_start();
            if rest.starts_with("#[") {
                rest = &rest[bracketed(rest, 2).len() + 3..];
            } else if rest.starts_with("//") {
                rest = rest.split_once('\n').map_or("", |(_, r)| r);
            } else {
                break;
            }
        }
        let rest = rest.trim_start_matches("pub ").trim_start_matches("struct ");
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let after = rest[name.len()..].trim_start();
        let mut sources: Vec<String> = Vec::new();
        if let Some(body) = after.strip_prefix('(') {
            let fields = bracketed(body, 0);
            let mut depth = 0;
            let mut idx = 0;
            let mut cur = String::new();
            for c in fields.chars().chain([',']) {
                match c {
                    '(' | '<' | '[' | '{' => depth += 1,
                    ')' | '>' | ']' | '}' => depth -= 1,
                    _ => {}
                }
                if c == ',' && depth == 0 {
                    if cur.contains("#[from]") || cur.contains("#[source]") {
                        sources.push(idx.to_string());
                    }
                    idx += 1;
                    cur.clear();
                } else {
                    cur.push(c);
                }
            }
        } else if let Some(body) = after.strip_prefix('{') {
            let fields = bracketed(body, 0);
            let mut marked = false;
            for line in fields.lines() {
                let line = line.trim();
                if line.contains("#[source]") || line.contains("#[from]") {
                    marked = true;
                }
                let field = line.trim_start_matches("pub ");
                if let Some((f, _)) = field.split_once(':') {
                    let f = f.trim();
                    if f.chars().all(|c| c.is_alphanumeric() || c == '_') && !f.is_empty() {
                        if marked || f == "source" {
                            sources.push(f.to_owned());
                        }
                        marked = false;
                    }
                }
            }
        }
        for f in sources {
            let used = ["{", "{."]
                .iter()
                .any(|p| attr.contains(&format!("{p}{f}}}")) || attr.contains(&format!("{p}{f}:")))
                || attr.contains(&format!(".{f}"));
            if used {
                out.push((name.clone(), attr.trim().chars().take(100).collect()));
            }
        }
    }
    out
}

#[test]
fn no_error_variant_both_formats_and_chains_its_source() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    sources(crates, &mut files);
    assert!(
        files.len() > 50,
        "found only {} source files under {}",
        files.len(),
        crates.display()
    );

    let mut found = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (variant, message) in doubling_variants(&text) {
            found.push(format!("{}: {variant}: {message}", f.display()));
        }
    }

    assert!(
        found.is_empty(),
        "these print their source in their message and chain it too (printed twice under {{:#}}): \
         drop the field from the message or stop chaining it:\n{}",
        found.join("\n")
    );
}

#[test]
fn doubling_scan_finds_the_bug_it_pins() {
    let bad = r#"
        enum E {
            #[error("{what} {path}: {source}")]
            Io { what: String, path: PathBuf, #[source] source: io::Error },
            #[error("reading: {0}")]
            Read(#[from] io::Error),
            #[error("line {line}: {error}")]
            Line { line: usize, error: Box<E> },
            #[error("parse")]
            Parse { #[source] source: P },
        }"#;

    let found: Vec<String> = doubling_variants(bad).into_iter().map(|(v, _)| v).collect();

    assert_eq!(found, ["Io", "Read"]);
}
