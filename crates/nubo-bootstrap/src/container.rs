//! `nubo image from-container`: a container image's root tree (unpacked by nubo-image's
//! `oci::unpack`) made a bootable disk by the same reproducible assembly as `image bootstrap`
//! ([`disk_stages`]): GPT, ext4 with times clamped to the epoch, GRUB for BIOS (and the EFI
//! system partition the assembly always writes). Every identifier is derived from the source
//! image's digest, so one container digest gives one disk sha256.
//!
//! The image's own kernel and initramfs boot it (`/boot/vmlinuz-<version>` with
//! `/boot/initrd.img-<version>`, or bootc's `/usr/lib/modules/<version>/vmlinuz` with
//! `initramfs.img`); nubo writes only `/etc/fstab` and `/boot/grub/grub.cfg` into the tree.
//! The tree is the image's, hence hostile: every path nubo reads or writes in it is checked to
//! be a real file under real directories, never reached through a symlink.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::build::{clamp_root_times, disk_stages, stage, DiskFormat, DiskSpec, TreeGuard};
use crate::commands;
use crate::error::{io_err, BootstrapError};
use crate::grub;
use crate::host::{Host, Mode};
use crate::identity::Ids;
use crate::iso;
use crate::layout::Layout;
use crate::run::Runner;
use crate::stage::{Progress, Stage};

/// What to assemble.
#[derive(Debug, Clone)]
pub struct ContainerSpec<'a> {
    /// The unpacked root tree. Consumed: removed once the root filesystem holds it.
    pub tree: &'a Path,
    /// The container image's manifest digest (`sha256:<hex>`): the ids' key and what errors name.
    pub source_digest: &'a str,
    /// What every time in the image is clamped to (the image config's `created`).
    pub epoch: u64,
    pub size: u64,
    pub format: DiskFormat,
    /// An image without cloud-init is refused unless it says it configures itself.
    pub appliance: bool,
    /// The work directory is made (and removed) in here: the store's `tmp/`.
    pub work_parent: &'a Path,
    /// Deliver a hybrid ISO instead of the disk (`format` is then the intermediate raw disk).
    pub iso: Option<IsoSpec<'a>>,
}

/// `--format iso`.
#[derive(Debug, Clone, Copy, Default)]
pub struct IsoSpec<'a> {
    /// A cloud-config baked into the ISO as its default NoCloud seed (`user-data`).
    pub cloud_config: Option<&'a [u8]>,
}

/// A finished disk; its files live in the work directory until moved, which dropping it removes.
#[derive(Debug)]
pub struct Assembled {
    _work: TempDir,
    pub disk: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub cmdline: String,
    /// `sha256:<hex>` of the disk file.
    pub digest: String,
    pub size: u64,
    pub virtual_size: u64,
    pub root_uuid: String,
    /// Where the kernel and initrd were found in the image (`/boot/vmlinuz-6.1.0-28-amd64`).
    pub kernel_path: String,
    pub initrd_path: String,
    pub cloud_init: bool,
    /// cloud-init's default user as the image's cloud.cfg names it.
    pub default_user: Option<String>,
    pub elapsed: Duration,
}

/// The kernel and initramfs found in a tree, relative to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelFiles {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

/// The ids of a disk made from the container image `source_digest`: its own key space
/// (`oci-container` + the digest), so no recipe key can give the same ids.
pub fn container_ids(source_digest: &str) -> Ids {
    Ids::derive(&container_key(source_digest))
}

fn container_key(source_digest: &str) -> String {
    format!("oci-container {source_digest}")
}

/// Whether `rel` (relative, no `..`) names something in `tree` reached through real
/// directories only; `Ok(None)` when a component is missing.
fn lookup(tree: &Path, rel: &Path) -> Result<Option<fs::Metadata>, String> {
    let mut p = tree.to_path_buf();
    let comps: Vec<_> = rel.components().collect();
    for (i, c) in comps.iter().enumerate() {
        let Component::Normal(c) = c else {
            return Err(format!("{} is not a plain relative path", rel.display()));
        };
        p.push(c);
        let m = match fs::symlink_metadata(&p) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("cannot inspect /{}: {e}", rel.display())),
        };
        if i + 1 < comps.len() && !m.file_type().is_dir() {
            return Err(format!(
                "/{} is a symlink or not a directory; nubo reads the image's boot files only through real directories",
                Path::new(&p).strip_prefix(tree).unwrap_or(&p).display()
            ));
        }
        if i + 1 == comps.len() {
            return Ok(Some(m));
        }
    }
    Ok(None)
}

