//! Manifests and small inputs against hostile use (issue 21 items 3, 4, 7, 10, 14, 15), through
//! the built binary: a manifest naming a host file (absolutely, through `../`, through a
//! symlinked directory, as an `@` SSH key file) is refused unless `--load-restrictor none`; no
//! error ever prints a byte of the "secret" file (a temp file with a unique marker); a YAML
//! alias bomb is refused on every path into a seed; `-` and pipes are accepted for small inputs,
//! bounded; a dry run refuses a FIFO as `--kernel`; `manifest validate` refuses what
//! `apply --dry-run` refuses. Nothing boots.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Every refusal here is immediate (a FIFO with no writer waits 5 s first); longer means nubo
/// read or expanded something it should have refused.
const FAST: Duration = Duration::from_secs(15);

/// The "secret": a line no error may ever print.
const MARKER: &str = "NUBO-SECRET-7f3a9c";

struct Env {
    dir: tempfile::TempDir,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    support::write_raw_base(&m.join("base.raw"));
    let secret = dir.path().join("secret");
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(
        secret.join("shadow"),
        format!("root:$6${MARKER}:19000:0:99999:7:::\n{MARKER}-line-two\n"),
    )
    .unwrap();
    Env { dir }
}

struct Run {
    out: Output,
    elapsed: Duration,
}

impl Run {
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    fn refused(&self, words: &[&str]) {
        let err = self.stderr();
        assert_eq!(self.out.status.code(), Some(1), "stderr: {err}");
        for w in words {
            assert!(err.contains(w), "expected `{w}` in: {err}");
        }
        assert!(!err.contains(MARKER), "the secret reached stderr: {err}");
        assert!(
            !String::from_utf8_lossy(&self.out.stdout).contains(MARKER),
            "the secret reached stdout"
        );
        assert!(self.elapsed < FAST, "took {:?}: {err}", self.elapsed);
    }

    fn ok(&self) {
        assert_eq!(self.out.status.code(), Some(0), "stderr: {}", self.stderr());
    }
}

impl Env {
    fn m(&self) -> PathBuf {
        self.dir.path().join("m")
    }

    fn secret(&self) -> PathBuf {
        self.dir.path().join("secret/shadow")
    }

