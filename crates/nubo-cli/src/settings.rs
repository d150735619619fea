//! Everything the binary reads from its environment, read once here; libraries never do.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::Context;
use nubo_core::{RootEnv, Roots};

use crate::cli::Cli;

#[derive(Debug, Clone)]
pub struct Settings {
    pub roots: Roots,
    /// `NUBO_VM_BACKEND`: the backend for new VMs when neither the command nor the image names one.
    pub env_backend: Option<String>,
    /// `NUBO_LIBVIRT_URI`: the libvirt URI in place of `qemu:///system` (root) or `qemu:///session`,
    /// checked against the same allowlist as a manifest's (any clean `socket=` path).
    pub libvirt_uri: Option<nubo_spec::ConnectUri>,
    /// Progress bars and live phase lines on a TTY; plain lines otherwise.
    pub stderr_tty: bool,
    pub stdin_tty: bool,
    /// `NUBO_MIRROR_<DISTRO>` (e.g. `NUBO_MIRROR_DEBIAN`): base URLs replacing each distro's own
    /// for `nubo image pull`, as (distro, URL).
    pub mirrors: Vec<(String, String)>,
    /// `SSL_CERT_FILE`: the CA bundle used instead of the system store (OpenSSL's meaning).
    pub ssl_cert_file: Option<PathBuf>,
    /// Where `nubo registry login` keeps credentials (0600): `$NUBO_ROOT/auth.json` when
    /// NUBO_ROOT is set, else `$XDG_CONFIG_HOME/nubo/auth.json` (`~/.config/nubo/auth.json`).
    pub auth_file: PathBuf,
    /// Credentials nubo reads but never writes: `$REGISTRY_AUTH_FILE` (containers' tools), then
    /// `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`.
    pub foreign_auth_files: Vec<PathBuf>,
    /// `HOME`: what `~/` stands for in a manifest's paths.
    pub home: Option<PathBuf>,
    /// `vm create --ca-cert FILE`s: CAs trusted, in addition, by the pulls the engine asks for
    /// (catalog, URL, registry), as `image pull --ca-cert` is for its own. Empty from the
    /// environment; set by the command.
    pub extra_ca: Vec<PathBuf>,
    /// `PATH` and `NUBO_HYPERVISOR_FW`, for the backends and host probes (read here, once).
    pub host: nubo_backend::HostEnv,
}

impl Settings {
    /// Each backend's configuration from these settings, built once for the registry.
    pub fn backend_config(&self) -> nubo_backend::BackendConfig {
        nubo_backend::BackendConfig::new(self.host.clone()).with(
            "libvirt",
            nubo_backend::libvirt::LibvirtConfig {
                uri: self.libvirt_uri.clone(),
            },
        )
    }

    /// The mirrors and TLS trust every pull of this command shares.
    pub fn pull_config(&self) -> nubo_image::PullConfig {
        nubo_image::PullConfig {
            mirrors: self.mirrors.clone(),
            tls: nubo_image::TlsSettings {
                ca_bundle: self.ssl_cert_file.clone(),
                extra_ca: self.extra_ca.clone(),
            },
            // nubo's own file, then $REGISTRY_AUTH_FILE, then docker's: read by the library
            // when a pull needs them.
            credentials: nubo_image::oci::CredentialSource {
                entries: Default::default(),
                files: std::iter::once(self.auth_file.clone())
                    .chain(self.foreign_auth_files.iter().cloned())
                    .collect(),
            },
        }
    }

    pub fn from_env(_cli: &Cli) -> anyhow::Result<Settings> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        let env = RootEnv {
            // Kept even when empty: `NUBO_ROOT=` is a mistake Roots refuses, never the default.
            nubo_root: std::env::var_os("NUBO_ROOT").map(PathBuf::from),
            nubo_run_dir: std::env::var_os("NUBO_RUN_DIR").map(PathBuf::from),
            xdg_data_home: var("XDG_DATA_HOME").map(PathBuf::from),
            xdg_runtime_dir: var("XDG_RUNTIME_DIR").map(PathBuf::from),
            home: var("HOME").map(PathBuf::from),
            is_root: nix::unistd::geteuid().is_root(),
        };
        let roots = Roots::resolve(&env).context("resolving nubo's state directories")?;
        let stderr_tty = std::io::stderr().is_terminal();
        let home = var("HOME").map(PathBuf::from);
        let auth_file = match (var("NUBO_ROOT"), var("XDG_CONFIG_HOME"), &home) {
            (Some(_), _, _) => roots.root.join("auth.json"),
            (None, Some(x), _) => PathBuf::from(x).join("nubo/auth.json"),
            (None, None, Some(h)) => h.join(".config/nubo/auth.json"),
            (None, None, None) => roots.root.join("auth.json"),
        };
        let mut foreign_auth_files: Vec<PathBuf> = var("REGISTRY_AUTH_FILE").map(PathBuf::from).into_iter().collect();
        match (var("DOCKER_CONFIG"), &home) {
            (Some(d), _) => foreign_auth_files.push(PathBuf::from(d).join("config.json")),
            (None, Some(h)) => foreign_auth_files.push(h.join(".docker/config.json")),
            (None, None) => {}
        }
        Ok(Settings {
            roots,
            env_backend: std::env::var("NUBO_VM_BACKEND").ok().filter(|v| !v.is_empty()),
            libvirt_uri: libvirt_uri_from_env()?,
            stderr_tty,
            stdin_tty: std::io::stdin().is_terminal(),
            mirrors: mirrors_from_env(),
            ssl_cert_file: var("SSL_CERT_FILE").map(PathBuf::from),
            auth_file,
            foreign_auth_files,
            home: env.home.clone(),
            extra_ca: Vec::new(),
            host: nubo_backend::HostEnv::from_process(),
        })
    }
}

/// `NUBO_LIBVIRT_URI`, parsed: libvirt runs programs for some URIs, so one outside the
/// allowlist is refused before any command runs.
fn libvirt_uri_from_env() -> anyhow::Result<Option<nubo_spec::ConnectUri>> {
    let Some(v) = std::env::var_os("NUBO_LIBVIRT_URI").filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let text = v.to_string_lossy();
    let uri = nubo_spec::ConnectUri::parse(&text, nubo_spec::uri::Origin::Env).context("NUBO_LIBVIRT_URI")?;
    Ok(Some(uri))
}

/// `NUBO_MIRROR_<DISTRO>` for each catalog distro that has one set.
fn mirrors_from_env() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for d in nubo_image::catalog::Distro::ALL {
        if let Some(url) = std::env::var(d.mirror_env()).ok().filter(|v| !v.is_empty()) {
            out.push((d.name().to_owned(), url));
        }
    }
    out
}
