//! The build, stage by stage: packages into a tree, the tree into a partitioned raw disk,
//! GRUB for BIOS and UEFI, then qcow2. No loop devices, no mounts.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::commands;
use crate::error::{io_err, BootstrapError};
use crate::ext4_times;
use crate::facts;
use crate::grub;
use crate::host::{Host, Mode, GRUB_BIOS_DIR, GRUB_EFI_DIR};
use crate::layout::Layout;
use crate::recipe::Recipe;
use crate::rootfs::{self, Ids};
use crate::run::Runner;
pub use crate::stage::{Progress, Stage};

/// Where the build puts its work and which .deb cache it uses.
#[derive(Debug, Clone)]
pub struct BuildSpec<'a> {
    pub recipe: &'a Recipe,
    /// Kept between builds; created if missing. `None` downloads every time.
    pub cache_dir: Option<&'a Path>,
    /// The build's work directory is made (and removed) in here: the store's `tmp/`, so the
    /// finished files move into the store by rename.
    pub work_parent: &'a Path,
}

/// A finished build. The files live in its work directory until moved; dropping it removes
/// whatever is left.
#[derive(Debug)]
pub struct Built {
    _work: TempDir,
    pub qcow2: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// `root=UUID=<uuid> ro`: boots the root filesystem; no `console=` (the backend adds its own).
    pub cmdline: String,
    /// `sha256:<hex>` of the qcow2.
    pub digest: String,
    /// Bytes of the qcow2 on disk.
    pub size: u64,
    pub virtual_size: u64,
    pub root_uuid: String,
    /// Every installed package, name to version: with the recipe, what a rebuild needs.
    pub packages: BTreeMap<String, String>,
    /// What the image's times are clamped to (see [`facts::source_date_epoch`]).
    pub source_date_epoch: u64,
    pub mode: Mode,
    pub elapsed: Duration,
}

/// Builds the image `spec.recipe` describes.
pub fn build(host: &Host, spec: &BuildSpec<'_>, progress: &mut dyn Progress) -> Result<Built, BootstrapError> {
    let t0 = Instant::now();
    // Absolute from here on: every path below reaches a tool's argv, where a relative one
    // starting with `-` would read as an option.
    let work_parent = absolute(spec.work_parent)?;
    let cache_dir = spec.cache_dir.map(absolute).transpose()?;
    let work = tempfile::Builder::new()
        .prefix("bootstrap-")
        .tempdir_in(&work_parent)
        .map_err(io_err("cannot create the build directory in", &work_parent))?;
    let w = work.path().to_path_buf();
    if host.mode == Mode::Unshare {
        // The namespace's root is not this user: it needs to traverse the work directory.
        set_mode(&w, 0o711)?;
    }
    // Nothing random: two builds of one recipe from the same packages are the same bytes.
    let ids = Ids::derive(&spec.recipe.key());
    let layout = Layout::for_size(spec.recipe.size.bytes());
    let mut runner = Runner {
        log: w.join("build.log"),
        progress,
    };
    let tree = TreeGuard {
        host,
        path: w.join("tree"),
    };
    let facts_dir = w.join("facts");

    stage(&mut runner, Stage::Packages, |r| {
        let overlay = w.join("overlay");
        write_overlay(&overlay, &rootfs::overlay(&ids))?;
        if let Some(c) = &cache_dir {
            fs::create_dir_all(c).map_err(io_err("cannot create the .deb cache", c))?;
        }
        fs::create_dir(&facts_dir).map_err(io_err("cannot create", &facts_dir))?;
        let mut cmd = Command::new(host.tool("mmdebstrap"));
        cmd.args(rootfs::mmdebstrap_args(
            spec.recipe,
            host.mode.mmdebstrap_mode(),
            &overlay,
            cache_dir.as_deref(),
            &facts_dir,
            &tree.path,
        ));
        // Maintainer scripts that write a date (shadow's last-change day) take the release's.
        cmd.env("SOURCE_DATE_EPOCH", spec.recipe.release.released.to_string());
        r.run(Stage::Packages, cmd, None)
    })?;
    let (packages, epoch) = read_facts(&facts_dir, spec.recipe.release.released)?;

    let disk = disk_stages(
        host,
        &mut runner,
        &DiskSpec {
            work: &w,
            tree: &tree,
            layout: &layout,
            ids: &ids,
            epoch,
            kernel: Path::new("vmlinuz"),
            initrd: Path::new("initrd.img"),
            format: DiskFormat::Qcow2,
            digest: true,
        },
    )?;
    let digest = disk
        .digest
        .ok_or_else(|| BootstrapError::Malformed("the disk's digest was not computed".into()))?;
    let (qcow2, kernel, initrd) = (disk.path, disk.kernel, disk.initrd);
    let size = fs::metadata(&qcow2).map_err(io_err("cannot stat", &qcow2))?.len();
    Ok(Built {
        _work: work,
        qcow2,
        kernel,
        initrd,
        cmdline: grub::kernel_cmdline(&ids.root_uuid),
        digest,
        size,
        virtual_size: layout.disk_bytes,
        root_uuid: ids.root_uuid,
        packages,
        source_date_epoch: epoch,
        mode: host.mode,
        elapsed: t0.elapsed(),
    })
}

