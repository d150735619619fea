//! The build, stage by stage: packages into a tree, the tree into a partitioned raw disk,
//! GRUB for BIOS and UEFI, then qcow2. No loop devices, no mounts.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::error::{io_err, BootstrapError};
use crate::grub;
use crate::host::{Host, Mode, GRUB_BIOS_DIR, GRUB_EFI_DIR};
use crate::layout::Layout;
use crate::recipe::Recipe;
use crate::rootfs::{self, Ids};
use crate::run::Runner;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Packages,
    Partition,
    RootFs,
    BiosBoot,
    Esp,
    Convert,
    Digest,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Packages,
        Stage::Partition,
        Stage::RootFs,
        Stage::BiosBoot,
        Stage::Esp,
        Stage::Convert,
        Stage::Digest,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Stage::Packages => "installing packages (mmdebstrap)",
            Stage::Partition => "partitioning (GPT: BIOS boot, ESP, root)",
            Stage::RootFs => "writing the root filesystem (ext4)",
            Stage::BiosBoot => "installing GRUB for BIOS",
            Stage::Esp => "writing the EFI system partition",
            Stage::Convert => "converting to qcow2",
            Stage::Digest => "computing sha256",
        }
    }

    /// 1-based position, for `[n/7]`.
    pub fn number(self) -> usize {
        Stage::ALL.iter().position(|s| *s == self).map_or(0, |i| i + 1)
    }
}

/// Told about each stage as it happens.
pub trait Progress {
    fn started(&mut self, stage: Stage);
    /// A line the stage's tool printed (mmdebstrap's `I: ...` progress, warnings).
    fn detail(&mut self, _stage: Stage, _line: &str) {}
    fn finished(&mut self, stage: Stage, elapsed: Duration);
}

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
    pub mode: Mode,
    pub elapsed: Duration,
}

/// Builds the image `spec.recipe` describes.
pub fn build(host: &Host, spec: &BuildSpec<'_>, progress: &mut dyn Progress) -> Result<Built, BootstrapError> {
    let t0 = Instant::now();
    let work = tempfile::Builder::new()
        .prefix("bootstrap-")
        .tempdir_in(spec.work_parent)
        .map_err(io_err("cannot create the build directory in", spec.work_parent))?;
    let w = work.path().to_path_buf();
    if host.mode == Mode::Unshare {
        // The namespace's root is not this user: it needs to traverse the work directory.
        set_mode(&w, 0o711)?;
    }
    let ids = Ids {
        root_uuid: uuid::Uuid::new_v4().to_string(),
        esp_id: esp_id(),
    };
    let layout = Layout::for_size(spec.recipe.size.bytes());
    let mut runner = Runner {
        log: w.join("build.log"),
        progress,
    };
    let raw = w.join("disk.raw");
    let tree = TreeGuard {
        host,
        path: w.join("tree"),
    };

    stage(&mut runner, Stage::Packages, |r| {
        let overlay = w.join("overlay");
        write_overlay(&overlay, &rootfs::overlay(&ids))?;
        if let Some(c) = spec.cache_dir {
            fs::create_dir_all(c).map_err(io_err("cannot create the .deb cache", c))?;
        }
        let mut cmd = Command::new(host.tool("mmdebstrap"));
        cmd.args(rootfs::mmdebstrap_args(
            spec.recipe,
            host.mode.mmdebstrap_mode(),
            &overlay,
            spec.cache_dir,
            &tree.path,
        ));
        r.run(Stage::Packages, cmd, None)
    })?;

    stage(&mut runner, Stage::Partition, |r| {
        let f = File::create(&raw).map_err(io_err("cannot create", &raw))?;
        f.set_len(layout.disk_bytes).map_err(io_err("cannot size", &raw))?;
        let mut cmd = Command::new(host.tool("sfdisk"));
        cmd.args(["--quiet", "--no-reread", "--no-tell-kernel"]).arg(&raw);
        r.run(Stage::Partition, cmd, Some(&layout.sfdisk_script()))
    })?;

    let kernel = w.join("vmlinuz");
    let initrd = w.join("initrd.img");
    stage(&mut runner, Stage::RootFs, |r| {
        // `/vmlinuz` and `/initrd.img` are the symlinks to the installed kernel; `cat` follows them.
        r.run_to_file(
            Stage::RootFs,
            tree.cmd("cat", &[tree.path.join("vmlinuz").as_os_str()]),
            &kernel,
        )?;
        r.run_to_file(
            Stage::RootFs,
            tree.cmd("cat", &[tree.path.join("initrd.img").as_os_str()]),
            &initrd,
        )?;
        if host.mode == Mode::Unshare {
            set_mode(&raw, 0o666)?;
        }
        let offset = format!("offset={},nodiscard", layout.root.offset());
        let size = format!("{}k", layout.root.bytes() / 1024);
        let mkfs = host.tool("mkfs.ext4").as_os_str();
        let args: Vec<&std::ffi::OsStr> = vec![
            "-q".as_ref(),
            "-F".as_ref(),
            "-L".as_ref(),
            "root".as_ref(),
            "-U".as_ref(),
            ids.root_uuid.as_ref(),
            "-E".as_ref(),
            offset.as_ref(),
            "-d".as_ref(),
            tree.path.as_os_str(),
            raw.as_os_str(),
            size.as_ref(),
        ];
        r.run(Stage::RootFs, tree.cmd(mkfs, &args), None)?;
        set_mode(&raw, 0o644)?;
        tree.remove(r)
    })?;

    let early = w.join("early.cfg");
    fs::write(&early, grub::early_config(&ids.root_uuid)).map_err(io_err("cannot write", &early))?;
    stage(&mut runner, Stage::BiosBoot, |r| {
        let core = w.join("core.img");
        r.run(
            Stage::BiosBoot,
            mkimage(host, "i386-pc", GRUB_BIOS_DIR, &early, &core, grub::BIOS_MODULES),
            None,
        )?;
        install_bios(&raw, &core, &layout)
    })?;

    stage(&mut runner, Stage::Esp, |r| {
        let efi = w.join("BOOTX64.EFI");
        r.run(
            Stage::Esp,
            mkimage(host, "x86_64-efi", GRUB_EFI_DIR, &early, &efi, grub::EFI_MODULES),
            None,
        )?;
        let mut mkfs = Command::new(host.tool("mkfs.vfat"));
        mkfs.arg(format!("--offset={}", layout.esp.start))
            // FAT32 as the UEFI spec asks of an ESP; 512-byte clusters give 62 MiB enough of them.
            .args(["-F", "32", "-s", "1", "-n", "ESP", "-i", &ids.esp_id.replace('-', "")])
            .arg(&raw)
            .arg((layout.esp.bytes() / 1024).to_string());
        r.run(Stage::Esp, mkfs, None)?;
        let image = format!("{}@@{}", raw.display(), layout.esp.offset());
        let mut mmd = Command::new(host.tool("mmd"));
        mmd.env("MTOOLS_SKIP_CHECK", "1")
            .args(["-i", &image, "::/EFI", "::/EFI/BOOT"]);
        r.run(Stage::Esp, mmd, None)?;
        let mut mcopy = Command::new(host.tool("mcopy"));
        mcopy
            .env("MTOOLS_SKIP_CHECK", "1")
            .args(["-i", &image])
            .arg(&efi)
            .arg("::/EFI/BOOT/BOOTX64.EFI");
        r.run(Stage::Esp, mcopy, None)
    })?;

    let qcow2 = w.join("image.qcow2");
    stage(&mut runner, Stage::Convert, |r| {
        // Uncompressed: compressed clusters are slower to read and not every VMM's qcow2 reader
        // handles them; the store keeps one copy however many VMs use it.
        let mut cmd = Command::new(host.tool("qemu-img"));
        cmd.args(["convert", "-f", "raw", "-O", "qcow2"]).arg(&raw).arg(&qcow2);
        r.run(Stage::Convert, cmd, None)?;
        fs::remove_file(&raw).map_err(io_err("cannot remove", &raw))
    })?;

    let mut digest = String::new();
    stage(&mut runner, Stage::Digest, |_| {
        digest = crate::digest::file_digest(&qcow2).map_err(io_err("cannot read", &qcow2))?;
        Ok(())
    })?;
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
        mode: host.mode,
        elapsed: t0.elapsed(),
    })
}

