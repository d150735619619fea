//! `nubo image ls-remote` and `image pull` against a hostile registry on 127.0.0.1 (plain http,
//! `--insecure-registry`): a tag list with a newline and an escape sequence, and a manifest
//! dripped a byte every 2 s. The library's tests (crates/nubo-image/tests/registry_hostile.rs)
//! cover the rest; these prove the flags and the output as users see them.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

/// Serves every connection with `reply(path)`: `(status, body, drip)`; a drip sends the body a
/// byte every 2 s.
fn fake(reply: fn(&str) -> (u16, Vec<u8>, bool)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                let path = line.split_whitespace().nth(1).unwrap_or_default().to_owned();
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                        break;
                    }
                }
                let (status, body, drip) = reply(&path);
                let mut out = conn;
                let head = format!(
                    "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = out.write_all(head.as_bytes());
                if !drip {
                    let _ = out.write_all(&body);
                    return;
                }
                for b in body {
                    if out.write_all(&[b]).and_then(|()| out.flush()).is_err() {
                        return;
                    }
                    thread::sleep(Duration::from_secs(2));
                }
            });
        }
    });
    port
}

fn nubo(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nubo"))
        .args(args)
        .env("NUBO_ROOT", root.join("root"))
        .env("NUBO_RUN_DIR", root.join("run"))
        .env("HOME", root)
        .env_remove("REGISTRY_AUTH_FILE")
        .output()
        .expect("the nubo binary runs")
}

#[test]
fn ls_remote_tag_with_newline_is_listed_escaped_and_not_fetched() {
    let dir = tempfile::tempdir().unwrap();
    let port = fake(|path| {
        if path.contains("/tags/list") {
            (
                200,
                br#"{"name":"vm","tags":["ok-1","bad\nline\u001b[31m"]}"#.to_vec(),
                false,
            )
        } else if path.contains("bad") {
            // Never asked: a fetch of the bad tag would list it as something else.
            (200, b"{}".to_vec(), false)
        } else {
            (404, b"{}".to_vec(), false)
        }
    });

    let o = nubo(
        dir.path(),
        &[
            "image",
            "ls-remote",
            &format!("127.0.0.1:{port}/vm"),
            "--insecure-registry",
        ],
    );

    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(
        out.contains("invalid-tag") && out.contains("\\n") && !out.contains('\u{1b}'),
        "{out}"
    );
}

#[test]
fn pull_manifest_dripped_fails_at_timeout_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let port = fake(|path| {
        if path.contains("/manifests/") {
            (200, br#"{"schemaVersion":2}"#.to_vec(), true)
        } else {
            (200, b"{}".to_vec(), false)
        }
    });
    let t = Instant::now();

    let o = nubo(
        dir.path(),
        &[
            "image",
            "pull",
            &format!("127.0.0.1:{port}/vm:1"),
            "--insecure-registry",
            "--timeout",
            "3s",
        ],
    );

    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    assert!(err.contains("/v2/vm/manifests/1") && err.contains("--timeout"), "{err}");
}

#[test]
fn pull_timeout_zero_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();

    let o = nubo(dir.path(), &["image", "pull", "127.0.0.1:9/vm:1", "--timeout", "0s"]);

    assert_eq!(o.status.code(), Some(2));
}