    fn run_with(&self, args: &[&str], stdin: Option<&[u8]>) -> Run {
        let t = Instant::now();
        let out = support::run_bounded(support::command(self.dir.path(), &self.m(), args), stdin, 4 * FAST);
        Run {
            out,
            elapsed: t.elapsed(),
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        self.run_with(args, None)
    }

    /// Writes `m/NAME` holding a VirtualMachine with `cloud_init` (indented by four) and
    /// returns its path.
    fn manifest(&self, name: &str, cloud_init: &str) -> String {
        let text = format!(
            "apiVersion: nubo.dev/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: web\nspec:\n  disk: ./base.raw\n  backend: qemu\n  resources: {{ vcpus: 1, memory: 512M }}\n  network: restricted\n  cloudInit:\n{cloud_init}"
        );
        let p = self.m().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    fn validate(&self, manifest: &str, extra: &[&str]) -> Run {
        let mut args = vec!["manifest", "validate", "-f", manifest];
        args.extend_from_slice(extra);
        self.run(&args)
    }
}

fn mkfifo(p: &Path) {
    let ok = Command::new("mkfifo").arg(p).status().expect("mkfifo runs").success();
    assert!(ok, "mkfifo {}", p.display());
}

/// A billion-node alias bomb: nine levels of ten aliases each, after `header`.
fn alias_bomb(header: &str) -> String {
    let mut t = format!("{header}a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..10 {
        let p = i - 1;
        t.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    t
}

/// Issue 21.3: every file key of a manifest, naming a host file outside the manifest's tree in
/// every way (absolute, `../`, a symlinked directory, `@` key file), is refused by `manifest
/// validate` and `apply --dry-run`, and no byte of the file is printed.
#[test]
fn manifest_file_outside_its_directory_refused_on_every_key() {
    let e = env();
    std::os::unix::fs::symlink(e.dir.path().join("secret"), e.m().join("linked")).unwrap();
    let abs = e.secret().display().to_string();
    let cases = [
        format!("    networkConfigFile: {abs}\n"),
        "    networkConfigFile: ../secret/shadow\n".to_owned(),
        "    networkConfigFile: ../../../../../../../../etc/hostname\n".to_owned(),
        "    vendorDataFile: linked/shadow\n".to_owned(),
        format!("    userDataFile: {abs}\n"),
        format!("    sshKeys: [\"@{abs}\"]\n"),
        "    sshKeys: [\"@linked/shadow\"]\n".to_owned(),
    ];
    for (i, c) in cases.iter().enumerate() {
        let m = e.manifest(&format!("vm{i}.yaml"), c);

        e.validate(&m, &[]).refused(&["outside", "--load-restrictor none"]);
        e.run(&["apply", "--dry-run", "-f", &m]).refused(&["outside"]);
    }
}

/// Issue 21.3: the disk, kernel and seed paths are files a manifest names too.
#[test]
fn manifest_disk_and_seed_outside_its_directory_refused() {
    let e = env();
    let outside = e.dir.path().join("base.raw");
    std::fs::copy(e.m().join("base.raw"), &outside).unwrap();
    let text = format!(
        "apiVersion: nubo.dev/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: web\nspec:\n  disk: {}\n",
        outside.display()
    );
    std::fs::write(e.m().join("disk.yaml"), text).unwrap();
    let seed = e.manifest("seed.yaml", "    seed: ../secret/shadow\n");

    e.validate("disk.yaml", &[]).refused(&["spec.disk", "outside"]);
    e.validate(&seed, &[]).refused(&["spec.cloudInit.seed", "outside"]);
}

/// Issue 21.3: `--load-restrictor none` (and kustomize's spelling) lets a trusted manifest name
/// any file; an unknown value is a usage error.
#[test]
fn manifest_load_restrictor_none_allows_outside_files() {
    let e = env();
    let net = e.dir.path().join("net.yaml");
    std::fs::write(&net, "version: 2\n").unwrap();
    let m = e.manifest("vm.yaml", &format!("    networkConfigFile: {}\n", net.display()));

    e.validate(&m, &[]).refused(&["outside"]);
    e.validate(&m, &["--load-restrictor", "none"]).ok();
    e.validate(&m, &["--load-restrictor", "LoadRestrictionsNone"]).ok();
    e.validate(&m, &["--load-restrictor", "LoadRestrictionsRootOnly"])
        .refused(&["outside"]);
    assert_eq!(e.validate(&m, &["--load-restrictor", "off"]).out.status.code(), Some(2));
}

/// Issue 21.3: a file below the manifest, and a manifest on stdin naming a file below the
/// working directory, are read as before.
#[test]
fn manifest_files_inside_its_tree_accepted() {
    let e = env();
    std::fs::create_dir(e.m().join("files")).unwrap();
    std::fs::write(e.m().join("files/net.yaml"), "version: 2\n").unwrap();
    let m = e.manifest("vm.yaml", "    networkConfigFile: files/net.yaml\n");
    let text = std::fs::read(&m).unwrap();

    e.validate(&m, &[]).ok();
    e.run_with(&["manifest", "validate", "-f", "-"], Some(&text)).ok();
}

/// Issue 21.4: with the restriction lifted, a secret file given as an `@` key file, user-data,
/// network-config or vendor-data is refused naming the file and line, never quoting it.
#[test]
fn manifest_secret_file_content_never_printed() {
    let e = env();
    let abs = e.secret().display().to_string();
    let cases = [
        (format!("    sshKeys: [\"@{abs}\"]\n"), "line 1"),
        (format!("    userDataFile: {abs}\n"), "line 1"),
        (format!("    vendorDataFile: {abs}\n"), "vendorDataFile"),
        (format!("    networkConfigFile: {abs}\n"), "networkConfigFile"),
    ];
    for (i, (c, word)) in cases.iter().enumerate() {
        let m = e.manifest(&format!("vm{i}.yaml"), c);

        e.validate(&m, &["--load-restrictor", "none"]).refused(&[word]);
    }
    e.run(&["seed", "build", "-o", "seed.iso", "--ssh-key", &format!("@{abs}")])
        .refused(&["line 1"]);
    e.run(&["seed", "build", "-o", "seed.iso", "--user-data", &abs])
        .refused(&["line 1"]);
    e.run(&[
        "vm",
        "create",
        "x",
        "--disk",
        "base.raw",
        "--dry-run",
        "--ssh-key",
        &format!("@{abs}"),
    ])
    .refused(&["line 1"]);
}

/// Issue 21.10: a 10^9-node alias bomb is refused on every path that puts YAML into a seed,
/// quickly, with the same YAML error.
#[test]
fn alias_bomb_refused_on_every_seed_path() {
    let e = env();
    std::fs::write(e.m().join("bomb.yaml"), alias_bomb("")).unwrap();
    std::fs::write(e.m().join("bomb-cc.yaml"), alias_bomb("#cloud-config\n")).unwrap();
    let indent = |t: &str| t.lines().map(|l| format!("      {l}\n")).collect::<String>();
    let inline_net = e.manifest(
        "inline-net.yaml",
        &format!("    networkConfig: |\n{}", indent(&alias_bomb(""))),
    );
    let inline_vendor = e.manifest(
        "inline-vendor.yaml",
        &format!("    vendorData: |\n{}", indent(&alias_bomb("#cloud-config\n"))),
    );
    let file_net = e.manifest("file-net.yaml", "    networkConfigFile: bomb.yaml\n");
    let file_vendor = e.manifest("file-vendor.yaml", "    vendorDataFile: bomb-cc.yaml\n");
    let file_user = e.manifest("file-user.yaml", "    userDataFile: bomb-cc.yaml\n");

    for m in [&inline_net, &inline_vendor, &file_net, &file_vendor, &file_user] {
        e.validate(m, &[]).refused(&["alias"]);
        e.run(&["apply", "--dry-run", "-f", m]).refused(&["alias"]);
    }
    for flag in ["--network-config", "--user-data"] {
        let file = if flag == "--user-data" {
            "bomb-cc.yaml"
        } else {
            "bomb.yaml"
        };
        e.run(&["vm", "create", "x", "--disk", "base.raw", "--dry-run", flag, file])
            .refused(&["alias"]);
        e.run(&["seed", "build", "-o", "seed.iso", flag, file])
            .refused(&["alias"]);
    }
    assert!(!e.m().join("seed.iso").exists());
}

/// Issue 21.15: `--user-data -` reads standard input; a second `-` in the same command is
/// refused by name.
#[test]
fn user_data_from_stdin_accepted_and_second_stdin_refused() {
    let e = env();

    let one = e.run_with(
        &["seed", "build", "-o", "seed.iso", "--user-data", "-"],
        Some(b"#cloud-config\nhostname: a\n"),
    );
    let two = e.run_with(
        &[
            "seed",
            "build",
            "-o",
            "two.iso",
            "--user-data",
            "-",
            "--network-config",
            "-",
        ],
        Some(b"#cloud-config\n"),
    );

    one.ok();
    assert!(e.m().join("seed.iso").is_file());
    two.refused(&["only one input per command can be `-`"]);
}

/// Issue 21.15: a pipe (as `<(generate)` gives) is read; a FIFO nobody writes is refused after
/// the first-byte timeout instead of hanging.
#[test]
fn user_data_from_fifo_accepted_and_silent_fifo_refused() {
    let e = env();
    let fifo = e.m().join("ud");
    mkfifo(&fifo);
    let writer_path = fifo.clone();
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new().write(true).open(writer_path).unwrap();
        f.write_all(b"#cloud-config\nhostname: a\n").unwrap();
    });
    let silent = e.m().join("silent");
    mkfifo(&silent);

    let read = e.run(&["seed", "build", "-o", "seed.iso", "--user-data", "ud"]);
    writer.join().unwrap();
    let refused = e.run(&["seed", "build", "-o", "x.iso", "--user-data", "silent"]);

    read.ok();
    refused.refused(&["silent", "nothing was written within 5 s"]);
}

/// Issue 21.15: `-f -` and `-f FIFO` manifests.
#[test]
fn manifest_from_pipe_accepted() {
    let e = env();
    let m = e.manifest("vm.yaml", "    hostname: web\n");
    let text = std::fs::read(&m).unwrap();
    let fifo = e.m().join("pipe.yaml");
    mkfifo(&fifo);
    let writer_path = fifo.clone();
    let bytes = text.clone();
    let writer = std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new().write(true).open(writer_path).unwrap();
        f.write_all(&bytes).unwrap();
    });

    let piped = e.run(&["manifest", "validate", "-f", "pipe.yaml"]);
    writer.join().unwrap();

    piped.ok();
    e.run_with(&["manifest", "validate", "-f", "-"], Some(&text)).ok();
}

