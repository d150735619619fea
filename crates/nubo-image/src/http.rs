//! The HTTPS client: ureq on rustls with ring. Trust is the system CA bundle (or the one
//! `SSL_CERT_FILE` names, which replaces it as in OpenSSL) plus any `--ca-cert` files. The
//! caller resolves those paths; this module reads no environment.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nubo_core::Cancel;
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

const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a server may take, as curl's `--max-time` and `--speed-limit/--speed-time`:
/// every request but a bulk transfer's body has a total deadline (`--timeout`); a bulk body
/// (an image, a blob, an upload chunk) is instead refused when it moves slower than
/// `speed_limit` bytes/s over any `speed_time` window, so a server that drips bytes fails
/// however large the file, and a slow but steady link does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// `--timeout`: a whole request (connect, redirects, headers, a small body).
    pub timeout: Duration,
    /// `--speed-limit`: bytes per second a bulk transfer must average over each window.
    pub speed_limit: u64,
    /// `--speed-time`: the window; also the longest a bulk read may wait for one byte.
    pub speed_time: Duration,
}

impl Default for Limits {
    /// 2 minutes for a manifest, a token or a checksum file is generous on any link that can
    /// carry a disk image; 1 KiB/s over 60 s is what a stalled mirror or a hostile server gives,
    /// far below any link worth waiting for.
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(120),
            speed_limit: 1024,
            speed_time: Duration::from_secs(60),
        }
    }
}

impl Limits {
    /// A GET of a bulk transfer: the deadline covers the response's headers only; the body is
    /// watched by a [`RateGuard`] (and no read may wait longer than `speed_time`).
    pub fn bulk_get(
        &self,
        req: ureq::RequestBuilder<ureq::typestate::WithoutBody>,
    ) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        req.config()
            .timeout_global(None)
            .timeout_recv_response(Some(self.timeout))
            .timeout_per_read(Some(self.speed_time))
            .build()
    }

    /// [`Limits::bulk_get`] for any request (an upload's chunk).
    pub fn bulk<S: ureq::AsSendBody>(
        &self,
        agent: &ureq::Agent,
        req: ureq::http::Request<S>,
    ) -> ureq::http::Request<S> {
        agent
            .configure_request(req)
            .timeout_global(None)
            .timeout_recv_response(Some(self.timeout))
            .timeout_per_read(Some(self.speed_time))
            .timeout_per_write(Some(self.speed_time))
            .build()
    }
}

/// The error a [`RateGuard`] reads with: the transfer was too slow.
#[derive(Debug)]
pub struct TooSlow {
    pub bytes: u64,
    pub secs: u64,
    pub limits: Limits,
}

impl std::fmt::Display for TooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes in {} s, slower than {} bytes/s (--speed-limit) over {} s (--speed-time)",
            self.bytes,
            self.secs,
            self.limits.speed_limit,
            self.limits.speed_time.as_secs()
        )
    }
}

impl std::error::Error for TooSlow {}

/// The [`TooSlow`] inside an I/O error, if that is what it is.
pub fn too_slow(e: &io::Error) -> Option<&TooSlow> {
    e.get_ref().and_then(|inner| inner.downcast_ref::<TooSlow>())
}

/// A reader that fails with [`TooSlow`] when fewer than `speed_limit × speed_time` bytes pass
/// through it in a `speed_time` window (curl's `--speed-limit/--speed-time`).
pub struct RateGuard<R> {
    inner: R,
    limits: Limits,
    window_start: Instant,
    window_bytes: u64,
    cancel: Option<Cancel>,
}

impl<R> RateGuard<R> {
    pub fn new(inner: R, limits: Limits) -> Self {
        RateGuard {
            inner,
            limits,
            window_start: Instant::now(),
            window_bytes: 0,
            cancel: None,
        }
    }

    /// Ends the transfer at the next read once `cancel` is tripped, with an error
    /// [`is_cancelled`] tells apart (a read already waiting ends when bytes come or the
    /// `speed_time` window passes).
    pub fn cancellable(mut self, cancel: Option<&Cancel>) -> Self {
        self.cancel = cancel.cloned();
        self
    }
}

