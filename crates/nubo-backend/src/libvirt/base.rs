//! A remote host's base images: content-addressed volumes of its storage pool.
//!
//! On a remote host (a `qemu+tls` or `qemu+ssh` URI) the base file in this host's image store
//! is not there, so the OS disk's overlay volume cannot back onto it. The base is uploaded once
//! into the pool as `nubo-base-<first 16 hex of its SHA-256>.<format>` through libvirt's volume
//! upload stream, streamed from the file in chunks and hashed on the way; then read back through
//! the download stream and hashed again: only a volume whose bytes read back with the store's
//! digest and length is used (the containerd/ORAS rule: verify, then name it by the digest).
//! A volume of that name that verifies is reused, so VMs on one host share one upload; one
//! that does not (an upload killed half-way) is deleted and made again, and a failed upload
//! deletes its own volume: a re-run converges. `vm rm` never deletes a base volume;
//! [`prune`] deletes those no overlay volume of the pool backs onto.

use std::io::Read;
use std::path::Path;

use ring::digest::{Context, SHA256};

use super::ffi::{self, Connection, StoragePool, StorageVol};
use super::{remote, render};
use crate::BackendError;

/// The prefix of every base volume nubo makes; [`prune`] touches nothing else.
pub const PREFIX: &str = "nubo-base-";
/// Hex digits of the digest in a volume name: 64 bits, no collision among a host's bases.
const NAME_HEX: usize = 16;

/// The base volume's name for a base of SHA-256 `digest` (hex) in `format`.
pub fn volume_name(digest: &str, format: &str) -> String {
    format!("{PREFIX}{}.{format}", &digest[..NAME_HEX.min(digest.len())])
}

/// Whether `name` is a base volume's name (`nubo-base-<16 hex>.<format>`).
pub fn is_base_volume(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .and_then(|r| r.split_once('.'))
        .is_some_and(|(hex, fmt)| {
            hex.len() == NAME_HEX
                && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                && matches!(fmt, "qcow2" | "raw" | "vmdk")
        })
}

/// The digest the store named `base` by (`blobs/<64 hex>.<format>`), if it is a store blob.
pub fn digest_from_name(base: &Path) -> Option<String> {
    let stem = base.file_stem()?.to_str()?;
    let in_blobs = base.parent().and_then(Path::file_name).is_some_and(|n| n == "blobs");
    (in_blobs && stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| stem.to_owned())
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> BackendError {
    BackendError::io(what)
}

/// SHA-256 of `base`: the store's digest when it is a store blob (the upload hashes the bytes
/// again and refuses a mismatch), else hashed here (a user's own `--disk`).
fn local_digest(base: &Path) -> Result<String, BackendError> {
    if let Some(d) = digest_from_name(base) {
        return Ok(d);
    }
    let mut f = std::fs::File::open(base).map_err(io_err(format!("opening base {}", base.display())))?;
    let mut ctx = Context::new(&SHA256);
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(io_err(format!("reading base {}", base.display())))?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(hex(ctx.finish().as_ref()))
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    ctx: Context,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.ctx.update(&buf[..n]);
        Ok(n)
    }
}

/// A base volume in the host's pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseVolume {
    pub name: String,
    /// Its path on the host: the overlay volume's `<backingStore>`.
    pub path: String,
    /// Whether this call uploaded it (else a verified volume was reused).
    pub uploaded: bool,
}

/// Reads `vol` back through the download stream: `Ok(None)` when it holds exactly `len`
/// bytes whose SHA-256 is `digest`, `Ok(Some(why))` when it holds something else, an error
/// when it could not be read (which proves nothing about it).
fn verify(
    conn: &Connection,
    vol: &StorageVol,
    name: &str,
    len: u64,
    digest: &str,
) -> Result<Option<String>, BackendError> {
    let mut ctx = Context::new(&SHA256);
    let got = match conn.download_to(vol, len, &mut |chunk| ctx.update(chunk)) {
        Ok(n) => n,
        // More bytes than the base: a mismatch, not a failure to read.
        Err(e) if e.code == ffi::ERR_OVER_MAX => len + 1,
        Err(e) => return Err(remote(format!("reading base volume `{name}` back"))(e)),
    };
    let d = hex(ctx.finish().as_ref());
    Ok((got != len || d != digest).then(|| {
        format!("it does not verify (it reads back as {got} bytes with sha256 {d}, not the base's {len} bytes with sha256 {digest})")
    }))
}

