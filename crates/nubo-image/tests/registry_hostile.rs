//! Registry behaviours Debian's docker-registry cannot produce, from an in-process fake registry
//! on 127.0.0.1 (plain http, pulled with `insecure`): a manifest dripped a byte every 2 s, a
//! blob dripped slower than the speed limit, a 3xx whose body looks like a manifest, a token
//! realm in plain http on another port, tags with newlines, annotations claiming more than the
//! disk can hold, zstd bombs made here, and a layer lying about the size of a disk already
//! stored. Each is refused with an error naming the cause, and nothing is left in the store.

mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nubo_core::error::chain;
use nubo_image::http::Limits;
use nubo_image::oci::{self, Client, ClientSettings, Credentials, OciPullRequest};
use nubo_image::{ImageStore, OciRef, TlsSettings};

/// One request as the fake registry saw it.
#[derive(Debug, Clone)]
struct Req {
    method: String,
    path: String,
    auth: Option<String>,
}

enum Reply {
    Full {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// A 200 with the right Content-Length whose body comes one byte per `every`.
    Drip { body: Vec<u8>, every: Duration },
}

fn ok(body: impl Into<Vec<u8>>) -> Reply {
    Reply::Full {
        status: 200,
        headers: vec![],
        body: body.into(),
    }
}

fn status(code: u16, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Reply {
    Reply::Full {
        status: code,
        headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        body: body.into(),
    }
}

type Handler = Arc<dyn Fn(&Req) -> Reply + Send + Sync>;

struct Fake {
    port: u16,
    hits: Arc<Mutex<Vec<Req>>>,
}

impl Fake {
    fn start(handler: impl Fn(&Req) -> Reply + Send + Sync + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(Mutex::new(Vec::new()));
        let handler: Handler = Arc::new(handler);
        let h = hits.clone();
        thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                let (handler, hits) = (handler.clone(), h.clone());
                thread::spawn(move || serve(conn, &handler, &hits));
            }
        });
        Fake { port, hits }
    }

    fn hits(&self) -> Vec<Req> {
        self.hits.lock().unwrap().clone()
    }

    fn registry(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

fn serve(conn: TcpStream, handler: &Handler, hits: &Mutex<Vec<Req>>) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut auth = None;
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            match k.to_ascii_lowercase().as_str() {
                "authorization" => auth = Some(v.trim().to_owned()),
                "content-length" => length = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
    }
    let mut body = vec![0; length];
    let _ = reader.read_exact(&mut body);
    let req = Req { method, path, auth };
    hits.lock().unwrap().push(req.clone());
    let mut out = conn;
    let head = |status: u16, headers: &[(String, String)], len: usize| {
        let mut s = format!("HTTP/1.1 {status} X\r\nContent-Length: {len}\r\nConnection: close\r\n");
        for (k, v) in headers {
            s.push_str(&format!("{k}: {v}\r\n"));
        }
        s.push_str("\r\n");
        s
    };
    match handler(&req) {
        Reply::Full { status, headers, body } => {
            let _ = out.write_all(head(status, &headers, body.len()).as_bytes());
            if req.method != "HEAD" {
                let _ = out.write_all(&body);
            }
        }
        Reply::Drip { body, every } => {
            let _ = out.write_all(head(200, &[], body.len()).as_bytes());
            for b in body {
                if out.write_all(&[b]).and_then(|()| out.flush()).is_err() {
                    return;
                }
                thread::sleep(every);
            }
        }
    }
}

const QCOW2_ZSTD: &str = "application/vnd.nubo.vm.disk.qcow2.v1+zstd";
const QCOW2: &str = "application/vnd.nubo.vm.disk.qcow2.v1";

/// A nubo VM manifest with one disk layer and these annotations.
fn manifest(media: &str, digest: &str, size: u64, annotations: &[(&str, String)]) -> Vec<u8> {
    let a: BTreeMap<&str, &String> = annotations.iter().map(|(k, v)| (*k, v)).collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.nubo.vm.v1",
        "config": {
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
            "size": 2
        },
        "layers": [{"mediaType": media, "digest": digest, "size": size}],
        "annotations": a,
    }))
    .unwrap()
}

fn zstd_of(data: &[u8]) -> Vec<u8> {
    zstd::stream::encode_all(data, 1).unwrap()
}

struct Env {
    dir: tempfile::TempDir,
    store: ImageStore,
    ca: std::path::PathBuf,
}

