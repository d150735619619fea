//! `nubo seed` against hostile input (issue 9): outputs that are symlinks, FIFOs or directories,
//! inputs that never end or are not files, YAML alias bombs, option-shaped values and terminal
//! escape sequences. Every case is generated here, in a temporary directory; each asserts the
//! exit code, a message naming the cause, that nothing is left behind, and that it ends fast.
//! No real device is ever written: the "device" outputs are a FIFO and a symlink to /dev/null.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// Every refusal here is immediate; a run that takes longer has read or expanded something it
/// should have refused (the debug binary included).
const FAST: Duration = Duration::from_secs(10);

struct Run {
    out: Output,
    elapsed: Duration,
}

impl Run {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    /// Exit code `code`, a message containing every one of `words`, within [`FAST`].
    fn assert_refused(&self, code: i32, words: &[&str]) {
        let err = self.stderr();
        assert_eq!(self.out.status.code(), Some(code), "stderr: {err}");
        for w in words {
            assert!(err.contains(w), "expected `{w}` in: {err}");
        }
        assert!(self.elapsed < FAST, "took {:?}: {err}", self.elapsed);
    }
}

fn nubo(dir: &Path, args: &[&str]) -> Run {
    let t = Instant::now();
    // Bounded well beyond FAST, so a hang fails here and a slow refusal fails the assertion.
    let out = support::nubo(dir, args, 6 * FAST);
    Run {
        out,
        elapsed: t.elapsed(),
    }
}

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().expect("mkfifo runs").success();
    assert!(ok, "mkfifo {}", p.display());
}

/// Names in `dir` other than the ones the test made: what nubo left behind.
fn leftovers(dir: &Path, made: &[&str]) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !made.contains(&n.as_str()) && n != "root" && n != "run")
        .collect();
    names.sort();
    names
}

fn write(dir: &Path, name: &str, data: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, data).unwrap();
    p
}

/// The 373-byte user-data: nine anchors of nine aliases each, 9^9 nodes expanded.
fn billion_laughs() -> String {
    let mut s = String::from(
        "#cloud-config\na: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i"];
    for w in names.windows(2) {
        let refs = vec![format!("*{}", w[0]); 9].join(",");
        s.push_str(&format!("{}: &{} [{}]\n", w[1], w[1], refs));
    }
    s
}

// ---- outputs ---------------------------------------------------------------------------

#[test]
fn seed_build_output_symlink_refused_and_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let victim = write(dir.path(), "victim", b"keep");
    std::os::unix::fs::symlink(&victim, dir.path().join("seed.iso")).unwrap();

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--hostname", "h"]);

    r.assert_refused(1, &["seed.iso", "symbolic link"]);
    assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
    assert!(std::fs::symlink_metadata(dir.path().join("seed.iso"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(leftovers(dir.path(), &["victim", "seed.iso"]), Vec::<String>::new());
}

#[test]
fn seed_build_output_symlink_to_dev_null_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink("/dev/null", dir.path().join("seed.iso")).unwrap();

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--hostname", "h"]);

    r.assert_refused(1, &["seed.iso", "symbolic link"]);
    assert_eq!(leftovers(dir.path(), &["seed.iso"]), Vec::<String>::new());
}

#[test]
fn seed_build_output_fifo_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("seed.iso"));

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--hostname", "h"]);

    r.assert_refused(1, &["seed.iso", "FIFO"]);
    assert_eq!(leftovers(dir.path(), &["seed.iso"]), Vec::<String>::new());
}

#[test]
fn seed_build_output_directory_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();

    let r = nubo(dir.path(), &["seed", "build", "-o", "out", "--hostname", "h"]);

    r.assert_refused(1, &["out", "a directory"]);
    assert_eq!(std::fs::read_dir(dir.path().join("out")).unwrap().count(), 0);
}

#[test]
fn seed_build_output_is_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--hostname", "h"]);

    assert!(r.out.status.success(), "{}", r.stderr());
    let mode = std::fs::metadata(dir.path().join("seed.iso"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn seed_build_refused_input_leaves_existing_output_untouched() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "seed.iso", b"old seed");
    write(dir.path(), "ud", b"not cloud-init\n");

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--user-data", "ud"]);

    r.assert_refused(1, &["ud", "#cloud-config"]);
    assert_eq!(std::fs::read(dir.path().join("seed.iso")).unwrap(), b"old seed");
    assert_eq!(leftovers(dir.path(), &["seed.iso", "ud"]), Vec::<String>::new());
}

