//! `nubo image` against hostile and careless input (issue 9 items 8 and 9), run as users run it:
//! the binary, temporary roots, inputs the tests make themselves. Each test asserts the exit
//! code, the message (object, cause, fix) and that the store holds nothing it should not.

mod support;

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// A refused input must be refused quickly; a FIFO that blocks nubo would hang here instead.
const DEADLINE: Duration = Duration::from_secs(60);

fn command(root: &Path, args: &[&str]) -> Command {
    support::command(root, root, args)
}

/// Runs to completion, killing (by its own pid) a child that outlives [`DEADLINE`].
fn run(c: Command) -> Output {
    support::run_bounded(c, None, DEADLINE)
}

fn nubo(root: &Path, args: &[&str]) -> Output {
    run(command(root, args))
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn images(root: &Path) -> PathBuf {
    root.join("root/images")
}

/// Entries of `images/<sub>`, sorted; none when the directory does not exist.
fn entries(root: &Path, sub: &str) -> Vec<String> {
    let mut v: Vec<String> = match fs::read_dir(images(root).join(sub)) {
        Ok(rd) => rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    };
    v.sort();
    v
}

fn assert_store_empty(root: &Path) {
    for sub in ["refs", "blobs", "tmp", "boot"] {
        assert!(entries(root, sub).is_empty(), "images/{sub}: {:?}", entries(root, sub));
    }
}

/// A small valid qcow2 of `mib` MiB virtual size (different sizes, different bytes).
fn qcow2(dir: &Path, name: &str, mib: u64) -> PathBuf {
    let p = dir.join(name);
    nubo_disk::create_qcow2(&p, mib << 20).unwrap();
    p
}

fn digest_of(root: &Path, reference: &str) -> String {
    let o = nubo(root, &["image", "inspect", reference]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["digest"].as_str().unwrap().to_owned()
}

fn import(root: &Path, file: &Path, tag: &str, extra: &[&str]) -> Output {
    let mut args = vec!["image", "import", file.to_str().unwrap(), "-t", tag];
    args.extend_from_slice(extra);
    nubo(root, &args)
}

#[test]
fn import_onto_existing_tag_refused_without_force() {
    let dir = tempfile::tempdir().unwrap();
    let a = qcow2(dir.path(), "a.qcow2", 64);
    let b = qcow2(dir.path(), "b.qcow2", 128);
    assert!(import(dir.path(), &a, "mine:1", &[]).status.success());
    let old = digest_of(dir.path(), "mine:1");

    let o = import(dir.path(), &b, "mine:1", &[]);

    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("`mine:1` already exists") && err.contains(&old) && err.contains("--force"),
        "{err}"
    );
    assert_eq!(digest_of(dir.path(), "mine:1"), old);
    assert_eq!(entries(dir.path(), "blobs").len(), 1);
    assert!(
        entries(dir.path(), "tmp").is_empty(),
        "{:?}",
        entries(dir.path(), "tmp")
    );
}

#[test]
fn import_force_names_replaced_digest_and_prune_reclaims_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = qcow2(dir.path(), "a.qcow2", 64);
    let b = qcow2(dir.path(), "b.qcow2", 128);
    assert!(import(dir.path(), &a, "mine:1", &[]).status.success());
    let old = digest_of(dir.path(), "mine:1");

    let forced = import(dir.path(), &b, "mine:1", &["--force"]);
    let pruned = nubo(dir.path(), &["image", "prune"]);
    let again = nubo(dir.path(), &["image", "prune"]);

    assert!(forced.status.success(), "{}", stderr(&forced));
    assert!(
        stderr(&forced).contains("replaced mine:1") && stderr(&forced).contains(&old),
        "{}",
        stderr(&forced)
    );
    assert!(pruned.status.success(), "{}", stderr(&pruned));
    let hex = old.strip_prefix("sha256:").unwrap();
    assert!(
        stdout(&pruned).contains("removed blob") && stdout(&pruned).contains(hex),
        "{}",
        stdout(&pruned)
    );
    assert_eq!(entries(dir.path(), "blobs").len(), 1);
    assert!(stdout(&again).contains("in 0 item(s)"), "{}", stdout(&again));
    assert_ne!(digest_of(dir.path(), "mine:1"), old);
}