/// The error a [`RateGuard`] read returns once its token was cancelled.
#[derive(Debug, thiserror::Error)]
#[error("cancelled")]
pub struct Cancelled;

/// Whether `e` is a [`RateGuard`]'s cancellation (not a transfer failure to retry).
pub fn is_cancelled(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Cancelled>())
}

impl<R: Read> Read for RateGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.cancel.as_ref().is_some_and(Cancel::is_cancelled) {
            return Err(io::Error::other(Cancelled));
        }
        let n = self.inner.read(buf)?;
        self.window_bytes += n as u64;
        let elapsed = self.window_start.elapsed();
        if elapsed >= self.limits.speed_time && !buf.is_empty() {
            let need = self.limits.speed_limit.saturating_mul(elapsed.as_secs().max(1));
            if self.window_bytes < need && n > 0 {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    TooSlow {
                        bytes: self.window_bytes,
                        secs: elapsed.as_secs(),
                        limits: self.limits,
                    },
                ));
            }
            self.window_start = Instant::now();
            self.window_bytes = 0;
        }
        Ok(n)
    }
}

/// Which CAs to trust.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// `SSL_CERT_FILE`: used instead of the system bundle when set.
    pub ca_bundle: Option<PathBuf>,
    /// `--ca-cert FILE`s, trusted in addition (a private mirror's CA).
    pub extra_ca: Vec<PathBuf>,
}

/// The largest CA bundle read: system bundles are a few hundred KiB.
const MAX_CA_FILE: u64 = 16 << 20;

/// What a non-regular CA path is, without repeating the path the caller's error names.
fn kind_of(e: &nubo_core::FileError) -> String {
    match e {
        nubo_core::FileError::NotRegular { kind, .. } => format!("{kind}, not a regular file"),
        other => other.to_string(),
    }
}

