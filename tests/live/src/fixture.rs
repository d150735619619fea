//! Temporary nubo state for a live test, and the bootstrapped `debian:12` guest image, built
//! once per machine and shared by hard links.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::run_with_timeout;

/// A bootstrap takes 1-3 minutes here; a cold one on a slow mirror more.
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(1800);
const IMAGE: &str = "debian:12";

/// The `nubo` binary under test: `NUBO_BIN`, else `target/<profile>/nubo` next to this test
/// binary (`target/<profile>/deps/<test>-<hash>`).
pub fn nubo_bin() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("NUBO_BIN").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("NUBO_BIN={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot locate the test binary: {e}"))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("test binary has no target/<profile>/deps parent")?;
    let nubo = profile_dir.join("nubo");
    if nubo.is_file() {
        Ok(nubo)
    } else {
        Err(format!(
            "the nubo binary is not built at {}: run `cargo build -p nubo-cli` (or `cargo test --workspace`, which builds it), or set NUBO_BIN",
            nubo.display()
        ))
    }
}

/// Names the cache entry: changes whenever the recipe version or the package list does, so a
/// changed recipe rebuilds instead of testing a stale image.
pub fn recipe_key() -> String {
    let text = format!(
        "{}\n{}",
        nubo_bootstrap::RECIPE_VERSION,
        nubo_bootstrap::BASE_PACKAGES.join(",")
    );
    nubo_bootstrap::digest::hex(text.as_bytes())[..16].to_owned()
}

/// `NUBO_LIVE_CACHE`, else `/var/tmp/nubo-live-cache` (outside the repository, kept across runs).
pub fn cache_base() -> PathBuf {
    std::env::var_os("NUBO_LIVE_CACHE")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("/var/tmp/nubo-live-cache"), PathBuf::from)
}

/// The image the fixture provides, as its record in the test's store describes it.
#[derive(Debug, Clone)]
pub struct DebianImage {
    pub reference: String,
    pub qcow2: PathBuf,
    pub digest: String,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    /// The whole record as `nubo image inspect` would print it.
    pub record: serde_json::Value,
}

/// A fresh `NUBO_ROOT` and a short `NUBO_RUN_DIR` (AF_UNIX paths must stay under 108 bytes),
/// both removed on drop.
pub struct TestRoot {
    root: tempfile::TempDir,
    run: tempfile::TempDir,
    /// A command prefix `nubo` runs under (`ip netns exec NS`), and extra environment.
    wrap: Vec<String>,
    env: Vec<(String, String)>,
}

impl TestRoot {
    pub fn new() -> Result<TestRoot, String> {
        // Next to the image cache, so its blobs can be hard-linked (same filesystem).
        let parent = cache_base().join("roots");
        fs::create_dir_all(&parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        let root = tempfile::Builder::new()
            .prefix("root-")
            .tempdir_in(&parent)
            .map_err(|e| format!("cannot create a NUBO_ROOT: {e}"))?;
        let run = tempfile::Builder::new()
            .prefix("nr")
            .tempdir_in("/tmp")
            .map_err(|e| format!("cannot create a NUBO_RUN_DIR: {e}"))?;
        Ok(TestRoot {
            root,
            run,
            wrap: Vec::new(),
            env: Vec::new(),
        })
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }

    pub fn run_dir(&self) -> &Path {
        self.run.path()
    }

    /// Runs every later `nubo` under `prefix` (e.g. `ip netns exec NS`) with `env` added.
    pub fn wrap(&mut self, prefix: Vec<String>, env: Vec<(String, String)>) {
        self.wrap = prefix;
        self.env = env;
    }

    /// `nubo` with this root's environment.
    pub fn cmd(&self) -> Result<Command, String> {
        let mut c = match self.wrap.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(nubo_bin()?);
                c
            }
            None => Command::new(nubo_bin()?),
        };
        c.env("NUBO_ROOT", self.root()).env("NUBO_RUN_DIR", self.run_dir());
        c.envs(self.env.iter().map(|(k, v)| (k, v)));
        Ok(c)
    }

    /// Makes `debian:12` available in this root: bootstrapped once per machine into the cache
    /// (under a file lock, so parallel test binaries build it once), then hard-linked here.
    pub fn with_debian_image(&self) -> Result<DebianImage, String> {
        let cache = ensure_cached()?;
        let src = cache.join("images");
        let dst = self.root().join("images");
        link_tree(&src, &dst, &src).map_err(|e| {
            format!(
                "cannot link the cached image store {} into {}: {e}",
                src.display(),
                dst.display()
            )
        })?;
        read_image(&dst)
    }
}