// ---- inputs ----------------------------------------------------------------------------

/// Regression (issue 9): this file took 17 GB of memory in 60 seconds.
#[test]
fn seed_build_user_data_billion_laughs_refused_fast() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "bomb.yaml", billion_laughs().as_bytes());

    let r = nubo(
        dir.path(),
        &["seed", "build", "-o", "seed.iso", "--user-data", "bomb.yaml"],
    );

    r.assert_refused(1, &["bomb.yaml", "alias bomb", "line "]);
    assert_eq!(leftovers(dir.path(), &["bomb.yaml"]), Vec::<String>::new());
}

#[test]
fn seed_build_network_config_billion_laughs_refused_fast() {
    let dir = tempfile::tempdir().unwrap();
    let bomb = billion_laughs().replacen("#cloud-config\n", "version: 2\n", 1);
    write(dir.path(), "net.yaml", bomb.as_bytes());

    let r = nubo(
        dir.path(),
        &[
            "seed",
            "build",
            "-o",
            "seed.iso",
            "--hostname",
            "h",
            "--network-config",
            "net.yaml",
        ],
    );

    r.assert_refused(1, &["net.yaml", "network-config", "alias bomb"]);
    assert_eq!(leftovers(dir.path(), &["net.yaml"]), Vec::<String>::new());
}

#[test]
fn seed_build_vendor_data_deep_nesting_refused_fast() {
    let dir = tempfile::tempdir().unwrap();
    let deep = format!("#cloud-config\na:\n{}x\n", "- ".repeat(200_000));
    write(dir.path(), "vd", deep.as_bytes());

    let r = nubo(
        dir.path(),
        &[
            "seed",
            "build",
            "-o",
            "seed.iso",
            "--hostname",
            "h",
            "--vendor-data",
            "vd",
        ],
    );

    r.assert_refused(1, &["vendor-data", "deeper than 128"]);
    assert_eq!(leftovers(dir.path(), &["vd"]), Vec::<String>::new());
}

#[test]
fn seed_build_user_data_dev_zero_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();

    let r = nubo(
        dir.path(),
        &["seed", "build", "-o", "seed.iso", "--user-data", "/dev/zero"],
    );

    r.assert_refused(1, &["/dev/zero", "character device"]);
    assert_eq!(leftovers(dir.path(), &[]), Vec::<String>::new());
}

#[test]
/// A FIFO is a pipe a user may name (`<(generate)`, issue 21.15); with no writer it is refused
/// once the first-byte timeout passes, never waited on forever.
fn seed_build_user_data_fifo_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("ud"));

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--user-data", "ud"]);

    r.assert_refused(1, &["ud", "nothing was written"]);
    assert_eq!(leftovers(dir.path(), &["ud"]), Vec::<String>::new());
}

#[test]
fn seed_build_user_data_directory_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ud")).unwrap();

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--user-data", "ud"]);

    r.assert_refused(1, &["ud", "a directory"]);
    assert_eq!(leftovers(dir.path(), &["ud"]), Vec::<String>::new());
}

#[test]
fn seed_build_user_data_17_mib_refused() {
    let dir = tempfile::tempdir().unwrap();
    let f = std::fs::File::create(dir.path().join("big")).unwrap();
    f.set_len(17 * 1024 * 1024).unwrap();

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--user-data", "big"]);

    r.assert_refused(1, &["big", "16777216 bytes"]);
    assert_eq!(leftovers(dir.path(), &["big"]), Vec::<String>::new());
}

#[test]
fn seed_build_ssh_key_file_fifo_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("keys"));

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--ssh-key", "@keys"]);

    r.assert_refused(1, &["keys", "nothing was written"]);
    assert_eq!(leftovers(dir.path(), &["keys"]), Vec::<String>::new());
}

#[test]
fn seed_build_ssh_key_file_dev_zero_refused() {
    let dir = tempfile::tempdir().unwrap();

    let r = nubo(
        dir.path(),
        &["seed", "build", "-o", "seed.iso", "--ssh-key", "@/dev/zero"],
    );

    r.assert_refused(1, &["/dev/zero", "character device"]);
    assert_eq!(leftovers(dir.path(), &[]), Vec::<String>::new());
}