fn load_pem(path: &Path, out: &mut Vec<Certificate<'static>>) -> Result<(), PullError> {
    // Bounded and regular files only: `--ca-cert /dev/zero` must not read until memory runs out.
    let ca_err = |source| PullError::CaFile {
        path: path.to_path_buf(),
        source,
    };
    let file = nubo_core::file::open_regular(path, "CA file").map_err(|e| match e {
        nubo_core::FileError::Io { error, .. } => ca_err(error),
        other => ca_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, kind_of(&other))),
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_CA_FILE + 1).read_to_end(&mut bytes).map_err(ca_err)?;
    if bytes.len() as u64 > MAX_CA_FILE {
        return Err(ca_err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("larger than the {MAX_CA_FILE} bytes nubo reads for a CA file"),
        )));
    }
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
/// follows no redirects itself: [`send`] follows them, checking each target's scheme, so a
/// redirect to `file://` or (without `allow_http`) to plain http is refused by name.
/// Every request has `limits.timeout` as its total deadline unless it is a bulk transfer
/// ([`Limits::bulk`]).
pub fn agent(tls: &TlsSettings, allow_http: bool, limits: &Limits) -> Result<ureq::Agent, PullError> {
    let tls_config = TlsConfig::builder()
        .root_certs(RootCerts::Specific(Arc::new(roots(tls)?)))
        .build();
    Ok(ureq::Agent::config_builder()
        .tls_config(tls_config)
        .http_status_as_error(false)
        .https_only(!allow_http)
        .max_redirects(0)
        .timeout_global(Some(limits.timeout))
        .timeout_connect(Some(CONNECT_TIMEOUT.min(limits.timeout)))
        .timeout_per_read(Some(limits.speed_time))
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

/// Mirrors redirect to their nearest node, sometimes twice; more than this is a loop.
const MAX_REDIRECTS: u32 = 10;

/// Why [`send`] returned no response.
#[derive(Debug)]
pub enum SendError {
    /// The transport failed (DNS, connect, TLS, I/O): the caller decides whether to retry.
    Transport(ureq::Error),
    /// A redirect nubo does not follow; never worth retrying.
    Refused(PullError),
}

impl SendError {
    /// The error for a caller that does not retry.
    pub fn into_pull_error(self, url: &str) -> PullError {
        match self {
            SendError::Transport(e) => crate::error::http_error(url, e),
            SendError::Refused(e) => e,
        }
    }
}

/// How [`send_with`] may talk to the URLs it is sent to.
#[derive(Debug, Clone, Copy, Default)]
pub struct SendOptions<'a> {
    /// Plain http to any host (`--allow-http`).
    pub allow_http: bool,
    /// Plain http to this `host:port` only (an OCI registry given `--insecure-registry`).
    pub http_host: Option<&'a str>,
    /// `Authorization`, sent only while the URL stays on the first URL's origin: a redirect to
    /// another host (a registry's blob storage) never carries the registry's credentials.
    pub auth: Option<&'a str>,
    /// A bulk transfer ([`Limits::bulk_get`]) rather than a small answer under the deadline.
    pub bulk: Option<Limits>,
}

/// GETs `url` (from byte `range_from` when given), following up to [`MAX_REDIRECTS`] redirects
/// to https (or http with `allow_http`) URLs only.
pub fn send(
    agent: &ureq::Agent,
    url: &str,
    range_from: Option<u64>,
    allow_http: bool,
) -> Result<ureq::http::Response<ureq::Body>, SendError> {
    send_with(
        agent,
        url,
        range_from,
        &SendOptions {
            allow_http,
            ..Default::default()
        },
    )
}

/// [`send`] with credentials and a per-host plain-http allowance.
pub fn send_with(
    agent: &ureq::Agent,
    url: &str,
    range_from: Option<u64>,
    opts: &SendOptions<'_>,
) -> Result<ureq::http::Response<ureq::Body>, SendError> {
    let first_origin = origin(url);
    let mut current = url.to_owned();
    for _ in 0..=MAX_REDIRECTS {
        let mut req = agent.get(&current);
        if let Some(limits) = &opts.bulk {
            req = limits.bulk_get(req);
        }
        if let Some(offset) = range_from {
            req = req.header("Range", format!("bytes={offset}-"));
        }
        if let Some(auth) = opts.auth.filter(|_| origin(&current) == first_origin) {
            req = req.header("Authorization", auth);
        }
        let resp = req.call().map_err(SendError::Transport)?;
        if !matches!(resp.status().as_u16(), 301 | 302 | 303 | 307 | 308) {
            return Ok(resp);
        }
        let Some(location) = resp.headers().get("location").and_then(|v| v.to_str().ok()) else {
            return Ok(resp);
        };
        let next = join_url(&current, location);
        let http_ok = opts.allow_http || opts.http_host.is_some_and(|h| host_port(&next) == h);
        check_redirect(&current, &next, http_ok).map_err(SendError::Refused)?;
        current = next;
    }
    Err(SendError::Refused(PullError::TooManyRedirects {
        url: url.to_owned(),
        max: MAX_REDIRECTS,
    }))
}

/// `scheme://host:port` of a URL, lowercased, for "same origin" checks.
pub(crate) fn origin(url: &str) -> String {
    let scheme = url.split_once("://").map_or("https", |(s, _)| s).to_ascii_lowercase();
    format!("{scheme}://{}", host_port(url).to_ascii_lowercase())
}

fn check_redirect(from: &str, to: &str, allow_http: bool) -> Result<(), PullError> {
    let lower = to.to_ascii_lowercase();
    if lower.starts_with("https://") || (allow_http && lower.starts_with("http://")) {
        Ok(())
    } else {
        Err(PullError::RedirectRefused {
            from: from.to_owned(),
            to: nubo_core::file::escape_control(to),
        })
    }
}

/// `location` resolved against `base` (RFC 3986 references, the forms servers send).
pub(crate) fn join_url(base: &str, location: &str) -> String {
    if location.contains("://") || location.split(['/', '?', '#']).next().is_some_and(|s| s.contains(':')) {
        return location.to_owned();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("https", base));
    if let Some(net) = location.strip_prefix("//") {
        return format!("{scheme}://{net}");
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let origin = format!("{scheme}://{}", &rest[..authority_end]);
    if location.starts_with('/') {
        return format!("{origin}{location}");
    }
    let path = rest[authority_end..].split(['?', '#']).next().unwrap_or("");
    let dir = path.rfind('/').map_or("/", |i| &path[..=i]);
    format!("{origin}{dir}{location}")
}

/// `host:port` of an http(s) URL, for connection errors.
pub fn host_port(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("https", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let has_port = authority.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']'));
    if has_port {
        authority.to_owned()
    } else if scheme.eq_ignore_ascii_case("http") {
        format!("{authority}:80")
    } else {
        format!("{authority}:443")
    }
}

/// The host part of [`host_port`].
pub fn host(url: &str) -> String {
    let hp = host_port(url);
    hp.rsplit_once(':').map_or(hp.clone(), |(h, _)| h.to_owned())
}

/// Checksum files and listings are small; a mirror answering with something huge is wrong.
const TEXT_LIMIT: u64 = 4 << 20;

/// GETs a small text file; `None` for 404/410 so callers can fall back.
pub fn get_text(agent: &ureq::Agent, url: &str, allow_http: bool) -> Result<Option<String>, PullError> {
    let resp = send(agent, url, None, allow_http).map_err(|e| e.into_pull_error(url))?;
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
        .map_err(|e| crate::error::http_error(url, ureq::Error::Io(e)))?;
    Ok(Some(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Yields one byte per read, `pause` apart.
    struct Drip(std::time::Duration);

    impl Read for Drip {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            std::thread::sleep(self.0);
            buf[0] = b'x';
            Ok(1)
        }
    }

    #[test]
    fn rate_guard_drip_below_limit_fails_too_slow() {
        let limits = Limits {
            timeout: Duration::from_secs(1),
            speed_limit: 100,
            speed_time: Duration::from_secs(1),
        };
        let mut r = RateGuard::new(Drip(Duration::from_millis(100)), limits);
        let mut buf = [0u8; 16];

        let err = (0..30).find_map(|_| r.read(&mut buf).err()).unwrap();

        let slow = too_slow(&err).unwrap();
        assert!(slow.bytes < 100 && err.to_string().contains("--speed-limit"), "{err}");
    }

    #[test]
    fn rate_guard_fast_reader_passes() {
        let limits = Limits {
            timeout: Duration::from_secs(1),
            speed_limit: 1,
            speed_time: Duration::from_secs(1),
        };
        let data = vec![1u8; 1 << 20];
        let mut r = RateGuard::new(&data[..], limits);

        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();

        assert_eq!(out.len(), 1 << 20);
    }

    #[test]
    fn origin_other_port_with_same_prefix_differs() {
        assert_ne!(origin("https://reg:50001/v2/x"), origin("https://reg:5000/v2/"));
    }

    #[test]
    fn origin_default_port_spelled_out_is_same() {
        assert_eq!(origin("https://REG:443/v2/x"), origin("https://reg"));
    }

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
    fn check_redirect_file_scheme_refused_names_target() {
        let err = check_redirect("https://m/x", "file:///etc/passwd", true).unwrap_err();

        assert!(
            err.to_string().contains("file:///etc/passwd") && err.to_string().contains("only https"),
            "{err}"
        );
    }

    #[test]
    fn check_redirect_http_refused_without_allow_http() {
        assert!(check_redirect("https://m/x", "http://m/x", false).is_err());
    }

    #[test]
    fn join_url_absolute_path_keeps_origin() {
        assert_eq!(join_url("https://h:1/a/b?q", "/c/d"), "https://h:1/c/d");
    }

    #[test]
    fn join_url_relative_is_beside_current() {
        assert_eq!(join_url("https://h/a/b", "c"), "https://h/a/c");
    }

    #[test]
    fn join_url_other_scheme_is_kept_as_is() {
        assert_eq!(join_url("https://h/a", "file:///x"), "file:///x");
    }

    #[test]
    fn host_port_defaults_https_port() {
        assert_eq!(host_port("https://cloud.debian.org/images/x"), "cloud.debian.org:443");
    }

    #[test]
    fn host_port_keeps_explicit_port() {
        assert_eq!(host_port("https://127.0.0.1:9/x"), "127.0.0.1:9");
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