fn mismatch(name: &str, why: String) -> BackendError {
    BackendError::Remote {
        what: format!("base volume `{name}`"),
        detail: why,
    }
}

/// The volumes of `pool` whose backing store is `path`.
fn users(pool: &StoragePool, pool_name: &str, path: &str) -> Result<Vec<String>, BackendError> {
    let mut out = Vec::new();
    for v in pool
        .volumes()
        .map_err(remote(format!("listing the volumes of pool `{pool_name}`")))?
    {
        let name = v.name().map_err(remote(format!("a volume of pool `{pool_name}`")))?;
        let xml = v.xml().map_err(remote(format!("volume `{name}`")))?;
        if super::xml::volume_backing(&xml).ok().flatten().as_deref() == Some(path) {
            out.push(name);
        }
    }
    Ok(out)
}

/// The base volumes this process verified (read back and hashed, or uploaded and hashed), by
/// URI, pool and volume name, with the volume's [`volume_fingerprint`] then: a volume that
/// still has that fingerprint holds the same bytes, so the next VM's create on that host does
/// not read the whole base back again (the controller makes many VMs per host; each read-back
/// took seconds over TLS and ran under the upload turn, one create at a time).
///
/// [`volume_fingerprint`]: super::xml::volume_fingerprint
#[derive(Default)]
pub struct Verified(std::sync::Mutex<std::collections::HashMap<(String, String, String), String>>);

impl Verified {
    fn key(uri: &str, pool: &str, name: &str) -> (String, String, String) {
        (uri.to_owned(), pool.to_owned(), name.to_owned())
    }

    /// Whether `vol` still has the fingerprint it had when this process verified it.
    fn holds(&self, uri: &str, pool: &str, name: &str, vol: &StorageVol) -> bool {
        let Some(now) = vol.xml().ok().and_then(|x| super::xml::volume_fingerprint(&x)) else {
            return false;
        };
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&Self::key(uri, pool, name)) == Some(&now)
    }

    /// Records `vol` as verified now (nothing when its pool reports no fingerprint).
    fn record(&self, uri: &str, pool: &str, name: &str, vol: &StorageVol) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match vol.xml().ok().and_then(|x| super::xml::volume_fingerprint(&x)) {
            Some(f) => m.insert(Self::key(uri, pool, name), f),
            None => m.remove(&Self::key(uri, pool, name)),
        };
    }

    fn forget(&self, uri: &str, pool: &str, name: &str) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.remove(&Self::key(uri, pool, name));
    }
}

