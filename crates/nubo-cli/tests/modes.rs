//! Issue 21 item 11: the modes of what nubo creates must not depend on the umask. Under
//! `umask 000` the store's directories were 0777 and `refs/*.json` 0666 (any local user could
//! re-point a tag or swap a blob); under `umask 077` the blobs libvirt's QEMU user reads would
//! be closed to it. Each test runs real nubo commands under a umask set by `sh -c 'umask M;
//! exec nubo ...'`, then walks everything they made.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(60);

/// `nubo ARGS` under `umask`, with the test's roots, run in `dir`.
fn nubo_umask(dir: &Path, umask: &str, args: &[&str]) -> Output {
    let c = support::command(dir, dir, &[]);
    let mut sh = std::process::Command::new("sh");
    sh.arg("-c")
        .arg(format!("umask {umask} && exec \"$0\" \"$@\""))
        .arg(c.get_program())
        .args(args)
        .current_dir(dir);
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => sh.env(k, v),
            None => sh.env_remove(k),
        };
    }
    sh.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let out = support::run_bounded(sh, None, DEADLINE);
    assert!(
        out.status.success(),
        "nubo {args:?} under umask {umask}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Every path under `root` (itself included), not following symlinks.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                out.push(e.unwrap().path());
            }
        }
        i += 1;
    }
    out
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// Makes the store (import), settings (default-backend), the run directory and its locks
/// (`vm rm` of a half-made VM takes its lock), a seed and a VMfile, all under `umask`.
fn make_everything(dir: &Path, umask: &str) {
    let disk = dir.join("disk.qcow2");
    nubo_disk::create_qcow2(&disk, 1 << 20).unwrap();
    nubo_umask(dir, umask, &["image", "import", disk.to_str().unwrap(), "-t", "base:1"]);
    nubo_umask(dir, umask, &["vm", "default-backend", "--set", "qemu"]);
    // A VM directory without a record: `vm rm` takes its lock (making run/ and run/locks),
    // then converges by removing it.
    std::fs::create_dir_all(dir.join("root/vms/ghost")).unwrap();
    nubo_umask(dir, umask, &["vm", "rm", "ghost"]);
    nubo_umask(dir, umask, &["seed", "build", "-o", "seed.iso", "--hostname", "h"]);
    nubo_umask(dir, umask, &["image", "init", "-f", "VMfile"]);
}

#[test]
fn umask_000_nothing_nubo_made_is_group_or_world_writable() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    make_everything(d, "000");

    let mut made = walk(&d.join("root"));
    made.extend(walk(&d.join("run")));
    made.extend([d.join("seed.iso"), d.join("VMfile")]);
    let writable: Vec<String> = made
        .iter()
        .filter(|p| mode(p) & 0o022 != 0)
        .map(|p| format!("{} {:o}", p.display(), mode(p)))
        .collect();
    assert!(
        writable.is_empty(),
        "group/world-writable under umask 000: {writable:#?}"
    );
    let images = d.join("root/images");
    for (p, want) in [
        (images.clone(), 0o755),
        (images.join("blobs"), 0o755),
        (images.join("refs"), 0o755),
        (images.join("refs/base"), 0o755),
        (images.join("refs/base/1.json"), 0o644),
        (images.join("tmp"), 0o700),
        (d.join("root/settings.json"), 0o644),
        (d.join("run"), 0o755),
        (d.join("run/locks"), 0o755),
        (d.join("seed.iso"), 0o600),
        (d.join("VMfile"), 0o644),
    ] {
        assert_eq!(mode(&p), want, "{}", p.display());
    }
    let blobs: Vec<PathBuf> = walk(&images.join("blobs")).into_iter().skip(1).collect();
    assert_eq!(blobs.len(), 1);
    assert_eq!(mode(&blobs[0]), 0o444);
}

#[test]
fn umask_077_store_stays_readable_by_the_vmm_user() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();

    make_everything(d, "077");

    let images = d.join("root/images");
    for p in [
        d.join("root"),
        images.clone(),
        images.join("blobs"),
        images.join("refs"),
    ] {
        assert_eq!(mode(&p), 0o755, "{}", p.display());
    }
    assert_eq!(mode(&images.join("refs/base/1.json")), 0o644);
    assert_eq!(mode(&d.join("VMfile")), 0o644);
    assert_eq!(mode(&d.join("seed.iso")), 0o600);
}
