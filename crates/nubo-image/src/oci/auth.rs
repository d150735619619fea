//! Registry credentials and challenges, pure where it can be.
//!
//! - [`Challenge::parse`]: a `WWW-Authenticate` header (`Basic realm=...`, `Bearer realm=...,
//!   service=...,scope=...`).
//! - [`AuthFile`]: the `{"auths": {"HOST[:PORT]": {"auth": base64("user:password")}}}` format
//!   that docker's `~/.docker/config.json`, containers' `$REGISTRY_AUTH_FILE` and nubo's own file
//!   share. nubo writes only its own file (0600); the others are read.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::path::Path;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// An auth file is a few hundred bytes per registry; anything bigger is not one.
const MAX_AUTH_FILE: u64 = 1 << 20;

#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never in a log or an error.
        write!(f, "Credentials {{ username: {:?}, password: <hidden> }}", self.username)
    }
}

impl Credentials {
    /// `Basic <base64(user:password)>`.
    pub fn basic_header(&self) -> String {
        format!("Basic {}", encode(&self.username, &self.password))
    }
}

fn encode(user: &str, password: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

/// What a registry asks for in its `WWW-Authenticate` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

impl Challenge {
    /// Parses `Basic realm="x"` or `Bearer realm="https://auth/token",service="reg",scope="repository:a/b:pull"`.
    /// `None` for any other scheme or a Bearer without a realm.
    pub fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        if scheme.eq_ignore_ascii_case("basic") {
            return Some(Challenge::Basic);
        }
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let params = params(rest);
        Some(Challenge::Bearer {
            realm: params.get("realm")?.clone(),
            service: params.get("service").cloned(),
            scope: params.get("scope").cloned(),
        })
    }
}

/// `k="v",k2=v2` (quoted values may hold commas; `\"` escapes).
fn params(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && *c != ',')).collect();
        if key.is_empty() {
            return out;
        }
        let mut value = String::new();
        if chars.next_if_eq(&'=').is_some() {
            if chars.next_if_eq(&'"').is_some() {
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => value.extend(chars.next()),
                        '"' => break,
                        c => value.push(c),
                    }
                }
            } else {
                value = std::iter::from_fn(|| chars.next_if(|c| *c != ',')).collect();
            }
        }
        out.insert(key.trim().to_ascii_lowercase(), value.trim().to_owned());
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AuthFile {
    #[serde(default)]
    pub auths: BTreeMap<String, AuthEntry>,
    /// Everything else (docker's credsStore, proxies...) is kept as it was.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AuthEntry {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<String>,
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthFileError {
    #[error("reading credentials {}", path.display())]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: nubo_core::FileError,
    },
    #[error("credentials file {} is not JSON of the `{{\"auths\": ...}}` form: fix or remove it", path.display())]
    Parse {
        path: std::path::PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("credentials for `{registry}` in {} are not base64 of `user:password`: run `nubo registry login {registry}` again", path.display())]
    BadEntry { registry: String, path: std::path::PathBuf },
    #[error("writing credentials {}", path.display())]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },
}

impl AuthFileError {
    pub fn kind(&self) -> nubo_core::ErrorKind {
        match self {
            AuthFileError::Read { source, .. } => source.kind(),
            AuthFileError::Parse { .. } | AuthFileError::BadEntry { .. } => nubo_core::ErrorKind::InvalidInput,
            AuthFileError::Write { .. } => nubo_core::ErrorKind::Io,
        }
    }
}

impl AuthFile {
    /// Reads `path`; a missing file is an empty one.
    pub fn load(path: &Path) -> Result<AuthFile, AuthFileError> {
        if !path.exists() {
            return Ok(AuthFile::default());
        }
        let bytes = nubo_core::file::read_bounded(path, "registry credentials", MAX_AUTH_FILE).map_err(|source| {
            AuthFileError::Read {
                path: path.to_path_buf(),
                source,
            }
        })?;
        serde_json::from_slice(&bytes).map_err(|source| AuthFileError::Parse {
            path: path.to_path_buf(),
            source,
        })
    }

