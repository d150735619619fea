//! The engines, one per Provider host, and the TLS credentials they connect with.
//!
//! The Provider's Secret is read by the controller alone; its three PEM files are written to a
//! private directory (0700, files 0600) made for that Secret's resourceVersion and passed to
//! libvirt as the URI's `pkipath`, the `--tls-dir` of the CLI. The engine gets a parsed URI, never
//! a Kubernetes client or a Secret object.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use nubo_engine::fetch::PullFetcher;
use nubo_engine::Engine;
use nubo_spec::uri::Origin;
use nubo_spec::ConnectUri;

/// The client's TLS files, as libvirt names them.
pub struct Credentials {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    /// The Secret's resourceVersion: a new one writes a new directory.
    pub version: String,
}

/// The Secret's keys, by libvirt's names or a `kubernetes.io/tls` Secret's.
pub const KEYS: [(&str, &str); 3] = [
    ("cacert.pem", "ca.crt"),
    ("clientcert.pem", "tls.crt"),
    ("clientkey.pem", "tls.key"),
];

struct Entry {
    engine: Arc<Engine>,
    version: String,
    uri: String,
    /// Removed when the entry is replaced or the controller ends.
    _tls: tempfile::TempDir,
}

/// Which host of which Provider.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostKey {
    pub namespace: String,
    pub provider: String,
    pub host: String,
}

impl HostKey {
    /// A directory name for this host: the three parts cannot hold `/` (they are DNS names).
    fn dir(&self) -> String {
        format!("{}.{}.{}", self.namespace, self.provider, self.host)
    }
}

pub struct Hosts {
    state: PathBuf,
    entries: Mutex<HashMap<HostKey, Arc<Entry>>>,
    cancel: nubo_core::Cancel,
    /// How the hosts' engines pull: TLS trust (registry credentials come per VMImage).
    pull: nubo_image::PullConfig,
}

impl Hosts {
    pub fn new(state: &Path, cancel: nubo_core::Cancel) -> Result<Hosts, String> {
        for d in [
            state.to_path_buf(),
            state.join("tls"),
            state.join("hosts"),
            state.join("run"),
        ] {
            nubo_core::fsmode::create_dir_all(&d, nubo_core::fsmode::PRIVATE_DIR)
                .map_err(|e| format!("cannot create the state directory {}: {e}", d.display()))?;
        }
        Ok(Hosts {
            state: state.to_path_buf(),
            entries: Mutex::new(HashMap::new()),
            cancel,
            pull: nubo_image::PullConfig::default(),
        })
    }

    /// Downloads and registries trusted by `tls` (the controller's `--ca-cert`, `SSL_CERT_FILE`).
    pub fn with_tls(mut self, tls: nubo_image::TlsSettings) -> Hosts {
        self.pull.tls = tls;
        self
    }

    /// How the controller pulls into the store at `images`: the hosts' TLS trust, registry
    /// `credentials` (a VMImage's pullSecretRef), URL images named by checksum so two VMImages'
    /// `.../disk.qcow2` never share (or fight over) one store name.
    pub fn fetcher(&self, images: PathBuf, credentials: nubo_image::oci::CredentialSource) -> PullFetcher {
        PullFetcher {
            images,
            config: nubo_image::PullConfig {
                credentials,
                ..self.pull.clone()
            },
            name_urls_by_checksum: true,
        }
    }