/// The verified base volume for `base` (of `format`) in `pool` (named `pool_name`): reused if
/// one of its name verifies, else uploaded and verified; one this process verified before
/// (`verified`, at `uri`) and unchanged since is not read back again. Nothing half-made is
/// left: a failed upload or verification deletes the volume it made.
pub fn ensure(
    conn: &Connection,
    (uri, verified): (&str, &Verified),
    pool: &StoragePool,
    pool_name: &str,
    base: &Path,
    format: &str,
) -> Result<BaseVolume, BackendError> {
    // Creates from this host's nubo processes (or a daemon's threads) for the same base take
    // turns: a second would see the first's volume half-uploaded, fail to verify it and
    // delete it under the upload.
    let _turn = upload_turn(base)?;
    let digest = local_digest(base)?;
    let name = volume_name(&digest, format);
    let len = std::fs::metadata(base)
        .map_err(io_err(format!("reading base {}", base.display())))?
        .len();
    let _ = pool.refresh();
    if let Some(v) = pool
        .volume(&name)
        .map_err(remote(format!("looking up base volume `{name}`")))?
    {
        let path = v.path().map_err(remote(format!("base volume `{name}`")))?;
        if verified.holds(uri, pool_name, &name, &v) {
            return Ok(BaseVolume {
                name,
                path,
                uploaded: false,
            });
        }
        match verify(conn, &v, &name, len, &digest)? {
            None => {
                verified.record(uri, pool_name, &name, &v);
                return Ok(BaseVolume {
                    name,
                    path,
                    uploaded: false,
                });
            }
            // An upload killed half-way (its process could not delete it): made again, unless
            // disks back onto it (then deleting it would pull the floor from under them).
            Some(why) => {
                let users = users(pool, pool_name, &path)?;
                if !users.is_empty() {
                    return Err(mismatch(
                        &name,
                        format!(
                            "{why}; the disk volumes {} back onto it, so nubo leaves it: remove those VMs, then `nubo image prune --connect` and create again",
                            users.join(", ")
                        ),
                    ));
                }
                verified.forget(uri, pool_name, &name);
                v.delete()
                    .map_err(remote(format!("deleting the unverified base volume `{name}`")))?
            }
        }
    }
    let vol = pool
        .create_volume(&render::base_volume(&name, len))
        .map_err(remote(format!("creating base volume `{name}` in pool `{pool_name}`")))?;
    match upload(conn, &vol, &name, base, len, &digest) {
        Ok(path) => {
            verified.record(uri, pool_name, &name, &vol);
            Ok(BaseVolume {
                name,
                path,
                uploaded: true,
            })
        }
        Err(e) => {
            let _ = vol.delete();
            Err(e)
        }
    }
}

/// How long a create waits for another one uploading the same base (gigabytes over a WAN).
const TURN_WAIT: std::time::Duration = std::time::Duration::from_secs(3600);

/// An exclusive flock on the base file itself (read-only, never written), waited for with a
/// deadline.
fn upload_turn(base: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, BackendError> {
    use nix::fcntl::{Flock, FlockArg};
    let t0 = std::time::Instant::now();
    loop {
        let f = std::fs::File::open(base).map_err(io_err(format!("opening base {}", base.display())))?;
        match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((_, nix::errno::Errno::EWOULDBLOCK)) if t0.elapsed() < TURN_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
            Err((_, e)) => {
                return Err(BackendError::Remote {
                    what: format!("base {}", base.display()),
                    detail: format!(
                        "another nubo create is uploading it to a libvirt host and did not finish within {}s ({e}): try again once it has",
                        TURN_WAIT.as_secs()
                    ),
                })
            }
        }
    }
}

fn upload(
    conn: &Connection,
    vol: &StorageVol,
    name: &str,
    base: &Path,
    len: u64,
    digest: &str,
) -> Result<String, BackendError> {
    let f = std::fs::File::open(base).map_err(io_err(format!("opening base {}", base.display())))?;
    let mut src = Hashing {
        inner: f.take(len),
        ctx: Context::new(&SHA256),
    };
    conn.upload_from(vol, len, &mut src)
        .map_err(remote(format!("uploading base {} as volume `{name}`", base.display())))?;
    let sent = hex(src.ctx.finish().as_ref());
    if sent != digest {
        return Err(BackendError::InvalidSpec(format!(
            "base {} hashes to sha256 {sent}, not the {digest} it is stored under: the image store is damaged; remove the image (`nubo image rm`) and pull it again",
            base.display()
        )));
    }
    if let Some(why) = verify(conn, vol, name, len, digest)? {
        return Err(mismatch(name, why));
    }
    vol.path().map_err(remote(format!("base volume `{name}`")))
}