fn is_regular(tree: &Path, rel: &Path) -> Result<bool, String> {
    Ok(lookup(tree, rel)?.is_some_and(|m| m.file_type().is_file()))
}

/// Names in the real directory `rel` of `tree` (none when it is missing), sorted.
fn names(tree: &Path, rel: &Path) -> Result<Vec<String>, String> {
    match lookup(tree, rel)? {
        Some(m) if m.file_type().is_dir() => {}
        _ => return Ok(Vec::new()),
    }
    let dir = tree.join(rel);
    let mut v: Vec<String> = fs::read_dir(&dir)
        .map_err(|e| format!("cannot list /{}: {e}", rel.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    v.sort();
    Ok(v)
}

/// The newest kernel with its initramfs: `/boot/vmlinuz-V` + `/boot/initrd.img-V` (Debian,
/// Ubuntu), else `/usr/lib/modules/V/vmlinuz` + `initramfs.img` beside it (bootc, Fedora).
/// Symlinks are not boot files here: only regular files under real directories count.
pub fn find_kernel(tree: &Path) -> Result<KernelFiles, String> {
    let mut looked = Vec::new();
    for name in names(tree, Path::new("boot"))?.iter().rev() {
        let Some(version) = name.strip_prefix("vmlinuz-") else {
            continue;
        };
        let kernel = Path::new("boot").join(name);
        let initrd = Path::new("boot").join(format!("initrd.img-{version}"));
        if is_regular(tree, &kernel)? {
            if is_regular(tree, &initrd)? {
                return Ok(KernelFiles { kernel, initrd });
            }
            looked.push(format!("/{} has no /{}", kernel.display(), initrd.display()));
        }
    }
    let modules = Path::new("usr/lib/modules");
    for version in names(tree, modules)?.iter().rev() {
        let kernel = modules.join(version).join("vmlinuz");
        let initrd = modules.join(version).join("initramfs.img");
        if is_regular(tree, &kernel)? {
            if is_regular(tree, &initrd)? {
                return Ok(KernelFiles { kernel, initrd });
            }
            looked.push(format!("/{} has no /{}", kernel.display(), initrd.display()));
        }
    }
    if looked.is_empty() {
        looked.push("neither /boot/vmlinuz-* nor /usr/lib/modules/*/vmlinuz is in it".into());
    }
    Err(looked.join("; "))
}

/// The kernel's modules directory in the tree (`usr/lib/modules/<version>`, else
/// `lib/modules/<version>`), reached through real directories only.
pub fn modules_dir(tree: &Path, k: &KernelFiles) -> Result<PathBuf, String> {
    let name = k.kernel.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let version = match name.strip_prefix("vmlinuz-") {
        Some(v) => v.to_owned(),
        // bootc: usr/lib/modules/<version>/vmlinuz
        None => k
            .kernel
            .parent()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned(),
    };
    if version.is_empty() || version.contains('/') {
        return Err(format!("cannot tell the kernel version of /{}", k.kernel.display()));
    }
    // The live boot is an initramfs-tools `boot=` script; a dracut initramfs ignores it.
    if !is_regular(tree, Path::new("usr/share/initramfs-tools/init"))? {
        return Err(
            "its initramfs is not made by initramfs-tools (/usr/share/initramfs-tools/init is missing), whose boot= scripts the ISO's live boot uses; make a disk instead (--format qcow2 or raw)"
                .into(),
        );
    }
    for base in ["usr/lib/modules", "lib/modules"] {
        let rel = Path::new(base).join(&version);
        if lookup(tree, &rel)?.is_some_and(|m| m.file_type().is_dir()) {
            return Ok(tree.join(rel));
        }
    }
    Err(format!(
        "its kernel {version} has no modules directory (/usr/lib/modules/{version}), which the ISO's live boot loads the CD-ROM and overlay modules from"
    ))
}

/// The user cloud-init creates by default (`system_info.default_user.name` in
/// `/etc/cloud/cloud.cfg`), when the image names one that is a valid user name: what `vm ssh`
/// logs in as. Read through real directories only, at most 1 MiB; anything else is `None`.
pub fn default_user(tree: &Path) -> Option<String> {
    let rel = Path::new("etc/cloud/cloud.cfg");
    if !is_regular(tree, rel).ok()? {
        return None;
    }
    let mut text = String::new();
    use std::io::Read;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tree.join(rel))
        .ok()?
        .take(1 << 20)
        .read_to_string(&mut text)
        .ok()?;
    cloud_cfg_default_user(&text)
}

/// `system_info: default_user: name: X` of a cloud.cfg, read by indentation (the form distro
/// cloud.cfg files use), the name checked as a portable user name.
pub fn cloud_cfg_default_user(text: &str) -> Option<String> {
    let indent = |l: &str| l.len() - l.trim_start().len();
    let meaningful = |l: &&str| !l.trim().is_empty() && !l.trim_start().starts_with('#');
    let mut lines = text.lines().filter(meaningful);
    lines.find(|l| indent(l) == 0 && l.trim_end() == "system_info:")?;
    let mut du_indent = None;
    for l in lines {
        let i = indent(l);
        if i == 0 {
            return None;
        }
        match du_indent {
            None if l.trim_end().ends_with("default_user:") && l.trim() == "default_user:" => du_indent = Some(i),
            None => {}
            Some(d) if i <= d => return None,
            Some(_) => {
                if let Some(v) = l.trim().strip_prefix("name:") {
                    let v = v.trim().trim_matches(|c| c == '"' || c == '\'');
                    let ok = !v.is_empty()
                        && v.len() <= 32
                        && v.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
                        && v.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
                    return ok.then(|| v.to_owned());
                }
            }
        }
    }
    None
}

/// Whether the image has cloud-init's entry point.
pub fn has_cloud_init(tree: &Path) -> bool {
    lookup(tree, Path::new("usr/bin/cloud-init"))
        .ok()
        .flatten()
        .is_some_and(|m| !m.file_type().is_dir())
}

/// Writes `contents` at `rel` in the tree: missing parents made, whatever was at the name
/// (a file, a symlink) replaced, never written through.
fn write_in_tree(tree: &Path, rel: &str, contents: &str) -> Result<(), String> {
    let rel = Path::new(rel);
    let parent = rel.parent().unwrap_or(Path::new(""));
    let mut p = tree.to_path_buf();
    for c in parent.components() {
        p.push(c);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "/{} is a symlink or not a directory; nubo writes /{} only under real directories",
                    p.strip_prefix(tree).unwrap_or(&p).display(),
                    rel.display()
                ))
            }
            Err(_) => fs::create_dir(&p).map_err(|e| format!("cannot create {}: {e}", p.display()))?,
        }
    }
    let path = tree.join(rel);
    if let Ok(m) = fs::symlink_metadata(&path) {
        if m.file_type().is_dir() {
            return Err(format!("/{} is a directory", rel.display()));
        }
        fs::remove_file(&path).map_err(|e| format!("cannot replace /{}: {e}", rel.display()))?;
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
        .and_then(|mut f| f.write_all(contents.as_bytes()))
        .map_err(|e| format!("cannot write /{}: {e}", rel.display()))
}