#[test]
fn import_same_file_twice_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let a = qcow2(dir.path(), "a.qcow2", 64);
    assert!(import(dir.path(), &a, "mine:1", &[]).status.success());

    let o = import(dir.path(), &a, "mine:1", &[]);

    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("mine:1 unchanged"), "{}", stderr(&o));
    assert_eq!(entries(dir.path(), "blobs").len(), 1);
}

#[test]
fn prune_removes_stale_partial_and_reports_json() {
    let dir = tempfile::tempdir().unwrap();
    assert!(nubo(dir.path(), &["image", "ls"]).status.success());
    let part = images(dir.path()).join("tmp/0123456789abcdef01234567.part");
    fs::write(&part, vec![7u8; 64 << 10]).unwrap();

    let dry = nubo(dir.path(), &["image", "prune", "--dry-run", "-o", "json"]);
    let kept = part.exists();
    let o = nubo(dir.path(), &["image", "prune", "-o", "json"]);

    assert!(
        dry.status.success() && o.status.success(),
        "{}{}",
        stderr(&dry),
        stderr(&o)
    );
    assert!(kept, "a dry run removed the partial");
    assert!(!part.exists());
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["removed"][0]["kind"], "partial");
    assert!(report["bytes"].as_u64().unwrap() >= 64 << 10, "{report}");
    assert_store_empty(dir.path());
}

#[test]
fn prune_removes_empty_ref_dir() {
    let dir = tempfile::tempdir().unwrap();
    assert!(nubo(dir.path(), &["image", "ls"]).status.success());
    fs::create_dir(images(dir.path()).join("refs/ghost")).unwrap();

    let o = nubo(dir.path(), &["image", "prune"]);

    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("empty-ref-dir"), "{}", stdout(&o));
    assert_store_empty(dir.path());
}

#[test]
fn ref_of_300_chars_refused_with_limit_not_os_error() {
    let dir = tempfile::tempdir().unwrap();
    let a = qcow2(dir.path(), "a.qcow2", 64);
    let long = format!("{}:1", "a".repeat(300));
    let long_tag = format!("a:{}", "b".repeat(300));

    let outs = [
        import(dir.path(), &a, &long, &[]),
        import(dir.path(), &a, &long_tag, &[]),
        nubo(dir.path(), &["image", "pull", &long]),
        nubo(dir.path(), &["image", "inspect", &long]),
        nubo(dir.path(), &["image", "rm", &long]),
    ];

    for o in &outs {
        let err = stderr(o);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("at most 128"), "{err}");
        assert!(!err.contains("os error"), "{err}");
    }
    assert_store_empty(dir.path());
}

/// `completions` writes nothing, so a binary that still falls back to the system root cannot
/// create it here.
#[test]
fn empty_nubo_root_names_variable_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = command(dir.path(), &["completions", "bash"]);
    c.env("NUBO_ROOT", "");

    let o = run(c);

    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("NUBO_ROOT is set but empty") && stderr(&o).contains("unset"),
        "{}",
        stderr(&o)
    );
}

/// `completions` writes nothing, so a binary that still falls back to the system root cannot
/// create it here.
#[test]
fn empty_nubo_run_dir_names_variable() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = command(dir.path(), &["completions", "bash"]);
    c.env("NUBO_RUN_DIR", "");

    let o = run(c);

    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("NUBO_RUN_DIR is set but empty"), "{}", stderr(&o));
}

#[test]
fn relative_nubo_root_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = command(dir.path(), &["image", "ls"]);
    c.env("NUBO_ROOT", "relative/root").current_dir(dir.path());

    let o = run(c);

    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("absolute path"), "{}", stderr(&o));
    assert!(!dir.path().join("relative").exists());
}

