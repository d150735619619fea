//! Issue 21, item 1: a libvirt connection URI runs host programs (`qemu+ext://...?command=`,
//! ssh's `command`/`netcat`/`proxy`), so a manifest, `--connect` or NUBO_LIBVIRT_URI naming one
//! outside the allowlist is refused before any connection is tried. Each case points libvirt at
//! a script that would leave a marker file: the marker never appears, whatever the exit code.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        support::write_raw_base(&dir.path().join("base.raw"));
        let env = Env { dir };
        let script = format!("#!/bin/sh\ntouch '{}'\n", env.marker().display());
        std::fs::write(env.pwn(), script).unwrap();
        std::fs::set_permissions(env.pwn(), std::fs::Permissions::from_mode(0o755)).unwrap();
        env
    }

    fn pwn(&self) -> PathBuf {
        self.dir.path().join("pwn.sh")
    }

    fn marker(&self) -> PathBuf {
        self.dir.path().join("pwned")
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }

    fn nubo(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = support::command(self.dir.path(), self.dir.path(), args);
        for (k, v) in env {
            c.env(k, v);
        }
        support::run_bounded(c, None, Duration::from_secs(60))
    }

    fn manifest(&self, uri: &str) -> String {
        let text = format!(
            "apiVersion: nubo.dev/v1alpha1\nkind: VirtualMachine\nmetadata:\n  name: evil\nspec:\n  disk: ./base.raw\n  backend: libvirt\n  network: restricted\n  overrides: {{libvirt: {{uri: \"{uri}\"}}}}\n"
        );
        let p = self.path("m.yaml");
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Refused (exit 1), naming the URI's problem and the accepted forms, and the program
    /// never ran.
    fn assert_refused(&self, o: &Output, cause: &str) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "stderr: {err}");
        assert!(err.contains(cause), "no `{cause}` in: {err}");
        assert!(err.contains("qemu+ssh://[USER@]HOST[:PORT]/system"), "no fix in: {err}");
        assert!(!self.marker().exists(), "the URI's program ran: {err}");
    }
}

fn ext_uri(env: &Env) -> String {
    format!("qemu+ext:///system?command={}", env.pwn().display())
}

#[test]
fn manifest_validate_ext_uri_is_refused_without_running_it() {
    let env = Env::new();
    let m = env.manifest(&ext_uri(&env));

    let o = env.nubo(&["manifest", "validate", "-f", &m], &[]);

    env.assert_refused(&o, "spec.overrides.libvirt.uri");
}

#[test]
fn apply_dry_run_ext_uri_is_refused_without_running_it() {
    let env = Env::new();
    let m = env.manifest(&ext_uri(&env));

    let o = env.nubo(&["apply", "-f", &m, "--dry-run"], &[]);

    env.assert_refused(&o, "`ext`");
}

#[test]
fn vm_create_connect_ext_uri_is_refused_without_running_it() {
    let env = Env::new();
    let disk = env.path("base.raw");
    let uri = ext_uri(&env);

    let o = env.nubo(
        &[
            "vm",
            "create",
            "evil",
            "--disk",
            &disk,
            "--backend",
            "libvirt",
            "--restrict-network",
            "--connect",
            &uri,
        ],
        &[],
    );

    env.assert_refused(&o, "`ext`");
    assert!(
        !Path::new(&env.path("root/vms/evil")).exists(),
        "a VM directory was left"
    );
}

#[test]
fn apply_dry_run_ssh_command_param_is_refused_without_running_it() {
    let env = Env::new();
    let m = env.manifest(&format!("qemu+ssh://localhost/system?command={}", env.pwn().display()));

    let o = env.nubo(&["apply", "-f", &m, "--dry-run"], &[]);

    env.assert_refused(&o, "`command`");
}

#[test]
fn apply_dry_run_socket_outside_libvirt_run_dirs_is_refused() {
    let env = Env::new();
    let m = env.manifest(&format!("qemu:///system?socket={}", env.path("sock")));

    let o = env.nubo(&["apply", "-f", &m, "--dry-run"], &[]);

    env.assert_refused(&o, "outside /run/libvirt");
}

#[test]
fn env_libvirt_uri_ext_is_refused_before_any_command() {
    let env = Env::new();
    let uri = ext_uri(&env);

    let o = env.nubo(&["vm", "ls"], &[("NUBO_LIBVIRT_URI", &uri)]);

    env.assert_refused(&o, "NUBO_LIBVIRT_URI");
}

#[test]
fn manifest_validate_allowlisted_tls_uri_is_accepted() {
    let env = Env::new();
    let m = env.manifest("qemu+tls://hv1.example:16514/system");

    let o = env.nubo(&["manifest", "validate", "-f", &m], &[]);

    assert!(o.status.success(), "stderr: {}", String::from_utf8_lossy(&o.stderr));
}