/// What nubo lays over the image: root and the ESP by UUID in fstab, GRUB's menu booting the
/// image's own kernel, the ESP's mount point.
pub fn prepare_tree(tree: &Path, ids: &Ids, k: &KernelFiles) -> Result<(), String> {
    write_in_tree(
        tree,
        "etc/fstab",
        &format!(
            "# <file system> <mount point> <type> <options> <dump> <pass>\n\
             UUID={} / ext4 rw,discard,errors=remount-ro 0 1\n\
             UUID={} /boot/efi vfat umask=0077,nofail 0 0\n",
            ids.root_uuid, ids.esp_id
        ),
    )?;
    write_in_tree(
        tree,
        "boot/grub/grub.cfg",
        &grub::grub_cfg_for(
            &ids.root_uuid,
            &format!("/{}", k.kernel.display()),
            &format!("/{}", k.initrd.display()),
        ),
    )?;
    match lookup(tree, Path::new("boot/efi"))? {
        Some(m) if m.file_type().is_dir() => Ok(()),
        Some(_) => Err("/boot/efi is not a directory".into()),
        None => fs::create_dir(tree.join("boot/efi")).map_err(|e| format!("cannot create /boot/efi: {e}")),
    }
}

/// The tree made a disk. Needs root (the tree's files keep their owners in the filesystem).
pub fn assemble(
    host: &Host,
    spec: &ContainerSpec<'_>,
    progress: &mut dyn Progress,
) -> Result<Assembled, BootstrapError> {
    let t0 = Instant::now();
    let image = spec.source_digest.to_owned();
    let bad = |why: String| BootstrapError::BadTree {
        image: image.clone(),
        why,
    };
    if host.mode != Mode::Root {
        return Err(BootstrapError::NoPrivilege(
            "a container image's files keep their owners only when unpacked and assembled as root; run `nubo image from-container` as root".into(),
        ));
    }
    let k = find_kernel(spec.tree).map_err(|why| BootstrapError::NoKernel {
        image: image.clone(),
        why,
    })?;
    let cloud_init = has_cloud_init(spec.tree);
    let default_user = default_user(spec.tree);
    if !cloud_init && !spec.appliance {
        return Err(BootstrapError::NoCloudInit { image: image.clone() });
    }
    let work_parent =
        std::path::absolute(spec.work_parent).map_err(io_err("cannot make an absolute path of", spec.work_parent))?;
    let work = tempfile::Builder::new()
        .prefix("from-container-")
        .tempdir_in(&work_parent)
        .map_err(io_err("cannot create the build directory in", &work_parent))?;
    let ids = container_ids(spec.source_digest);
    prepare_tree(spec.tree, &ids, &k).map_err(bad)?;
    // Read before the tree is consumed: the modules come from the image's own kernel.
    let live_cpio = match spec.iso {
        Some(_) => {
            let dir = modules_dir(spec.tree, &k).map_err(bad)?;
            Some(iso::live_cpio(&dir, &ids.root_uuid, spec.epoch).map_err(bad)?)
        }
        None => None,
    };
    let layout = Layout::for_size(spec.size);
    let tree = TreeGuard {
        host,
        path: std::path::absolute(spec.tree).map_err(io_err("cannot make an absolute path of", spec.tree))?,
    };
    let mut runner = Runner {
        log: work.path().join("build.log"),
        progress,
    };
    let disk = disk_stages(
        host,
        &mut runner,
        &DiskSpec {
            work: work.path(),
            tree: &tree,
            layout: &layout,
            ids: &ids,
            epoch: spec.epoch,
            kernel: &k.kernel,
            initrd: &k.initrd,
            format: spec.format,
            digest: spec.iso.is_none(),
        },
    )?;
    let (path, digest) = match (spec.iso, live_cpio) {
        (Some(iso_spec), Some(cpio)) => {
            let out = make_iso(
                &mut runner,
                &IsoInputs {
                    work: work.path(),
                    raw: &disk.path,
                    kernel: &disk.kernel,
                    initrd: &disk.initrd,
                    layout: &layout,
                    ids: &ids,
                    epoch: spec.epoch,
                    cpio: &cpio,
                    source: spec.source_digest,
                    cloud_config: iso_spec.cloud_config,
                    e2fsck: host.tool("e2fsck"),
                },
            )?;
            let digest = crate::digest::file_digest(&out).map_err(io_err("cannot read", &out))?;
            (out, digest)
        }
        _ => {
            let digest = disk
                .digest
                .ok_or_else(|| BootstrapError::Malformed("the disk's digest was not computed".into()))?;
            (disk.path, digest)
        }
    };
    let size = fs::metadata(&path).map_err(io_err("cannot stat", &path))?.len();
    Ok(Assembled {
        _work: work,
        disk: path,
        kernel: disk.kernel,
        initrd: disk.initrd,
        cmdline: grub::kernel_cmdline(&ids.root_uuid),
        digest,
        size,
        virtual_size: layout.disk_bytes,
        root_uuid: ids.root_uuid,
        kernel_path: format!("/{}", k.kernel.display()),
        initrd_path: format!("/{}", k.initrd.display()),
        cloud_init,
        default_user,
        elapsed: t0.elapsed(),
    })
}