    /// The credentials for `registry` (`host[:port]`), also under the keys docker writes
    /// (`https://host/`, `host/v2/`).
    pub fn get(&self, registry: &str, path: &Path) -> Result<Option<Credentials>, AuthFileError> {
        let entry = self.auths.iter().find(|(k, _)| key_host(k) == registry).map(|(_, v)| v);
        let Some(auth) = entry.and_then(|e| e.auth.as_deref()).filter(|a| !a.is_empty()) else {
            return Ok(None);
        };
        let bad = || AuthFileError::BadEntry {
            registry: registry.to_owned(),
            path: path.to_path_buf(),
        };
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .map_err(|_| bad())?;
        let text = String::from_utf8(decoded).map_err(|_| bad())?;
        let (username, password) = text.split_once(':').ok_or_else(bad)?;
        Ok(Some(Credentials {
            username: username.to_owned(),
            password: password.to_owned(),
        }))
    }

    pub fn set(&mut self, registry: &str, c: &Credentials) {
        self.auths.retain(|k, _| key_host(k) != registry);
        self.auths.insert(
            registry.to_owned(),
            AuthEntry {
                auth: Some(encode(&c.username, &c.password)),
                other: BTreeMap::new(),
            },
        );
    }

    /// Removes `registry`'s entry; whether there was one.
    pub fn remove(&mut self, registry: &str) -> bool {
        let before = self.auths.len();
        self.auths.retain(|k, _| key_host(k) != registry);
        self.auths.len() != before
    }

    /// Writes the file atomically with mode 0600 (its directory made 0700 if missing).
    pub fn save(&self, path: &Path) -> Result<(), AuthFileError> {
        let err = |source| AuthFileError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(err)?;
            }
        }
        let mut bytes = serde_json::to_vec_pretty(self).expect("an auth file always serialises");
        bytes.push(b'\n');
        nubo_core::file::write_output(path, &bytes, 0o600).map_err(|e| match e {
            nubo_core::FileError::Io { error, .. } => err(error),
            other => err(io::Error::new(io::ErrorKind::InvalidInput, other.to_string())),
        })
    }
}