#[test]
fn seed_inspect_fifo_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    mkfifo(&dir.path().join("seed.iso"));

    let r = nubo(dir.path(), &["seed", "inspect", "seed.iso"]);

    r.assert_refused(1, &["seed.iso", "FIFO"]);
}

#[test]
fn seed_inspect_dev_zero_refused() {
    let dir = tempfile::tempdir().unwrap();

    let r = nubo(dir.path(), &["seed", "inspect", "/dev/zero"]);

    r.assert_refused(1, &["/dev/zero", "character device"]);
}

// ---- option-shaped values and extreme text -----------------------------------------------

#[test]
fn seed_build_option_shaped_hostname_refused() {
    let dir = tempfile::tempdir().unwrap();

    let r = nubo(
        dir.path(),
        &["seed", "build", "-o", "seed.iso", "--hostname=-oProxyCommand=x"],
    );

    r.assert_refused(1, &["hostname", "-oProxyCommand=x"]);
    assert_eq!(leftovers(dir.path(), &[]), Vec::<String>::new());
}

#[test]
fn seed_build_option_shaped_hostname_as_separate_word_is_usage_error() {
    let dir = tempfile::tempdir().unwrap();

    let r = nubo(
        dir.path(),
        &["seed", "build", "-o", "seed.iso", "--hostname", "--customize-hook=x"],
    );

    assert_eq!(r.out.status.code(), Some(2), "{}", r.stderr());
    assert_eq!(leftovers(dir.path(), &[]), Vec::<String>::new());
}

#[test]
fn seed_build_escape_sequence_hostname_is_escaped_in_error() {
    let dir = tempfile::tempdir().unwrap();

    let r = nubo(
        dir.path(),
        &["seed", "build", "-o", "seed.iso", "--hostname", "a\x1b]0;pwned\x07"],
    );

    r.assert_refused(1, &["hostname", "\\u{1b}]0;pwned\\u{7}"]);
    assert!(!r.stderr().contains('\x1b'), "{}", r.stderr());
}

#[test]
fn seed_build_long_hostname_is_refused_and_quoted_short() {
    let dir = tempfile::tempdir().unwrap();
    let long = "a".repeat(100_000);

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--hostname", &long]);

    r.assert_refused(1, &["hostname", "over the limit"]);
    assert!(r.stderr().len() < 1000, "{} bytes of error", r.stderr().len());
}

#[test]
/// Issue 21.4: a bad user-data line is named by number, never quoted (it may be a secret), so
/// its escape sequences never reach the terminal.
fn seed_build_escape_sequence_in_user_data_is_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ud", b"\x1b[2J\x1b]0;pwned\x07\n");

    let r = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--user-data", "ud"]);

    r.assert_refused(1, &["line 1"]);
    assert!(
        !r.stderr().contains('\x1b') && !r.stderr().contains("pwned"),
        "{}",
        r.stderr()
    );
}

#[test]
fn seed_inspect_escape_sequences_in_user_data_are_printed_escaped() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ud", b"#!/bin/sh\necho '\x1b[2J\x1b]0;pwned\x07'\n");
    let built = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--user-data", "ud"]);
    assert!(built.out.status.success(), "{}", built.stderr());

    let r = nubo(dir.path(), &["seed", "inspect", "seed.iso"]);

    assert!(r.out.status.success(), "{}", r.stderr());
    assert!(
        !r.stdout().contains('\x1b') && !r.stdout().contains('\x07'),
        "{}",
        r.stdout()
    );
    assert!(
        r.stdout().contains("echo '\\u{1b}[2J\\u{1b}]0;pwned\\u{7}'"),
        "{}",
        r.stdout()
    );
}

#[test]
fn seed_inspect_json_escapes_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "ud", b"#!/bin/sh\necho '\x1b[2J'\n");
    let built = nubo(dir.path(), &["seed", "build", "-o", "seed.iso", "--user-data", "ud"]);
    assert!(built.out.status.success(), "{}", built.stderr());

    let r = nubo(dir.path(), &["seed", "inspect", "seed.iso", "-o", "json"]);

    assert!(r.out.status.success(), "{}", r.stderr());
    assert!(
        !r.stdout().contains('\x1b') && r.stdout().contains("\\u001b[2J"),
        "{}",
        r.stdout()
    );
}
