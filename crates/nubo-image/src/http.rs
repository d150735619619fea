//! The HTTPS client: ureq on rustls with ring. Trust is the system CA bundle (or the one
//! `SSL_CERT_FILE` names, which replaces it as in OpenSSL) plus any `--ca-cert` files. The
//! caller resolves those paths; this module reads no environment.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

use crate::error::PullError;

/// Where distributions keep the system CA bundle (the list openssl-probe and Go search).
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/ssl/cert.pem",
];

/// A stalled mirror fails the attempt (and is retried with Range) instead of hanging forever.
const READ_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Which CAs to trust.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `SSL_CERT_FILE`: used instead of the system bundle when set.
    pub ca_bundle: Option<PathBuf>,
    /// `--ca-cert FILE`s, trusted in addition (a private mirror's CA).
    pub extra_ca: Vec<PathBuf>,
}

fn load_pem(path: &Path, out: &mut Vec<Certificate<'static>>) -> Result<(), PullError> {
    let bytes = fs::read(path).map_err(|source| PullError::CaFile {
        path: path.to_path_buf(),
        source,
    })?;
    let before = out.len();
    for item in ureq::tls::parse_pem(&bytes) {
        // A bundle with one unreadable entry still has the rest; an empty result is the error.
        if let Ok(PemItem::Certificate(c)) = item {
            out.push(c);
        }
    }
    if out.len() == before {
        return Err(PullError::CaEmpty {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn roots(tls: &TlsSettings) -> Result<Vec<Certificate<'static>>, PullError> {
    let mut certs = Vec::new();
    match &tls.ca_bundle {
        Some(p) => load_pem(p, &mut certs)?,
        None => match SYSTEM_BUNDLES.iter().map(Path::new).find(|p| p.is_file()) {
            Some(p) => load_pem(p, &mut certs)?,
            // With an explicit --ca-cert the system store is optional (air-gapped hosts).
            None if !tls.extra_ca.is_empty() => {}
            None => {
                return Err(PullError::NoSystemCa {
                    tried: SYSTEM_BUNDLES.iter().map(|s| s.to_string()).collect(),
                })
            }
        },
    }
    for p in &tls.extra_ca {
        load_pem(p, &mut certs)?;
    }
    Ok(certs)
}

/// An agent that reports every HTTP status to the caller (Range handling needs 206/416) and
/// follows redirects (mirrors redirect to their nearest node); unless `allow_http`, a redirect
/// to plain http is refused too, not just the first URL.
pub fn agent(tls: &TlsSettings, allow_http: bool) -> Result<ureq::Agent, PullError> {
    let tls_config = TlsConfig::builder()
        .root_certs(RootCerts::Specific(Arc::new(roots(tls)?)))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls_config)
        .http_status_as_error(false)
        .https_only(!allow_http)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_recv_body(None)
        .timeout_per_read(Some(READ_TIMEOUT))
        .user_agent(concat!("nubo/", env!("CARGO_PKG_VERSION")))
        .build()
        .new_agent())
}

/// Refuses anything but https (and http when allowed).
pub fn check_scheme(url: &str, allow_http: bool) -> Result<(), PullError> {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        Ok(())
    } else if lower.starts_with("http://") {
        if allow_http {
            Ok(())
        } else {
            Err(PullError::HttpRefused(url.to_owned()))
        }
    } else {
        Err(PullError::BadUrl(url.to_owned()))
    }
}

/// Checksum files and listings are small; a mirror answering with something huge is wrong.
const TEXT_LIMIT: u64 = 4 << 20;

/// GETs a small text file; `None` for 404/410 so callers can fall back.
pub fn get_text(agent: &ureq::Agent, url: &str) -> Result<Option<String>, PullError> {
    let http = |source| crate::error::http_error(url, source);
    let resp = agent.get(url).call().map_err(http)?;
    match resp.status().as_u16() {
        200 => {}
        404 | 410 => return Ok(None),
        status => {
            return Err(PullError::Status {
                url: url.to_owned(),
                status,
            })
        }
    }
    let mut text = String::new();
    resp.into_body()
        .into_reader()
        .take(TEXT_LIMIT)
        .read_to_string(&mut text)
        .map_err(|e| http(ureq::Error::Io(e)))?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_scheme_http_refused_by_default() {
        let err = check_scheme("http://mirror/x.qcow2", false).unwrap_err();

        assert!(err.to_string().contains("--allow-http"));
    }

    #[test]
    fn check_scheme_http_allowed_when_asked() {
        assert!(check_scheme("HTTP://mirror/x.qcow2", true).is_ok());
    }

    #[test]
    fn check_scheme_file_url_is_bad() {
        assert!(matches!(check_scheme("file:///x", true), Err(PullError::BadUrl(_))));
    }

    #[test]
    fn roots_missing_ca_file_names_it() {
        let tls = TlsSettings {
            ca_bundle: Some("/nonexistent/ca.pem".into()),
            extra_ca: vec![],
        };

        let err = roots(&tls).unwrap_err();

        assert!(err.to_string().contains("/nonexistent/ca.pem"));
    }
}