/// `https://host:5000/v2/` -> `host:5000`; docker keys its entries either way.
fn key_host(k: &str) -> &str {
    let k = k.split_once("://").map_or(k, |(_, rest)| rest);
    k.split('/').next().unwrap_or(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenge_bearer_with_quoted_comma_parses() {
        let h =
            r#"Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push""#;

        let c = Challenge::parse(h).unwrap();

        assert_eq!(
            c,
            Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry.example".into()),
                scope: Some("repository:a/b:pull,push".into()),
            }
        );
    }

    #[test]
    fn challenge_basic_parses() {
        assert_eq!(Challenge::parse(r#"Basic realm="basic-realm""#), Some(Challenge::Basic));
    }

    #[test]
    fn challenge_bearer_without_realm_is_none() {
        assert_eq!(Challenge::parse(r#"Bearer service="x""#), None);
    }

    #[test]
    fn challenge_unknown_scheme_is_none() {
        assert_eq!(Challenge::parse("Negotiate abc"), None);
    }

    #[test]
    fn auth_file_docker_url_key_found_by_host() {
        let f: AuthFile = serde_json::from_str(
            r#"{"auths":{"https://reg.example:5000/v2/":{"auth":"dXNlcjpwYTpzcw=="}},"credsStore":"x"}"#,
        )
        .unwrap();

        let c = f.get("reg.example:5000", Path::new("c.json")).unwrap().unwrap();

        assert_eq!((c.username.as_str(), c.password.as_str()), ("user", "pa:ss"));
    }

    #[test]
    fn auth_file_bad_base64_names_registry() {
        let f: AuthFile = serde_json::from_str(r#"{"auths":{"r.io":{"auth":"%%%"}}}"#).unwrap();

        let err = f.get("r.io", Path::new("c.json")).unwrap_err();

        assert!(err.to_string().contains("nubo registry login r.io"), "{err}");
    }

    #[test]
    fn auth_file_save_is_0600_and_round_trips_other_keys() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/auth.json");
        let mut f: AuthFile = serde_json::from_str(r#"{"auths":{},"credsStore":"pass"}"#).unwrap();
        let c = Credentials {
            username: "u".into(),
            password: "p".into(),
        };

        f.set("r.io:5000", &c);
        f.save(&path).unwrap();
        let back = AuthFile::load(&path).unwrap();

        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(back.get("r.io:5000", &path).unwrap(), Some(c));
        assert!(back.other.contains_key("credsStore"));
    }

    #[test]
    fn credentials_debug_hides_password() {
        let c = Credentials {
            username: "u".into(),
            password: "secret".into(),
        };

        assert!(!format!("{c:?}").contains("secret"));
    }
}

/// Where a pull finds a registry's credentials, given by whoever builds the
/// [`crate::PullConfig`]: the CLI names its auth files (`nubo registry login`'s, then
/// `$REGISTRY_AUTH_FILE`, then docker's), a daemon hands over what it read from its own secret.
/// The library reads the files when a pull needs them, never an environment variable.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialSource {
    /// Credentials held in memory, by registry `host[:port]`: looked at first.
    pub entries: BTreeMap<String, Credentials>,
    /// Auth files in the `auths` format docker and podman write, in order: the first with an
    /// entry for the registry wins; a missing file is skipped.
    pub files: Vec<std::path::PathBuf>,
}

impl CredentialSource {
    /// The credentials for `registry` (`host[:port]`), or none; an unreadable or malformed
    /// file is an error naming it.
    pub fn lookup(&self, registry: &str) -> Result<Option<Credentials>, AuthFileError> {
        if let Some(c) = self.entries.get(registry) {
            return Ok(Some(c.clone()));
        }
        for path in &self.files {
            if let Some(c) = AuthFile::load(path)?.get(registry, path)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod source_tests {
    use super::*;

    fn creds(u: &str) -> Credentials {
        Credentials {
            username: u.into(),
            password: "pw".into(),
        }
    }

    fn file_with(dir: &Path, name: &str, registry: &str, c: &Credentials) -> std::path::PathBuf {
        let mut f = AuthFile::default();
        f.set(registry, c);
        let path = dir.join(name);
        std::fs::write(&path, serde_json::to_vec(&f).unwrap()).unwrap();
        path
    }

    #[test]
    fn credential_source_entries_win_over_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = file_with(dir.path(), "a.json", "127.0.0.1:5000", &creds("fromfile"));
        let mut src = CredentialSource {
            files: vec![file],
            ..Default::default()
        };
        src.entries.insert("127.0.0.1:5000".into(), creds("secret"));

        assert_eq!(src.lookup("127.0.0.1:5000").unwrap(), Some(creds("secret")));
    }

    #[test]
    fn credential_source_first_file_with_entry_wins_missing_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let other = file_with(dir.path(), "a.json", "other:5000", &creds("other"));
        let second = file_with(dir.path(), "b.json", "127.0.0.1:5000", &creds("second"));
        let third = file_with(dir.path(), "c.json", "127.0.0.1:5000", &creds("third"));
        let src = CredentialSource {
            files: vec![dir.path().join("missing.json"), other, second, third],
            ..Default::default()
        };

        assert_eq!(src.lookup("127.0.0.1:5000").unwrap(), Some(creds("second")));
        assert_eq!(src.lookup("nowhere:1").unwrap(), None);
    }

    #[test]
    fn credential_source_malformed_file_is_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, b"{not json").unwrap();
        let src = CredentialSource {
            files: vec![bad],
            ..Default::default()
        };

        let err = src.lookup("127.0.0.1:5000").unwrap_err();

        assert!(err.to_string().contains("bad.json"), "{err}");
    }
}
