//! Pulls against a real HTTPS server on 127.0.0.1 serving each distro's real layout.

mod support;

use std::error::Error;
use std::fs;
use std::os::unix::fs::PermissionsExt;

use nubo_image::{
    pull, DownloadEvent, ImageRef, ImageStore, PullError, PullEvent, PullRequest, PullSource, TlsSettings,
};
use support::{qcow2_bytes, sha256, sha512, Server};

const UBUNTU_DIR: &str = "/ubuntu/releases/24.04/release-20250610/";
const UBUNTU_IMG: &str = "ubuntu-24.04-server-cloudimg-amd64.img";
const DEBIAN_DIR: &str = "/debian/bookworm/latest/";
const DEBIAN_IMG: &str = "debian-12-genericcloud-amd64.qcow2";
const ROCKY_DIR: &str = "/rocky/9/images/x86_64/";
const ROCKY_IMG: &str = "Rocky-9-GenericCloud-Base-9.6-20250531.0.x86_64.qcow2";

struct Fixture {
    _dir: tempfile::TempDir,
    server: Server,
    store: ImageStore,
    image: Vec<u8>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let store = ImageStore::open(&dir.path().join("images")).unwrap();
    let image = qcow2_bytes(dir.path(), "img.qcow2", 3 << 20);
    Fixture {
        _dir: dir,
        server,
        store,
        image,
    }
}

fn request(f: &Fixture, reference: &str, distro: &str) -> PullRequest {
    let mut req = PullRequest::new(PullSource::parse(reference).unwrap());
    req.mirror = Some(f.server.url(&format!("/{distro}")));
    req.tls = TlsSettings {
        ca_bundle: None,
        extra_ca: vec![f.server.ca.clone()],
    };
    req
}

fn url_request(f: &Fixture, path: &str) -> PullRequest {
    let mut req = PullRequest::new(PullSource::Url(f.server.url(path)));
    req.tls = TlsSettings {
        ca_bundle: None,
        extra_ca: vec![f.server.ca.clone()],
    };
    req
}

fn serve_ubuntu(f: &Fixture, image: &[u8], sums: &str) {
    f.server.put(
        "/ubuntu/releases/24.04/",
        "<a href=\"release-20240423/\">release-20240423/</a>\n<a href=\"release-20250610/\">release-20250610/</a>\n<a href=\"release/\">release/</a>\n",
    );
    f.server.put(&format!("{UBUNTU_DIR}SHA256SUMS"), sums.to_owned());
    f.server.put(&format!("{UBUNTU_DIR}{UBUNTU_IMG}"), image.to_vec());
}

fn ubuntu_sums(image: &[u8]) -> String {
    format!(
        "{} *ubuntu-24.04-server-cloudimg-amd64.manifest\n{} *{UBUNTU_IMG}\n{} *ubuntu-24.04-server-cloudimg-amd64.tar.gz\n",
        sha256(b"manifest"),
        sha256(image),
        sha256(b"tarball")
    )
}

fn serve_debian(f: &Fixture, image: &[u8]) {
    let sums = format!(
        "{}  debian-12-genericcloud-amd64.json\n{}  {DEBIAN_IMG}\n",
        sha512(b"json"),
        sha512(image)
    );
    f.server.put(&format!("{DEBIAN_DIR}SHA512SUMS"), sums);
    f.server.put(&format!("{DEBIAN_DIR}{DEBIAN_IMG}"), image.to_vec());
}

fn serve_rocky(f: &Fixture, image: &[u8]) {
    let checksum = format!(
        "# {ROCKY_IMG}: {} bytes\nSHA256 ({ROCKY_IMG}) = {}\n",
        image.len(),
        sha256(image)
    );
    f.server.put(
        &format!("{ROCKY_DIR}Rocky-9-GenericCloud-Base.latest.x86_64.qcow2.CHECKSUM"),
        checksum,
    );
    f.server.put(&format!("{ROCKY_DIR}{ROCKY_IMG}"), image.to_vec());
}

fn tmp_is_empty(store: &ImageStore) -> bool {
    fs::read_dir(store.tmp_dir()).unwrap().next().is_none()
}

fn blobs(store: &ImageStore) -> usize {
    fs::read_dir(store.dir().join("blobs")).unwrap().count()
}

fn run(store: &ImageStore, req: &PullRequest) -> (Result<nubo_image::ImageRecord, PullError>, Vec<PullEvent>) {
    let mut events = Vec::new();
    let r = pull(store, req, &mut |e| events.push(e)).map(|added| added.record);
    (r, events)
}

#[test]
fn pull_ubuntu_pins_serial_and_verifies() {
    let f = fixture();
    serve_ubuntu(&f, &f.image, &ubuntu_sums(&f.image));

    let (rec, _) = run(&f.store, &request(&f, "ubuntu:noble", "ubuntu"));

    let rec = rec.unwrap();
    assert_eq!(rec.reference, "ubuntu:24.04");
    assert_eq!(rec.digest, format!("sha256:{}", sha256(&f.image)));
    assert_eq!(rec.source.serial.as_deref(), Some("20250610"));
    assert_eq!(rec.default_user.as_deref(), Some("ubuntu"));
    assert_eq!(rec.format, "qcow2");
    assert_eq!(rec.virtual_size, 64 << 20);
    assert!(rec.verified);
    assert_eq!(fs::metadata(&rec.path).unwrap().permissions().mode() & 0o777, 0o444);
    assert!(tmp_is_empty(&f.store));
}