/// Which file the disk is delivered as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFormat {
    Qcow2,
    Raw,
}

/// What [`disk_stages`] makes a disk of: a finished root tree (its `/etc/fstab` and
/// `/boot/grub/grub.cfg` written for `ids`) and where the kernel and initrd are in it.
pub(crate) struct DiskSpec<'a, 'h> {
    pub work: &'a Path,
    pub tree: &'a TreeGuard<'h>,
    pub layout: &'a Layout,
    pub ids: &'a Ids,
    pub epoch: u64,
    /// Relative to the tree; read through `cat` (the bootstrap's are the `/vmlinuz` symlinks).
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub format: DiskFormat,
    /// Whether the delivered file's digest is computed: not for an intermediate disk (the
    /// ISO's), whose sha256 over gigabytes of sparse zeros would only be thrown away.
    pub digest: bool,
}

pub(crate) struct Disk {
    pub path: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// `sha256:<hex>` of the delivered file, when [`DiskSpec::digest`] asked for it.
    pub digest: Option<String>,
}

/// The tree into a partitioned raw disk (GPT, ext4 root with clamped times, GRUB for BIOS and
/// UEFI), then qcow2 (or the raw file as it is), and its digest. The tree is removed once the
/// root filesystem holds it. Shared by `image bootstrap` and `image from-container`.
pub(crate) fn disk_stages(host: &Host, runner: &mut Runner<'_>, d: &DiskSpec<'_, '_>) -> Result<Disk, BootstrapError> {
    let (w, tree, layout, ids, epoch) = (d.work, d.tree, d.layout, d.ids, d.epoch);
    let raw = w.join("disk.raw");
    stage(runner, Stage::Partition, |r| {
        let f = File::create(&raw).map_err(io_err("cannot create", &raw))?;
        f.set_len(layout.disk_bytes).map_err(io_err("cannot size", &raw))?;
        r.run(
            Stage::Partition,
            commands::sfdisk(host.tool("sfdisk"), &raw),
            Some(&layout.sfdisk_script(ids)),
        )
    })?;

    let kernel = w.join("vmlinuz");
    let initrd = w.join("initrd.img");
    stage(runner, Stage::RootFs, |r| {
        // `/vmlinuz` and `/initrd.img` are the symlinks to the installed kernel; `cat` follows them.
        r.run_to_file(
            Stage::RootFs,
            tree.cmd("cat", &["--".as_ref(), tree.path.join(d.kernel).as_os_str()]),
            &kernel,
        )?;
        r.run_to_file(
            Stage::RootFs,
            tree.cmd("cat", &["--".as_ref(), tree.path.join(d.initrd).as_os_str()]),
            &initrd,
        )?;
        if host.mode == Mode::Unshare {
            set_mode(&raw, 0o666)?;
        }
        let args = commands::mkfs_ext4_args(
            &ids.root_uuid,
            &ids.root_hash_seed,
            layout.root.offset(),
            &tree.path,
            &raw,
            layout.root.bytes() / 1024,
        );
        let args: Vec<&OsStr> = args.iter().map(OsString::as_os_str).collect();
        let mut mkfs = tree.cmd(host.tool("mkfs.ext4"), &args);
        mkfs.envs(commands::mkfs_ext4_env(epoch));
        r.run(Stage::RootFs, mkfs, None)?;
        set_mode(&raw, 0o644)?;
        tree.remove(r)?;
        clamp_root_times(&raw, layout.root.offset(), epoch)?;
        r.run(
            Stage::RootFs,
            commands::e2fsck(host.tool("e2fsck"), &raw, layout.root.offset()),
            None,
        )
    })?;

    let early = w.join("early.cfg");
    fs::write(&early, grub::early_config(&ids.root_uuid)).map_err(io_err("cannot write", &early))?;
    stage(runner, Stage::BiosBoot, |r| {
        let core = w.join("core.img");
        r.run(
            Stage::BiosBoot,
            mkimage(host, "i386-pc", GRUB_BIOS_DIR, &early, &core, grub::BIOS_MODULES),
            None,
        )?;
        install_bios(&raw, &core, layout)
    })?;

    stage(runner, Stage::Esp, |r| {
        let efi = w.join("BOOTX64.EFI");
        r.run(
            Stage::Esp,
            mkimage(host, "x86_64-efi", GRUB_EFI_DIR, &early, &efi, grub::EFI_MODULES),
            None,
        )?;
        let mkfs = commands::mkfs_vfat(
            host.tool("mkfs.vfat"),
            layout.esp.start,
            &ids.esp_volume_hex(),
            &raw,
            layout.esp.bytes() / 1024,
        );
        r.run(Stage::Esp, mkfs, None)?;
        let image = commands::mtools_image(&raw, layout.esp.offset());
        r.run(
            Stage::Esp,
            commands::mmd(host.tool("mmd"), &image, &["::/EFI", "::/EFI/BOOT"], epoch),
            None,
        )?;
        r.run(
            Stage::Esp,
            commands::mcopy(host.tool("mcopy"), &image, &efi, "::/EFI/BOOT/BOOTX64.EFI", epoch),
            None,
        )
    })?;

    let out = match d.format {
        DiskFormat::Qcow2 => {
            let qcow2 = w.join("image.qcow2");
            stage(runner, Stage::Convert, |r| {
                r.run(
                    Stage::Convert,
                    commands::qemu_img_convert(host.tool("qemu-img"), &raw, &qcow2),
                    None,
                )?;
                fs::remove_file(&raw).map_err(io_err("cannot remove", &raw))
            })?;
            qcow2
        }
        DiskFormat::Raw => raw,
    };
    let mut digest = None;
    if d.digest {
        stage(runner, Stage::Digest, |_| {
            digest = Some(crate::digest::file_digest(&out).map_err(io_err("cannot read", &out))?);
            Ok(())
        })?;
    }
    Ok(Disk {
        path: out,
        kernel,
        initrd,
        digest,
    })
}