    /// The engine for `key` reaching `uri` with `creds`, made on first use and again when the
    /// credentials or the URI change.
    pub fn engine(&self, key: &HostKey, uri: &str, creds: &Credentials) -> Result<Arc<Engine>, String> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = entries.get(key) {
            if e.version == creds.version && e.uri == uri {
                return Ok(e.engine.clone());
            }
        }
        // The host's name becomes part of a directory name: a DNS label only (no `/`, no `..`).
        check_host_name(&key.host)?;
        let parsed = ConnectUri::parse(uri, Origin::Spec).map_err(|e| format!("host `{}`: {e}", key.host))?;
        let tls = tempfile::Builder::new()
            .prefix("pki-")
            .tempdir_in(self.state.join("tls"))
            .map_err(|e| format!("cannot make a private TLS directory: {e}"))?;
        for ((name, _), bytes) in KEYS.iter().zip([&creds.ca, &creds.cert, &creds.key]) {
            write_private(&tls.path().join(name), bytes)?;
        }
        let uri_tls = parsed
            .with_pkipath(tls.path())
            .map_err(|e| format!("host `{}`: {e}", key.host))?;
        let root = self.state.join("hosts").join(key.dir());
        // AF_UNIX paths are short: the run directory is named by a hash of the key.
        let run = self.state.join("run").join(format!("{:08x}", fnv(&key.dir())));
        let roots = nubo_core::Roots { root, run_dir: run };
        let registry = nubo_backend::builtin_registry_for(Some(uri_tls), &nubo_backend::HostEnv::from_process());
        let fetcher = self.fetcher(roots.images(), Default::default());
        let mut engine = Engine::new(roots.clone(), registry, None).with_fetcher(Box::new(fetcher));
        engine.user_data_uuid = true;
        engine.cancel = self.cancel.clone();
        let entry = Arc::new(Entry {
            engine: Arc::new(engine),
            version: creds.version.clone(),
            uri: uri.to_owned(),
            _tls: tls,
        });
        entries.insert(key.clone(), entry.clone());
        Ok(entry.engine.clone())
    }

    /// The host's memory and CPUs when its backend reports them (`None` when it cannot, after a
    /// probe says it answers), or why it is unreachable. One connection.
    pub fn resources(engine: &Engine) -> Result<Option<nubo_backend::HostResources>, String> {
        let b = engine.registry.resolve("libvirt").map_err(|e| e.to_string())?;
        if !b.capabilities().has(nubo_backend::Capability::HostResources) {
            return Hosts::probe(engine).map(|()| None);
        }
        b.host_resources().map(Some).map_err(|e| e.to_string())
    }

    /// Whether libvirtd on `uri` answers with these credentials (a connection and its version).
    pub fn probe(engine: &Engine) -> Result<(), String> {
        let b = engine.registry.resolve("libvirt").map_err(|e| e.to_string())?;
        match b.probe() {
            nubo_backend::Probe::Available { .. } => Ok(()),
            nubo_backend::Probe::Missing { what, package } => Err(format!("{what} is missing: install {package}")),
            nubo_backend::Probe::Broken { error } => Err(error),
        }
    }
}

/// Which host could not be reached, for [`unreachable`].
pub struct Unreachable<'a> {
    /// `namespace/name` of the Provider.
    pub provider: &'a str,
    pub host: &'a str,
    /// The URI as the Provider gives it (not the engine's, which names a private pkipath).
    pub uri: &'a str,
    /// The Provider's credentialsSecretRef name.
    pub secret: &'a str,
}

/// An unreachable host's message for a condition or a Provider's status: the Provider, host and
/// URI, libvirt's own words, and what to fix where a controller runs (the Provider's
/// `hosts[].uri`, its credentials Secret, the host's libvirtd and TLS), not the CLI's
/// `--connect` / `NUBO_LIBVIRT_URI`, which a controller has not.
pub fn unreachable(at: &Unreachable, err: &str) -> String {
    let Unreachable {
        provider,
        host,
        uri,
        secret,
    } = at;
    format!(
        "host `{host}` of Provider `{provider}` at `{uri}` is unreachable ({}): check the Provider's hosts[].uri for `{host}`, that libvirtd on that host listens for TLS (libvirtd --listen, or virtproxyd-tls.socket) and trusts the client certificate, and that the credentialsSecretRef Secret `{secret}` holds that host's CA and a client certificate and key it accepts",
        libvirt_detail(err)
    )
}

/// libvirt's own words in an engine's connection error, without the CLI's advice that follows
/// them (`: start libvirtd ..., or give another URI with --connect ...`) and without the URI
/// (the engine's names the private pkipath).
pub fn libvirt_detail(err: &str) -> String {
    if let Some((_, rest)) = err.split_once("is unreachable (") {
        // `... is unreachable (<detail>): <fix>`; the detail may hold parentheses of its own.
        if let Some(i) = rest.rfind("): ") {
            return rest[..i].to_owned();
        }
        return rest.trim_end_matches(')').to_owned();
    }
    if let Some((_, rest)) = err.split_once("is unreachable: ") {
        return rest.to_owned();
    }
    err.to_owned()
}

/// A reachable host as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// Free memory libvirt reported; `None` when the host's backend cannot report it.
    pub free_memory: Option<u64>,
    /// VMs this controller already has there.
    pub vms: usize,
}

/// The host a new VM goes to: the one with the most free memory; hosts that could not say
/// theirs come after every host that did; ties go to fewer VMs, then to the Provider's order.
/// `None` when no host is reachable.
pub fn choose(hosts: &[Candidate]) -> Option<usize> {
    hosts
        .iter()
        .enumerate()
        .min_by_key(|(i, c)| {
            (
                c.free_memory.is_none(),
                std::cmp::Reverse(c.free_memory.unwrap_or(0)),
                c.vms,
                *i,
            )
        })
        .map(|(i, _)| i)
}

