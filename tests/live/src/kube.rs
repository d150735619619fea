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

    /// Restarts kube-apiserver alone, as after a crash: the process `run-apiserver.sh` started
    /// (its pid file) is killed (SIGKILL: its graceful SIGTERM shutdown alone takes 10 s and
    /// more, most of a client's 15 s lease) and started again with the same command line, so
    /// the same port, certificates and etcd (which keeps running, with its data). The new pid
    /// goes into the pid file, so `stop` (the drop) stops it. Returns when /readyz says ok, or
    /// fails after 120 s. The script has no restart of its own: `start` wipes etcd's data.
    pub fn restart_apiserver(&self) -> Result<(), String> {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        use std::time::Instant;
        let pid_file = self.dir().join("apiserver.pid");
        let text = std::fs::read_to_string(&pid_file).map_err(|e| format!("{}: {e}", pid_file.display()))?;
        let pid: i32 = text
            .trim()
            .parse()
            .map_err(|_| format!("{}: not a pid: {text:?}", pid_file.display()))?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
            .map_err(|e| format!("kube-apiserver (pid {pid}) is not running: {e}"))?;
        let argv: Vec<std::ffi::OsString> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(a).to_owned())
            .collect();
        let is_apiserver = argv.first().and_then(|a| Path::new(a).file_name()).is_some_and(|n| {
            let n = n.to_string_lossy();
            n.starts_with("kube-apiserver") || n.starts_with("kube-generic")
        });
        if !is_apiserver {
            return Err(format!(
                "pid {pid} of {} is not kube-apiserver: {argv:?}",
                pid_file.display()
            ));
        }
        let gone = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
                .unwrap_or(true)
        };
        let port = argv
            .iter()
            .find_map(|a| a.to_str()?.strip_prefix("--secure-port=")?.parse::<u16>().ok())
            .ok_or_else(|| format!("kube-apiserver's command line has no --secure-port: {argv:?}"))?;
        kill(Pid::from_raw(pid), Signal::SIGKILL).map_err(|e| format!("killing kube-apiserver (pid {pid}): {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while !gone() {
            if Instant::now() >= deadline {
                return Err(format!("kube-apiserver (pid {pid}) outlived SIGKILL by 20 s"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // The port is one the script chose from the ephemeral range, so while the apiserver is
        // down any outgoing connection on this machine may be given it as its own port (among
        // them a client's retry to this very port, which then connects to itself, and leaves
        // the port in TIME_WAIT for a minute). The new apiserver then fails at once with
        // "address already in use". So the port is held, as soon as the old apiserver is gone,
        // by a socket bound with SO_REUSEADDR and not listening: the kernel gives no outgoing
        // connection a port so held, and kube-apiserver (SO_REUSEADDR too) still binds it. It
        // is let go once the new apiserver is ready. Starting again on a refused bind stays,
        // for a port taken before the hold.
        let log_path = self.dir().join("apiserver.log");
        let bind_deadline = Instant::now() + Duration::from_secs(60);
        let _hold = hold_port(port, bind_deadline)?;
        let mut starts = 0;
        let mut child = loop {
            let log_len = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
            let log = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&log_path)
                .map_err(|e| format!("apiserver.log: {e}"))?;
            let log2 = log.try_clone().map_err(|e| e.to_string())?;
            let mut child = Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(std::process::Stdio::null())
                .stdout(log)
                .stderr(log2)
                .spawn()
                .map_err(|e| format!("starting kube-apiserver again: {e}"))?;
            starts += 1;
            std::fs::write(&pid_file, format!("{}\n", child.id()))
                .map_err(|e| format!("{}: {e}", pid_file.display()))?;
            // A refused bind ends the process within a second of its start.
            let settle = Instant::now() + Duration::from_secs(3);
            let exited = loop {
                match child.try_wait() {
                    Ok(Some(st)) => break Some(st),
                    Ok(None) if Instant::now() < settle => std::thread::sleep(Duration::from_millis(50)),
                    _ => break None,
                }
            };
            let Some(status) = exited else { break child };
            let tail = std::fs::read(&log_path)
                .map(|b| String::from_utf8_lossy(&b[(log_len as usize).min(b.len())..]).into_owned())
                .unwrap_or_default();
            if tail.contains("address already in use") && Instant::now() < bind_deadline {
                eprintln!("kube-apiserver restart {starts}: 127.0.0.1:{port} was taken again; retrying");
                continue;
            }
            return Err(format!(
                "kube-apiserver ended at once after its restart ({status}):\n{}",
                tail.lines().rev().take(30).collect::<Vec<_>>().join("\n")
            ));
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let ready = loop {
            let out = self.kubectl(&["get", "--raw", "/readyz"])?;
            if out.ok && out.stdout.trim() == "ok" {
                break Ok(());
            }
            if Instant::now() >= deadline || matches!(child.try_wait(), Ok(Some(_))) {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                break Err(format!(
                    "kube-apiserver not ready 120 s after its restart: {} {}\n--- apiserver.log (last lines, newest first):\n{}",
                    out.stdout,
                    out.stderr,
                    tail.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        };
        // Reaped when it ends (the script's `stop`, by the pid file).
        std::thread::spawn(move || {
            let _ = child.wait();
        });
        ready
    }
}

/// Binds 127.0.0.1:`port` with SO_REUSEADDR, without listening, retrying until `deadline`
/// while another socket has it. See [`ApiServer::restart_apiserver`].
fn hold_port(port: u16, deadline: std::time::Instant) -> Result<std::os::fd::OwnedFd, String> {
    use nix::sys::socket::{bind, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    loop {
        let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
            .map_err(|e| format!("socket: {e}"))?;
        setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(|e| format!("SO_REUSEADDR: {e}"))?;
        match bind(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, port)) {
            Ok(()) => return Ok(fd),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(format!(
                    "127.0.0.1:{port} still taken 60 s after kube-apiserver was killed: {e}"
                ))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
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
