//! Issue 21, item 12: names with control characters (a manifest's `name`, `vm create`'s NAME,
//! `--hostname`, snapshot names, manifest file names with OSC sequences, a flag's value) are
//! refused, and what nubo prints about them never holds a raw ESC, BEL or a newline from inside
//! the name: the terminal shows them escaped (`\u{1b}`, `\n`), as `{:?}` would.

mod support;

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        support::write_raw_base(&dir.path().join("base.raw"));
        Env { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn disk(&self) -> String {
        self.path("base.raw").display().to_string()
    }

    fn nubo(&self, args: &[&str]) -> Output {
        support::nubo(self.dir.path(), args, Duration::from_secs(60))
    }
}

/// Refused with `code`, and neither stream holds a raw escape, BEL or `forbidden` (the name's
/// own text across its newline).
fn assert_refused_escaped(o: &Output, code: i32, forbidden: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(code), "stderr: {err:?}");
    for text in [&err, &out] {
        assert!(
            !text.contains(['\x1b', '\x07', '\u{9b}']),
            "raw control character in {text:?}"
        );
        assert!(!text.contains(forbidden), "raw {forbidden:?} in {text:?}");
    }
}

const MANIFEST_ESCAPED_NAME: &str = "apiVersion: nubo.dev/v1alpha1
kind: VirtualMachine
metadata:
  name: \"m1\\e[31mX\\nfoo\"
spec:
  disk: ./base.raw
";

#[test]
fn manifest_name_with_escape_and_newline_is_refused_escaped() {
    let env = Env::new();
    let m = env.path("m.yaml");
    std::fs::write(&m, MANIFEST_ESCAPED_NAME).unwrap();

    let o = env.nubo(&["manifest", "validate", "-f", m.to_str().unwrap()]);

    assert_refused_escaped(&o, 1, "X\nfoo");
    assert!(String::from_utf8_lossy(&o.stderr).contains("\\u{1b}[31mX\\nfoo"));
}

#[test]
fn apply_dry_run_name_with_raw_escape_bytes_is_refused_escaped() {
    let env = Env::new();
    let m = env.path("m.yaml");
    std::fs::write(&m, MANIFEST_ESCAPED_NAME.replace("\\e", "\x1b")).unwrap();

    let o = env.nubo(&["apply", "--dry-run", "-f", m.to_str().unwrap()]);

    assert_refused_escaped(&o, 1, "X\nfoo");
}

#[test]
fn vm_create_name_with_escape_is_refused_escaped() {
    let env = Env::new();
    let disk = env.disk();

    let o = env.nubo(&["vm", "create", "a\x1b[31mb", "--disk", &disk, "--restrict-network"]);

    assert_refused_escaped(&o, 1, "a\x1b");
    assert!(String::from_utf8_lossy(&o.stderr).contains("VM name `a\\u{1b}[31mb`"));
}

#[test]
fn vm_create_hostname_with_newline_is_refused_escaped() {
    let env = Env::new();
    let disk = env.disk();

    let o = env.nubo(&[
        "vm",
        "create",
        "web",
        "--disk",
        &disk,
        "--restrict-network",
        "--hostname",
        "h\nforged: line",
    ]);

    assert_refused_escaped(&o, 1, "h\nforged");
}

#[test]
fn manifest_file_name_with_osc_sequence_is_refused_escaped() {
    let env = Env::new();
    let m = env.path("m\x1b]0;owned\x07.yaml");
    std::fs::write(&m, "apiVersion: nubo.dev/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: web\nspec:\n  disk: ./base.raw\n  resources: { vcpus: 0 }\n").unwrap();

    let o = env.nubo(&["manifest", "validate", "-f", m.to_str().unwrap()]);

    assert_refused_escaped(&o, 1, "\x1b]0;");
}

#[test]
fn missing_manifest_file_name_with_newline_is_refused_escaped() {
    let env = Env::new();
    let m = env.path("x\x1b]0;t\x07\nerror: forged.yaml");

    let o = env.nubo(&["apply", "--dry-run", "-f", m.to_str().unwrap()]);

    assert_refused_escaped(&o, 1, "\nerror: forged");
}

#[test]
fn snapshot_names_with_newlines_are_refused_escaped() {
    let env = Env::new();
    for args in [
        ["vm", "snapshot", "create", "web", "a\nforged line"],
        ["vm", "snapshot", "rm", "web", "a\nforged line"],
        ["vm", "snapshot", "restore", "web", "a\nforged line"],
    ] {
        let o = env.nubo(&args);

        assert_refused_escaped(&o, 1, "a\nforged");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("snapshot name `a\\nforged line`"),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn usage_error_value_with_escape_is_escaped() {
    let env = Env::new();
    let disk = env.disk();

    let o = env.nubo(&["vm", "create", "web", "--disk", &disk, "--vcpus", "1\x1b[2J\nforged"]);

    assert_refused_escaped(&o, 2, "\nforged");
}

#[test]
fn build_arg_name_with_escape_is_refused_escaped() {
    let env = Env::new();

    let o = env.nubo(&["image", "build", "--build-arg", "A\x1b[31m\nB=1", "."]);

    assert_refused_escaped(&o, 1, "\nB=");
    assert!(String::from_utf8_lossy(&o.stderr).contains("build-arg name `A\\u{1b}[31m\\nB`"));
}
