//! Container image layers applied, in order, to a new work directory: the root tree of
//! `nubo image from-container`. A layer is hostile input.
//!
//! Two passes. The first reads every layer whole without writing anything: its sha256 and size
//! against its descriptor, its uncompressed sha256 against the config's `diff_id`, and every
//! entry's path (no `..`, no absolute escape, no whiteout of `..`), type (no device node outside
//! `/dev`, no GNU sparse file) and declared size (the sum of all regular files' sizes within
//! [`Limits::max_bytes`], checked before a byte is written, so a 2^40-byte sparse entry stops
//! there). The second pass writes, each layer's entries in order:
//!
//! - every path is reached from the root's directory handle one component at a time with
//!   `O_NOFOLLOW | O_DIRECTORY`: a symlink (even one the image itself made, even one pointing
//!   inside) is never followed, so a link to `/etc` followed by a file through it is refused;
//! - `.wh.NAME` removes NAME from the layers below, `.wh..wh..opq` empties its directory of
//!   what the layers below put there (entries of the same layer stay);
//! - regular files are created with `O_CREAT | O_EXCL` (a link left at the name is removed
//!   first, never written through), written to exactly their declared size;
//! - hard links must name a file already unpacked, reached the same way;
//! - symlinks are made as links with their target as given (never resolved here);
//! - modes, times and, when running as root, ownership are kept; device nodes under `/dev` are
//!   recorded and skipped (the VM's devtmpfs provides them), FIFOs are made;
//! - xattrs (pax `SCHILY.xattr.*`, `LIBARCHIVE.xattr.*` base64) are checked in the first pass
//!   (a name at most 255 bytes without NUL, a value at most 64 KiB, at most 64 per entry) and
//!   set after the owner and mode (chown clears file capabilities) with `lsetxattr` on the name
//!   inside the open parent directory, so the last component is never followed: `user.*` on
//!   files and directories, `security.capability` and `trusted.*` only as root; any other
//!   name (`security.selinux`, ACLs) and any xattr on a symlink is counted, not set.
//!
//! On any refusal the work directory is removed; nothing is ever written outside it.

use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::libc;
use nix::sys::stat::{fchmodat, fstatat, mkdirat, utimensat, FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchownat, linkat, mkfifoat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};
use ring::digest::{Context, SHA256};

pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// GNU long names and link names longer than Linux's PATH_MAX are refused.
const MAX_NAME: u64 = 4096;
/// A pax header of one entry: path, link path, a few numbers and xattrs.
const MAX_PAX: u64 = 1 << 20;
/// Headers, padding and metadata a layer may hold beyond its files' bytes.
const STREAM_SLACK: u64 = 1 << 30;

/// How a layer's bytes are compressed, from its media type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn of_media_type(media_type: &str) -> Option<Compression> {
        match media_type {
            LAYER_TAR => Some(Compression::None),
            LAYER_GZIP | DOCKER_LAYER_GZIP => Some(Compression::Gzip),
            LAYER_ZSTD => Some(Compression::Zstd),
            _ => None,
        }
    }
}

/// One downloaded layer blob and what its manifest and config say of it.
#[derive(Debug, Clone)]
pub struct Layer {
    pub path: PathBuf,
    pub media_type: String,
    /// `sha256:<hex>` of the blob as stored (compressed).
    pub digest: String,
    pub size: u64,
    /// `sha256:<hex>` of the uncompressed tar (the config's `rootfs.diff_ids`).
    pub diff_id: Option<String>,
}

#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The most bytes all regular files of all layers may declare.
    pub max_bytes: u64,
    /// The most entries all layers may hold.
    pub max_entries: u64,
}

impl Limits {
    /// `max_bytes`, lowered to what the filesystem holding `dir` has free (less 256 MiB for the
    /// disk assembly's own files).
    pub fn within_free_space(dir: &Path, max_bytes: u64) -> io::Result<Limits> {
        let st = nix::sys::statvfs::statvfs(dir).map_err(io::Error::from)?;
        let free = (st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64);
        Ok(Limits {
            max_bytes: max_bytes.min(free.saturating_sub(256 << 20)),
            max_entries: 4_000_000,
        })
    }
}

