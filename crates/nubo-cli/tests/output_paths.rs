//! Issue 21 item 13: every flag naming a file nubo writes follows the one output-path rule of
//! `seed build -o`: a symlink (to a file or dangling), a FIFO, a device (/dev/null) or a
//! directory at the path is refused, never written through, never blocks; `--force` replaces a
//! regular file only, atomically. `image init -f L --force` used to follow a symlink and clobber
//! its target, create a dangling link's target, hang on a FIFO and "write" /dev/null.

mod support;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// A refusal is immediate; a run that takes longer opened a FIFO or similar.
const FAST: Duration = Duration::from_secs(10);

fn nubo(dir: &Path, args: &[&str]) -> (Output, Duration) {
    let t = Instant::now();
    let out = support::nubo(dir, args, 6 * FAST);
    (out, t.elapsed())
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every writer flag, with `OUT` where the output path goes.
fn writers(src: &str) -> Vec<Vec<String>> {
    let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    vec![
        v(&["seed", "build", "-o", "OUT", "--hostname", "h"]),
        v(&["seed", "build", "OUT", "user-data"]),
        v(&["image", "convert", src, "--to", "qcow2", "-o", "OUT"]),
        v(&["image", "init", "-f", "OUT"]),
        v(&["image", "init", "-f", "OUT", "--force"]),
    ]
}

struct Hostile {
    /// The output path handed to nubo.
    out: PathBuf,
    /// The words the refusal must contain.
    kind: &'static str,
}

/// A fresh directory with every hostile output, a victim file and a source image.
fn setup(dir: &Path) -> (Vec<Hostile>, PathBuf) {
    let victim = dir.join("victim");
    std::fs::write(&victim, b"keep").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join("link")).unwrap();
    std::os::unix::fs::symlink(dir.join("absent"), dir.join("dangling")).unwrap();
    let ok = std::process::Command::new("mkfifo")
        .arg(dir.join("fifo"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo");
    std::fs::create_dir(dir.join("adir")).unwrap();
    std::fs::write(dir.join("user-data"), b"#cloud-config\n").unwrap();
    nubo_disk::create_qcow2(&dir.join("src.qcow2"), 1 << 20).unwrap();
    let hostile = vec![
        Hostile {
            out: dir.join("link"),
            kind: "symbolic link",
        },
        Hostile {
            out: dir.join("dangling"),
            kind: "symbolic link",
        },
        Hostile {
            out: dir.join("fifo"),
            kind: "FIFO",
        },
        Hostile {
            out: "/dev/null".into(),
            kind: "character device",
        },
        Hostile {
            out: dir.join("adir"),
            kind: "directory",
        },
    ];
    (hostile, victim)
}

#[test]
fn every_writer_flag_refuses_symlink_dangling_link_fifo_device_and_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (hostile, victim) = setup(d);
    let src = d.join("src.qcow2");

    for w in writers(src.to_str().unwrap()) {
        for h in &hostile {
            let args: Vec<String> = w
                .iter()
                .map(|a| {
                    if a == "OUT" {
                        h.out.display().to_string()
                    } else {
                        a.clone()
                    }
                })
                .collect();
            let args: Vec<&str> = args.iter().map(String::as_str).collect();

            let (o, took) = nubo(d, &args);

            let err = stderr(&o);
            assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
            assert!(err.contains(h.kind), "{args:?}: expected `{}` in: {err}", h.kind);
            assert!(took < FAST, "{args:?} took {took:?}");
            assert_eq!(
                std::fs::read(&victim).unwrap(),
                b"keep",
                "{args:?} wrote through the link"
            );
            assert!(
                !d.join("absent").exists(),
                "{args:?} created the dangling link's target"
            );
            assert!(
                std::fs::symlink_metadata(d.join("link"))
                    .unwrap()
                    .file_type()
                    .is_symlink(),
                "{args:?} replaced the link"
            );
        }
    }
    // What nubo may have made of its own state lives under root/; nothing else is left.
    let mut left: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "root")
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["adir", "dangling", "fifo", "link", "src.qcow2", "user-data", "victim"],
        "temporary files left behind"
    );
}

#[test]
fn init_force_replaces_a_regular_file_atomically_and_without_force_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("VMfile"), b"mine").unwrap();

    let (refused, _) = nubo(d, &["image", "init", "-f", "VMfile"]);
    let kept = std::fs::read(d.join("VMfile")).unwrap();
    let (forced, _) = nubo(d, &["image", "init", "-f", "VMfile", "--force"]);

    assert_eq!(refused.status.code(), Some(1));
    assert!(stderr(&refused).contains("pass --force"), "{}", stderr(&refused));
    assert_eq!(kept, b"mine");
    assert!(forced.status.success(), "{}", stderr(&forced));
    let text = std::fs::read_to_string(d.join("VMfile")).unwrap();
    assert!(text.contains("FROM debian:12"), "{text}");
    assert_eq!(std::fs::read_dir(d).unwrap().count(), 1, "a temporary file was left");
}

#[test]
fn convert_existing_regular_output_refused_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    nubo_disk::create_qcow2(&d.join("src.qcow2"), 1 << 20).unwrap();
    std::fs::write(d.join("out.qcow2"), b"mine").unwrap();

    let (o, _) = nubo(
        d,
        &["image", "convert", "src.qcow2", "--to", "qcow2", "-o", "out.qcow2"],
    );

    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert_eq!(std::fs::read(d.join("out.qcow2")).unwrap(), b"mine");
}
