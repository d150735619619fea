//! The step cache: one qcow2 layer per step that writes, keyed like BuildKit keys its steps:
//! the parent's key, the instruction, the environment it runs with and the content of every
//! file it reads. Each layer is a delta directly over FROM's blob (cumulative: it holds every
//! change up to its step), so a chain is always one deep, and it is read-only once made.
//!
//! ```text
//! <store>/build-cache/<key>.qcow2   layer: backing = FROM's blob (absolute path), mode 0444
//! <store>/build-cache/<key>.image   {"digest": ...}: the sealed image a final key gave
//! <store>/build-cache/tmp/<id>/     one build's work files, with its flock (`lock`)
//! <store>/build-cache/locks/<key>    held (flock) by the build of a final key while it runs
//! <store>/build-cache/locks/work-dirs  held while a work directory is made, and by the sweep
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::context::ContextFile;
use crate::error::{io, BuildError};

/// Bumped whenever what a key stands for changes (the seal script, the layer format).
pub const CACHE_VERSION: &str = "nubo-build/1";

pub struct Cache {
    pub dir: PathBuf,
}

fn sha(parts: &[&[u8]]) -> String {
    let mut h = ring::digest::Context::new(&ring::digest::SHA256);
    for p in parts {
        // Length-prefixed, so no two part lists hash alike.
        h.update(&(p.len() as u64).to_le_bytes());
        h.update(p);
    }
    nubo_core::hex(h.finish().as_ref())
}

/// The key everything starts from: FROM's digest and the disk size.
pub fn root_key(from_digest: &str, size: Option<u64>) -> String {
    sha(&[
        CACHE_VERSION.as_bytes(),
        from_digest.as_bytes(),
        size.unwrap_or(0).to_string().as_bytes(),
    ])
}

/// A step's key: parent, instruction text, environment, files read (guest path, mode, sha256).
pub fn step_key(parent: &str, text: &str, env: &BTreeMap<String, String>, files: &[ContextFile]) -> String {
    let env = serde_json::to_vec(env).expect("a map of strings serialises");
    let files: Vec<(&str, u32, &str)> = files
        .iter()
        .map(|f| (f.guest.as_str(), f.mode, f.sha256.as_str()))
        .collect();
    let files = serde_json::to_vec(&files).expect("a list of strings serialises");
    sha(&[parent.as_bytes(), text.as_bytes(), &env, &files])
}

/// The key of the sealed image: the last step's key, the seal and the output's options.
pub fn final_key(last: &str, compress: bool, appliance: bool) -> String {
    sha(&[
        last.as_bytes(),
        crate::seal::SCRIPT.as_bytes(),
        &[compress as u8, appliance as u8],
    ])
}

impl Cache {
    pub fn open(store_dir: &Path) -> Result<Cache, BuildError> {
        let dir = store_dir.join("build-cache");
        // 0755 whatever the umask: a build VM's QEMU (libvirt's user) reads the layers here.
        nubo_core::fsmode::create_dir_all(&dir.join("tmp"), nubo_core::fsmode::DIR)
            .map_err(io(format!("creating {}", dir.display())))?;
        Ok(Cache { dir })
    }

    pub fn layer(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.qcow2"))
    }

    fn image_file(&self, key: &str) -> PathBuf {
        self.dir.join(format!("{key}.image"))
    }

    /// A layer for `key`, verified by the strict inspector: nubo's own qcow2 over exactly
    /// `from_blob`. A layer that fails is removed (it is only a cache) and reported as absent.
    pub fn verified_layer(&self, key: &str, from_blob: &Path) -> Option<PathBuf> {
        let p = self.layer(key);
        if !p.is_file() {
            return None;
        }
        let ok = nubo_disk::inspect_overlay_chain(&p)
            .ok()
            .filter(|i| i.chain_depth == 1)
            .and_then(|i| i.backing)
            .is_some_and(|b| b.file == from_blob);
        if !ok {
            let _ = fs::remove_file(&p);
            return None;
        }
        Some(p)
    }

    pub fn image(&self, key: &str) -> Option<String> {
        let b = nubo_core::file::read_bounded(&self.image_file(key), "build cache entry", 4096).ok()?;
        let v: serde_json::Value = serde_json::from_slice(&b).ok()?;
        v.get("digest")?.as_str().map(str::to_owned)
    }

    pub fn set_image(&self, key: &str, digest: &str) -> Result<(), BuildError> {
        let p = self.image_file(key);
        nubo_core::write_json_atomic(&p, &serde_json::json!({ "digest": digest }))
            .map_err(io(format!("writing {}", p.display())))
    }