#[test]
fn pull_debian_verifies_sha512() {
    let f = fixture();
    serve_debian(&f, &f.image);

    let (rec, _) = run(&f.store, &request(&f, "debian:bookworm", "debian"));

    let rec = rec.unwrap();
    assert_eq!(rec.reference, "debian:12");
    assert_eq!(rec.source.checksum, Some(format!("sha512:{}", sha512(&f.image))));
    assert_eq!(rec.default_user.as_deref(), Some("debian"));
}

#[test]
fn pull_rocky_latest_resolves_to_build() {
    let f = fixture();
    serve_rocky(&f, &f.image);

    let (rec, _) = run(&f.store, &request(&f, "rocky:9", "rocky"));

    let rec = rec.unwrap();
    assert_eq!(rec.source.serial.as_deref(), Some("9.6-20250531.0"));
    assert!(rec.source.url.unwrap().ends_with(ROCKY_IMG));
    assert_eq!(rec.default_user.as_deref(), Some("rocky"));
}

#[test]
fn pull_tampered_image_deletes_partial_and_names_both_hashes() {
    let f = fixture();
    let mut tampered = f.image.clone();
    tampered[1 << 20] ^= 1;
    serve_ubuntu(&f, &tampered, &ubuntu_sums(&f.image));

    let (r, _) = run(&f.store, &request(&f, "ubuntu:24.04", "ubuntu"));

    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains(&sha256(&f.image)) && msg.contains(&sha256(&tampered)),
        "{msg}"
    );
    assert!(tmp_is_empty(&f.store));
    assert_eq!(blobs(&f.store), 0);
    assert!(f.store.list().unwrap().is_empty());
}

#[test]
fn pull_tampered_checksum_file_is_refused_before_download() {
    let f = fixture();
    let sums = ubuntu_sums(&f.image).replace(
        " *ubuntu-24.04-server-cloudimg-amd64.manifest",
        " ubuntu-24.04.manifest",
    );
    serve_ubuntu(&f, &f.image, &sums);

    let (r, _) = run(&f.store, &request(&f, "ubuntu:24.04", "ubuntu"));

    assert!(matches!(r, Err(PullError::Checksum { .. })), "{r:?}");
    assert!(f.server.hits(&format!("{UBUNTU_DIR}{UBUNTU_IMG}")).is_empty());
}

#[test]
fn pull_checksum_file_missing_the_file_is_refused() {
    let f = fixture();
    let sums = format!("{} *ubuntu-24.04-server-cloudimg-amd64.manifest\n", sha256(b"m"));
    serve_ubuntu(&f, &f.image, &sums);

    let (r, _) = run(&f.store, &request(&f, "ubuntu:24.04", "ubuntu"));

    let err = r.unwrap_err();
    assert!(err.source().unwrap().to_string().contains("is not listed"), "{err:?}");
}

#[test]
fn pull_sha256_in_sha512sums_is_wrong_length() {
    let f = fixture();
    serve_debian(&f, &f.image);
    f.server.put(
        &format!("{DEBIAN_DIR}SHA512SUMS"),
        format!("{}  {DEBIAN_IMG}\n", sha256(&f.image)),
    );

    let (r, _) = run(&f.store, &request(&f, "debian:12", "debian"));

    let err = r.unwrap_err();
    assert!(format!("{:?}", err).contains("WrongLength"), "{err:?}");
}

#[test]
fn pull_dropped_connection_resumes_with_range() {
    let f = fixture();
    serve_debian(&f, &f.image);
    let path = format!("{DEBIAN_DIR}{DEBIAN_IMG}");
    f.server.put_dropping(&path, f.image.clone(), 1 << 20);

    let (rec, events) = run(&f.store, &request(&f, "debian:12", "debian"));

    let rec = rec.unwrap();
    assert_eq!(rec.digest, format!("sha256:{}", sha256(&f.image)));
    let hits = f.server.hits(&path);
    assert_eq!(hits.len(), 2);
    assert!(
        hits[1]
            .range
            .as_deref()
            .is_some_and(|r| r.starts_with("bytes=") && r != "bytes=0-"),
        "{hits:?}"
    );
    assert!(events
        .iter()
        .any(|e| matches!(e, PullEvent::Transfer(DownloadEvent::Retry { .. }))));
}

#[test]
fn pull_interrupted_run_keeps_partial_and_next_run_resumes() {
    let f = fixture();
    serve_debian(&f, &f.image);
    let path = format!("{DEBIAN_DIR}{DEBIAN_IMG}");
    f.server.put_dropping(&path, f.image.clone(), 1 << 20);
    let mut req = request(&f, "debian:12", "debian");
    req.retries = 0;

    let (first, _) = run(&f.store, &req);
    let (second, _) = run(&f.store, &req);

    assert!(matches!(first, Err(PullError::Interrupted { .. })), "{first:?}");
    assert_eq!(second.unwrap().digest, format!("sha256:{}", sha256(&f.image)));
    assert!(f.server.hits(&path)[1].range.is_some());
    assert!(tmp_is_empty(&f.store));
}

