//! Prerequisite probes, each run at most once per process. Names are what `NUBO_LIVE_REQUIRE`
//! lists.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

static CACHE: Mutex<Option<HashMap<String, Result<(), String>>>> = Mutex::new(None);

/// `Ok` when `name` is usable here, else why not (with the package that fixes it).
pub fn check(name: &str) -> Result<(), String> {
    let mut cache = CACHE.lock().expect("prereq cache poisoned");
    let cache = cache.get_or_insert_with(HashMap::new);
    if let Some(r) = cache.get(name) {
        return r.clone();
    }
    let r = probe(name);
    cache.insert(name.to_owned(), r.clone());
    r
}

fn probe(name: &str) -> Result<(), String> {
    match name {
        "qemu" => tool("qemu-system-x86_64", "qemu-system-x86 (from bookworm-backports)"),
        other => Err(format!("unknown prerequisite `{other}` (a bug in the test)")),
    }
}

/// An executable on PATH.
pub fn tool(cmd: &str, package: &str) -> Result<(), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| is_executable(&d.join(cmd))) {
        Ok(())
    } else {
        Err(format!("`{cmd}` not found on PATH: install {package}"))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
