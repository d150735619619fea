//! Pulls that must be refused or must fail clearly (issue 9 items 8 and 9): tags are never
//! re-pointed silently, only transient failures are retried, and every failure names its cause
//! and fix. Each runs against a real HTTPS server on 127.0.0.1, or against nothing at all.

mod support;

use std::fs;
use std::net::TcpListener;

use nubo_image::{
    pull, Added, DownloadEvent, ImageRef, ImageStore, PullError, PullEvent, PullRequest, PullSource, StoreError,
    TagChange, TlsSettings,
};
use support::{qcow2_bytes, sha256, Server};

struct Fixture {
    dir: tempfile::TempDir,
    server: Server,
    store: ImageStore,
    image: Vec<u8>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let image = qcow2_bytes(dir.path(), "img.qcow2", 1 << 20);
    Fixture {
        dir,
        server,
        store,
        image,
    }
}

fn url_request(f: &Fixture, path: &str) -> PullRequest {
    let mut req = PullRequest::new(PullSource::Url(f.server.url(path)));
    req.tls = TlsSettings {
        ca_bundle: None,
        extra_ca: vec![f.server.ca.clone()],
    };
    req.name = Some(ImageRef::parse("mine:1").unwrap());
    req
}

/// Serves `body` at `path` with a matching `.sha256` sidecar.
fn serve(f: &Fixture, path: &str, body: &[u8]) {
    f.server.put(path, body.to_vec());
    f.server.put(&format!("{path}.sha256"), format!("{}\n", sha256(body)));
}

fn run(store: &ImageStore, req: &PullRequest) -> (Result<Added, PullError>, Vec<PullEvent>) {
    let mut events = Vec::new();
    let r = pull(store, req, &mut |e| events.push(e));
    (r, events)
}

fn tmp_entries(store: &ImageStore) -> Vec<String> {
    fs::read_dir(store.tmp_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

fn other_image(f: &Fixture) -> Vec<u8> {
    qcow2_bytes(f.dir.path(), "other.qcow2", 4096)
}

/// A 127.0.0.1 port with nothing listening: bound, then closed.
fn dead_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn pull_onto_existing_tag_with_other_digest_refused_before_download() {
    let f = fixture();
    serve(&f, "/a.qcow2", &f.image);
    let other = other_image(&f);
    serve(&f, "/b.qcow2", &other);
    run(&f.store, &url_request(&f, "/a.qcow2")).0.unwrap();

    let (r, _) = run(&f.store, &url_request(&f, "/b.qcow2"));

    let err = r.unwrap_err();
    assert!(
        matches!(err, PullError::Store(StoreError::TagExists { verified: true, .. })),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("mine:1") && msg.contains(&sha256(&f.image)) && msg.contains("--force"),
        "{msg}"
    );
    assert!(f.server.hits("/b.qcow2").is_empty(), "downloaded before refusing");
    let rec = f.store.require(&ImageRef::parse("mine:1").unwrap()).unwrap();
    assert_eq!(rec.digest, format!("sha256:{}", sha256(&f.image)));
}

#[test]
fn pull_onto_existing_tag_with_force_reports_replaced_digest() {
    let f = fixture();
    serve(&f, "/a.qcow2", &f.image);
    let other = other_image(&f);
    serve(&f, "/b.qcow2", &other);
    let first = run(&f.store, &url_request(&f, "/a.qcow2")).0.unwrap();
    let mut req = url_request(&f, "/b.qcow2");
    req.force = true;

    let (r, _) = run(&f.store, &req);

    let added = r.unwrap();
    assert_eq!(
        added.change,
        TagChange::Replaced {
            digest: first.record.digest.clone(),
            verified: true
        }
    );
    assert_eq!(added.record.digest, format!("sha256:{}", sha256(&other)));
    assert!(first.record.path.exists(), "the old blob stays until prune");
}

#[test]
fn pull_same_image_again_is_unchanged() {
    let f = fixture();
    serve(&f, "/a.qcow2", &f.image);
    run(&f.store, &url_request(&f, "/a.qcow2")).0.unwrap();

    let (r, events) = run(&f.store, &url_request(&f, "/a.qcow2"));

    assert_eq!(r.unwrap().change, TagChange::Unchanged);
    assert!(events.iter().any(|e| matches!(e, PullEvent::AlreadyPresent { .. })));
    assert_eq!(f.server.hits("/a.qcow2").len(), 1);
}

#[test]
fn pull_unverified_onto_existing_tag_refused_and_leaves_nothing() {
    let f = fixture();
    serve(&f, "/a.qcow2", &f.image);
    run(&f.store, &url_request(&f, "/a.qcow2")).0.unwrap();
    f.server.put("/c.qcow2", other_image(&f));
    let mut req = url_request(&f, "/c.qcow2");
    req.insecure_no_checksum = true;

    let (r, _) = run(&f.store, &req);

    assert!(
        matches!(r, Err(PullError::Store(StoreError::TagExists { .. }))),
        "{r:?}"
    );
    assert!(tmp_entries(&f.store).is_empty(), "{:?}", tmp_entries(&f.store));
    assert_eq!(fs::read_dir(f.store.dir().join("blobs")).unwrap().count(), 1);
}

#[test]
fn pull_nothing_listening_says_nothing_downloaded() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let port = dead_port();
    let mut req = PullRequest::new(PullSource::Url(format!("https://127.0.0.1:{port}/x.qcow2")));
    req.checksum = Some(format!("sha256:{}", "a".repeat(64)).parse().unwrap());
    req.tls.extra_ca = vec![Server::start(dir.path()).ca];

    let (r, events) = run(&store, &req);

    let err = r.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PullError::Connect { .. }), "{err:?}");
    assert!(
        msg.contains(&format!("could not connect to 127.0.0.1:{port}")) && msg.contains("nothing was downloaded"),
        "{msg}"
    );
    assert!(!msg.contains("partial download is kept"), "{msg}");
    assert!(!events
        .iter()
        .any(|e| matches!(e, PullEvent::Transfer(DownloadEvent::Retry { .. }))));
    assert!(tmp_entries(&store).is_empty(), "{:?}", tmp_entries(&store));
}