#[test]
fn pull_server_ignoring_range_restarts_cleanly() {
    let f = fixture();
    serve_debian(&f, &f.image);
    let path = format!("{DEBIAN_DIR}{DEBIAN_IMG}");
    f.server.put_dropping(&path, f.image.clone(), 1 << 20);
    let mut req = request(&f, "debian:12", "debian");
    req.retries = 0;
    let _ = run(&f.store, &req);
    f.server.put_ignoring_range(&path, f.image.clone());

    let (rec, events) = run(&f.store, &req);

    assert_eq!(rec.unwrap().digest, format!("sha256:{}", sha256(&f.image)));
    assert!(events
        .iter()
        .any(|e| matches!(e, PullEvent::Transfer(DownloadEvent::Restart { .. }))));
}

#[test]
fn pull_plain_http_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path()).unwrap();
    let req = PullRequest::new(PullSource::Url("http://127.0.0.1:9/x.qcow2".into()));

    let (r, _) = run(&store, &req);

    assert!(matches!(r, Err(PullError::HttpRefused(_))), "{r:?}");
}

#[test]
fn pull_http_mirror_is_refused() {
    let f = fixture();
    let mut req = request(&f, "debian:12", "debian");
    req.mirror = Some("http://127.0.0.1:9/debian".into());

    let (r, _) = run(&f.store, &req);

    assert!(matches!(r, Err(PullError::HttpRefused(_))), "{r:?}");
}

#[test]
fn pull_url_with_sidecar_sha256_is_verified() {
    let f = fixture();
    f.server.put("/files/My_Image.qcow2", f.image.clone());
    f.server.put(
        "/files/My_Image.qcow2.sha256",
        format!("{}  My_Image.qcow2\n", sha256(&f.image)),
    );

    let (rec, _) = run(&f.store, &url_request(&f, "/files/My_Image.qcow2"));

    let rec = rec.unwrap();
    assert_eq!(rec.reference, "my_image:latest");
    assert!(rec.verified);
}

#[test]
fn pull_url_without_checksum_is_refused() {
    let f = fixture();
    f.server.put("/files/x.qcow2", f.image.clone());

    let (r, _) = run(&f.store, &url_request(&f, "/files/x.qcow2"));

    let msg = r.unwrap_err().to_string();
    assert!(
        msg.contains("only TLS vouches") && msg.contains("--insecure-no-checksum"),
        "{msg}"
    );
    assert!(f.server.hits("/files/x.qcow2").is_empty());
}

#[test]
fn pull_url_insecure_no_checksum_records_unverified() {
    let f = fixture();
    f.server.put("/files/x.qcow2", f.image.clone());
    let mut req = url_request(&f, "/files/x.qcow2");
    req.insecure_no_checksum = true;
    req.name = Some(ImageRef::parse("mine:1").unwrap());

    let (rec, events) = run(&f.store, &req);

    let rec = rec.unwrap();
    assert_eq!(rec.reference, "mine:1");
    assert!(!rec.verified);
    assert!(events.iter().any(|e| matches!(e, PullEvent::Unverified { .. })));
}

#[test]
fn pull_url_given_checksum_mismatch_is_refused() {
    let f = fixture();
    f.server.put("/files/x.qcow2", f.image.clone());
    let mut req = url_request(&f, "/files/x.qcow2");
    req.checksum = Some(format!("sha256:{}", sha256(b"other")).parse().unwrap());

    let (r, _) = run(&f.store, &req);

    assert!(matches!(r, Err(PullError::Mismatch { .. })), "{r:?}");
    assert!(tmp_is_empty(&f.store));
}

#[test]
fn pull_concurrent_pulls_download_once() {
    let f = fixture();
    serve_rocky(&f, &f.image);
    let req = request(&f, "rocky:9", "rocky");

    let results: Vec<_> = std::thread::scope(|s| {
        let a = s.spawn(|| run(&f.store, &req).0);
        let b = s.spawn(|| run(&f.store, &req).0);
        vec![a.join().unwrap(), b.join().unwrap()]
    });

    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(f.server.hits(&format!("{ROCKY_DIR}{ROCKY_IMG}")).len(), 1);
    assert_eq!(blobs(&f.store), 1);
    assert!(tmp_is_empty(&f.store));
}

#[test]
fn pull_untrusted_ca_fails() {
    let f = fixture();
    serve_debian(&f, &f.image);
    let mut req = request(&f, "debian:12", "debian");
    let other = tempfile::tempdir().unwrap();
    let stranger = Server::start(other.path());
    req.tls.extra_ca = vec![stranger.ca.clone()];
    req.tls.ca_bundle = Some(stranger.ca.clone());

    let (r, _) = run(&f.store, &req);

    assert!(matches!(r, Err(PullError::Untrusted { .. })), "{r:?}");
}
