//! Atomic file replacement: temp file in the same directory, fsync, rename, fsync the directory.
//! A reader sees the old contents or the new ones, never a torn record, even across a crash.
//! Records get [`fsmode::RECORD`] (0644) whatever the umask; [`write_atomic_with_mode`] gives
//! another mode.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::fsmode;

/// A tag no other writer uses: `<pid>.<n>`, `n` a process-wide counter. The pid alone is not
/// enough once one process (a daemon) has several threads writing the same file; the counter
/// alone is not enough across processes. Temp files carrying it are still created with
/// `O_EXCL`, so a stale one left by a killed writer of a recycled pid refuses, never clobbers.
pub fn unique_tag() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!("{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Replaces `path` with `data` atomically. The temp file lives beside `path` so the rename never
/// crosses a filesystem; it is removed if any step fails.
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    replace(path, data, true, fsmode::RECORD)
}

/// [`write_atomic`] with file mode `mode` (exactly, whatever the umask).
pub fn write_atomic_with_mode(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    replace(path, data, true, mode)
}

/// Like [`write_atomic`] (readers never see a torn file) but without the fsyncs: for files on
/// a latency-critical path whose durability the caller establishes afterwards with one
/// `syncfs` before writing the durable record that depends on them.
pub fn write_atomic_unsynced(path: &Path, data: &[u8]) -> io::Result<()> {
    replace(path, data, false, fsmode::RECORD)
}

fn replace(path: &Path, data: &[u8], durable: bool, mode: u32) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let file_name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".tmp.{}", unique_tag()));
    let tmp = dir.join(tmp_name);

    let result = (|| {
        let mut f = fsmode::create_new(&tmp, mode)?;
        f.write_all(data)?;
        if durable {
            f.sync_all()?;
        }
        drop(f);
        fs::rename(&tmp, path)?;
        if durable {
            File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Serialises `value` as pretty JSON (with a trailing newline) and writes it atomically.
pub fn write_json_atomic<T: serde::Serialize>(path: &Path, value: &T) -> io::Result<()> {
    write_atomic(path, &json_bytes(value)?)
}

/// [`write_json_atomic`] without the fsyncs (see [`write_atomic_unsynced`]).
pub fn write_json_atomic_unsynced<T: serde::Serialize>(path: &Path, value: &T) -> io::Result<()> {
    write_atomic_unsynced(path, &json_bytes(value)?)
}

fn json_bytes<T: serde::Serialize>(value: &T) -> io::Result<Vec<u8>> {
    let mut data = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    data.push(b'\n');
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_atomic_replaces_contents_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.json");
        write_atomic(&path, b"old").unwrap();

        write_atomic(&path, b"new").unwrap();

        assert_eq!(fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("rec.json")]);
    }

    #[test]
    fn write_atomic_missing_dir_fails_without_residue() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent").join("rec.json");

        let err = write_atomic(&path, b"x").unwrap_err();

        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn write_atomic_unsynced_replaces_contents_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seed.img");
        write_atomic_unsynced(&path, b"old").unwrap();

        write_atomic_unsynced(&path, b"new").unwrap();

        assert_eq!(fs::read(&path).unwrap(), b"new");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn write_atomic_record_mode_is_0644_and_with_mode_exact() {
        let dir = tempfile::tempdir().unwrap();
        let rec = dir.path().join("rec.json");
        let key = dir.path().join("key");

        write_atomic(&rec, b"{}").unwrap();
        write_atomic_with_mode(&key, b"k", fsmode::PRIVATE).unwrap();

        assert_eq!(fsmode::mode_of(&rec).unwrap(), 0o644);
        assert_eq!(fsmode::mode_of(&key).unwrap(), 0o600);
    }

    #[test]
    fn write_atomic_sixteen_threads_one_file_whole_value_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.json");
        // Each writer's value is long enough that a torn or interleaved write would show.
        let value = |i: usize| vec![b'a' + i as u8; 64 * 1024];

        std::thread::scope(|s| {
            for i in 0..16 {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..20 {
                        write_atomic_unsynced(path, &value(i)).unwrap();
                        let seen = fs::read(path).unwrap();
                        assert!((0..16).any(|j| seen == value(j)), "torn record");
                    }
                });
            }
        });

        let last = fs::read(&path).unwrap();
        assert!((0..16).any(|j| last == value(j)));
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("rec.json")]);
    }

    #[test]
    fn unique_tag_two_calls_differ() {
        assert_ne!(unique_tag(), unique_tag());
    }

    #[test]
    fn write_json_atomic_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.json");

        write_json_atomic(&path, &serde_json::json!({"a": 1})).unwrap();

        let v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(v["a"], 1);
    }
}
