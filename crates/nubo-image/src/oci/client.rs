//! A small OCI distribution client over the tree's one HTTP stack (ureq on rustls with ring):
//! manifests, blobs (HEAD, resumable verified GET, chunked upload), tag lists, and the
//! anonymous / Basic / Bearer-token auth flows. Plain http only to the one registry given
//! `insecure`, never to a redirect or token service elsewhere.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use ureq::http::{Method, Request, Response};
use ureq::{Body, SendBody};

use super::auth::{Challenge, Credentials};
use super::error::OciError;
use super::manifest::{ACCEPT, MANIFEST_V1, MAX_MANIFEST};
use crate::digest::Digests;
use crate::download::{fetch, DownloadEvent, Fetch};
use crate::http::{self, TlsSettings};

/// Upload chunk: large blobs go up in PATCHes of this size (the distribution spec's chunked
/// upload), so a proxy's body limit is never hit and progress is per chunk.
pub const CHUNK: u64 = 64 << 20;

/// Pause before a failed chunk is retried, doubled each attempt.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// A blob being uploaded: read in order, rewound to the registry's offset when a chunk is
/// retried.
pub trait ReadSeek: Read + Seek {}
impl<T: Read + Seek> ReadSeek for T {}

/// What an upload reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadEvent {
    /// Bytes the registry accepted so far.
    Sent(u64),
    /// A chunk failed in transit; going on from `offset`, what the registry kept.
    Retry { attempt: u32, offset: u64, error: String },
}

/// A registry's error body or token answer is small; more is not read.
const SMALL: u64 = 64 << 10;

/// Most tags one `ls-remote` lists (pages of 1000, bounded).
const MAX_TAGS: usize = 10_000;

#[derive(Debug, Clone, Default)]
pub struct ClientSettings {
    pub tls: TlsSettings,
    /// Plain http to this registry (and only to it).
    pub insecure: bool,
    pub credentials: Option<Credentials>,
    /// Reconnections per blob after a transient failure.
    pub retries: u32,
    /// `--timeout`, `--speed-limit`, `--speed-time`.
    pub limits: http::Limits,
    /// Ends blob transfers between reads once tripped (a download keeps its partial).
    pub cancel: Option<nubo_core::Cancel>,
}

pub struct Client {
    agent: ureq::Agent,
    /// `host[:port]` as the user wrote it.
    pub registry: String,
    base: String,
    /// `host:port` that may be spoken to in plain http (insecure registries only).
    http_host: Option<String>,
    credentials: Option<Credentials>,
    /// The `Authorization` value that worked last (Basic, or a Bearer token).
    auth: Mutex<Option<String>>,
    retries: u32,
    limits: http::Limits,
    cancel: Option<nubo_core::Cancel>,
}