    /// Moves a finished layer in under `key` (read-only). A layer another build made first wins.
    pub fn put_layer(&self, key: &str, file: &Path) -> Result<(), BuildError> {
        let dst = self.layer(key);
        if dst.exists() {
            let _ = fs::remove_file(file);
            return Ok(());
        }
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(file, fs::Permissions::from_mode(0o444))
            .map_err(io(format!("securing {}", file.display())))?;
        fs::rename(file, &dst).map_err(io(format!("placing {}", dst.display())))
    }

    /// A work directory for one build, locked for its life.
    pub fn work_dir(&self, id: &str) -> Result<(PathBuf, Flock<fs::File>), BuildError> {
        // Another build's sweep removes a work directory that has no lock file; the guard
        // keeps it from seeing this one between its mkdir and its lock.
        let _guard = self.tmp_guard()?;
        let d = self.dir.join("tmp").join(id);
        nubo_core::fsmode::create_dir_all(&d, nubo_core::fsmode::DIR)
            .map_err(io(format!("creating {}", d.display())))?;
        let f = nubo_core::fsmode::open_lock(&d.join("lock")).map_err(io(format!("creating {}", d.display())))?;
        let lock = Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| BuildError::Io {
            what: format!("locking {}", d.display()),
            source: e.into(),
        })?;
        Ok((d, lock))
    }

    /// Held while a work directory is made and locked, and while the sweep looks for stale
    /// ones: a directory is never seen between its creation and its lock.
    fn tmp_guard(&self) -> Result<Flock<fs::File>, BuildError> {
        let d = self.dir.join("locks");
        nubo_core::fsmode::create_dir_all(&d, nubo_core::fsmode::DIR)
            .map_err(io(format!("creating {}", d.display())))?;
        // Not a hex key, so never a build's lock; not in tmp/, which holds work directories only.
        let p = d.join("work-dirs");
        let f = nubo_core::fsmode::open_lock(&p).map_err(io(format!("opening {}", p.display())))?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| BuildError::Io {
            what: format!("locking {}", p.display()),
            source: e.into(),
        })
    }

    /// Takes the lock of the build of `key` (a final key), for the caller's build. Two builds
    /// of the same VMfile would otherwise boot two VMs to make the same layers; the second waits
    /// here, calling `waiting` once first, and then finds the first's layers cached. The kernel
    /// releases the lock of a build that dies.
    pub fn lock_build(&self, key: &str, waiting: impl FnOnce()) -> Result<Flock<fs::File>, BuildError> {
        let d = self.dir.join("locks");
        nubo_core::fsmode::create_dir_all(&d, nubo_core::fsmode::DIR)
            .map_err(io(format!("creating {}", d.display())))?;
        let p = d.join(key);
        let open = || nubo_core::fsmode::open_lock(&p).map_err(io(format!("opening {}", p.display())));
        let locked = |f, how| Flock::lock(f, how).map_err(|(f, e)| (f, e, format!("locking {}", p.display())));
        match locked(open()?, FlockArg::LockExclusiveNonblock) {
            Ok(l) => Ok(l),
            Err((f, nix::errno::Errno::EWOULDBLOCK, _)) => {
                waiting();
                locked(f, FlockArg::LockExclusive).map_err(|(_, e, what)| BuildError::Io { what, source: e.into() })
            }
            Err((_, e, what)) => Err(BuildError::Io { what, source: e.into() }),
        }
    }

    /// Work directories whose build is gone (killed, interrupted): their ids, each locked now.
    /// Those with a `kept` marker (`--keep-failed`) are left alone.
    pub fn stale(&self) -> Vec<(String, PathBuf, Flock<fs::File>)> {
        let Ok(_guard) = self.tmp_guard() else {
            return vec![];
        };
        let Ok(rd) = fs::read_dir(self.dir.join("tmp")) else {
            return vec![];
        };
        let mut out = vec![];
        for e in rd.flatten() {
            let d = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) || d.join("kept").exists() {
                continue;
            }
            let Ok(f) = fs::File::open(d.join("lock")) else {
                out.push((e.file_name().to_string_lossy().into_owned(), d.clone(), None));
                continue;
            };
            if let Ok(l) = Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                out.push((e.file_name().to_string_lossy().into_owned(), d.clone(), Some(l)));
            }
        }
        out.into_iter()
            .filter_map(|(id, d, l)| match l {
                Some(l) => Some((id, d, l)),
                None => {
                    let _ = fs::remove_dir_all(&d);
                    None
                }
            })
            .collect()
    }
}