/// What an unpack made.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Unpacked {
    pub entries: u64,
    /// Bytes of regular files written.
    pub bytes: u64,
    /// Device nodes under `/dev` recorded and not made (`dev/console c 5:1`).
    pub skipped_devices: Vec<String>,
    /// Entries with an xattr that was not set (a name nubo does not set, on a symlink, or
    /// a root-only name when not root).
    pub skipped_xattrs: u64,
    /// xattrs set.
    pub xattrs: u64,
    /// Whether ownership was kept (only as root).
    pub ownership: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer {layer}: entry `{entry}` refused: {why}")]
    Refused { layer: String, entry: String, why: String },
    #[error("layer {layer} refused: {why}")]
    Layer { layer: String, why: String },
    #[error("layer {layer} is not a readable tar stream (the blob is damaged or not a layer)")]
    Malformed {
        layer: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot {what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl UnpackError {
    pub fn kind(&self) -> nubo_core::ErrorKind {
        match self {
            UnpackError::Io { .. } => nubo_core::ErrorKind::Io,
            UnpackError::Layer { .. } => nubo_core::ErrorKind::Integrity,
            _ => nubo_core::ErrorKind::InvalidInput,
        }
    }
}

/// Applies `layers` in order to `dest`, which must not exist and is created; on an error it is
/// removed again.
pub fn unpack(layers: &[Layer], dest: &Path, limits: &Limits) -> Result<Unpacked, UnpackError> {
    let mut budget = Budget {
        bytes: limits.max_bytes,
        entries: limits.max_entries,
        max: *limits,
    };
    for l in layers {
        walk(l, limits, &mut |e, _| budget.check(l, e))?;
    }
    fs::create_dir(dest).map_err(io_err("create the work directory", dest))?;
    let result = (|| {
        fs::set_permissions(dest, fs::Permissions::from_mode(0o755)).map_err(io_err("set the mode of", dest))?;
        let root = open_dir_path(dest).map_err(io_err("open", dest))?;
        let mut w = Writer {
            root,
            dest: dest.to_path_buf(),
            touched: HashSet::new(),
            out: Unpacked {
                ownership: nix::unistd::geteuid().is_root(),
                ..Unpacked::default()
            },
        };
        for l in layers {
            w.touched.clear();
            walk(l, limits, &mut |e, data| w.apply(l, e, data))?;
        }
        Ok(w.out)
    })();
    if result.is_err() {
        // std's remove_dir_all never follows a symlink inside the tree.
        let _ = fs::remove_dir_all(dest);
    }
    result
}

/// One entry as the writer needs it, metadata resolved (GNU long names, pax records).
#[derive(Debug)]
struct Entry {
    /// Normalised components; empty for the root itself.
    path: Vec<OsString>,
    shown: String,
    kind: Kind,
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: u64,
    size: u64,
    /// pax xattrs, names checked by [`check_xattr`].
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Longest xattr name Linux takes (XATTR_NAME_MAX).
const MAX_XATTR_NAME: usize = 255;
/// Largest value nubo sets: capabilities are 24 bytes, user xattrs small; ext4 holds a block.
const MAX_XATTR_VALUE: usize = 64 << 10;
const MAX_XATTRS: usize = 64;

/// Whether an xattr name is one nubo sets: `user.*`, and as root also `security.capability`
/// and `trusted.*`. Others are counted, not set.
pub fn xattr_settable(name: &[u8], root: bool) -> bool {
    let suffix = |p: &[u8]| name.len() > p.len() && name.starts_with(p);
    suffix(b"user.") || (root && (name == b"security.capability" || suffix(b"trusted.")))
}

/// A pax xattr of a hostile layer: a name without NUL of at most 255 bytes, in a namespace
/// (`user.`, `trusted.`, `security.`, `system.`), its value at most 64 KiB.
pub fn check_xattr(name: &[u8], value: &[u8]) -> Result<(), String> {
    let shown = String::from_utf8_lossy(name);
    if name.is_empty() || name.len() > MAX_XATTR_NAME || name.contains(&0) {
        return Err(format!(
            "its xattr name `{}` is empty, has a NUL or is past {MAX_XATTR_NAME} bytes",
            shown.escape_debug()
        ));
    }
    if ![&b"user."[..], b"trusted.", b"security.", b"system."]
        .iter()
        .any(|p| name.len() > p.len() && name.starts_with(p))
    {
        return Err(format!(
            "its xattr `{}` is in no namespace Linux knows",
            shown.escape_debug()
        ));
    }
    if value.len() > MAX_XATTR_VALUE {
        return Err(format!(
            "its xattr `{}` holds {} bytes (at most {MAX_XATTR_VALUE})",
            shown.escape_debug(),
            value.len()
        ));
    }
    Ok(())
}

/// Sets `name`=`value` on `entry` inside the open directory `dir`, never following `entry`.
fn set_xattr(dir: &File, entry: &OsStr, name: &[u8], value: &[u8]) -> io::Result<()> {
    let path = std::ffi::CString::new(at(dir, entry).into_os_string().into_vec())?;
    let name = std::ffi::CString::new(name.to_vec())?;
    // SAFETY: both strings are NUL-terminated and outlive the call; value points at
    // value.len() readable bytes; lsetxattr reads them and keeps no pointer.
    #[allow(unsafe_code)]
    let r = unsafe { libc::lsetxattr(path.as_ptr(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Symlink(OsString),
    HardLink(Vec<OsString>),
    Fifo,
    /// `c` or `b`, major, minor: recorded under `/dev`, refused elsewhere.
    Device(char, u32, u32),
    /// `.wh.NAME`
    Whiteout,
    /// `.wh..wh..opq`
    Opaque,
    /// aufs metadata (`.wh..wh.plnk` ...): skipped as other runtimes do.
    Ignored,
}

struct Budget {
    bytes: u64,
    entries: u64,
    max: Limits,
}

impl Budget {
    fn check(&mut self, l: &Layer, e: &Entry) -> Result<(), UnpackError> {
        let refuse = |why: String| refused(l, &e.shown, why);
        self.entries = self.entries.checked_sub(1).ok_or_else(|| {
            refuse(format!(
                "the layers hold more than {} entries; a root tree this large is not a VM's",
                self.max.max_entries
            ))
        })?;
        if e.kind == Kind::File {
            self.bytes = self.bytes.checked_sub(e.size).ok_or_else(|| {
                refuse(format!(
                    "it declares {} bytes, past the {} bytes the work directory may take \
                     (the free space there or the configured maximum); free space or use a smaller image",
                    e.size, self.max.max_bytes
                ))
            })?;
        }
        Ok(())
    }
}

fn refused(l: &Layer, entry: &str, why: String) -> UnpackError {
    UnpackError::Refused {
        layer: l.digest.clone(),
        entry: entry.to_owned(),
        why,
    }
}

fn io_err<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> UnpackError + 'p {
    move |source| UnpackError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Reads `l` whole, calling `each` for every entry (with its data for regular files), and
/// checks its digest, size and diff_id at the end.
fn walk(
    l: &Layer,
    limits: &Limits,
    each: &mut dyn FnMut(&Entry, &mut dyn Read) -> Result<(), UnpackError>,
) -> Result<(), UnpackError> {
    let layer_err = |why: String| UnpackError::Layer {
        layer: l.digest.clone(),
        why,
    };
    let compression = Compression::of_media_type(&l.media_type).ok_or_else(|| {
        layer_err(format!(
            "media type `{}` is not a tar layer nubo reads (tar, tar+gzip, tar+zstd)",
            l.media_type
        ))
    })?;
    if !l.digest.starts_with("sha256:") {
        return Err(layer_err("its digest is not sha256".into()));
    }
    let file = File::open(&l.path).map_err(io_err("open the layer blob", &l.path))?;
    let mut raw = Hashing::new(file.take(l.size.saturating_add(1)), u64::MAX);
    let malformed = |source| UnpackError::Malformed {
        layer: l.digest.clone(),
        source,
    };
    {
        let decoded: Box<dyn Read + '_> = match compression {
            Compression::None => Box::new(&mut raw),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(&mut raw)),
            Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(&mut raw).map_err(malformed)?),
        };
        let mut tarred = Hashing::new(decoded, limits.max_bytes.saturating_add(STREAM_SLACK));
        {
            let mut archive = tar::Archive::new(&mut tarred);
            let entries = archive.entries().map_err(malformed)?.raw(true);
            let mut meta = Meta::default();
            for e in entries {
                let mut e = e.map_err(malformed)?;
                if let Some(entry) = meta.resolve(l, &mut e).map_err(|m| match m {
                    MetaErr::Io(source) => malformed(source),
                    MetaErr::Refused(entry, why) => refused(l, &entry, why),
                })? {
                    each(&entry, &mut e)?;
                }
            }
            if meta.pending() {
                return Err(layer_err(
                    "it ends with a long name or pax header describing no entry".into(),
                ));
            }
        }
        // The zero blocks after the end of the archive belong to the diff_id too.
        io::copy(&mut tarred, &mut io::sink()).map_err(malformed)?;
        let diff = tarred.finish();
        if let Some(want) = &l.diff_id {
            if *want != diff {
                return Err(layer_err(format!(
                    "its uncompressed content is {diff}, not the diff_id {want} the image config names"
                )));
            }
        }
    }
    io::copy(&mut raw, &mut io::sink()).map_err(io_err("read the layer blob", &l.path))?;
    let (count, digest) = (raw.count, raw.finish());
    if count != l.size {
        return Err(layer_err(format!(
            "it is {count} bytes, not the {} its descriptor says",
            l.size
        )));
    }
    if digest != l.digest {
        return Err(layer_err(format!(
            "its content is {digest}: the blob does not match its digest (a damaged or substituted layer)"
        )));
    }
    Ok(())
}

/// A reader that hashes (sha256) and counts what passes, failing past `limit` bytes.
struct Hashing<R> {
    inner: R,
    ctx: Context,
    count: u64,
    limit: u64,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R, limit: u64) -> Self {
        Hashing {
            inner,
            ctx: Context::new(&SHA256),
            count: 0,
            limit,
        }
    }

    fn finish(self) -> String {
        format!("sha256:{}", nubo_core::hex(self.ctx.finish().as_ref()))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if self.count > self.limit {
            return Err(io::Error::other(format!(
                "it decompresses to more than {} bytes",
                self.limit
            )));
        }
        self.ctx.update(&buf[..n]);
        Ok(n)
    }
}

enum MetaErr {
    Io(io::Error),
    Refused(String, String),
}

impl From<io::Error> for MetaErr {
    fn from(e: io::Error) -> Self {
        MetaErr::Io(e)
    }
}

/// GNU long name/link and pax records waiting for the entry they describe.
#[derive(Default)]
struct Meta {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Vec<u8>>,
}

fn read_meta<R: Read>(e: &mut tar::Entry<'_, R>, max: u64, what: &str) -> Result<Vec<u8>, MetaErr> {
    if e.size() > max {
        return Err(MetaErr::Refused(
            String::from_utf8_lossy(&e.path_bytes()).into_owned(),
            format!("its {what} is {} bytes, past the {max} nubo reads", e.size()),
        ));
    }
    let mut v = Vec::with_capacity(e.size() as usize);
    e.read_to_end(&mut v)?;
    Ok(v)
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

impl Meta {
    fn pending(&self) -> bool {
        self.long_name.is_some() || self.long_link.is_some() || self.pax.is_some()
    }

    /// The entry `e` describes, or `None` for a metadata entry (kept for the next).
    fn resolve<R: Read>(&mut self, _l: &Layer, e: &mut tar::Entry<'_, R>) -> Result<Option<Entry>, MetaErr> {
        use tar::EntryType as T;
        let ty = e.header().entry_type();
        match ty {
            T::GNULongName => {
                self.long_name = Some(trim_nul(read_meta(e, MAX_NAME, "GNU long name")?));
                return Ok(None);
            }
            T::GNULongLink => {
                self.long_link = Some(trim_nul(read_meta(e, MAX_NAME, "GNU long link name")?));
                return Ok(None);
            }
            T::XHeader => {
                self.pax = Some(read_meta(e, MAX_PAX, "pax header")?);
                return Ok(None);
            }
            T::XGlobalHeader => {
                read_meta(e, MAX_PAX, "pax global header")?;
                return Ok(None);
            }
            _ => {}
        }
        let h = e.header();
        let mut path = self.long_name.take().unwrap_or_else(|| h.path_bytes().into_owned());
        let mut link = self
            .long_link
            .take()
            .or_else(|| h.link_name_bytes().map(|b| b.into_owned()));
        let (mut uid, mut gid, mut mtime) = (h.uid()?, h.gid()?, h.mtime()?);
        let mut size = e.size();
        let mut xattrs = Vec::new();
        let shown_now = String::from_utf8_lossy(&path).into_owned();
        let bad = |why: String| MetaErr::Refused(shown_now.clone(), why);
        if let Some(pax) = self.pax.take() {
            for rec in tar::PaxExtensions::new(&pax) {
                let rec = rec.map_err(|_| bad("its pax header is malformed".into()))?;
                let key = rec.key().map_err(|_| bad("a pax key is not UTF-8".into()))?;
                let num = || -> Result<u64, MetaErr> {
                    let v = rec.value().map_err(|_| bad(format!("pax `{key}` is not UTF-8")))?;
                    // mtime may have a fraction: the seconds are kept.
                    v.split('.')
                        .next()
                        .unwrap_or("")
                        .parse()
                        .map_err(|_| bad(format!("pax `{key}` is not a number")))
                };
                match key {
                    "path" => path = rec.value_bytes().to_vec(),
                    "linkpath" => link = Some(rec.value_bytes().to_vec()),
                    "uid" => uid = num()?,
                    "gid" => gid = num()?,
                    "mtime" => mtime = num()?,
                    "size" => {
                        let s = num()?;
                        if s != size {
                            return Err(bad(format!(
                                "its pax size {s} differs from its header's {size}: files past 8 GiB are not unpacked"
                            )));
                        }
                        size = s;
                    }
                    k if k.starts_with("SCHILY.xattr.") => {
                        let name = &rec.key_bytes()["SCHILY.xattr.".len()..];
                        check_xattr(name, rec.value_bytes()).map_err(bad)?;
                        xattrs.push((name.to_vec(), rec.value_bytes().to_vec()));
                    }
                    k if k.starts_with("LIBARCHIVE.xattr.") => {
                        // libarchive: the name URL-encoded, the value base64; not decoded here.
                        xattrs.push((Vec::new(), Vec::new()));
                    }
                    _ => {}
                }
                if xattrs.len() > MAX_XATTRS {
                    return Err(bad(format!("it carries more than {MAX_XATTRS} xattrs")));
                }
            }
        }
        let shown = String::from_utf8_lossy(&path).into_owned();
        let bad = |why: String| MetaErr::Refused(shown.clone(), why);
        let comps = normalise(&path).map_err(bad)?;
        let name = comps.last().map(|c| c.as_bytes()).unwrap_or(b"");
        let h = e.header();
        let kind = if name == b".wh..wh..opq" {
            Kind::Opaque
        } else if name.starts_with(b".wh..wh.") {
            Kind::Ignored
        } else if let Some(target) = name.strip_prefix(b".wh.") {
            if target.is_empty() || target == b"." || target == b".." {
                return Err(bad(format!(
                    "a whiteout of `{}` would remove a directory above its own; a layer whites out names inside its directory",
                    String::from_utf8_lossy(target)
                )));
            }
            Kind::Whiteout
        } else {
            match ty {
                T::Regular | T::Continuous => Kind::File,
                T::Directory => Kind::Dir,
                T::Symlink => {
                    let t = link.ok_or_else(|| bad("a symlink without a target".into()))?;
                    if t.is_empty() {
                        return Err(bad("a symlink with an empty target".into()));
                    }
                    Kind::Symlink(OsString::from_vec(t))
                }
                T::Link => {
                    let t = link.ok_or_else(|| bad("a hard link without a target".into()))?;
                    let t = normalise(&t).map_err(|why| bad(format!("its link target: {why}")))?;
                    if t.is_empty() {
                        return Err(bad("a hard link to the root directory".into()));
                    }
                    Kind::HardLink(t)
                }
                T::Fifo => Kind::Fifo,
                T::Char | T::Block => {
                    // Unreadable numbers are 0: the node is refused or only recorded either way.
                    let major = h.device_major().ok().flatten().unwrap_or(0);
                    let minor = h.device_minor().ok().flatten().unwrap_or(0);
                    if comps.first().map(|c| c.as_bytes()) != Some(b"dev") || comps.len() < 2 {
                        return Err(bad(format!(
                            "a device node ({major}:{minor}) outside /dev: it would give the VM's users raw access to a device; rebuild the layer without it"
                        )));
                    }
                    Kind::Device(if ty == T::Char { 'c' } else { 'b' }, major, minor)
                }
                T::GNUSparse => {
                    return Err(bad(format!(
                        "a GNU sparse file (declaring {size} bytes): container layers hold none; re-export the layer without --sparse"
                    )))
                }
                other => {
                    return Err(bad(format!(
                        "entry type {:?} is not one a container layer holds",
                        other.as_byte() as char
                    )))
                }
            }
        };
        if comps.is_empty() && kind != Kind::Dir {
            return Err(bad("the root itself as something other than a directory".into()));
        }
        Ok(Some(Entry {
            path: comps,
            shown,
            kind,
            mode: h.mode()? & 0o7777,
            uid,
            gid,
            mtime,
            size,
            xattrs,
        }))
    }
}

/// `path`'s components below the root: `/` and `./` prefixes and `.` dropped, `..` refused.
fn normalise(path: &[u8]) -> Result<Vec<OsString>, String> {
    if path.is_empty() {
        return Err("an empty path".into());
    }
    let mut out = Vec::new();
    for c in path.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err("its path has a `..` component: it could reach outside the root".into()),
            c => out.push(OsStr::from_bytes(c).to_owned()),
        }
    }
    Ok(out)
}

fn shown(path: &[OsString]) -> String {
    let v: Vec<_> = path.iter().map(|c| c.to_string_lossy()).collect();
    format!("/{}", v.join("/"))
}

/// A directory opened without following a symlink at its last component.
fn open_dir_path(p: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p)
}

