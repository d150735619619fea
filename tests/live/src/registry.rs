//! A real OCI registry for live tests: Debian's `docker-registry` (distribution 2.8) started
//! by the test on 127.0.0.1 with a free port, TLS from a test CA (rcgen), htpasswd basic auth
//! (or, with [`Registry::start_with_token`], the bearer-token flow through the harness's own
//! token service) and storage in a temporary directory; killed by PID when dropped. Never its
//! systemd unit.

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

use crate::net::free_port;
use crate::process::{run_with_timeout, Guard};
use crate::token::{TokenServer, ISSUER, SERVICE};

pub const USER: &str = "nubo";
pub const PASSWORD: &str = "live-test-password";

pub struct Registry {
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// The test CA (PEM), for `--ca-cert` / `SSL_CERT_FILE`.
    pub ca: PathBuf,
    /// A directory holding `ca.crt`, for skopeo's `--cert-dir`.
    pub cert_dir: PathBuf,
    /// The registry's storage root.
    pub storage: PathBuf,
    pub dir: tempfile::TempDir,
    /// The token service, when the registry uses bearer tokens.
    pub token: Option<TokenServer>,
    guard: Guard,
}

impl Registry {
    /// `nubo registry login HOST` in `root` as [`USER`] with `password` and this registry's
    /// CA, whatever its exit: `host` is the registry's, or a proxy's in front of it.
    pub fn login_with(&self, root: &crate::TestRoot, host: &str, password: &str) -> Result<crate::cli::Out, String> {
        let ca = self.ca.display().to_string();
        crate::cli::nubo_in(
            root,
            &[
                "registry",
                "login",
                host,
                "-u",
                USER,
                "--password-stdin",
                "--ca-cert",
                &ca,
            ],
            Some(&format!("{password}\n")),
            Duration::from_secs(60),
        )
    }

    /// `nubo registry login` to this registry in `root` as [`USER`], which must succeed.
    pub fn login(&self, root: &crate::TestRoot) -> Result<(), String> {
        self.login_with(root, &self.host, PASSWORD)?.require().map(drop)
    }

    /// htpasswd (Basic) auth.
    pub fn start() -> Result<Registry, String> {
        Self::start_auth(false)
    }

    /// Bearer tokens: the registry answers 401 with `WWW-Authenticate: Bearer realm=...` and
    /// trusts tokens signed by the harness's token service, which checks [`USER`]/[`PASSWORD`].
    pub fn start_with_token() -> Result<Registry, String> {
        Self::start_auth(true)
    }

    fn start_auth(bearer: bool) -> Result<Registry, String> {
        let dir = tempfile::Builder::new()
            .prefix("nubo-registry-")
            .tempdir()
            .map_err(|e| format!("cannot create the registry's directory: {e}"))?;
        let d = dir.path();
        let (ca_pem, cert_pem, key_pem) = certificates()?;
        let write = |p: &Path, s: &str| fs::write(p, s).map_err(|e| format!("writing {}: {e}", p.display()));
        let cert_dir = d.join("certs");
        fs::create_dir(&cert_dir).map_err(|e| e.to_string())?;
        write(&d.join("ca.pem"), &ca_pem)?;
        write(&cert_dir.join("ca.crt"), &ca_pem)?;
        write(&d.join("cert.pem"), &cert_pem)?;
        write(&d.join("key.pem"), &key_pem)?;
        let line = run_with_timeout(
            Command::new("htpasswd").args(["-Bbn", USER, PASSWORD]),
            Duration::from_secs(30),
        )?;
        write(&d.join("htpasswd"), line.trim())?;
        let token = if bearer {
            let t = TokenServer::start(&cert_pem, &key_pem, USER, PASSWORD)?;
            write(&d.join("token-signer.pem"), &t.signer_pem)?;
            Some(t)
        } else {
            None
        };
        let auth = match &token {
            Some(t) => format!(
                "auth:\n  token:\n    realm: {}\n    service: {SERVICE}\n    issuer: {ISSUER}\n    rootcertbundle: {}\n",
                t.realm,
                d.join("token-signer.pem").display()
            ),
            None => format!(
                "auth:\n  htpasswd:\n    realm: nubo-live\n    path: {}\n",
                d.join("htpasswd").display()
            ),
        };
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let storage = d.join("storage");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n  tls:\n    certificate: {cert}\n    key: {key}\n{auth}",
            storage = storage.display(),
            cert = d.join("cert.pem").display(),
            key = d.join("key.pem").display(),
        );
        write(&d.join("config.yml"), &config)?;
        let log = fs::File::create(d.join("registry.log")).map_err(|e| e.to_string())?;
        let log2 = log.try_clone().map_err(|e| e.to_string())?;
        let mut guard = Guard::spawn(
            Command::new("docker-registry")
                .arg("serve")
                .arg(d.join("config.yml"))
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log2)),
            "docker-registry",
        )?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&host).is_err() {
            if let Some(s) = guard.exited() {
                let log = fs::read_to_string(d.join("registry.log")).unwrap_or_default();
                return Err(format!("docker-registry exited with {s}:\n{log}"));
            }
            if Instant::now() > deadline {
                return Err(format!("docker-registry did not listen on {host} within 30s"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Registry {
            host,
            ca: d.join("ca.pem"),
            cert_dir,
            storage,
            dir,
            token,
            guard,
        })
    }

    /// The file holding blob `digest` in the registry's storage (what a tamper test edits).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// The registry's own log so far (for failure messages).
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.guard.pid()
    }
}

/// (CA, server certificate for 127.0.0.1 signed by it, server key), PEM.
fn certificates() -> Result<(String, String, String), String> {
    let e = |e: rcgen::Error| format!("making the test CA: {e}");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "nubo live registry CA");
    let ca_key = KeyPair::generate().map_err(e)?;
    let ca = ca_params.self_signed(&ca_key).map_err(e)?;
    let key = KeyPair::generate().map_err(e)?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .map_err(e)?
        .signed_by(&key, &ca, &ca_key)
        .map_err(e)?;
    Ok((ca.pem(), cert.pem(), key.serialize_pem()))
}