struct IsoInputs<'a> {
    work: &'a Path,
    raw: &'a Path,
    kernel: &'a Path,
    initrd: &'a Path,
    layout: &'a Layout,
    ids: &'a Ids,
    epoch: u64,
    cpio: &'a [u8],
    source: &'a str,
    cloud_config: Option<&'a [u8]>,
    e2fsck: &'a Path,
}

/// The raw disk's root filesystem, shrunk, with the image's kernel and initramfs, nubo's
/// initramfs addition and GRUB, as a hybrid ISO (see [`iso`]). Returns the ISO's path.
fn make_iso(r: &mut Runner<'_>, i: &IsoInputs<'_>) -> Result<PathBuf, BootstrapError> {
    let tools = iso::probe_tools()?;
    let dir = i.work.join("iso");
    let out = i.work.join("image.iso");
    stage(r, Stage::Iso, |r| {
        let root = dir.join(iso::ROOT_IMG);
        iso::put(&dir, iso::ID_FILE, format!("{}\n", i.ids.root_uuid).as_bytes())?;
        iso::copy_sparse(i.raw, i.layout.root.offset(), i.layout.root.bytes(), &root)?;
        fs::remove_file(i.raw).map_err(io_err("cannot remove", i.raw))?;
        r.run(
            Stage::Iso,
            iso::resize2fs_min(&tools["resize2fs"], &root, i.epoch),
            None,
        )?;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&root)
            .map_err(io_err("cannot open", &root))?;
        let bytes = iso::ext4_bytes(&f).map_err(|why| {
            BootstrapError::Malformed(format!("the shrunk root filesystem {}: {why}", root.display()))
        })?;
        f.set_len(bytes).map_err(io_err("cannot size", &root))?;
        drop(f);
        clamp_root_times(&root, 0, i.epoch)?;
        r.run(Stage::Iso, commands::e2fsck(i.e2fsck, &root, 0), None)?;
        for (from, to) in [(i.kernel, "live/vmlinuz"), (i.initrd, "live/initrd.img")] {
            let dest = dir.join(to);
            fs::copy(from, &dest).map_err(io_err("cannot copy into the ISO tree", &dest))?;
        }
        iso::put(&dir, "live/nubolive.img", i.cpio)?;
        let short = i.source.trim_start_matches("sha256:").get(..12).unwrap_or_default();
        iso::put(
            &dir,
            "boot/grub/grub.cfg",
            iso::iso_grub_cfg(&format!("nubo live sha256:{short}")).as_bytes(),
        )?;
        if let Some(cc) = i.cloud_config {
            iso::put(&dir, "nocloud/user-data", cc)?;
            iso::put(&dir, "nocloud/meta-data", iso::nocloud_meta_data(cc).as_bytes())?;
        }
        let key = container_key(i.source);
        r.run(
            Stage::Iso,
            iso::grub_mkrescue(
                &tools["grub-mkrescue"],
                &tools["xorriso"],
                &dir,
                &out,
                i.epoch,
                &crate::identity::derived_uuid(&key, crate::identity::Purpose::IsoDiskGuid),
            ),
            None,
        )?;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&out)
            .map_err(io_err("cannot open", &out))?;
        iso::set_efi_boot_serial(&f, crate::identity::iso_esp_serial(&key))
            .map_err(|why| BootstrapError::Malformed(format!("the ISO grub-mkrescue wrote: {why}")))?;
        f.sync_all().map_err(io_err("cannot sync", &out))?;
        drop(f);
        fs::remove_dir_all(&dir).map_err(io_err("cannot remove", &dir))
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn tree() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn touch(t: &Path, rel: &str) {
        let p = t.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"x").unwrap();
    }

    #[test]
    fn find_kernel_debian_boot_newest_version() {
        let t = tree();
        for f in [
            "boot/vmlinuz-6.1.0-1-amd64",
            "boot/initrd.img-6.1.0-1-amd64",
            "boot/vmlinuz-6.1.0-2-amd64",
            "boot/initrd.img-6.1.0-2-amd64",
        ] {
            touch(t.path(), f);
        }

        let k = find_kernel(t.path()).unwrap();

        assert_eq!(
            (k.kernel, k.initrd),
            (
                "boot/vmlinuz-6.1.0-2-amd64".into(),
                "boot/initrd.img-6.1.0-2-amd64".into()
            )
        );
    }

    #[test]
    fn find_kernel_bootc_modules_dir() {
        let t = tree();
        touch(t.path(), "usr/lib/modules/6.8.5/vmlinuz");
        touch(t.path(), "usr/lib/modules/6.8.5/initramfs.img");

        let k = find_kernel(t.path()).unwrap();

        assert_eq!(k.kernel, Path::new("usr/lib/modules/6.8.5/vmlinuz"));
    }

    #[test]
    fn find_kernel_none_says_what_was_looked_for() {
        let t = tree();
        touch(t.path(), "etc/os-release");

        let err = find_kernel(t.path()).unwrap_err();

        assert!(err.contains("/boot/vmlinuz-*"), "{err}");
    }

    #[test]
    fn find_kernel_without_initrd_named() {
        let t = tree();
        touch(t.path(), "boot/vmlinuz-6.1.0-1-amd64");

        let err = find_kernel(t.path()).unwrap_err();

        assert!(err.contains("has no /boot/initrd.img-6.1.0-1-amd64"), "{err}");
    }

    #[test]
    fn find_kernel_symlinked_boot_refused() {
        let t = tree();
        let host = tree();
        touch(host.path(), "vmlinuz-9-amd64");
        touch(host.path(), "initrd.img-9-amd64");
        symlink(host.path(), t.path().join("boot")).unwrap();

        let err = find_kernel(t.path()).unwrap_err();

        assert!(err.contains("neither"), "{err}");
    }

    #[test]
    fn find_kernel_symlinked_kernel_file_skipped() {
        let t = tree();
        let host = tree();
        touch(host.path(), "k");
        fs::create_dir(t.path().join("boot")).unwrap();
        symlink(host.path().join("k"), t.path().join("boot/vmlinuz-9")).unwrap();
        symlink(host.path().join("k"), t.path().join("boot/initrd.img-9")).unwrap();

        assert!(find_kernel(t.path()).is_err());
    }

    #[test]
    fn has_cloud_init_needs_usr_bin_cloud_init() {
        let t = tree();
        assert!(!has_cloud_init(t.path()));

        touch(t.path(), "usr/bin/cloud-init");

        assert!(has_cloud_init(t.path()));
    }

    #[test]
    fn prepare_tree_writes_fstab_and_grub_cfg_for_image_kernel() {
        let t = tree();
        touch(t.path(), "etc/fstab");
        let ids = container_ids("sha256:abc");
        let k = KernelFiles {
            kernel: "boot/vmlinuz-6.1.0-2-amd64".into(),
            initrd: "boot/initrd.img-6.1.0-2-amd64".into(),
        };

        prepare_tree(t.path(), &ids, &k).unwrap();

        let fstab = fs::read_to_string(t.path().join("etc/fstab")).unwrap();
        assert!(fstab.contains(&format!("UUID={} / ext4", ids.root_uuid)), "{fstab}");
        let cfg = fs::read_to_string(t.path().join("boot/grub/grub.cfg")).unwrap();
        assert!(
            cfg.contains(&format!(
                "linux /boot/vmlinuz-6.1.0-2-amd64 root=UUID={} ro",
                ids.root_uuid
            )) && cfg.contains("initrd /boot/initrd.img-6.1.0-2-amd64\n"),
            "{cfg}"
        );
        assert!(t.path().join("boot/efi").is_dir());
    }

    #[test]
    fn prepare_tree_symlinked_etc_refused_host_untouched() {
        let t = tree();
        let host = tree();
        symlink(host.path(), t.path().join("etc")).unwrap();
        let k = KernelFiles {
            kernel: "boot/k".into(),
            initrd: "boot/i".into(),
        };

        let err = prepare_tree(t.path(), &container_ids("sha256:abc"), &k).unwrap_err();

        assert!(err.contains("/etc is a symlink"), "{err}");
        assert_eq!(fs::read_dir(host.path()).unwrap().count(), 0);
    }

    #[test]
    fn prepare_tree_fstab_symlink_replaced_not_followed() {
        let t = tree();
        let host = tree();
        fs::create_dir(t.path().join("etc")).unwrap();
        fs::write(host.path().join("victim"), b"host").unwrap();
        symlink(host.path().join("victim"), t.path().join("etc/fstab")).unwrap();
        let k = KernelFiles {
            kernel: "boot/k".into(),
            initrd: "boot/i".into(),
        };

        prepare_tree(t.path(), &container_ids("sha256:abc"), &k).unwrap();

        assert_eq!(fs::read(host.path().join("victim")).unwrap(), b"host");
        assert!(fs::symlink_metadata(t.path().join("etc/fstab")).unwrap().is_file());
    }

    const DEBIAN_CLOUD_CFG: &str = "# The top level settings\nusers:\n - default\n\nsystem_info:\n   # This will affect which distro class gets used\n   distro: debian\n   default_user:\n     name: debian\n     lock_passwd: True\n     groups: [adm]\n   paths:\n      cloud_dir: /var/lib/cloud/\n";

    #[test]
    fn cloud_cfg_default_user_debian_named() {
        assert_eq!(cloud_cfg_default_user(DEBIAN_CLOUD_CFG).as_deref(), Some("debian"));
    }

    #[test]
    fn cloud_cfg_default_user_bad_name_ignored() {
        let text = DEBIAN_CLOUD_CFG.replace("name: debian", "name: ../root;rm");

        assert_eq!(cloud_cfg_default_user(&text), None);
    }

    #[test]
    fn cloud_cfg_default_user_outside_system_info_ignored() {
        assert_eq!(cloud_cfg_default_user("default_user:\n  name: x\n"), None);
        assert_eq!(
            cloud_cfg_default_user("system_info:\n  distro: debian\nother:\n  default_user:\n    name: x\n"),
            None
        );
    }

    #[test]
    fn default_user_symlinked_cloud_cfg_not_read() {
        let t = tree();
        let host = tree();
        fs::write(host.path().join("cloud.cfg"), DEBIAN_CLOUD_CFG).unwrap();
        fs::create_dir_all(t.path().join("etc")).unwrap();
        symlink(host.path(), t.path().join("etc/cloud")).unwrap();

        assert_eq!(default_user(t.path()), None);
    }

    #[test]
    fn modules_dir_found_for_debian_kernel() {
        let t = tree();
        touch(t.path(), "usr/share/initramfs-tools/init");
        touch(t.path(), "usr/lib/modules/6.1.0-2-amd64/modules.dep");
        let k = KernelFiles {
            kernel: "boot/vmlinuz-6.1.0-2-amd64".into(),
            initrd: "boot/initrd.img-6.1.0-2-amd64".into(),
        };

        assert_eq!(
            modules_dir(t.path(), &k).unwrap(),
            t.path().join("usr/lib/modules/6.1.0-2-amd64")
        );
    }

    #[test]
    fn modules_dir_without_initramfs_tools_refused() {
        let t = tree();
        touch(t.path(), "usr/lib/modules/6.8.5/vmlinuz");
        let k = KernelFiles {
            kernel: "usr/lib/modules/6.8.5/vmlinuz".into(),
            initrd: "usr/lib/modules/6.8.5/initramfs.img".into(),
        };

        let err = modules_dir(t.path(), &k).unwrap_err();

        assert!(err.contains("not made by initramfs-tools"), "{err}");
    }

    #[test]
    fn container_ids_differ_from_recipe_key_ids() {
        assert_ne!(container_ids("sha256:abc"), Ids::derive("sha256:abc"));
        assert_eq!(container_ids("sha256:abc"), container_ids("sha256:abc"));
    }
}
