//! Hostile input to `nubo image build` and `nubo image init` (issue 15): every case is refused
//! before a VM would boot, with the VMfile line or the file named, exit code 1, and nothing
//! left behind (no VM directory, no work files, no image). Nothing hangs.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    fn ctx(&self) -> PathBuf {
        let c = self.dir.path().join("ctx");
        std::fs::create_dir_all(&c).unwrap();
        c
    }

    /// Runs nubo, killing it after 60 s (a hang is a failure, not a stuck test).
    fn nubo(&self, args: &[&str]) -> Output {
        support::nubo(self.dir.path(), args, Duration::from_secs(60))
    }

    fn build(&self, vmfile: &str, extra: &[&str]) -> Output {
        let ctx = self.ctx();
        std::fs::write(ctx.join("VMfile"), vmfile).unwrap();
        let c = ctx.display().to_string();
        let mut args = vec!["image", "build", "-t", "out:1"];
        args.extend_from_slice(extra);
        args.push(&c);
        self.nubo(&args)
    }

    /// A tiny local image `tiny:1` (a raw file imported, so converted to qcow2), `--appliance` on request.
    fn tiny(&self, extra: &[&str]) {
        let raw = self.dir.path().join("tiny.raw");
        std::fs::write(&raw, vec![0u8; 1 << 20]).unwrap();
        let r = raw.display().to_string();
        let mut args = vec!["image", "import", &r, "-t", "tiny:1"];
        args.extend_from_slice(extra);
        let out = self.nubo(&args);
        assert!(out.status.success(), "import: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn refused(&self, out: &Output, words: &[&str]) {
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "stderr: {err}");
        for w in words {
            assert!(err.contains(w), "stderr does not say `{w}`: {err}");
        }
        self.nothing_left();
    }

    fn nothing_left(&self) {
        let entries = |p: &Path| std::fs::read_dir(p).map(|d| d.count()).unwrap_or(0);
        assert_eq!(entries(&self.root().join("vms")), 0, "a VM directory was left");
        assert_eq!(
            entries(&self.root().join("images/build-cache/tmp")),
            0,
            "build work files were left"
        );
        assert!(!self.root().join("images/refs/out").exists(), "an image was stored");
    }
}

#[test]
fn build_copy_escaping_context_names_line() {
    let e = Env::new();

    let out = e.build("FROM tiny:1\nCOPY ../secret /etc/\n", &[]);

    e.refused(&out, &["VMfile: line 2", "leaves the build context"]);
}

#[test]
fn build_size_after_run_names_both_lines() {
    let e = Env::new();

    let out = e.build("FROM tiny:1\nRUN true\nSIZE 20G\n", &[]);

    e.refused(&out, &["line 3", "SIZE after RUN (line 2)"]);
}

#[test]
fn build_undeclared_build_arg_is_refused() {
    let e = Env::new();

    let out = e.build("FROM tiny:1\n", &["--build-arg", "NOPE=1"]);

    e.refused(&out, &["--build-arg NOPE", "ARG NOPE"]);
}

#[test]
fn build_unknown_hypervisor_is_refused() {
    let e = Env::new();

    let out = e.build("FROM tiny:1\nHYPERVISOR vmware\n", &[]);

    e.refused(&out, &["HYPERVISOR vmware"]);
}

#[test]
fn build_symlink_out_of_context_is_refused() {
    let e = Env::new();
    e.tiny(&[]);
    std::fs::write(e.dir.path().join("secret"), "x").unwrap();
    std::os::unix::fs::symlink(e.dir.path().join("secret"), e.ctx().join("link")).unwrap();

    let out = e.build("FROM tiny:1\nCOPY link /etc/\n", &[]);

    e.refused(&out, &["outside the build context"]);
}

#[test]
fn build_fifo_in_context_is_refused_without_hanging() {
    let e = Env::new();
    e.tiny(&[]);
    nix::unistd::mkfifo(&e.ctx().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();

    let out = e.build("FROM tiny:1\nCOPY pipe /etc/\n", &[]);

    e.refused(&out, &["not a regular file"]);
}

#[test]
fn build_from_appliance_is_refused() {
    let e = Env::new();
    e.tiny(&["--appliance"]);

    let out = e.build("FROM tiny:1\nRUN true\n", &[]);

    e.refused(&out, &["FROM tiny:1", "appliance"]);
}

#[test]
fn build_vmfile_fifo_is_refused_without_hanging() {
    let e = Env::new();
    let ctx = e.ctx();
    nix::unistd::mkfifo(&ctx.join("VMfile"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let c = ctx.display().to_string();

    let out = e.nubo(&["image", "build", &c]);

    e.refused(&out, &["VMfile"]);
}

#[test]
fn build_vmfile_from_stdin_is_read_and_parsed() {
    let e = Env::new();
    let c = e.ctx().display().to_string();
    let cmd = support::command(e.dir.path(), e.dir.path(), &["image", "build", "-f", "-", &c]);

    let out = support::run_bounded(cmd, Some(b"FROM debian:12\nFROBNICATE x\n"), Duration::from_secs(60));

    e.refused(&out, &["FROBNICATE", "line 2"]);
}

#[test]
fn init_refuses_to_overwrite_unless_forced() {
    let e = Env::new();

    let first = e.nubo(&["image", "init", "--from", "ubuntu:24.04"]);
    let second = e.nubo(&["image", "init"]);
    let forced = e.nubo(&["image", "init", "--force"]);

    assert!(first.status.success());
    assert_eq!(second.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&second.stderr).contains("already exists"));
    assert!(forced.status.success());
    let text = std::fs::read_to_string(e.dir.path().join("VMfile")).unwrap();
    assert!(text.contains("FROM debian:12"), "{text}");
}