/// Deletes the base volumes of `pool` no other volume of it backs onto; returns their names.
pub fn prune(pool: &StoragePool, pool_name: &str, dry_run: bool) -> Result<Vec<String>, BackendError> {
    pool.refresh()
        .map_err(remote(format!("refreshing pool `{pool_name}`")))?;
    let vols = pool
        .volumes()
        .map_err(remote(format!("listing the volumes of pool `{pool_name}`")))?;
    let mut bases = Vec::new();
    let mut used = Vec::new();
    for v in vols {
        let name = v.name().map_err(remote(format!("a volume of pool `{pool_name}`")))?;
        if is_base_volume(&name) {
            let path = v.path().map_err(remote(format!("volume `{name}`")))?;
            bases.push((name, path, v));
        } else {
            let xml = v.xml().map_err(remote(format!("volume `{name}`")))?;
            if let Ok(Some(b)) = super::xml::volume_backing(&xml) {
                used.push(b);
            }
        }
    }
    let mut removed = Vec::new();
    for (name, path, v) in bases {
        if used.contains(&path) {
            continue;
        }
        if !dry_run {
            v.delete().map_err(remote(format!("deleting base volume `{name}`")))?;
        }
        removed.push(name);
    }
    Ok(removed)
}

/// The overlay volume `disk`'s backing store in `pool`, for the check before each boot.
pub fn backing_of(pool: &StoragePool, disk: &str) -> Result<Option<String>, BackendError> {
    let Some(v) = pool
        .volume(disk)
        .map_err(remote(format!("looking up volume `{disk}`")))?
    else {
        return Ok(None);
    };
    let xml = v.xml().map_err(remote(format!("volume `{disk}`")))?;
    super::xml::volume_backing(&xml).map_err(|e| BackendError::Remote {
        what: format!("volume `{disk}`"),
        detail: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vol_xml(mtime: &str) -> String {
        format!(
            "<volume type='file'><name>nubo-base-0123456789abcdef.qcow2</name>\
             <key>/pool/nubo-base-0123456789abcdef.qcow2</key><capacity unit='bytes'>4096</capacity>\
             <target><path>/pool/nubo-base-0123456789abcdef.qcow2</path>{mtime}</target></volume>"
        )
    }

    #[test]
    fn volume_fingerprint_moves_with_mtime_and_needs_one() {
        let t = |m: &str| format!("<timestamps><atime>1.5</atime><mtime>{m}</mtime></timestamps>");
        let a = super::super::xml::volume_fingerprint(&vol_xml(&t("1700000000.123456789")));
        let b = super::super::xml::volume_fingerprint(&vol_xml(&t("1700000000.123456790")));

        assert!(a.is_some());
        assert_ne!(a, b);
        // No mtime (not a file) or unreadable XML: no fingerprint, so the volume is read back.
        assert_eq!(super::super::xml::volume_fingerprint(&vol_xml("")), None);
        assert_eq!(
            super::super::xml::volume_fingerprint(&vol_xml("<timestamps><mtime></mtime></timestamps>")),
            None
        );
        assert_eq!(super::super::xml::volume_fingerprint("<volume"), None);
    }

    #[test]
    fn volume_name_takes_sixteen_hex_of_the_digest() {
        let d = "0123456789abcdef".repeat(4);

        assert_eq!(volume_name(&d, "qcow2"), "nubo-base-0123456789abcdef.qcow2");
    }

    #[test]
    fn is_base_volume_accepts_only_nubos_names() {
        assert!(is_base_volume("nubo-base-0123456789abcdef.qcow2"));
        assert!(!is_base_volume("nubo-base-0123456789ABCDEF.qcow2"));
        assert!(!is_base_volume("nubo-base-0123.qcow2"));
        assert!(!is_base_volume("web.qcow2"));
        assert!(!is_base_volume("nubo-base-0123456789abcdef.iso"));
    }

    #[test]
    fn digest_from_name_store_blob_is_its_digest() {
        let d = "ab".repeat(32);
        let p = format!("/var/lib/nubo/images/blobs/{d}.qcow2");

        assert_eq!(digest_from_name(Path::new(&p)), Some(d));
    }

    #[test]
    fn digest_from_name_user_file_is_none() {
        assert_eq!(digest_from_name(Path::new("/home/u/debian.qcow2")), None);
        let d = "ab".repeat(32);
        assert_eq!(digest_from_name(Path::new(&format!("/home/u/{d}.qcow2"))), None);
    }

    #[test]
    fn local_digest_user_file_is_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("disk.raw");
        std::fs::write(&p, b"abc").unwrap();

        let d = local_digest(&p).unwrap();

        assert_eq!(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}