fn stage(
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
    let mut cmd = Command::new(host.tool("grub-mkimage"));
    cmd.args(["-O", format, "-d", dir, "-p", "/boot/grub", "-c"])
        .arg(early)
        .arg("-o")
        .arg(out)
        .args(grub::modules(extra));
    cmd
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

/// FAT volume id, `XXXX-XXXX` as fstab and blkid spell it.
fn esp_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string().to_uppercase();
    format!("{}-{}", &hex[..4], &hex[4..8])
}

/// The root tree mmdebstrap made. In unshare mode its files belong to subordinate ids this user
/// cannot touch, so reading and removing it go through `mmdebstrap --unshare-helper`. Removed
/// on every path: explicitly after the root filesystem is written, else on drop.
struct TreeGuard<'h> {
    host: &'h Host,
    path: PathBuf,
}

impl TreeGuard<'_> {
    fn cmd(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&std::ffi::OsStr]) -> Command {
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

    fn remove(&self, r: &mut Runner<'_>) -> Result<(), BootstrapError> {
        if !self.path.exists() {
            return Ok(());
        }
        match self.host.mode {
            Mode::Root => fs::remove_dir_all(&self.path).map_err(io_err("cannot remove the build tree", &self.path)),
            Mode::Unshare => r.run(
                Stage::RootFs,
                self.cmd("rm", &["-rf".as_ref(), self.path.as_os_str()]),
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
                .cmd("rm", &["-rf".as_ref(), self.path.as_os_str()])
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
    fn stage_numbers_count_from_one() {
        assert_eq!((Stage::Packages.number(), Stage::Digest.number()), (1, 7));
    }

    #[test]
    fn esp_id_is_fat_volume_id() {
        let id = esp_id();

        assert!(id.len() == 9 && id.as_bytes()[4] == b'-', "{id}");
    }

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