/// The cache entry's NUBO_ROOT, bootstrapping into it when it holds no image yet.
fn ensure_cached() -> Result<PathBuf, String> {
    let base = cache_base();
    let dir = base.join(recipe_key());
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create the live-test image cache {}: {e}", dir.display()))?;
    let lock_path = dir.join(".lock");
    let lock = fs::File::create(&lock_path).map_err(|e| format!("cannot create {}: {e}", lock_path.display()))?;
    let _lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("cannot lock {}: {e}", lock_path.display()))?;
    if read_image(&dir.join("images")).is_ok() {
        return Ok(dir);
    }
    let run = tempfile::Builder::new()
        .prefix("nr")
        .tempdir_in("/tmp")
        .map_err(|e| format!("cannot create a NUBO_RUN_DIR: {e}"))?;
    let mut cmd = Command::new(nubo_bin()?);
    cmd.env("NUBO_ROOT", &dir)
        .env("NUBO_RUN_DIR", run.path())
        .args(["image", "bootstrap", IMAGE, "--cache-dir"])
        .arg(base.join("debs"));
    eprintln!(
        "bootstrapping {IMAGE} for the live tests into {} (once per recipe) ...",
        dir.display()
    );
    let t = Instant::now();
    run_with_timeout(&mut cmd, BOOTSTRAP_TIMEOUT).map_err(|e| format!("bootstrapping the live-test image: {e}"))?;
    eprintln!("bootstrapped {IMAGE} in {:.1}s", t.elapsed().as_secs_f64());
    read_image(&dir.join("images"))?;
    Ok(dir)
}

/// Recreates `src` under `dst`: directories made, files hard-linked (copied across
/// filesystems), except records, which are rewritten to point into `dst`, and `tmp/`.
fn link_tree(src: &Path, dst: &Path, top: &Path) -> io::Result<()> {
    fs::create_dir_all(dst)?;
    for e in fs::read_dir(src)? {
        let e = e?;
        let (from, to) = (e.path(), dst.join(e.file_name()));
        if e.file_type()?.is_dir() {
            if from != top.join("tmp") {
                link_tree(&from, &to, top)?;
            }
        } else if from.extension().is_some_and(|x| x == "json") {
            let text = fs::read_to_string(&from)?;
            let top_json = serde_json::to_string(&top.display().to_string())?;
            let dst_top = dst_top(dst, &from, top);
            let dst_json = serde_json::to_string(&dst_top.display().to_string())?;
            // Paths are JSON strings: replace the escaped prefix without the closing quote.
            fs::write(
                &to,
                text.replace(top_json.trim_end_matches('"'), dst_json.trim_end_matches('"')),
            )?;
        } else if !to.exists() && fs::hard_link(&from, &to).is_err() {
            fs::copy(&from, &to)?;
        }
    }
    Ok(())
}

/// The `dst` counterpart of `top`, given a file `from` under `top` copied into `dst`.
fn dst_top(dst: &Path, from: &Path, top: &Path) -> PathBuf {
    let depth = from
        .parent()
        .and_then(|p| p.strip_prefix(top).ok())
        .map_or(0, |r| r.components().count());
    let mut p = dst.to_path_buf();
    for _ in 0..depth {
        p.pop();
    }
    p
}

fn read_image(images: &Path) -> Result<DebianImage, String> {
    let path = images.join("refs/debian/12.json");
    let text = fs::read_to_string(&path).map_err(|e| format!("no {IMAGE} record at {}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("record {} is not JSON: {e}", path.display()))?;
    let s = |ptr: &str| {
        v.pointer(ptr)
            .and_then(|x| x.as_str())
            .map(str::to_owned)
            .ok_or_else(|| format!("record {} has no {ptr}", path.display()))
    };
    let img = DebianImage {
        reference: s("/reference")?,
        qcow2: PathBuf::from(s("/path")?),
        digest: s("/digest")?,
        kernel: PathBuf::from(s("/boot/kernel")?),
        initrd: PathBuf::from(s("/boot/initrd")?),
        cmdline: s("/boot/cmdline")?,
        record: v.clone(),
    };
    for f in [&img.qcow2, &img.kernel, &img.initrd] {
        if !f.is_file() {
            return Err(format!(
                "record {} names {}, which is missing",
                path.display(),
                f.display()
            ));
        }
    }
    Ok(img)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipe_key_is_stable_hex() {
        assert_eq!(recipe_key().len(), 16);
        assert_eq!(recipe_key(), recipe_key());
    }

    #[test]
    fn link_tree_rewrites_record_paths_and_links_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("cache/images");
        fs::create_dir_all(src.join("refs/debian")).unwrap();
        fs::create_dir_all(src.join("blobs")).unwrap();
        fs::create_dir_all(src.join("tmp/junk")).unwrap();
        fs::write(src.join("blobs/x.qcow2"), "q").unwrap();
        let rec = serde_json::json!({ "path": src.join("blobs/x.qcow2") }).to_string();
        fs::write(src.join("refs/debian/12.json"), rec).unwrap();
        let dst = dir.path().join("test/images");

        link_tree(&src, &dst, &src).unwrap();

        let text = fs::read_to_string(dst.join("refs/debian/12.json")).unwrap();
        assert!(
            text.contains(&dst.join("blobs/x.qcow2").display().to_string()),
            "{text}"
        );
        assert!(dst.join("blobs/x.qcow2").is_file());
        assert!(!dst.join("tmp/junk").exists());
    }
}