pub(crate) fn stage(
    r: &mut Runner<'_>,
    s: Stage,
    body: impl FnOnce(&mut Runner<'_>) -> Result<(), BootstrapError>,
) -> Result<(), BootstrapError> {
    let t = Instant::now();
    r.progress.started(s);
    body(r)?;
    r.progress.finished(s, t.elapsed());
    Ok(())
}

fn mkimage(host: &Host, format: &str, dir: &str, early: &Path, out: &Path, extra: &[&'static str]) -> Command {
    commands::grub_mkimage(
        host.tool("grub-mkimage"),
        format,
        dir,
        early,
        out,
        &grub::modules(extra),
    )
}

/// `p` made absolute against the working directory (not resolved: symlinks stay as given).
fn absolute(p: &Path) -> Result<PathBuf, BootstrapError> {
    std::path::absolute(p).map_err(io_err("cannot make an absolute path of", p))
}

/// What grub-bios-setup does, on the raw file: boot.img into sector 0, core.img into the
/// BIOS-boot partition, each pointing at the next.
fn install_bios(raw: &Path, core_path: &Path, layout: &Layout) -> Result<(), BootstrapError> {
    let boot_path = Path::new(GRUB_BIOS_DIR).join("boot.img");
    let boot = fs::read(&boot_path).map_err(io_err("cannot read", &boot_path))?;
    let boot: [u8; 512] = boot
        .try_into()
        .map_err(|_| BootstrapError::Malformed(format!("{} is not 512 bytes", boot_path.display())))?;
    let mut core = fs::read(core_path).map_err(io_err("cannot read", core_path))?;
    grub::patch_core_img(&mut core, layout.bios_boot.start, layout.bios_boot.sectors)
        .map_err(BootstrapError::Malformed)?;
    let mut disk = OpenOptions::new()
        .read(true)
        .write(true)
        .open(raw)
        .map_err(io_err("cannot open", raw))?;
    let mut mbr = [0u8; 512];
    disk.read_exact(&mut mbr)
        .map_err(io_err("cannot read the MBR of", raw))?;
    let mbr = grub::patch_boot_img(&boot, &mbr, layout.bios_boot.start);
    disk.write_all_at(&mbr, 0)
        .map_err(io_err("cannot write the MBR of", raw))?;
    disk.write_all_at(&core, layout.bios_boot.offset())
        .map_err(io_err("cannot write core.img into", raw))?;
    disk.sync_all().map_err(io_err("cannot sync", raw))
}

fn write_overlay(dir: &Path, files: &[rootfs::OverlayFile]) -> Result<(), BootstrapError> {
    for f in files {
        let path = dir.join(f.path);
        let parent = path.parent().expect("overlay paths have a parent");
        fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
        fs::write(&path, &f.contents).map_err(io_err("cannot write", &path))?;
        set_mode(&path, 0o644)?;
    }
    // Directories as the image expects them, whatever the caller's umask.
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        set_mode(&d, 0o755)?;
        for e in fs::read_dir(&d).map_err(io_err("cannot read", &d))?.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    Ok(())
}

fn set_mode(p: &Path, mode: u32) -> Result<(), BootstrapError> {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).map_err(io_err("cannot set permissions of", p))
}

/// The package versions and the image's epoch, from the files the facts hook left in `dir`.
fn read_facts(dir: &Path, released: u64) -> Result<(BTreeMap<String, String>, u64), BootstrapError> {
    let read = |name: &str| {
        let p = dir.join(name);
        let mut text = String::new();
        File::open(&p)
            .and_then(|f| f.take(4 << 20).read_to_string(&mut text))
            .map_err(io_err("cannot read the build's facts file", &p))?;
        Ok::<_, BootstrapError>((p, text))
    };
    let (p, text) = read("packages")?;
    let packages =
        facts::parse_packages(&text).map_err(|why| BootstrapError::Malformed(format!("{}: {why}", p.display())))?;
    let (p, text) = read("newest")?;
    let newest =
        facts::parse_newest(&text).map_err(|why| BootstrapError::Malformed(format!("{}: {why}", p.display())))?;
    Ok((packages, facts::source_date_epoch(released, newest)))
}

/// Clamps the root filesystem's inode times to `epoch` (see [`ext4_times`]).
pub(crate) fn clamp_root_times(raw: &Path, offset: u64, epoch: u64) -> Result<(), BootstrapError> {
    let epoch = u32::try_from(epoch)
        .map_err(|_| BootstrapError::Malformed(format!("epoch {epoch} is past what ext4's times hold")))?;
    let disk = OpenOptions::new()
        .read(true)
        .write(true)
        .open(raw)
        .map_err(io_err("cannot open", raw))?;
    ext4_times::clamp_times(&disk, offset, epoch).map_err(|why| {
        BootstrapError::Malformed(format!(
            "clamping the times of the root filesystem in {}: {why}",
            raw.display()
        ))
    })?;
    disk.sync_all().map_err(io_err("cannot sync", raw))
}

/// The root tree mmdebstrap made. In unshare mode its files belong to subordinate ids this user
/// cannot touch, so reading and removing it go through `mmdebstrap --unshare-helper`. Removed
/// on every path: explicitly after the root filesystem is written, else on drop.
pub(crate) struct TreeGuard<'h> {
    pub host: &'h Host,
    pub path: PathBuf,
}