#[test]
fn pull_unresolvable_host_names_host_and_mirror_fix() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let mut req = PullRequest::new(PullSource::Url("https://nubo-test.invalid/x.qcow2".into()));
    req.tls.extra_ca = vec![Server::start(dir.path()).ca];

    let (r, _) = run(&store, &req);

    let err = r.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PullError::Dns { .. }), "{err:?}");
    assert!(
        msg.contains("nubo-test.invalid") && msg.contains("NUBO_MIRROR_"),
        "{msg}"
    );
}

#[test]
fn pull_redirect_to_file_scheme_refused_by_name() {
    let f = fixture();
    f.server.put_redirect("/r.qcow2", "file:///etc/passwd");
    let mut req = url_request(&f, "/r.qcow2");
    req.checksum = Some(format!("sha256:{}", sha256(&f.image)).parse().unwrap());

    let (r, _) = run(&f.store, &req);

    let err = r.unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, PullError::RedirectRefused { .. }), "{err:?}");
    assert!(
        msg.contains("refused redirect") && msg.contains("file:///etc/passwd") && msg.contains("only https"),
        "{msg}"
    );
    assert!(!msg.contains("404"), "{msg}");
    assert!(tmp_entries(&f.store).is_empty());
}

#[test]
fn pull_redirect_to_https_is_followed() {
    let f = fixture();
    serve(&f, "/real.qcow2", &f.image);
    f.server.put_redirect("/r.qcow2", "/real.qcow2");
    let mut req = url_request(&f, "/r.qcow2");
    req.checksum = Some(format!("sha256:{}", sha256(&f.image)).parse().unwrap());

    let (r, _) = run(&f.store, &req);

    assert_eq!(r.unwrap().record.digest, format!("sha256:{}", sha256(&f.image)));
}

#[test]
fn pull_503_then_body_is_retried() {
    let f = fixture();
    f.server.put_status("/a.qcow2", 503, 1, f.image.clone());
    f.server.put("/a.qcow2.sha256", format!("{}\n", sha256(&f.image)));

    let (r, events) = run(&f.store, &url_request(&f, "/a.qcow2"));

    assert!(r.is_ok(), "{r:?}");
    assert_eq!(f.server.hits("/a.qcow2").len(), 2);
    assert!(events
        .iter()
        .any(|e| matches!(e, PullEvent::Transfer(DownloadEvent::Retry { .. }))));
}

#[test]
fn pull_403_is_not_retried() {
    let f = fixture();
    f.server.put_status("/a.qcow2", 403, 10, f.image.clone());
    f.server.put("/a.qcow2.sha256", format!("{}\n", sha256(&f.image)));

    let (r, _) = run(&f.store, &url_request(&f, "/a.qcow2"));

    assert!(matches!(r, Err(PullError::Status { status: 403, .. })), "{r:?}");
    assert_eq!(f.server.hits("/a.qcow2").len(), 1);
}

#[test]
fn pull_tls_failure_mid_body_is_not_retried() {
    let f = fixture();
    f.server.put_corrupting("/a.qcow2", f.image.clone(), 64 << 10);
    f.server.put("/a.qcow2.sha256", format!("{}\n", sha256(&f.image)));

    let (r, events) = run(&f.store, &url_request(&f, "/a.qcow2"));

    let err = r.unwrap_err();
    assert!(!matches!(err, PullError::Interrupted { .. }), "{err:?}");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, PullEvent::Transfer(DownloadEvent::Retry { .. }))),
        "{events:?}"
    );
    assert_eq!(f.server.hits("/a.qcow2").len(), 1);
    assert!(tmp_entries(&f.store).is_empty(), "{:?}", tmp_entries(&f.store));
}

#[test]
fn pull_interrupted_with_bytes_kept_says_how_many() {
    let f = fixture();
    f.server.put_dropping("/a.qcow2", f.image.clone(), 64 << 10);
    f.server.put("/a.qcow2.sha256", format!("{}\n", sha256(&f.image)));
    let mut req = url_request(&f, "/a.qcow2");
    req.retries = 0;

    let (r, _) = run(&f.store, &req);

    let err = r.unwrap_err();
    let PullError::Interrupted { kept, .. } = &err else {
        panic!("{err:?}")
    };
    assert!(*kept > 0);
    assert!(err.to_string().contains(&format!("{kept} bytes are kept")), "{err}");
}

#[test]
fn pull_oci_reference_is_left_to_the_registry_pull() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let req = PullRequest::new(PullSource::parse(&format!("registry.example/repo@sha256:{}", "b".repeat(64))).unwrap());

    let (r, _) = run(&store, &req);

    assert!(matches!(r, Err(PullError::OciUnsupported(_))), "{r:?}");
}