/// Issue 21.7: `registry login --password-stdin </dev/zero` read until killed; it is refused at
/// its bound, which the error names.
#[test]
fn password_stdin_from_dev_zero_refused_at_bound() {
    let e = env();
    let mut c = support::command(
        e.dir.path(),
        &e.m(),
        &["registry", "login", "127.0.0.1:1", "-u", "ci", "--password-stdin"],
    );
    c.stdin(Stdio::from(std::fs::File::open("/dev/zero").unwrap()));
    let t = Instant::now();

    let out = support::run_bounded(c, None, 4 * FAST);

    Run {
        out,
        elapsed: t.elapsed(),
    }
    .refused(&["--password-stdin", "8192 bytes"]);
}

/// Issue 21.14: a dry run accepted a FIFO as `--kernel`; it makes the create's file checks.
#[test]
fn dry_run_kernel_fifo_refused() {
    let e = env();
    mkfifo(&e.m().join("vmlinuz"));

    e.run(&[
        "vm",
        "create",
        "x",
        "--disk",
        "base.raw",
        "--backend",
        "qemu",
        "--kernel",
        "vmlinuz",
        "--cmdline",
        "console=ttyS0",
        "--dry-run",
    ])
    .refused(&["--kernel", "FIFO"]);
}

/// Issue 21.14: `manifest validate` accepted overrides that `apply --dry-run` refused; it now
/// plans as the dry run does.
#[test]
fn validate_refuses_what_dry_run_refuses() {
    let e = env();
    let text = "apiVersion: nubo.dev/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: web\nspec:\n  disk: ./base.raw\n  backend: qemu\n  resources: { vcpus: 1, memory: 512M }\n  network: restricted\n  overrides: { qemu: { frobnicate: \"1\" } }\n";
    std::fs::write(e.m().join("o.yaml"), text).unwrap();

    let dry = e.run(&["apply", "--dry-run", "-f", "o.yaml"]);
    let validate = e.validate("o.yaml", &[]);

    dry.refused(&["frobnicate"]);
    validate.refused(&["frobnicate"]);
}