fn env() -> Env {
    let dir = tempfile::tempdir().unwrap();
    // A CA to trust, so the client never needs the host's CA store.
    let ca = support::Server::start(dir.path()).ca;
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    Env { dir, store, ca }
}

fn settings(e: &Env, limits: Limits, credentials: Option<Credentials>) -> ClientSettings {
    ClientSettings {
        tls: TlsSettings {
            ca_bundle: Some(e.ca.clone()),
            extra_ca: vec![],
        },
        insecure: true,
        credentials,
        retries: 0,
        limits,
        cancel: None,
    }
}

fn pull(e: &Env, fake: &Fake, tag: &str, limits: Limits) -> Result<nubo_image::Added, oci::OciError> {
    let req = OciPullRequest {
        reference: OciRef::parse(&format!("{}/vm:{tag}", fake.registry())).unwrap(),
        name: None,
        force: false,
        client: settings(e, limits, None),
    };
    oci::pull(&e.store, &req, &mut |_| {})
}

/// Nothing stored and no partial left behind.
fn assert_nothing_stored(e: &Env) {
    assert!(e.store.list().unwrap().is_empty());
    let left: Vec<_> = std::fs::read_dir(e.store.tmp_dir())
        .map(|d| d.flatten().map(|f| f.file_name()).collect())
        .unwrap_or_default();
    assert!(
        left.iter().all(|n| n.to_string_lossy().ends_with(".lock")),
        "left in tmp: {left:?}"
    );
}

fn short(timeout: u64, speed_limit: u64, speed_time: u64) -> Limits {
    Limits {
        timeout: Duration::from_secs(timeout),
        speed_limit,
        speed_time: Duration::from_secs(speed_time),
    }
}

#[test]
fn manifest_dripped_one_byte_every_2s_fails_at_the_deadline_naming_url_and_flag() {
    let e = env();
    let fake = Fake::start(|r| {
        if r.path.contains("/manifests/") {
            Reply::Drip {
                body: manifest(QCOW2, &format!("sha256:{}", "a".repeat(64)), 1, &[]),
                every: Duration::from_secs(2),
            }
        } else {
            ok("{}")
        }
    });
    let t = Instant::now();

    let err = pull(&e, &fake, "1", short(3, 1024, 60)).unwrap_err();

    let msg = chain(&err);
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    assert!(msg.contains("/v2/vm/manifests/1") && msg.contains("--timeout"), "{msg}");
    assert_nothing_stored(&e);
}

#[test]
fn blob_dripped_below_speed_limit_fails_naming_url_and_flags() {
    let e = env();
    let blob = vec![7u8; 4096];
    let digest = format!("sha256:{}", support::sha256(&blob));
    let m = manifest(QCOW2, &digest, blob.len() as u64, &[]);
    let fake = Fake::start(move |r| {
        if r.path.contains("/manifests/") {
            ok(m.clone())
        } else if r.path.contains("/blobs/") {
            Reply::Drip {
                body: blob.clone(),
                every: Duration::from_millis(500),
            }
        } else {
            ok("{}")
        }
    });
    let t = Instant::now();

    // The manifest deadline is long: the blob's body is held to the rate, not to it.
    let err = pull(&e, &fake, "1", short(60, 1024, 2)).unwrap_err();

    let msg = chain(&err);
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    assert!(
        msg.contains(&format!("/v2/vm/blobs/{digest}"))
            && msg.contains("--speed-limit")
            && msg.contains("--speed-time"),
        "{msg}"
    );
    assert_nothing_stored(&e);
}

#[test]
fn redirect_with_a_manifest_looking_body_is_not_read_as_the_manifest() {
    let e = env();
    let disk = support::qcow2_bytes(e.dir.path(), "d.qcow2", 4096);
    let digest = format!("sha256:{}", support::sha256(&disk));
    let m = manifest(QCOW2, &digest, disk.len() as u64, &[]);
    let fake = Fake::start(move |r| {
        if r.path.contains("/manifests/") {
            status(302, &[("Location", "http://127.0.0.1:9/elsewhere")], m.clone())
        } else if r.path.contains("/blobs/") {
            ok(disk.clone())
        } else {
            ok("{}")
        }
    });

    let err = pull(&e, &fake, "1", Limits::default()).unwrap_err();

    let msg = chain(&err);
    assert!(msg.contains("HTTP 302") && msg.contains("redirect"), "{msg}");
    assert!(
        fake.hits().iter().all(|h| !h.path.contains("/blobs/")),
        "{:?}",
        fake.hits()
    );
    assert_nothing_stored(&e);
}