/// A Provider host's name must be a DNS label: it names the host's state directory.
pub fn check_host_name(name: &str) -> Result<(), String> {
    nubo_core::VmName::parse(name).map(|_| ()).map_err(|e| {
        format!(
            "host name `{}` is not a DNS label ({e}): rename it in the Provider",
            name.escape_default()
        )
    })
}

fn write_private(p: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p)
        .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    f.write_all(bytes)
        .map_err(|e| format!("cannot write {}: {e}", p.display()))
}

/// FNV-1a, 32 bits: a stable short name.
pub fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(free: Option<u64>, vms: usize) -> Candidate {
        Candidate { free_memory: free, vms }
    }

    #[test]
    fn choose_most_free_memory_wins() {
        let hosts = [host(Some(2 << 30), 0), host(Some(8 << 30), 9), host(Some(4 << 30), 0)];
        assert_eq!(choose(&hosts), Some(1));
    }

    #[test]
    fn choose_tie_fewer_vms_then_first() {
        assert_eq!(choose(&[host(Some(1 << 30), 3), host(Some(1 << 30), 1)]), Some(1));
        assert_eq!(choose(&[host(Some(1 << 30), 1), host(Some(1 << 30), 1)]), Some(0));
    }

    #[test]
    fn choose_unreported_memory_after_reported() {
        assert_eq!(choose(&[host(None, 0), host(Some(1), 50)]), Some(1));
        assert_eq!(choose(&[host(None, 4), host(None, 2)]), Some(1));
    }

    #[test]
    fn choose_no_reachable_host_none() {
        assert_eq!(choose(&[]), None);
    }

    const AT: Unreachable<'static> = Unreachable {
        provider: "nubo-system/lab",
        host: "hv9",
        uri: "qemu+tls://10.0.0.9/system",
        secret: "lab-tls",
    };

    #[test]
    fn unreachable_names_provider_host_uri_and_the_controllers_fix() {
        // What the engine says: the libvirt backend's words, with the CLI's advice.
        let err = "the libvirt backend is unavailable: libvirt at `qemu+tls://10.0.0.9/system?pkipath=/var/lib/nubo-controller/tls/pki-x` is unreachable (unable to connect to server at '10.0.0.9:16514': Connection refused (os error 111)): start libvirtd (or virtqemud), or give another URI with --connect / NUBO_LIBVIRT_URI";
        let m = unreachable(&AT, err);
        for want in [
            "host `hv9`",
            "Provider `nubo-system/lab`",
            "`qemu+tls://10.0.0.9/system`",
            "unable to connect to server at '10.0.0.9:16514': Connection refused (os error 111)",
            "hosts[].uri",
            "credentialsSecretRef Secret `lab-tls`",
            "libvirtd",
            "TLS",
        ] {
            assert!(m.contains(want), "{want} not in {m}");
        }
        for not in ["--connect", "NUBO_LIBVIRT_URI", "pkipath", "virtqemud), or give"] {
            assert!(!m.contains(not), "{not} in {m}");
        }
    }

    #[test]
    fn unreachable_probe_wording_and_other_text_kept() {
        let m = unreachable(&AT, "libvirt at `x` is unreachable: authentication failed");
        assert!(m.contains("(authentication failed)"), "{m}");
        let m = unreachable(&AT, "libvirtd did not answer within 20 s");
        assert!(m.contains("(libvirtd did not answer within 20 s)"), "{m}");
    }

    #[test]
    fn check_host_name_traversal_refused() {
        for bad in ["../../etc", "a/b", "..", "", "a b", "x\0"] {
            assert!(check_host_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_host_name("hv1").is_ok());
    }

    #[test]
    fn engine_hostile_host_name_makes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = Hosts::new(dir.path(), nubo_core::Cancel::new()).unwrap();
        let key = HostKey {
            namespace: "ns".into(),
            provider: "p".into(),
            host: "../../escape".into(),
        };
        let creds = Credentials {
            ca: b"x".to_vec(),
            cert: b"x".to_vec(),
            key: b"x".to_vec(),
            version: "1".into(),
        };
        assert!(hosts.engine(&key, "qemu+tls://10.0.0.1/system", &creds).is_err());
        assert!(std::fs::read_dir(dir.path().join("tls")).unwrap().next().is_none());
        assert!(!dir.path().join("escape").exists());
    }
}
