//! Hostile and ordinary layers, built in memory with the tar crate's builder (raw header bytes
//! where the builder refuses the hostile entry).

use std::io::Write;
use std::os::unix::fs::MetadataExt;

use super::*;
use tar::{EntryType, Header};

enum E<'a> {
    File(&'a str, &'a [u8], u32),
    Dir(&'a str),
    Sym(&'a str, &'a str),
    Hard(&'a str, &'a str),
    Node(&'a str, EntryType),
    /// A regular file header declaring `size` bytes with none following.
    Declares(&'a str, u64),
    /// A pax header of these raw records (`key=value`), describing the next entry.
    Pax(&'a [(&'a [u8], &'a [u8])]),
}

/// pax records: `<len> <key>=<value>\n`, the length counting itself.
fn pax_records(recs: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in recs {
        let body = k.len() + v.len() + 3; // ' ', '=', '\n'
        let mut len = body + body.to_string().len();
        if len.to_string().len() != body.to_string().len() {
            len += 1;
        }
        out.extend_from_slice(format!("{len} ").as_bytes());
        out.extend_from_slice(k);
        out.push(b'=');
        out.extend_from_slice(v);
        out.push(b'\n');
    }
    out
}

/// The name written byte for byte, as the builder would refuse `..`.
fn header(path: &str, ty: EntryType, size: u64, mode: u32) -> Header {
    let mut h = Header::new_gnu();
    let name = &mut h.as_old_mut().name;
    name[..path.len()].copy_from_slice(path.as_bytes());
    h.set_entry_type(ty);
    h.set_size(size);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(1_000_000);
    h
}

/// The archive written block by block (the builder would refuse the hostile entries and
/// ends the archive on `into_inner`).
fn tar_of(entries: &[E<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let (mut h, data): (Header, &[u8]) = match e {
            E::File(p, d, m) => (header(p, EntryType::Regular, d.len() as u64, *m), d),
            E::Dir(p) => (header(p, EntryType::Directory, 0, 0o755), &[]),
            E::Sym(p, t) => {
                let mut h = header(p, EntryType::Symlink, 0, 0o777);
                h.set_link_name_literal(t).unwrap();
                (h, &[])
            }
            E::Hard(p, t) => {
                let mut h = header(p, EntryType::Link, 0, 0o644);
                h.set_link_name_literal(t).unwrap();
                (h, &[])
            }
            E::Node(p, ty) => {
                let mut h = header(p, *ty, 0, 0o600);
                h.set_device_major(5).unwrap();
                h.set_device_minor(1).unwrap();
                (h, &[])
            }
            // The header alone: the data it declares never follows.
            E::Declares(p, size) => (header(p, EntryType::Regular, *size, 0o644), &[]),
            E::Pax(recs) => {
                let body = pax_records(recs);
                let mut h = header("PaxHeaders/x", EntryType::XHeader, body.len() as u64, 0o644);
                h.set_cksum();
                out.extend_from_slice(h.as_bytes());
                out.extend_from_slice(&body);
                out.resize(out.len().div_ceil(512) * 512, 0);
                continue;
            }
        };
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0; 1024]);
    out
}

fn sha(b: &[u8]) -> String {
    format!("sha256:{}", nubo_core::hex(ring::digest::digest(&SHA256, b).as_ref()))
}

/// Writes `tar` compressed as `c` into `dir` and describes it truly.
fn layer(dir: &Path, n: usize, tar: &[u8], c: Compression) -> Layer {
    let (bytes, media_type) = match c {
        Compression::None => (tar.to_vec(), LAYER_TAR),
        Compression::Gzip => {
            let mut g = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            g.write_all(tar).unwrap();
            (g.finish().unwrap(), LAYER_GZIP)
        }
        Compression::Zstd => (zstd::encode_all(tar, 1).unwrap(), LAYER_ZSTD),
    };
    let path = dir.join(format!("layer{n}"));
    fs::write(&path, &bytes).unwrap();
    Layer {
        path,
        media_type: media_type.into(),
        digest: sha(&bytes),
        size: bytes.len() as u64,
        diff_id: Some(sha(tar)),
    }
}

const LIMITS: Limits = Limits {
    max_bytes: 1 << 30,
    max_entries: 1000,
};

struct Case {
    dir: tempfile::TempDir,
    /// A directory beside the root: nothing may ever appear in it.
    outside: PathBuf,
    dest: PathBuf,
}

fn case() -> Case {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let dest = dir.path().join("work").join("root");
    fs::create_dir(dir.path().join("work")).unwrap();
    Case { dest, outside, dir }
}

impl Case {
    fn run(&self, layers: &[&[E<'_>]]) -> Result<Unpacked, UnpackError> {
        let ls: Vec<Layer> = layers
            .iter()
            .enumerate()
            .map(|(i, es)| layer(self.dir.path(), i, &tar_of(es), Compression::None))
            .collect();
        unpack(&ls, &self.dest, &LIMITS)
    }

    /// The unpack was refused, the work directory is gone and nothing was written outside it.
    fn assert_refused(&self, r: Result<Unpacked, UnpackError>, says: &str) {
        let err = r.expect_err("the layer must be refused");
        assert!(err.to_string().contains(says), "{err}");
        assert!(!self.dest.exists(), "the work directory was left behind");
        assert_eq!(
            fs::read_dir(&self.outside).unwrap().count(),
            0,
            "something was written outside"
        );
        assert_eq!(
            fs::read_dir(self.dir.path().join("work")).unwrap().count(),
            0,
            "something was left beside the root"
        );
    }
}

#[test]
fn unpack_ordinary_layers_keep_modes_owners_times() {
    let c = case();
    let mut h = header("usr/bin/tool", EntryType::Regular, 2, 0o4755);
    h.set_uid(1234);
    h.set_gid(99);
    h.set_cksum();
    let mut b = tar::Builder::new(Vec::new());
    b.append(&h, &b"hi"[..]).unwrap();
    let l = layer(c.dir.path(), 0, &b.into_inner().unwrap(), Compression::None);

    let out = unpack(&[l], &c.dest, &LIMITS).unwrap();

    let m = fs::symlink_metadata(c.dest.join("usr/bin/tool")).unwrap();
    assert_eq!(fs::read(c.dest.join("usr/bin/tool")).unwrap(), b"hi");
    assert_eq!((m.mode() & 0o7777, m.mtime()), (0o4755, 1_000_000));
    if out.ownership {
        assert_eq!((m.uid(), m.gid()), (1234, 99));
    }
    assert_eq!((out.entries, out.bytes), (1, 2));
}

#[test]
fn unpack_gzip_and_zstd_layers_apply_in_order() {
    let c = case();
    let a = layer(
        c.dir.path(),
        0,
        &tar_of(&[E::File("etc/a", b"one", 0o644), E::File("etc/b", b"b", 0o644)]),
        Compression::Gzip,
    );
    let b = layer(
        c.dir.path(),
        1,
        &tar_of(&[E::File("etc/a", b"two", 0o600)]),
        Compression::Zstd,
    );

    unpack(&[a, b], &c.dest, &LIMITS).unwrap();

    assert_eq!(fs::read(c.dest.join("etc/a")).unwrap(), b"two");
    assert_eq!(fs::read(c.dest.join("etc/b")).unwrap(), b"b");
}

#[test]
fn unpack_whiteout_removes_lower_file_and_dir() {
    let c = case();

    c.run(&[
        &[
            E::File("a/x", b"x", 0o644),
            E::File("a/d/y", b"y", 0o644),
            E::File("a/z", b"z", 0o644),
        ],
        &[E::File("a/.wh.x", b"", 0o644), E::File("a/.wh.d", b"", 0o644)],
    ])
    .unwrap();

    let names: Vec<_> = fs::read_dir(c.dest.join("a"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["z"]);
}

#[test]
fn unpack_opaque_dir_hides_lower_keeps_same_layer() {
    let c = case();

    c.run(&[
        &[E::File("d/old", b"o", 0o644), E::File("d/sub/old", b"o", 0o644)],
        &[E::File("d/new", b"n", 0o644), E::File("d/.wh..wh..opq", b"", 0o644)],
    ])
    .unwrap();

    let names: Vec<_> = fs::read_dir(c.dest.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["new"]);
}

#[test]
fn unpack_hard_link_shares_inode() {
    let c = case();

    c.run(&[&[E::File("bin/a", b"x", 0o755), E::Hard("bin/b", "bin/a")]])
        .unwrap();

    let (a, b) = (
        fs::metadata(c.dest.join("bin/a")).unwrap(),
        fs::metadata(c.dest.join("bin/b")).unwrap(),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
}

#[test]
fn unpack_symlink_is_written_as_link_not_followed() {
    let c = case();
    let target = c.outside.join("secret");

    c.run(&[&[E::Sym("etc/link", target.to_str().unwrap())]]).unwrap();

    assert_eq!(fs::read_link(c.dest.join("etc/link")).unwrap(), target);
    assert!(!target.exists());
}

#[test]
fn unpack_file_over_absolute_symlink_replaces_link() {
    let c = case();
    let target = c.outside.join("victim");

    c.run(&[
        &[E::Sym("etc/passwd", target.to_str().unwrap())],
        &[E::File("etc/passwd", b"root", 0o644)],
    ])
    .unwrap();

    assert_eq!(fs::read(c.dest.join("etc/passwd")).unwrap(), b"root");
    assert_eq!(fs::read_dir(&c.outside).unwrap().count(), 0);
}

#[test]
fn unpack_absolute_path_lands_inside_root() {
    let c = case();

    c.run(&[&[E::File("/etc/hostname", b"h", 0o644)]]).unwrap();

    assert_eq!(fs::read(c.dest.join("etc/hostname")).unwrap(), b"h");
}

#[test]
fn unpack_dotdot_path_refused() {
    let c = case();

    let r = c.run(&[&[E::File("../outside/evil", b"x", 0o644)]]);

    c.assert_refused(r, "`..` component");
}

#[test]
fn unpack_dotdot_inside_path_refused() {
    let c = case();

    let r = c.run(&[&[E::File("etc/../../outside/evil", b"x", 0o644)]]);

    c.assert_refused(r, "`..` component");
}

#[test]
fn unpack_absolute_symlink_then_file_through_it_refused() {
    let c = case();
    let outside = c.outside.to_str().unwrap().to_owned();

    let r = c.run(&[&[E::Sym("escape", &outside), E::File("escape/evil", b"x", 0o644)]]);

    c.assert_refused(r, "never follows a link");
}

#[test]
fn unpack_symlink_in_lower_layer_then_file_through_it_refused() {
    let c = case();
    let outside = c.outside.to_str().unwrap().to_owned();

    let r = c.run(&[&[E::Sym("etc", &outside)], &[E::File("etc/cron.d/evil", b"x", 0o644)]]);

    c.assert_refused(r, "never follows a link");
}

#[test]
fn unpack_relative_symlink_parent_refused() {
    let c = case();

    let r = c.run(&[&[
        E::Dir("real"),
        E::Sym("lnk", "../../outside"),
        E::File("lnk/evil", b"x", 0o644),
    ]]);

    c.assert_refused(r, "never follows a link");
}

#[test]
fn unpack_hard_link_through_symlink_refused() {
    let c = case();
    let outside = c.outside.to_str().unwrap().to_owned();
    fs::write(c.outside.join("f"), b"host").unwrap();

    let r = c.run(&[&[E::Sym("out", &outside), E::Hard("stolen", "out/f")]]);

    let err = r.unwrap_err();
    assert!(err.to_string().contains("link target /out/f"), "{err}");
    assert!(!c.dest.exists());
    assert_eq!(fs::read(c.outside.join("f")).unwrap(), b"host");
}

#[test]
fn unpack_hard_link_dotdot_target_refused() {
    let c = case();

    let r = c.run(&[&[E::Hard("stolen", "../outside/f")]]);

    c.assert_refused(r, "`..` component");
}

#[test]
fn unpack_hard_link_to_missing_target_refused() {
    let c = case();

    let r = c.run(&[&[E::Hard("b", "a")]]);

    c.assert_refused(r, "not unpacked yet");
}

#[test]
fn unpack_whiteout_of_dotdot_refused() {
    let c = case();

    let r = c.run(&[&[E::File("etc/x", b"x", 0o644)], &[E::File("etc/.wh...", b"", 0o644)]]);

    c.assert_refused(r, "a whiteout of `..`");
}

#[test]
fn unpack_enormous_sparse_declared_file_refused_before_writing() {
    let c = case();

    let r = c.run(&[&[E::File("first", b"x", 0o644), E::Declares("big", 1 << 40)]]);

    c.assert_refused(r, "1099511627776 bytes");
}

#[test]
fn unpack_device_node_outside_dev_refused() {
    let c = case();

    let r = c.run(&[&[E::Node("usr/bin/disk", EntryType::Block)]]);

    c.assert_refused(r, "device node");
}

#[test]
fn unpack_device_node_under_dev_recorded_not_made() {
    let c = case();

    let out = c
        .run(&[&[E::Dir("dev"), E::Node("dev/console", EntryType::Char)]])
        .unwrap();

    assert_eq!(out.skipped_devices, ["/dev/console c 5:1"]);
    assert!(!c.dest.join("dev/console").exists());
}

#[test]
fn unpack_layer_whose_digest_lies_refused() {
    let c = case();
    let mut l = layer(
        c.dir.path(),
        0,
        &tar_of(&[E::File("a", b"x", 0o644)]),
        Compression::Gzip,
    );
    l.digest = sha(b"something else");

    let r = unpack(&[l], &c.dest, &LIMITS);

    c.assert_refused(r, "does not match its digest");
}

#[test]
fn unpack_layer_whose_size_lies_refused() {
    let c = case();
    let mut l = layer(
        c.dir.path(),
        0,
        &tar_of(&[E::File("a", b"x", 0o644)]),
        Compression::None,
    );
    l.size -= 1;

    let r = unpack(&[l], &c.dest, &LIMITS);

    c.assert_refused(r, "bytes, not the");
}

#[test]
fn unpack_diff_id_lie_refused() {
    let c = case();
    let mut l = layer(
        c.dir.path(),
        0,
        &tar_of(&[E::File("a", b"x", 0o644)]),
        Compression::Zstd,
    );
    l.diff_id = Some(sha(b"other"));

    let r = unpack(&[l], &c.dest, &LIMITS);

    c.assert_refused(r, "diff_id");
}

#[test]
fn unpack_later_bad_layer_leaves_nothing() {
    let c = case();

    let r = c.run(&[&[E::File("ok", b"x", 0o644)], &[E::File("../x", b"x", 0o644)]]);

    c.assert_refused(r, "`..` component");
}

#[test]
fn unpack_garbage_blob_is_malformed() {
    let c = case();
    let path = c.dir.path().join("g");
    fs::write(&path, b"this is no gzip").unwrap();
    let l = Layer {
        path,
        media_type: LAYER_GZIP.into(),
        digest: sha(b"this is no gzip"),
        size: 15,
        diff_id: None,
    };

    let r = unpack(&[l], &c.dest, &LIMITS);

    c.assert_refused(r, "not a readable tar stream");
}

#[test]
fn unpack_unknown_media_type_refused() {
    let c = case();
    let mut l = layer(
        c.dir.path(),
        0,
        &tar_of(&[E::File("a", b"x", 0o644)]),
        Compression::None,
    );
    l.media_type = "application/vnd.nubo.vm.disk.qcow2.v1".into();

    let r = unpack(&[l], &c.dest, &LIMITS);

    c.assert_refused(r, "is not a tar layer");
}

#[test]
fn unpack_too_many_entries_refused() {
    let c = case();
    let names: Vec<String> = (0..5).map(|i| format!("f{i}")).collect();
    let es: Vec<E<'_>> = names.iter().map(|n| E::File(n, b"", 0o644)).collect();
    let l = layer(c.dir.path(), 0, &tar_of(&es), Compression::None);

    let r = unpack(
        &[l],
        &c.dest,
        &Limits {
            max_bytes: 1 << 20,
            max_entries: 3,
        },
    );

    c.assert_refused(r, "more than 3 entries");
}

#[test]
fn unpack_long_gnu_name_kept() {
    let c = case();
    let long = format!("d/{}", "n".repeat(200));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = header("x", EntryType::Regular, 1, 0o644);
    b.append_data(&mut h, &long, &b"x"[..]).unwrap();
    let l = layer(c.dir.path(), 0, &b.into_inner().unwrap(), Compression::None);

    unpack(&[l], &c.dest, &LIMITS).unwrap();

    assert_eq!(fs::read(c.dest.join(&long)).unwrap(), b"x");
}

#[test]
fn unpack_existing_dest_refused_untouched() {
    let c = case();
    fs::create_dir(&c.dest).unwrap();
    fs::write(c.dest.join("keep"), b"k").unwrap();

    let r = c.run(&[&[E::File("a", b"x", 0o644)]]);

    assert!(r.is_err());
    assert_eq!(fs::read(c.dest.join("keep")).unwrap(), b"k");
}

#[test]
fn unpack_device_node_without_numbers_outside_dev_refused() {
    let c = case();
    let mut h = header("usr/bin/disk", EntryType::Block, 0, 0o600);
    h.as_gnu_mut().unwrap().dev_major = [0; 8];
    h.set_cksum();
    let mut tar = h.as_bytes().to_vec();
    tar.extend_from_slice(&[0; 1024]);
    let l = layer(c.dir.path(), 0, &tar, Compression::None);

    let r = unpack(&[l], &c.dest, &LIMITS);

    c.assert_refused(r, "device node");
}

fn lgetxattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: NUL-terminated strings and a buffer of buf.len() writable bytes.
    #[allow(unsafe_code)]
    let n = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

#[test]
fn unpack_pax_user_xattr_set_on_file() {
    let c = case();

    let out = c
        .run(&[&[
            E::Pax(&[(b"SCHILY.xattr.user.nubo", b"v1")]),
            E::File("usr/bin/ping", b"x", 0o755),
        ]])
        .unwrap();

    assert_eq!(
        lgetxattr(&c.dest.join("usr/bin/ping"), "user.nubo").as_deref(),
        Some(&b"v1"[..])
    );
    assert_eq!((out.xattrs, out.skipped_xattrs), (1, 0));
}

#[test]
fn unpack_pax_xattr_outside_namespaces_refused() {
    let c = case();

    let r = c.run(&[&[E::Pax(&[(b"SCHILY.xattr.evil", b"v")]), E::File("a", b"x", 0o644)]]);

    c.assert_refused(r, "in no namespace Linux knows");
}

#[test]
fn unpack_pax_xattr_value_too_big_refused() {
    let c = case();
    let big = vec![b'a'; MAX_XATTR_VALUE + 1];

    let r = c.run(&[&[E::Pax(&[(b"SCHILY.xattr.user.big", &big)]), E::File("a", b"x", 0o644)]]);

    c.assert_refused(r, "holds 65537 bytes");
}

#[test]
fn unpack_pax_xattr_on_symlink_counted_not_set() {
    let c = case();

    let out = c
        .run(&[&[E::Pax(&[(b"SCHILY.xattr.user.x", b"v")]), E::Sym("l", "/etc/passwd")]])
        .unwrap();

    assert_eq!((out.xattrs, out.skipped_xattrs), (0, 1));
}

#[test]
fn xattr_settable_root_only_names() {
    assert!(xattr_settable(b"user.a", false));
    assert!(!xattr_settable(b"security.capability", false));
    assert!(xattr_settable(b"security.capability", true));
    assert!(xattr_settable(b"trusted.overlay.opaque", true));
    assert!(!xattr_settable(b"security.selinux", true));
    assert!(!xattr_settable(b"system.posix_acl_access", true));
    assert!(!xattr_settable(b"user.", false));
}