#[test]
fn plain_http_realm_on_another_port_never_receives_credentials() {
    let e = env();
    let token = Fake::start(|_| ok(r#"{"token":"t"}"#));
    let realm = format!("http://127.0.0.1:{}/token", token.port);
    let fake = Fake::start(move |r| match &r.auth {
        Some(a) if a == "Bearer t" => ok("{}"),
        _ => status(
            401,
            &[(
                "WWW-Authenticate",
                &format!(r#"Bearer realm="{realm}",service="reg",scope="repository:vm:pull""#),
            )],
            "{}",
        ),
    });
    let creds = Credentials {
        username: "u".into(),
        password: "secret".into(),
    };

    let err = Client::new(&fake.registry(), &settings(&e, Limits::default(), Some(creds)))
        .unwrap()
        .ping()
        .unwrap_err();

    let msg = chain(&err);
    assert!(msg.contains("not https") && msg.contains("/token"), "{msg}");
    assert!(token.hits().is_empty(), "the realm was asked: {:?}", token.hits());
    assert!(!msg.contains("secret"));
}

#[test]
fn plain_http_realm_on_the_insecure_registrys_own_origin_gets_the_token() {
    let e = env();
    let fake = Arc::new(Mutex::new(0u16));
    let port = fake.clone();
    let reg = Fake::start(move |r| {
        let realm = format!("http://127.0.0.1:{}/token", port.lock().unwrap());
        match (r.path.as_str(), &r.auth) {
            (p, Some(a)) if p.starts_with("/token") && a.starts_with("Basic ") => ok(r#"{"token":"t"}"#),
            (_, Some(a)) if a == "Bearer t" => ok("{}"),
            _ => status(
                401,
                &[("WWW-Authenticate", &format!(r#"Bearer realm="{realm}""#))],
                "{}",
            ),
        }
    });
    *fake.lock().unwrap() = reg.port;
    let creds = Credentials {
        username: "u".into(),
        password: "p".into(),
    };

    Client::new(&reg.registry(), &settings(&e, Limits::default(), Some(creds)))
        .unwrap()
        .ping()
        .unwrap();

    assert!(reg.hits().iter().any(|h| h.path.starts_with("/token")));
}

#[test]
fn tags_with_newlines_are_listed_escaped_and_never_fetched() {
    let e = env();
    let fake = Fake::start(|r| {
        if r.path.contains("/tags/list") {
            ok(r#"{"name":"vm","tags":["ok-1","bad\nline","x\u001b[31m","../up"]}"#)
        } else {
            ok("{}")
        }
    });
    let client = Client::new(&fake.registry(), &settings(&e, Limits::default(), None)).unwrap();

    let tags = client.tags("vm", "r/vm").unwrap();

    assert!(tags.contains(&"ok-1".to_owned()), "{tags:?}");
    assert!(tags.iter().all(|t| !t.chars().any(char::is_control)), "{tags:?}");
    let invalid: Vec<_> = tags.iter().filter(|t| !nubo_image::reference::is_tag(t)).collect();
    assert_eq!(invalid.len(), 3, "{tags:?}");
}

#[test]
fn annotated_disk_size_of_1tib_from_a_small_layer_is_refused_before_any_download() {
    let e = env();
    // The issue's example: a small zstd layer of zeros annotated 1 TiB.
    let zeros = vec![0u8; 8 << 20];
    let layer = zstd_of(&zeros);
    let digest = format!("sha256:{}", support::sha256(&layer));
    let m = manifest(
        QCOW2_ZSTD,
        &digest,
        layer.len() as u64,
        &[
            ("io.nubo.image.disk.size", (1u64 << 40).to_string()),
            ("io.nubo.image.disk.digest", format!("sha256:{}", "b".repeat(64))),
        ],
    );
    let fake = Fake::start(move |r| {
        if r.path.contains("/manifests/") {
            ok(m.clone())
        } else {
            ok(layer.clone())
        }
    });

    let err = pull(&e, &fake, "1", Limits::default()).unwrap_err();

    let msg = chain(&err);
    assert!(
        msg.contains("io.nubo.image.disk.size") && msg.contains("1099511627776"),
        "{msg}"
    );
    assert!(
        fake.hits().iter().all(|h| !h.path.contains("/blobs/")),
        "{:?}",
        fake.hits()
    );
    assert_nothing_stored(&e);
}

#[test]
fn layer_larger_than_free_space_is_refused_before_any_download() {
    let e = env();
    let m = manifest(QCOW2, &format!("sha256:{}", "c".repeat(64)), 1 << 62, &[]);
    let fake = Fake::start(move |r| {
        if r.path.contains("/manifests/") {
            ok(m.clone())
        } else {
            ok("")
        }
    });

    let err = pull(&e, &fake, "1", Limits::default()).unwrap_err();

    let msg = chain(&err);
    assert!(msg.contains("free") && msg.contains(&(1u64 << 62).to_string()), "{msg}");
    assert!(
        fake.hits().iter().all(|h| !h.path.contains("/blobs/")),
        "{:?}",
        fake.hits()
    );
    assert_nothing_stored(&e);
}

#[test]
fn zstd_bomb_of_dense_fill_stops_at_the_ratio_and_leaves_nothing() {
    let e = env();
    // 0xff fill: data (no holes), compresses like zeros. 96 MiB from a few KiB.
    let disk = vec![0xffu8; 96 << 20];
    let layer = zstd_of(&disk);
    let digest = format!("sha256:{}", support::sha256(&layer));
    let m = manifest(
        QCOW2_ZSTD,
        &digest,
        layer.len() as u64,
        &[
            ("io.nubo.image.disk.size", disk.len().to_string()),
            (
                "io.nubo.image.disk.digest",
                format!("sha256:{}", support::sha256(&disk)),
            ),
        ],
    );
    drop(disk);
    let fake = Fake::start(move |r| {
        if r.path.contains("/manifests/") {
            ok(m.clone())
        } else {
            ok(layer.clone())
        }
    });

    let err = pull(&e, &fake, "1", Limits::default()).unwrap_err();

    let msg = chain(&err);
    assert!(msg.contains("decompression bomb") && msg.contains("64x"), "{msg}");
    assert_nothing_stored(&e);
}

#[test]
fn zstd_layer_of_zero_runs_is_stored_sparse() {
    use std::os::unix::fs::MetadataExt;
    let e = env();
    // A real qcow2 followed by 200 MiB of zeros: the zeros cost no space once stored.
    let mut disk = support::qcow2_bytes(e.dir.path(), "d.qcow2", 0);
    disk.resize(disk.len() + (200 << 20), 0);
    let layer = zstd_of(&disk);
    let digest = format!("sha256:{}", support::sha256(&layer));
    let m = manifest(
        QCOW2_ZSTD,
        &digest,
        layer.len() as u64,
        &[
            ("io.nubo.image.disk.size", disk.len().to_string()),
            (
                "io.nubo.image.disk.digest",
                format!("sha256:{}", support::sha256(&disk)),
            ),
        ],
    );
    let size = disk.len() as u64;
    let disk_digest = support::sha256(&disk);
    drop(disk);
    let fake = Fake::start(move |r| {
        if r.path.contains("/manifests/") {
            ok(m.clone())
        } else {
            ok(layer.clone())
        }
    });

    let added = pull(&e, &fake, "1", Limits::default()).unwrap();

    let meta = std::fs::metadata(&added.record.path).unwrap();
    assert_eq!((meta.len(), added.record.size), (size, size));
    assert!(
        meta.blocks() * 512 < 16 << 20,
        "{} bytes allocated",
        meta.blocks() * 512
    );
    // The bytes on disk, holes read back as zeros, are the disk's (not only the stream hashed).
    assert_eq!(
        support::sha256(&std::fs::read(&added.record.path).unwrap()),
        disk_digest
    );
}

#[test]
fn layer_claiming_10_bytes_for_a_stored_disk_is_refused_not_recorded() {
    let e = env();
    let disk = support::qcow2_bytes(e.dir.path(), "d.qcow2", 4096);
    let digest = format!("sha256:{}", support::sha256(&disk));
    let good = manifest(QCOW2, &digest, disk.len() as u64, &[]);
    let liar = manifest(QCOW2, &digest, 10, &[]);
    let fake = Fake::start(move |r| {
        if r.path.ends_with("/manifests/good") {
            ok(good.clone())
        } else if r.path.ends_with("/manifests/liar") {
            ok(liar.clone())
        } else {
            ok(disk.clone())
        }
    });
    pull(&e, &fake, "good", Limits::default()).unwrap();

    let err = pull(&e, &fake, "liar", Limits::default()).unwrap_err();

    let msg = chain(&err);
    assert!(msg.contains("10 bytes") && msg.contains("already stored"), "{msg}");
    let recs = e.store.list().unwrap();
    assert_eq!(recs.len(), 1);
    assert!(recs[0].size > 10);
}