/// A request body that can be sent again after a 401 (bytes), or not (a stream, sent only
/// once authentication is settled).
pub enum Payload<'a> {
    Empty,
    Bytes(&'a [u8]),
    Stream(&'a mut dyn Read, u64),
}

impl Client {
    pub fn new(registry: &str, s: &ClientSettings) -> Result<Client, OciError> {
        let agent = http::agent(&s.tls, s.insecure, &s.limits).map_err(|e| OciError::Setup(Box::new(e)))?;
        let scheme = if s.insecure { "http" } else { "https" };
        let base = format!("{scheme}://{registry}");
        Ok(Client {
            agent,
            registry: registry.to_owned(),
            http_host: s.insecure.then(|| http::host_port(&base)),
            base,
            credentials: s.credentials.clone(),
            auth: Mutex::new(None),
            retries: s.retries,
            limits: s.limits,
            cancel: s.cancel.clone(),
        })
    }

    /// Whether `url` is on the registry's own origin: scheme, host and port (`https://reg/`
    /// is `https://reg:443/`; `https://reg:50001/` is not `https://reg:5000/`, which a bare
    /// prefix test accepted).
    fn on_origin(&self, url: &str) -> bool {
        http::origin(url) == http::origin(&self.base)
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn current_auth(&self) -> Option<String> {
        self.auth.lock().map(|a| a.clone()).unwrap_or(None)
    }

    fn transport(&self, url: &str, e: ureq::Error) -> OciError {
        let registry = self.registry.clone();
        let url_shown = || nubo_core::file::escape_control(url);
        if crate::error::is_deadline(&e) {
            return OciError::Deadline {
                registry,
                url: url_shown(),
                secs: self.limits.timeout.as_secs(),
            };
        }
        if let Some(slow) = match &e {
            ureq::Error::Io(io) => http::too_slow(io),
            _ => None,
        } {
            return OciError::TooSlow {
                registry,
                url: url_shown(),
                why: slow.to_string(),
            };
        }
        if crate::error::is_connect(&e) {
            OciError::Unreachable { registry, source: e }
        } else if matches!(e, ureq::Error::HostNotFound) || e.to_string().contains("failed to lookup address") {
            OciError::Dns { registry, source: e }
        } else if crate::error::is_tls(&e) {
            OciError::Untrusted { registry, source: e }
        } else {
            OciError::Transport {
                registry,
                url: url.to_owned(),
                source: e,
            }
        }
    }

    fn once(
        &self,
        method: &Method,
        url: &str,
        headers: &[(&str, &str)],
        body: &mut Payload<'_>,
    ) -> Result<Response<Body>, OciError> {
        let mut b = Request::builder().method(method.clone()).uri(url);
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        if let Some(a) = self.current_auth() {
            b = b.header("Authorization", a);
        }
        let bad = |e: ureq::http::Error| OciError::Transport {
            registry: self.registry.clone(),
            url: url.to_owned(),
            source: ureq::Error::Http(e),
        };
        let r = match body {
            Payload::Empty => self.agent.run(b.body(()).map_err(bad)?),
            Payload::Bytes(bytes) => self.agent.run(
                b.header("Content-Length", bytes.len().to_string())
                    .body(*bytes)
                    .map_err(bad)?,
            ),
            Payload::Stream(reader, len) => {
                // A chunk of an upload: watched for its rate, not held to the deadline.
                let mut guarded = http::RateGuard::new(&mut **reader, self.limits).cancellable(self.cancel.as_ref());
                let req = b
                    .header("Content-Length", len.to_string())
                    .body(SendBody::from_reader(&mut guarded))
                    .map_err(bad)?;
                self.agent.run(self.limits.bulk(&self.agent, req))
            }
        };
        r.map_err(|e| self.transport(url, e))
    }

    /// Sends a request; on a 401 with a challenge it authenticates (Basic with the stored
    /// credentials, or a Bearer token for the challenge's scope) and sends it once more.
    pub fn request(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        mut body: Payload<'_>,
        what: &str,
    ) -> Result<Response<Body>, OciError> {
        let resp = self.once(&method, url, headers, &mut body)?;
        if resp.status().as_u16() != 401 || matches!(body, Payload::Stream(..)) {
            return self.checked(resp, what);
        }
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .and_then(Challenge::parse);
        let Some(challenge) = challenge else {
            return self.checked(resp, what);
        };
        let had = self.current_auth();
        let header = match challenge {
            Challenge::Basic => match &self.credentials {
                Some(c) => c.basic_header(),
                None => return Err(self.unauthorized(what)),
            },
            Challenge::Bearer { realm, service, scope } => self.token(&realm, service.as_deref(), scope.as_deref())?,
        };
        if had.as_deref() == Some(header.as_str()) {
            // The same credentials were refused already.
            return Err(self.unauthorized(what));
        }
        if let Ok(mut a) = self.auth.lock() {
            *a = Some(header);
        }
        let resp = self.once(&method, url, headers, &mut body)?;
        self.checked(resp, what)
    }

    fn unauthorized(&self, what: &str) -> OciError {
        OciError::Unauthorized {
            registry: self.registry.clone(),
            what: what.to_owned(),
        }
    }

    /// 2xx and 3xx pass; 401/403 are told apart; the rest carry the registry's own message.
    fn checked(&self, resp: Response<Body>, what: &str) -> Result<Response<Body>, OciError> {
        let status = resp.status().as_u16();
        match status {
            200..=399 | 404 | 416 => Ok(resp),
            401 => Err(self.unauthorized(what)),
            403 => Err(OciError::Forbidden {
                registry: self.registry.clone(),
                what: what.to_owned(),
            }),
            _ => Err(OciError::Status {
                registry: self.registry.clone(),
                what: what.to_owned(),
                status,
                detail: error_detail(resp),
            }),
        }
    }

    /// The Bearer token flow: GET realm?service=..&scope=.., with Basic credentials if any.
    fn token(&self, realm: &str, service: Option<&str>, scope: Option<&str>) -> Result<String, OciError> {
        let token_err = |why: String| OciError::Token {
            registry: self.registry.clone(),
            why,
        };
        let lower = realm.to_ascii_lowercase();
        let plain_ok = self.http_host.as_deref().is_some_and(|h| http::host_port(realm) == h);
        if !(lower.starts_with("https://") || (lower.starts_with("http://") && plain_ok)) {
            return Err(token_err(format!(
                "with realm `{}`, which is not https (credentials are never sent in plain http to another host)",
                nubo_core::file::escape_control(realm)
            )));
        }
        let mut url = realm.to_owned();
        let mut sep = if url.contains('?') { '&' } else { '?' };
        for (k, v) in [("service", service), ("scope", scope)] {
            if let Some(v) = v {
                url.push(sep);
                url.push_str(k);
                url.push('=');
                url.push_str(&percent_encode(v));
                sep = '&';
            }
        }
        let mut req = self.agent.get(&url);
        if let Some(c) = &self.credentials {
            req = req.header("Authorization", c.basic_header());
        }
        let resp = req.call().map_err(|e| self.transport(&url, e))?;
        match resp.status().as_u16() {
            200 => {}
            401 | 403 => return Err(self.unauthorized("a token")),
            s => return Err(token_err(format!("HTTP {s}"))),
        }
        let mut text = String::new();
        resp.into_body()
            .into_reader()
            .take(SMALL)
            .read_to_string(&mut text)
            .map_err(|e| self.transport(&url, ureq::Error::from(e)))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| token_err(format!("no JSON ({e})")))?;
        let token = v
            .get("token")
            .or_else(|| v.get("access_token"))
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()))
            .ok_or_else(|| token_err("without a usable token".into()))?;
        Ok(format!("Bearer {token}"))
    }

    /// `GET /v2/`: whether the registry answers and accepts our credentials (login's check).
    pub fn ping(&self) -> Result<(), OciError> {
        let url = self.url("/v2/");
        let resp = self.request(Method::GET, &url, &[], Payload::Empty, "the API check (/v2/)")?;
        match resp.status().as_u16() {
            200..=299 => Ok(()),
            status => Err(OciError::Status {
                registry: self.registry.clone(),
                what: "the API check (/v2/)".into(),
                status,
                detail: Some("this is not an OCI registry (no /v2/ API)".into()),
            }),
        }
    }

    /// The manifest at `reference` (a tag or digest), bounded, and its sha256. `None` on 404.
    pub fn manifest(&self, repository: &str, reference: &str, shown: &str) -> Result<Option<Vec<u8>>, OciError> {
        let url = self.url(&format!("/v2/{repository}/manifests/{reference}"));
        let what = format!("reading manifest {repository}:{reference}");
        let resp = self.request(Method::GET, &url, &[("Accept", ACCEPT)], Payload::Empty, &what)?;
        match resp.status().as_u16() {
            404 => return Ok(None),
            200 => {}
            // A redirect's (or any other answer's) body is not the manifest.
            _ => return Err(self.not_ok(resp, &what)),
        }
        let len: Option<u64> = resp
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        if let Some(size) = len.filter(|l| *l > MAX_MANIFEST) {
            return Err(OciError::ManifestTooBig {
                reference: shown.to_owned(),
                size,
                max: MAX_MANIFEST,
            });
        }
        let mut bytes = Vec::new();
        resp.into_body()
            .into_reader()
            .take(MAX_MANIFEST + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.transport(&url, ureq::Error::from(e)))?;
        if bytes.len() as u64 > MAX_MANIFEST {
            return Err(OciError::ManifestTooBig {
                reference: shown.to_owned(),
                size: bytes.len() as u64,
                max: MAX_MANIFEST,
            });
        }
        Ok(Some(bytes))
    }

    /// `HEAD` a blob: whether the registry has it (push skips what is there).
    pub fn has_blob(&self, repository: &str, digest: &str) -> Result<bool, OciError> {
        let url = self.url(&format!("/v2/{repository}/blobs/{digest}"));
        let resp = self.request(
            Method::HEAD,
            &url,
            &[],
            Payload::Empty,
            &format!("checking blob {digest} in {repository}"),
        )?;
        Ok(matches!(resp.status().as_u16(), 200 | 307))
    }

    /// Downloads a blob into `part` (resuming what is there), hashing as it arrives and refusing
    /// more than `size` bytes; the caller compares digest and size.
    pub fn fetch_blob(
        &self,
        repository: &str,
        digest: &str,
        size: u64,
        part: &Path,
        progress: &mut dyn FnMut(DownloadEvent),
    ) -> Result<(Digests, u64), crate::error::PullError> {
        let url = self.url(&format!("/v2/{repository}/blobs/{digest}"));
        let auth = self.current_auth();
        let f = Fetch {
            agent: &self.agent,
            url: &url,
            verify_with: None,
            retries: self.retries,
            allow_http: false,
            http_host: self.http_host.as_deref(),
            auth: auth.as_deref(),
            expected_size: Some(size),
            limits: self.limits,
            cancel: self.cancel.as_ref(),
        };
        fetch(&f, part, progress)
    }

    /// Uploads `reader`'s `size` bytes as blob `digest`: POST to open an upload session, PATCH
    /// in [`CHUNK`]s, PUT with the digest to close it (the registry checks the digest).
    /// `check` runs before the closing PUT and may refuse (the caller's own hash of what it
    /// sent).
    ///
    /// A chunk that fails in transit (connection cut, timeout, 5xx) is retried, at most
    /// `retries` times per blob: the upload's status (`GET` on the session) says how much the
    /// registry kept (`Range: 0-<last>`), and the upload goes on from there. A registry that
    /// dropped the session instead (distribution discards one whose stored size no longer
    /// matches its state) gets a new session from byte 0.
    pub fn upload_blob(
        &self,
        repository: &str,
        digest: &str,
        size: u64,
        reader: &mut dyn ReadSeek,
        progress: &mut dyn FnMut(UploadEvent),
        check: &mut dyn FnMut() -> Result<(), OciError>,
    ) -> Result<(), OciError> {
        let what = format!("uploading blob {digest} to {repository}");
        let start = self.url(&format!("/v2/{repository}/blobs/uploads/"));
        let open = || -> Result<String, OciError> {
            let resp = self.request(Method::POST, &start, &[], Payload::Empty, &what)?;
            self.location(&start, &resp, &what)
        };
        let mut location = open()?;
        let mut sent = 0u64;
        let mut attempt = 0u32;
        while sent < size {
            let n = CHUNK.min(size - sent);
            let range = format!("{sent}-{}", sent + n - 1);
            let seek = |r: &mut dyn ReadSeek, at: u64| {
                r.seek(SeekFrom::Start(at)).map(drop).map_err(|source| OciError::Io {
                    path: PathBuf::from(format!("the {what} source")),
                    source,
                })
            };
            seek(reader, sent)?;
            let mut chunk = (&mut *reader).take(n);
            let sent_chunk = self
                .request(
                    Method::PATCH,
                    &location,
                    &[("Content-Type", "application/octet-stream"), ("Content-Range", &range)],
                    Payload::Stream(&mut chunk, n),
                    &what,
                )
                .and_then(|resp| match resp.status().as_u16() {
                    202 => self.location(&location, &resp, &what),
                    _ => Err(self.status(resp, &what)),
                });
            match sent_chunk {
                Ok(next) => {
                    location = next;
                    sent += n;
                    progress(UploadEvent::Sent(sent));
                }
                Err(e) if attempt < self.retries && transient(&e) => {
                    attempt += 1;
                    let (at, next, how) = match self.upload_status(&location, &what)? {
                        Some((kept, next)) if kept <= size => (kept, next, "the registry kept the bytes before it"),
                        _ => (0, open()?, "the registry dropped the upload session: a new one"),
                    };
                    progress(UploadEvent::Retry {
                        attempt,
                        offset: at,
                        error: format!("chunk at byte {sent}: {}; {how}", nubo_core::error::chain(&e)),
                    });
                    std::thread::sleep(RETRY_PAUSE * 2u32.saturating_pow(attempt - 1));
                    location = next;
                    sent = at;
                }
                Err(e) => return Err(e),
            }
        }
        check()?;
        let sep = if location.contains('?') { '&' } else { '?' };
        let done = format!("{location}{sep}digest={}", percent_encode(digest));
        let resp = self.request(Method::PUT, &done, &[], Payload::Bytes(&[]), &what)?;
        if resp.status().as_u16() != 201 {
            return Err(self.status(resp, &what));
        }
        Ok(())
    }

    /// `GET` on an upload session: the bytes the registry holds and the session's next
    /// location, or `None` when the registry no longer knows the session (404, 400).
    fn upload_status(&self, location: &str, what: &str) -> Result<Option<(u64, String)>, OciError> {
        let resp = self.request(Method::GET, location, &[], Payload::Empty, what);
        let resp = match resp {
            Ok(r) => r,
            Err(OciError::Status { status: 400, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if resp.status().as_u16() != 204 {
            return Ok(None);
        }
        let kept = resp
            .headers()
            .get("range")
            .and_then(|v| v.to_str().ok())
            .and_then(upload_range)
            .unwrap_or(0);
        let next = self.location(location, &resp, what)?;
        Ok(Some((kept, next)))
    }

    /// Uploads a small blob in one request.
    pub fn upload_bytes(&self, repository: &str, digest: &str, bytes: &[u8]) -> Result<(), OciError> {
        let mut r = std::io::Cursor::new(bytes);
        self.upload_blob(repository, digest, bytes.len() as u64, &mut r, &mut |_| {}, &mut || {
            Ok(())
        })
    }

    /// `PUT` the manifest under `tag`; returns the digest the registry reports (or ours).
    pub fn put_manifest(&self, repository: &str, tag: &str, bytes: &[u8]) -> Result<Option<String>, OciError> {
        let url = self.url(&format!("/v2/{repository}/manifests/{tag}"));
        let what = format!("pushing manifest {repository}:{tag}");
        let resp = self.request(
            Method::PUT,
            &url,
            &[("Content-Type", MANIFEST_V1)],
            Payload::Bytes(bytes),
            &what,
        )?;
        if resp.status().as_u16() != 201 {
            return Err(self.status(resp, &what));
        }
        Ok(resp
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned))
    }

    /// Every tag of `repository`, following `Link` pagination (bounded).
    pub fn tags(&self, repository: &str, shown: &str) -> Result<Vec<String>, OciError> {
        let mut url = self.url(&format!("/v2/{repository}/tags/list?n=1000"));
        let mut out = Vec::new();
        loop {
            let what = format!("listing tags of {repository}");
            let resp = self.request(Method::GET, &url, &[], Payload::Empty, &what)?;
            if resp.status().as_u16() == 404 {
                return Err(OciError::NotFound {
                    reference: shown.to_owned(),
                    registry: self.registry.clone(),
                    repository: repository.to_owned(),
                    what: "tags (the repository does not exist)".into(),
                });
            }
            if resp.status().as_u16() != 200 {
                return Err(self.not_ok(resp, &what));
            }
            let next = resp
                .headers()
                .get("link")
                .and_then(|v| v.to_str().ok())
                .and_then(link_next)
                .map(|n| http::join_url(&url, &n));
            let mut text = String::new();
            resp.into_body()
                .into_reader()
                .take(MAX_MANIFEST)
                .read_to_string(&mut text)
                .map_err(|e| self.transport(&url, ureq::Error::from(e)))?;
            let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| OciError::Status {
                registry: self.registry.clone(),
                what,
                status: 200,
                detail: Some(format!("the tag list is not JSON ({e})")),
            })?;
            for t in v.get("tags").and_then(|t| t.as_array()).into_iter().flatten() {
                if let Some(t) = t.as_str() {
                    // A tag outside the grammar (a newline, a `/`) is listed escaped, and
                    // the caller, seeing it is no tag, fetches nothing for it.
                    out.push(if crate::reference::is_tag(t) {
                        t.to_owned()
                    } else {
                        format!("{t:?}")
                    });
                }
            }
            match next {
                Some(n) if out.len() < MAX_TAGS && self.on_origin(&n) => url = n,
                _ => break,
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }

    fn location(&self, base: &str, resp: &Response<Body>, what: &str) -> Result<String, OciError> {
        let loc = resp
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| OciError::Status {
                registry: self.registry.clone(),
                what: what.to_owned(),
                status: resp.status().as_u16(),
                detail: Some("no Location for the upload session".into()),
            })?;
        let next = http::join_url(base, loc);
        // An upload session elsewhere would get our credentials and the image: refused.
        if !self.on_origin(&next) {
            return Err(OciError::Status {
                registry: self.registry.clone(),
                what: what.to_owned(),
                status: resp.status().as_u16(),
                detail: Some(format!(
                    "the upload session is on another host ({}), which nubo does not follow",
                    nubo_core::file::escape_control(&next)
                )),
            });
        }
        Ok(next)
    }

    /// A 2xx/3xx that is not the 200 the request needs: a redirect is named with its target
    /// (nubo follows redirects for blobs only), anything else as [`Client::status`].
    fn not_ok(&self, resp: Response<Body>, what: &str) -> OciError {
        let status = resp.status().as_u16();
        if !(300..=399).contains(&status) {
            return self.status(resp, what);
        }
        let to = resp
            .headers()
            .get("location")
            .map(|v| nubo_core::file::escape_control(&String::from_utf8_lossy(v.as_bytes())))
            .unwrap_or_else(|| "nowhere".into());
        OciError::Status {
            registry: self.registry.clone(),
            what: what.to_owned(),
            status,
            detail: Some(format!(
                "a redirect to {to} where the answer itself belongs (its body is not read; nubo follows redirects for blobs only)"
            )),
        }
    }

    fn status(&self, resp: Response<Body>, what: &str) -> OciError {
        OciError::Status {
            registry: self.registry.clone(),
            what: what.to_owned(),
            status: resp.status().as_u16(),
            detail: error_detail(resp),
        }
    }
}

/// Bytes a registry holds for an upload, from its `Range: 0-<last>` (distribution writes
/// `0-0` for an empty upload too, read as 0: resuming one byte early is refused with 416 and
/// retried, resuming one byte late would corrupt the blob).
fn upload_range(v: &str) -> Option<u64> {
    let last: u64 = v
        .trim()
        .strip_prefix("bytes=")
        .unwrap_or(v.trim())
        .strip_prefix("0-")?
        .parse()
        .ok()?;
    Some(if last == 0 { 0 } else { last + 1 })
}

/// Failures a chunk's retry can cure: the connection broke or timed out, or the registry
/// answered 5xx or 429.
fn transient(e: &OciError) -> bool {
    match e {
        OciError::Transport { source, .. } => !crate::error::is_tls(source),
        OciError::Unreachable { .. } => true,
        OciError::Status { status, .. } => *status == 429 || *status >= 500,
        _ => false,
    }
}

/// The first `message` of a registry's `{"errors":[{"code","message"}]}` body.
fn error_detail(resp: Response<Body>) -> Option<String> {
    let mut text = String::new();
    resp.into_body()
        .into_reader()
        .take(SMALL)
        .read_to_string(&mut text)
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let e = v.get("errors")?.as_array()?.first()?;
    let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("");
    let msg = e.get("message").and_then(|c| c.as_str()).unwrap_or("");
    Some(
        nubo_core::file::escape_control(&format!("{code} {msg}").chars().take(300).collect::<String>())
            .trim()
            .to_owned(),
    )
}

/// `<url>; rel="next"` from a `Link` header.
fn link_next(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        params
            .contains("rel=\"next\"")
            .then(|| url.trim().trim_start_matches('<').trim_end_matches('>').to_owned())
    })
}

/// RFC 3986 unreserved characters pass; everything else is `%XX`.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encode_scope_escapes_colon_and_slash() {
        assert_eq!(percent_encode("repository:a/b:pull"), "repository%3Aa%2Fb%3Apull");
    }

    #[test]
    fn upload_range_is_bytes_held() {
        assert_eq!(upload_range("0-1048575"), Some(1 << 20));
    }

    #[test]
    fn upload_range_empty_upload_is_zero() {
        assert_eq!(upload_range("0-0"), Some(0));
    }

    #[test]
    fn upload_range_garbage_is_none() {
        assert_eq!(upload_range("5-9"), None);
    }

    #[test]
    fn link_next_reads_rel_next() {
        assert_eq!(
            link_next(r#"</v2/a/tags/list?last=x&n=2>; rel="next""#).as_deref(),
            Some("/v2/a/tags/list?last=x&n=2")
        );
    }

    #[test]
    fn link_next_without_next_is_none() {
        assert_eq!(link_next(r#"</x>; rel="prev""#), None);
    }
}
