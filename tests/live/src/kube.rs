//! A genuine kube-apiserver + etcd for the controller's live test and bench, started by the
//! shared `run-apiserver.sh` (never copied into the repository) in a directory of the test's own
//! (`K8S_TEST_DIR`), so two tests never share certificates, etcd data or ports; the built
//! binaries come from the cache outside the clone. Stopped (by the script, by PID) on drop.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::cli::{run, run_in, Out};

/// The environment variable naming the tool's directory.
pub const TOOL_ENV: &str = "NUBO_KUBE_APISERVER_TOOL";
/// Where it lives on the machines this project is built on.
pub const TOOL_DEFAULT: &str = "/work/shared/tools/kube-apiserver";
const VERSION: &str = "v1.37.2";

/// The tool's directory: `$NUBO_KUBE_APISERVER_TOOL`, else the shared one.
pub fn tool_dir() -> PathBuf {
    std::env::var_os(TOOL_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(TOOL_DEFAULT))
}

fn cache_dir() -> PathBuf {
    std::env::var_os("K8S_CACHE_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/nubo-k8s/cache"))
}

/// The prerequisite `kube-apiserver`: the script, and its binaries already built in the cache
/// (`run-apiserver.sh build`, which CI runs first: a cold build takes 10-20 minutes).
pub fn probe() -> Result<(), String> {
    let script = tool_dir().join("run-apiserver.sh");
    if !script.is_file() {
        return Err(format!(
            "{} not found: set {TOOL_ENV} to the kube-apiserver tool's directory",
            script.display()
        ));
    }
    for b in ["kube-apiserver", "etcd", "kubectl"] {
        let p = cache_dir().join("bin").join(format!("{b}-{VERSION}"));
        if !p.is_file() {
            return Err(format!(
                "{} is not built: run `{} build` first",
                p.display(),
                script.display()
            ));
        }
    }
    Ok(())
}

pub struct ApiServer {
    dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
}

impl ApiServer {
    pub fn start() -> Result<ApiServer, String> {
        let dir = tempfile::Builder::new()
            .prefix("nubo-k8s-")
            .tempdir_in("/var/tmp")
            .map_err(|e| format!("temp dir: {e}"))?;
        let out = run(
            Command::new(tool_dir().join("run-apiserver.sh"))
                .arg("start")
                .env("K8S_TEST_DIR", dir.path())
                .env("K8S_CACHE_DIR", cache_dir()),
            Duration::from_secs(300),
        )?
        .require()?;
        let env = std::fs::read_to_string(dir.path().join("env"))
            .map_err(|e| format!("run-apiserver.sh wrote no env file ({e}):\n{}", out.stderr))?;
        let vars = parse_env(&env);
        let get = |k: &str| {
            vars.get(k)
                .map(PathBuf::from)
                .ok_or_else(|| format!("the env file has no {k}:\n{env}"))
        };
        Ok(ApiServer {
            kubeconfig: get("KUBECONFIG")?,
            kubectl: get("KUBECTL")?,
            dir,
        })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `kubectl ARGS` against this apiserver.
    pub fn kubectl(&self, args: &[&str]) -> Result<Out, String> {
        self.kubectl_in(args, None)
    }

    /// `kubectl ARGS` with `stdin` (for `apply -f -`).
    pub fn kubectl_in(&self, args: &[&str], stdin: Option<&str>) -> Result<Out, String> {
        run_in(
            Command::new(&self.kubectl)
                .args(args)
                .env("KUBECONFIG", &self.kubeconfig),
            stdin,
            Duration::from_secs(60),
        )
    }

    /// `kubectl apply -f -` of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) -> Result<(), String> {
        self.kubectl_in(&["apply", "-f", "-"], Some(yaml))?
            .require()
            .map(|_| ())
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = run(
            Command::new(tool_dir().join("run-apiserver.sh"))
                .arg("stop")
                .env("K8S_TEST_DIR", self.dir.path())
                .env("K8S_CACHE_DIR", cache_dir()),
            Duration::from_secs(60),
        );
    }
}

/// `export K=V` / `K=V` lines, values unquoted.
fn parse_env(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("export ").unwrap_or(l.trim());
            let (k, v) = l.split_once('=')?;
            Some((k.to_owned(), v.trim_matches(|c| c == '"' || c == '\'').to_owned()))
        })
        .collect()
}