/// What `nubo image prune` reclaims: every layer and image entry, and the work directories of
/// builds that are gone (a running build's and a `--keep-failed` one's are left). Returns each
/// path with its bytes; `dry_run` removes nothing.
pub fn prune(store_dir: &Path, dry_run: bool) -> Result<Vec<(PathBuf, u64)>, BuildError> {
    let dir = store_dir.join("build-cache");
    if !dir.exists() {
        return Ok(vec![]);
    }
    let cache = Cache { dir: dir.clone() };
    let mut out = vec![];
    for (_, d, _lock) in cache.stale() {
        out.push((d.clone(), du(&d)));
        if !dry_run {
            let _ = fs::remove_dir_all(&d);
        }
    }
    for e in fs::read_dir(&dir)
        .map_err(io(format!("listing {}", dir.display())))?
        .flatten()
    {
        let p = e.path();
        if p.is_file() {
            use std::os::unix::fs::MetadataExt;
            out.push((p.clone(), e.metadata().map(|m| m.blocks() * 512).unwrap_or(0)));
            if !dry_run {
                fs::remove_file(&p).map_err(io(format!("removing {}", p.display())))?;
            }
        }
    }
    Ok(out)
}

fn du(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::read_dir(p)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.metadata().map(|m| m.blocks() * 512).unwrap_or(0))
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use super::*;

    #[test]
    fn lock_build_second_build_waits_saying_so_until_the_first_ends() {
        let store = tempfile::tempdir().unwrap();
        let cache = Arc::new(Cache::open(store.path()).unwrap());
        let first = cache.lock_build("k", || panic!("the first build waited")).unwrap();
        let released = Arc::new(AtomicBool::new(false));
        let (said, heard) = mpsc::channel();

        let second = {
            let (cache, released) = (cache.clone(), released.clone());
            std::thread::spawn(move || {
                let _l = cache.lock_build("k", move || said.send(()).unwrap()).unwrap();
                released.load(Ordering::SeqCst)
            })
        };
        heard
            .recv_timeout(Duration::from_secs(10))
            .expect("the second build said it waits");
        std::thread::sleep(Duration::from_millis(200));
        released.store(true, Ordering::SeqCst);
        drop(first);

        assert!(
            second.join().unwrap(),
            "the second build ran before the first released its lock"
        );
    }

    #[test]
    fn work_dir_is_never_swept_between_its_creation_and_its_lock() {
        let store = tempfile::tempdir().unwrap();
        let cache = Arc::new(Cache::open(store.path()).unwrap());
        let done = Arc::new(AtomicBool::new(false));
        let sweeper = {
            let (cache, done) = (cache.clone(), done.clone());
            std::thread::spawn(move || {
                while !done.load(Ordering::SeqCst) {
                    for (_, d, _lock) in cache.stale() {
                        let _ = fs::remove_dir_all(&d);
                    }
                }
            })
        };

        let made: Result<Vec<_>, _> = (0..300).map(|i| cache.work_dir(&format!("b{i}"))).collect();
        done.store(true, Ordering::SeqCst);
        sweeper.join().unwrap();

        let made = made.expect("a sweep running alongside broke a build's work directory");
        assert!(made.iter().all(|(d, _)| d.join("lock").is_file()));
    }

    #[test]
    fn lock_build_other_keys_do_not_wait() {
        let store = tempfile::tempdir().unwrap();
        let cache = Cache::open(store.path()).unwrap();
        let _first = cache.lock_build("k", || {}).unwrap();

        let other = cache.lock_build("other", || panic!("a build of another key waited"));

        assert!(other.is_ok());
    }

    #[test]
    fn step_key_changes_with_text_env_and_content() {
        let env = BTreeMap::new();
        let f = |sha: &str| ContextFile {
            host: "/c/a".into(),
            guest: "/a".into(),
            mode: 0o644,
            sha256: sha.into(),
            len: 1,
        };

        let base = step_key("p", "COPY a /a", &env, &[f("1")]);

        assert_eq!(base, step_key("p", "COPY a /a", &env, &[f("1")]));
        assert_ne!(base, step_key("q", "COPY a /a", &env, &[f("1")]));
        assert_ne!(base, step_key("p", "COPY a  /a", &env, &[f("1")]));
        assert_ne!(base, step_key("p", "COPY a /a", &env, &[f("2")]));
        assert_ne!(
            base,
            step_key("p", "COPY a /a", &BTreeMap::from([("A".into(), "1".into())]), &[f("1")])
        );
    }
}
