//! A pull that runs out of space leaves nothing behind: no partial, no blob, no record. The
//! "disk" is RLIMIT_FSIZE on a child process (this binary re-executed), so no root or tmpfs is
//! needed: writes past the limit fail with EFBIG exactly where ENOSPC would.

mod support;

use std::fs;
use std::process::Command;

use nix::sys::resource::{setrlimit, Resource};
use nix::sys::signal::{SigSet, Signal};
use nubo_image::{pull, ImageStore, PullError, PullRequest, PullSource, TlsSettings};
use support::{qcow2_bytes, sha256, Server};

const LIMIT: u64 = 1 << 20;

fn child(url: String, ca: String, store: String) -> ! {
    // SIGXFSZ would kill us; blocked, the write just fails with EFBIG.
    let mut set = SigSet::empty();
    set.add(Signal::SIGXFSZ);
    set.thread_block().unwrap();
    setrlimit(Resource::RLIMIT_FSIZE, LIMIT, LIMIT).unwrap();
    let store = ImageStore::open(store.as_ref()).unwrap();
    let mut req = PullRequest::new(PullSource::Url(url));
    req.tls = TlsSettings {
        ca_bundle: None,
        extra_ca: vec![ca.into()],
    };
    match pull(&store, &req, &mut |_| {}) {
        Err(PullError::Write { .. }) => std::process::exit(0),
        other => {
            eprintln!("expected a write error, got {other:?}");
            std::process::exit(1)
        }
    }
}

fn main() {
    if let (Ok(url), Ok(ca), Ok(store)) = (
        std::env::var("NUBO_TEST_URL"),
        std::env::var("NUBO_TEST_CA"),
        std::env::var("NUBO_TEST_STORE"),
    ) {
        child(url, ca, store);
    }
    if std::env::args().any(|a| a == "--list") {
        println!("pull_disk_full_leaves_nothing_behind: test");
        return;
    }

    // Arrange
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let image = qcow2_bytes(dir.path(), "img.qcow2", 3 << 20);
    server.put("/x.qcow2", image.clone());
    server.put("/x.qcow2.sha256", format!("{}\n", sha256(&image)));
    let store_dir = dir.path().join("images");
    let store = ImageStore::open(&store_dir).unwrap();

    // Act
    let status = Command::new(std::env::current_exe().unwrap())
        .env("NUBO_TEST_URL", server.url("/x.qcow2"))
        .env("NUBO_TEST_CA", &server.ca)
        .env("NUBO_TEST_STORE", &store_dir)
        .status()
        .unwrap();

    // Assert
    assert!(status.success(), "child: {status}");
    assert_eq!(fs::read_dir(store.tmp_dir()).unwrap().count(), 0, "tmp/ not empty");
    assert_eq!(
        fs::read_dir(store_dir.join("blobs")).unwrap().count(),
        0,
        "a blob was stored"
    );
    assert!(store.list().unwrap().is_empty());
    println!("test pull_disk_full_leaves_nothing_behind ... ok");
}
