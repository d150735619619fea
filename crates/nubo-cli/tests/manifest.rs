//! `nubo apply` / `delete` / `manifest` through the binary, without booting anything: the
//! examples validate, a dry run leaves the state roots byte-identical, an invalid document
//! stops every document with `file:line:col: path: message`, stdin works, deleting missing VMs
//! is no error.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

struct Env {
    dir: tempfile::TempDir,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("m")).unwrap();
    support::write_raw_base(&dir.path().join("m/base.raw"));
    Env { dir }
}

impl Env {
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }
    fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }
    fn m(&self) -> PathBuf {
        self.dir.path().join("m")
    }

    fn nubo_in(&self, cwd: &Path, args: &[&str], stdin: &[u8]) -> Output {
        support::run_bounded(
            support::command(self.dir.path(), cwd, args),
            Some(stdin),
            std::time::Duration::from_secs(60),
        )
    }

    fn nubo(&self, args: &[&str]) -> Output {
        self.nubo_in(self.dir.path(), args, b"")
    }

    fn write(&self, name: &str, text: &str) -> String {
        let p = self.m().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const VMS: &str = "apiVersion: nubo.dev/v1alpha1
kind: VirtualMachine
metadata:
  name: web
spec:
  disk: ./base.raw
  resources: { vcpus: 1, memory: 512M }
  network: restricted
  cloudInit:
    hostname: web
---
apiVersion: nubo.dev/v1alpha1
kind: Workload
metadata:
  name: worker
spec:
  type: microvm
  microvm:
    disk: base.raw
    kernel: ./base.raw
    cmdline: console=ttyS0
    memory: 256M
    network: restricted
";

/// Every path under `p` with its mode and content.
fn snapshot(p: &Path) -> Vec<(PathBuf, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![p.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(m) = std::fs::symlink_metadata(&d) else { continue };
        let content = if m.is_file() {
            std::fs::read(&d).unwrap()
        } else {
            Vec::new()
        };
        out.push((d.clone(), m.permissions().mode(), content));
        if m.is_dir() {
            todo.extend(std::fs::read_dir(&d).unwrap().flatten().map(|e| e.path()));
        }
    }
    out.sort();
    out
}

#[test]
fn examples_validate() {
    let e = env();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");

    let o = e.nubo(&["manifest", "validate", "-f", &examples.display().to_string()]);

    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    for name in ["`web`", "`worker`", "`cache`"] {
        assert!(out.contains(name), "{out}");
    }
}

#[test]
fn apply_dry_run_leaves_state_roots_byte_identical() {
    let e = env();
    let vms = e.write("vms.yaml", VMS);
    // State to keep unchanged: settings, an imported image, the run dir.
    let set = e.nubo(&["vm", "default-backend", "--set", "qemu"]);
    assert!(set.status.success(), "{}", text(&set.stderr));
    let base = e.m().join("base.raw").display().to_string();
    let imp = e.nubo(&["image", "import", &base, "-t", "local:1"]);
    assert!(imp.status.success(), "{}", text(&imp.stderr));
    std::fs::create_dir_all(e.run_dir()).unwrap();
    e.write(
        "img.yaml",
        &VMS.replace("disk: ./base.raw", "image: local:1")
            .replace("name: web", "name: img")
            .replace("name: worker", "name: img-worker")
            .replace("disk: base.raw", "image: local:1"),
    );
    let before = (snapshot(&e.root()), snapshot(&e.run_dir()));

    let o = e.nubo(&["apply", "--dry-run", "-f", &e.m().display().to_string(), "-o", "json"]);
    let o2 = e.nubo(&["apply", "--dry-run", "-f", &vms]);

    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(o2.status.success(), "{}", text(&o2.stderr));
    assert_eq!((snapshot(&e.root()), snapshot(&e.run_dir())), before);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let docs = v["documents"].as_array().unwrap();
    assert_eq!(docs.len(), 4);
    assert!(
        docs.iter().all(|d| d["action"] == "create" && d["plan"].is_object()),
        "{v}"
    );
    assert!(
        docs.iter()
            .all(|d| d["backendReason"].as_str().unwrap().contains("chosen by")),
        "{v}"
    );
    let human = text(&o2.stdout);
    assert!(
        human.contains("`web`: would be created") && human.contains("spec: {"),
        "{human}"
    );
}

#[test]
fn apply_dry_run_on_fresh_root_creates_nothing() {
    let e = env();
    let vms = e.write("vms.yaml", VMS);

    let o = e.nubo(&["apply", "--dry-run", "-f", &vms]);

    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(!e.root().exists() && !e.run_dir().exists());
}

#[test]
fn apply_one_invalid_document_stops_all_with_position() {
    let e = env();
    let vms = e.write("vms.yaml", &VMS.replace("memory: 256M", "memory: 2X"));

    let o = e.nubo(&["apply", "-f", &vms]);

    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{vms}:22:5: spec.microvm.memory: \"2X\" is not a size")),
        "{err}"
    );
    assert!(!e.root().join("vms").exists(), "a VM was made: {err}");
}

#[test]
fn apply_missing_reference_refused_at_its_key() {
    let e = env();
    let vms = e.write("vms.yaml", &VMS.replace("kernel: ./base.raw", "kernel: ./vmlinuz"));

    let o = e.nubo(&["manifest", "validate", "-f", &vms]);

    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains(&format!("{vms}:20:5: spec.microvm.kernel: ")), "{err}");
}

#[test]
fn apply_stdin_resolves_paths_against_cwd() {
    let e = env();

    let o = e.nubo_in(&e.m(), &["apply", "--dry-run", "-f", "-"], VMS.as_bytes());

    assert!(o.status.success(), "{}", text(&o.stderr));
    let want = format!("\"path\":\"{}\"", e.m().join("base.raw").display());
    assert!(text(&o.stdout).contains(&want), "{}", text(&o.stdout));
}

#[test]
fn delete_missing_vms_is_no_error() {
    let e = env();
    let vms = e.write("vms.yaml", VMS);

    let o = e.nubo(&["delete", "-f", &vms]);

    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("vm `worker` does not exist: nothing to remove"));
}

#[test]
fn manifest_schema_is_json_with_both_kinds() {
    let e = env();

    let o = e.nubo(&["manifest", "schema"]);

    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["oneOf"][0]["properties"]["kind"]["const"], "VirtualMachine");
    assert_eq!(v["oneOf"][1]["properties"]["kind"]["const"], "Workload");
}

/// README's manifest example is what a newcomer copies: it must validate as written.
#[test]
fn readme_manifest_example_validates() {
    let e = env();
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap();
    let start = readme.find("### Manifests").expect("README has the manifest section");
    let block = readme[start..]
        .split("```yaml\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let home = e.dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    // The example's key file lies below the manifest, as the load restriction asks (issue 21.3).
    std::fs::create_dir_all(e.m().join("keys")).unwrap();
    std::fs::write(e.m().join("keys/id_ed25519.pub"), "ssh-ed25519 AAAAreadme you@laptop\n").unwrap();
    let file = e.write("web.yaml", block);

    let o = Command::new(env!("CARGO_BIN_EXE_nubo"))
        .args(["manifest", "validate", "-f", &file])
        .env("NUBO_ROOT", e.root())
        .env("NUBO_RUN_DIR", e.run_dir())
        .env("HOME", &home)
        .stdin(Stdio::null())
        .output()
        .unwrap();

    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("VirtualMachine `web` is valid"));
}