/// `name` inside the directory `dir` as a path the kernel resolves from that open directory
/// (`/proc/self/fd/N/name`): nothing above `dir` is walked again.
fn at(dir: &File, name: &OsStr) -> PathBuf {
    Path::new("/proc/self/fd").join(dir.as_raw_fd().to_string()).join(name)
}

struct Writer {
    root: File,
    dest: PathBuf,
    /// Paths this layer made (an opaque whiteout keeps them).
    touched: HashSet<Vec<OsString>>,
    out: Unpacked,
}

impl Writer {
    fn apply(&mut self, l: &Layer, e: &Entry, data: &mut dyn Read) -> Result<(), UnpackError> {
        let refuse = |why: String| refused(l, &e.shown, why);
        let sys = |what: &str, err: Errno| refuse(format!("cannot {what}: {err}"));
        if e.path.is_empty() {
            return Ok(()); // the root keeps 0755 root:root
        }
        let (name, parents) = e.path.split_last().expect("not empty");
        let dir = self.parent(l, e, parents)?;
        let fd = Some(dir.as_raw_fd());
        for i in 1..=parents.len() {
            self.touched.insert(parents[..i].to_vec());
        }
        match &e.kind {
            Kind::Ignored => return Ok(()),
            Kind::Whiteout => {
                let target = OsStr::from_bytes(&name.as_bytes()[4..]);
                return remove(&dir, target).map_err(|err| refuse(format!("cannot apply the whiteout: {err}")));
            }
            Kind::Opaque => {
                return self
                    .clear(&dir, parents.to_vec())
                    .map_err(|err| refuse(format!("cannot apply the opaque whiteout: {err}")));
            }
            _ => {}
        }
        self.touched.insert(e.path.clone());
        self.out.entries += 1;
        let existing = fstatat(fd, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok();
        let existing_dir =
            existing.is_some_and(|s| SFlag::from_bits_truncate(s.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR);
        // A directory over a directory merges; anything else replaces what is there.
        if existing.is_some() && !(e.kind == Kind::Dir && existing_dir) {
            if let Kind::Device(..) = e.kind {
                // recorded only: what is there stays
            } else {
                remove(&dir, name).map_err(|err| refuse(format!("cannot replace what is there: {err}")))?;
            }
        }
        let mode = Mode::from_bits_truncate(e.mode);
        match &e.kind {
            Kind::Dir => {
                if !existing_dir {
                    mkdirat(fd, name.as_os_str(), Mode::from_bits_truncate(0o700))
                        .map_err(|x| sys("make the directory", x))?;
                }
            }
            Kind::File => {
                let mut f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(at(&dir, name))
                    .map_err(|err| refuse(format!("cannot create the file: {err}")))?;
                let n = io::copy(&mut data.take(e.size), &mut f)
                    .map_err(|err| refuse(format!("cannot write the file: {err}")))?;
                if n != e.size {
                    return Err(refuse(format!("the layer ends after {n} of its {} bytes", e.size)));
                }
                self.out.bytes += n;
            }
            Kind::Symlink(target) => {
                symlinkat(target.as_os_str(), fd, name.as_os_str()).map_err(|x| sys("make the symlink", x))?;
            }
            Kind::HardLink(target) => {
                let (tname, tparents) = target.split_last().expect("normalise refused an empty target");
                let tdir = self
                    .walk_dirs(tparents)
                    .map_err(|why| refuse(format!("its link target {}: {why}", shown(target))))?;
                let st =
                    fstatat(Some(tdir.as_raw_fd()), tname.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW).map_err(|_| {
                        refuse(format!(
                            "its link target {} is not unpacked yet; a hard link names a file earlier in the layers",
                            shown(target)
                        ))
                    })?;
                if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR {
                    return Err(refuse(format!("its link target {} is a directory", shown(target))));
                }
                linkat(
                    Some(tdir.as_raw_fd()),
                    tname.as_os_str(),
                    fd,
                    name.as_os_str(),
                    AtFlags::empty(),
                )
                .map_err(|x| sys("make the hard link", x))?;
                // A hard link shares its target's inode: mode, owner and times are the target's.
                return Ok(());
            }
            Kind::Fifo => {
                mkfifoat(fd, name.as_os_str(), mode).map_err(|x| sys("make the FIFO", x))?;
            }
            Kind::Device(t, major, minor) => {
                self.out
                    .skipped_devices
                    .push(format!("{} {t} {major}:{minor}", shown(&e.path)));
                return Ok(());
            }
            Kind::Whiteout | Kind::Opaque | Kind::Ignored => unreachable!("handled above"),
        }
        let is_link = matches!(e.kind, Kind::Symlink(_));
        if self.out.ownership {
            fchownat(
                fd,
                name.as_os_str(),
                Some(Uid::from_raw(e.uid.min(u32::MAX as u64 - 1) as u32)),
                Some(Gid::from_raw(e.gid.min(u32::MAX as u64 - 1) as u32)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|x| sys("set the owner", x))?;
        }
        if !is_link {
            // After chown, which clears set-id bits.
            fchmodat(fd, name.as_os_str(), mode, FchmodatFlags::NoFollowSymlink).map_err(|x| sys("set the mode", x))?;
        }
        // After chown and chmod: chown clears security.capability.
        let mut skipped = false;
        for (xname, value) in &e.xattrs {
            if is_link || !xattr_settable(xname, self.out.ownership) {
                skipped = true;
                continue;
            }
            set_xattr(&dir, name, xname, value).map_err(|err| {
                refuse(format!(
                    "cannot set its xattr `{}`: {err}",
                    String::from_utf8_lossy(xname).escape_debug()
                ))
            })?;
            self.out.xattrs += 1;
        }
        self.out.skipped_xattrs += u64::from(skipped);
        let t = TimeSpec::new(e.mtime.min(i64::MAX as u64) as i64, 0);
        utimensat(fd, name.as_os_str(), &t, &t, UtimensatFlags::NoFollowSymlink)
            .map_err(|x| sys("set the times", x))?;
        Ok(())
    }

    /// The directory that holds `e`, missing parents made (0755, as other runtimes do).
    fn parent(&mut self, l: &Layer, e: &Entry, parents: &[OsString]) -> Result<File, UnpackError> {
        let mut dir = self.root.try_clone().map_err(io_err("open", &self.dest))?;
        for (i, c) in parents.iter().enumerate() {
            let next = match open_dir_path(&at(&dir, c)) {
                Err(err) if err.kind() == io::ErrorKind::NotFound => {
                    mkdirat(Some(dir.as_raw_fd()), c.as_os_str(), Mode::from_bits_truncate(0o755))
                        .map_err(|x| refused(l, &e.shown, format!("cannot make its parent directory: {x}")))?;
                    open_dir_path(&at(&dir, c))
                }
                r => r,
            };
            dir = next.map_err(|err| {
                refused(
                    l,
                    &e.shown,
                    format!(
                        "its parent {} is a symlink or not a directory ({err}); nubo never follows a link while unpacking",
                        shown(&parents[..=i])
                    ),
                )
            })?;
        }
        Ok(dir)
    }

    /// The existing directory `parents`, reached without following links.
    fn walk_dirs(&self, parents: &[OsString]) -> Result<File, String> {
        let mut dir = self.root.try_clone().map_err(|e| e.to_string())?;
        for (i, c) in parents.iter().enumerate() {
            dir = open_dir_path(&at(&dir, c)).map_err(|err| {
                format!(
                    "{} is not a directory reached without a link ({err})",
                    shown(&parents[..=i])
                )
            })?;
        }
        Ok(dir)
    }

    /// Empties `dir` (at `path`) of what this layer did not make.
    fn clear(&self, dir: &File, path: Vec<OsString>) -> io::Result<()> {
        for child in fs::read_dir(Path::new("/proc/self/fd").join(dir.as_raw_fd().to_string()))? {
            let name = child?.file_name();
            let mut p = path.clone();
            p.push(name.clone());
            if !self.touched.contains(&p) {
                remove(dir, &name)?;
            } else if let Ok(sub) = open_dir_path(&at(dir, &name)) {
                self.clear(&sub, p)?;
            }
        }
        Ok(())
    }
}

/// Removes `name` from `dir` if it is there; a directory with all it holds. Links are removed,
/// never followed.
fn remove(dir: &File, name: &OsStr) -> io::Result<()> {
    let fd = Some(dir.as_raw_fd());
    match fstatat(fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Err(Errno::ENOENT) => Ok(()),
        Err(e) => Err(e.into()),
        Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFDIR => {
            fs::remove_dir_all(at(dir, name))
        }
        Ok(_) => unlinkat(fd, name, UnlinkatFlags::NoRemoveDir).map_err(io::Error::from),
    }
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
