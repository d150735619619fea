//! The Kubernetes controller's test parts shared by its live test and its bench: the
//! `nubo-controller` binary under test, replicas started against an [`ApiServer`], their
//! /readyz and /metrics, and an HTTP server on 127.0.0.1 serving the image.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::kube::ApiServer;
use crate::libvirtd::{Libvirtd, Options, TlsListen};
use crate::net::free_port;
use crate::{Guard, TestResult};

pub fn controller_bin() -> Result<PathBuf, String> {
    let nubo = crate::nubo_bin()?;
    let p = nubo.with_file_name("nubo-controller");
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "the nubo-controller binary is not built at {}: run `cargo build -p nubo-controller`",
            p.display()
        ))
    }
}

/// A controller replica, its output in `log`.
pub struct Replica {
    pub guard: Guard,
    pub log: PathBuf,
    pub port: u16,
}

pub fn start_replica(api: &ApiServer, state: &Path, ns: &str, id: &str) -> Result<Replica, String> {
    start_replica_with(api, state, ns, id, &[])
}

/// [`start_replica`] with extra environment (`NUBO_CONTROLLER_RESYNC`, the test hooks).
pub fn start_replica_with(
    api: &ApiServer,
    state: &Path,
    ns: &str,
    id: &str,
    env: &[(&str, &str)],
) -> Result<Replica, String> {
    let port = free_port()?;
    let log = api.dir().join(format!("controller-{id}.log"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .map_err(|e| format!("log: {e}"))?;
    let f2 = f.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(controller_bin()?);
    cmd.args(["run", "--state-dir"])
        .arg(state)
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--lease-namespace",
            ns,
            "--identity",
            id,
            "--watch-secrets-in",
            ns,
        ])
        .env("KUBECONFIG", &api.kubeconfig)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::from(f))
        .stderr(Stdio::from(f2));
    let guard = Guard::spawn(&mut cmd, &format!("nubo-controller {id}"))?;
    Ok(Replica { guard, log, port })
}

/// `GET path` on 127.0.0.1:port: (status code, body).
pub fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect :{port}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(format!("no status line: {out}"))?;
    Ok((
        code,
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default(),
    ))
}

pub fn wait_ready(r: &mut Replica, timeout: Duration) -> TestResult {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok((200, _)) = http_get(r.port, "/readyz") {
            return Ok(());
        }
        if let Some(s) = r.guard.exited() {
            return Err(format!("the controller exited with {s}: {}", tail(&r.log)));
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "the controller was not ready within {timeout:?}: {}",
                tail(&r.log)
            ));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

pub fn tail(p: &Path) -> String {
    let t = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// An HTTP/1.1 server on 127.0.0.1 serving `file` to every GET (HEAD without the body).
pub fn serve(file: PathBuf) -> Result<String, String> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let file = file.clone();
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16384 {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let Ok(mut f) = std::fs::File::open(&file) else { return };
                let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n");
                let _ = s.write_all(head.as_bytes());
                if !req.starts_with(b"HEAD") {
                    let _ = std::io::copy(&mut f, &mut s);
                }
            });
        }
    });
    Ok(format!("http://{addr}/debian-12.qcow2"))
}

/// A libvirtd over `qemu+tls://` on `net` (its `.1`) with a started dir pool `pool`: the
/// daemon, its URI and the client's TLS directory.
pub fn libvirtd_with_pool(net: &'static str, pool: &str) -> Result<(Libvirtd, String, PathBuf), String> {
    let lv = Libvirtd::start_with(Options {
        tls: Some(TlsListen { net }),
        ..Options::default()
    })?;
    let (uri, tls_dir) = lv.tls.clone().ok_or("the harness made no TLS listener")?;
    let dir = lv.dir().join(format!("{pool}-dir"));
    std::fs::create_dir_all(&dir).map_err(|e| format!("pool dir: {e}"))?;
    let dir_s = dir.display().to_string();
    lv.virsh(&["pool-define-as", pool, "dir", "--target", &dir_s])?
        .require()?;
    lv.virsh(&["pool-start", pool])?.require()?;
    Ok((lv, uri, tls_dir))
}

/// deploy/crds.yaml applied and Established, then namespace `ns` with the Secret `lab-tls`
/// holding the libvirt client's TLS files from `tls` (a Provider's credentialsSecretRef).
pub fn crds_namespace_credentials(api: &ApiServer, ns: &str, tls: &Path) -> TestResult {
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds.yaml");
    api.kubectl(&["apply", "-f", &crds.display().to_string()])?.require()?;
    api.kubectl(&[
        "wait",
        "--for",
        "condition=Established",
        "--timeout=60s",
        "crd/virtualmachines.nubo.dev",
        "crd/vmclasses.nubo.dev",
        "crd/vmimages.nubo.dev",
        "crd/providers.nubo.dev",
    ])?
    .require()?;
    api.kubectl(&["create", "namespace", ns])?.require()?;
    let t = tls.display().to_string();
    api.kubectl(&[
        "-n",
        ns,
        "create",
        "secret",
        "generic",
        "lab-tls",
        &format!("--from-file=cacert.pem={t}/cacert.pem"),
        &format!("--from-file=clientcert.pem={t}/clientcert.pem"),
        &format!("--from-file=clientkey.pem={t}/clientkey.pem"),
    ])?
    .require()?;
    Ok(())
}

/// Every domain of `lv`, by name, sorted.
pub fn domains(lv: &Libvirtd) -> Result<Vec<String>, String> {
    let out = lv.virsh(&["list", "--all", "--name"])?.require()?;
    let mut d: Vec<String> = out.stdout.split_whitespace().map(str::to_owned).collect();
    d.sort();
    Ok(d)
}

/// The volumes of `pool`, by name.
pub fn volumes(lv: &Libvirtd, pool: &str) -> Result<Vec<String>, String> {
    let out = lv.virsh(&["vol-list", "--pool", pool])?.require()?;
    Ok(out
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|v| v != "Name" && !v.starts_with("---"))
        .collect())
}