#[test]
fn ls_with_corrupt_record_lists_the_rest_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = qcow2(dir.path(), "a.qcow2", 64);
    assert!(import(dir.path(), &a, "mine:1", &[]).status.success());
    let bad = images(dir.path()).join("refs/broken");
    fs::create_dir(&bad).unwrap();
    fs::write(bad.join("1.json"), b"{\"reference\": \x1b[2J").unwrap();

    let table = nubo(dir.path(), &["image", "ls"]);
    let json = nubo(dir.path(), &["image", "ls", "-o", "json"]);

    assert!(table.status.success(), "{}", stderr(&table));
    assert!(stdout(&table).contains("mine:1"), "{}", stdout(&table));
    assert!(stderr(&table).contains("refs/broken/1.json"), "{}", stderr(&table));
    assert!(!stderr(&table).contains('\u{1b}'), "{}", stderr(&table));
    assert!(json.status.success(), "{}", stderr(&json));
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("-o json stays valid JSON");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
}

#[test]
fn prune_with_corrupt_record_refused_and_keeps_blobs() {
    let dir = tempfile::tempdir().unwrap();
    let a = qcow2(dir.path(), "a.qcow2", 64);
    assert!(import(dir.path(), &a, "mine:1", &[]).status.success());
    fs::write(images(dir.path()).join("refs/mine/2.json"), b"garbage").unwrap();

    let o = nubo(dir.path(), &["image", "prune"]);

    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("refs/mine/2.json") && stderr(&o).contains("remove or repair"),
        "{}",
        stderr(&o)
    );
    assert_eq!(entries(dir.path(), "blobs").len(), 1);
}

/// Issue 9: a non-image, a FIFO, an empty file. The stricter inspector refuses each; whatever
/// the message, the command fails, does not hang and leaves nothing in the store.
#[test]
fn import_non_images_refused_and_nothing_left() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let empty = dir.path().join("empty.img");
    fs::write(&empty, b"").unwrap();

    let cases = [
        (Path::new("/dev/null"), "character device"),
        (fifo.as_path(), "FIFO"),
        (empty.as_path(), "empty"),
    ];
    for (file, cause) in cases {
        let o = import(dir.path(), file, "mine:1", &[]);

        assert_eq!(o.status.code(), Some(1), "{}: {}", file.display(), stderr(&o));
        assert!(
            stderr(&o).contains(&file.display().to_string()) && stderr(&o).contains(cause),
            "{}: {}",
            file.display(),
            stderr(&o)
        );
        assert_store_empty(dir.path());
    }
}

#[test]
fn import_refused_leaves_no_ref_dir() {
    let dir = tempfile::tempdir().unwrap();

    let o = import(dir.path(), &dir.path().join("absent.qcow2"), "newname:1", &[]);

    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("absent.qcow2"), "{}", stderr(&o));
    assert!(!images(dir.path()).join("refs/newname").exists());
    assert_store_empty(dir.path());
}

#[test]
fn pull_oci_reference_unreachable_registry_is_connect_error_not_not_found() {
    let dir = tempfile::tempdir().unwrap();

    // Port 1 on loopback: nothing listens, and no packet leaves the machine.
    let pull = nubo(dir.path(), &["image", "pull", "127.0.0.1:1/team/repo:tag"]);
    let create = nubo(dir.path(), &["vm", "create", "web", "--image", "127.0.0.1:1/repo:1"]);

    for o in [&pull, &create] {
        assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
        assert!(
            stderr(o).contains("could not connect to registry 127.0.0.1:1"),
            "{}",
            stderr(o)
        );
        assert!(!stderr(o).contains("not in the store"), "{}", stderr(o));
    }
    assert_store_empty(dir.path());
}

#[test]
fn pull_nothing_listening_says_nothing_was_downloaded() {
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("https://127.0.0.1:{port}/x.qcow2");
    let sum = format!("sha256:{}", "a".repeat(64));

    let o = nubo(
        dir.path(),
        &["image", "pull", &url, "--checksum", &sum, "--name", "x:1"],
    );

    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("could not connect to 127.0.0.1:{port}")) && err.contains("nothing was downloaded"),
        "{err}"
    );
    assert!(!err.contains("partial download is kept"), "{err}");
    assert_store_empty(dir.path());
}

#[test]
fn pull_file_url_refused() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["image", "pull", "file:///etc/passwd", "--name", "x:1"]);

    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("file:///etc/passwd"), "{}", stderr(&o));
    assert_store_empty(dir.path());
}
