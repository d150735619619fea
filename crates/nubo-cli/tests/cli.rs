//! The `nubo` binary as users run it: exit codes, messages, and that refused input leaves
//! nothing behind. No VM boots here (tests/live does that); every run uses temporary roots.

use std::path::Path;
use std::process::{Command, Output};

fn nubo(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nubo"))
        .args(args)
        .env("NUBO_ROOT", root.join("root"))
        .env("NUBO_RUN_DIR", root.join("run"))
        .env_remove("NUBO_VM_BACKEND")
        .output()
        .expect("the nubo binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn version_prints_name_and_version() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["--version"]);

    assert!(o.status.success());
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("nubo {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completions_bash_mentions_subcommands() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["completions", "bash"]);

    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("complete") && text.contains("bootstrap"), "{text}");
}

#[test]
fn usage_error_exits_2() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "frobnicate"]);

    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn vm_ls_json_empty_root_is_empty_array() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "ls", "-o", "json"]);

    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
}

#[test]
fn vm_create_bad_names_refused_and_nothing_created() {
    let dir = tempfile::tempdir().unwrap();
    for bad in ["a/b", "..", &"a".repeat(64), "Web"] {
        let o = nubo(dir.path(), &["vm", "create", bad, "--image", "mine:v1"]);

        assert_eq!(o.status.code(), Some(1), "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains("name"), "{bad}: {}", stderr(&o));
    }
    assert!(
        !dir.path().join("root/vms").exists() || std::fs::read_dir(dir.path().join("root/vms")).unwrap().count() == 0
    );
}

#[test]
fn vm_create_missing_local_image_names_it_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "create", "web", "--image", "mine:v1"]);

    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("`mine:v1`") && err.contains("nubo image"), "{err}");
}

#[test]
fn vm_rm_absent_vm_succeeds() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "rm", "ghost"]);

    assert!(o.status.success(), "{}", stderr(&o));
}

#[test]
fn vm_start_absent_vm_names_it() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "start", "ghost"]);

    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("vm `ghost` does not exist"), "{}", stderr(&o));
}

#[test]
fn vm_status_absent_vm_names_it() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "status", "ghost", "-o", "json"]);

    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("vm `ghost` does not exist"), "{}", stderr(&o));
    assert!(o.stdout.is_empty(), "printed a status for a VM that does not exist");
}

#[test]
fn default_backend_unknown_name_refused() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "default-backend", "--set", "vbox"]);

    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("unknown backend `vbox`"), "{}", stderr(&o));
}

#[test]
fn default_backend_set_then_show_then_clear() {
    let dir = tempfile::tempdir().unwrap();

    assert!(nubo(dir.path(), &["vm", "default-backend", "--set", "qemu"])
        .status
        .success());
    let shown = nubo(dir.path(), &["vm", "default-backend"]);
    assert!(nubo(dir.path(), &["vm", "default-backend", "--clear"]).status.success());
    let cleared = nubo(dir.path(), &["vm", "default-backend"]);

    assert_eq!(String::from_utf8_lossy(&shown.stdout).trim(), "qemu");
    assert!(String::from_utf8_lossy(&cleared.stdout).contains("none"));
}

#[test]
fn snapshot_create_bad_name_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "snapshot", "create", "web", "../etc"]);

    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("snapshot name `../etc` is invalid"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn snapshot_ls_unknown_vm_is_not_found() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "snapshot", "ls", "web", "-o", "json"]);

    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("vm `web` does not exist"), "{}", stderr(&o));
}

#[test]
fn snapshot_rm_without_snapshot_names_is_usage_error() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["vm", "snapshot", "rm", "web"]);

    assert_eq!(o.status.code(), Some(2));
}