impl TreeGuard<'_> {
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&std::ffi::OsStr]) -> Command {
        match self.host.mode {
            Mode::Root => {
                let mut c = Command::new(program);
                c.args(args);
                c
            }
            Mode::Unshare => {
                let mut c = Command::new(self.host.tool("mmdebstrap"));
                c.arg("--unshare-helper").arg(program).args(args);
                c
            }
        }
    }

    pub fn remove(&self, r: &mut Runner<'_>) -> Result<(), BootstrapError> {
        if !self.path.exists() {
            return Ok(());
        }
        match self.host.mode {
            Mode::Root => fs::remove_dir_all(&self.path).map_err(io_err("cannot remove the build tree", &self.path)),
            Mode::Unshare => r.run(
                Stage::RootFs,
                self.cmd("rm", &["-rf".as_ref(), "--".as_ref(), self.path.as_os_str()]),
                None,
            ),
        }
    }
}

impl Drop for TreeGuard<'_> {
    fn drop(&mut self) {
        if !self.path.exists() {
            return;
        }
        // Best effort on an error path: the error being returned matters more.
        let _ = match self.host.mode {
            Mode::Root => fs::remove_dir_all(&self.path).map_err(|_| ()),
            Mode::Unshare => self
                .cmd("rm", &["-rf".as_ref(), "--".as_ref(), self.path.as_os_str()])
                .status()
                .map(|_| ())
                .map_err(|_| ()),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_overlay_makes_world_readable_tree() {
        let dir = tempfile::tempdir().unwrap();
        let files = vec![rootfs::OverlayFile {
            path: "etc/a/b",
            contents: "x".into(),
        }];

        write_overlay(dir.path(), &files).unwrap();

        let mode = fs::metadata(dir.path().join("etc/a")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o755);
        assert_eq!(fs::read_to_string(dir.path().join("etc/a/b")).unwrap(), "x");
    }
}
