//! The argv of every tool the build runs besides mmdebstrap (whose argv is in `rootfs`). Pure:
//! paths and numbers in, [`Command`]s out, nothing run.
//!
//! Every path reaches a tool as an operand after `--` (each of these tools parses options with
//! getopt or argp, which stop at `--`), and [`operand`] makes it absolute-or-`./`-prefixed, so
//! no path, whatever a user named the cache or store directory, is read as an option.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Command;

/// `p` as an operand that cannot start with `-`: absolute paths as they are, relative ones
/// prefixed with `./`.
pub fn operand(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        Path::new(".").join(p)
    }
}

/// `sfdisk` writing the GPT the script on its stdin describes into the raw file (no kernel
/// re-read: it is a file, not a device).
pub fn sfdisk(tool: &Path, raw: &Path) -> Command {
    let mut cmd = Command::new(tool);
    cmd.args(["--quiet", "--no-reread", "--no-tell-kernel", "--"])
        .arg(operand(raw));
    cmd
}

/// `mkfs.ext4`'s arguments: the tree's files copied in (`-d`), written at `offset` bytes into the
/// raw file and `size_kib` long. Arguments only: the program runs directly or under
/// mmdebstrap's unshare helper. Its clock comes from [`mkfs_ext4_env`].
pub fn mkfs_ext4_args(
    root_uuid: &str,
    hash_seed: &str,
    offset: u64,
    tree: &Path,
    raw: &Path,
    size_kib: u64,
) -> Vec<OsString> {
    let mut tree_arg = OsString::from("-d");
    tree_arg.push(operand(tree));
    vec![
        "-q".into(),
        "-F".into(),
        "-L".into(),
        "root".into(),
        "-U".into(),
        root_uuid.into(),
        "-E".into(),
        // The directory-index hash seed is otherwise random, and with it the order of entries
        // in every large directory's index blocks.
        format!("offset={offset},nodiscard,hash_seed={hash_seed}").into(),
        tree_arg,
        "--".into(),
        operand(raw).into(),
        format!("{size_kib}k").into(),
    ]
}

/// The environment that fixes mkfs.ext4's clock (superblock times, the times of the inodes it
/// makes itself) at `epoch`: `E2FSPROGS_FAKE_TIME` for e2fsprogs 1.47.0, `SOURCE_DATE_EPOCH` for
/// later ones, which read it.
pub fn mkfs_ext4_env(epoch: u64) -> [(&'static str, String); 2] {
    [
        ("E2FSPROGS_FAKE_TIME", epoch.to_string()),
        ("SOURCE_DATE_EPOCH", epoch.to_string()),
    ]
}

/// `grub-mkimage` for `format` (`i386-pc`, `x86_64-efi`) with `early` embedded, into `out`.
pub fn grub_mkimage(
    tool: &Path,
    format: &str,
    dir: &str,
    early: &Path,
    out: &Path,
    modules: &[&'static str],
) -> Command {
    let mut cmd = Command::new(tool);
    cmd.args(["-O", format, "-d", dir, "-p", "/boot/grub"])
        .arg(join("-c", early))
        .arg(join("-o", out))
        .arg("--")
        .args(modules);
    cmd
}

/// `mkfs.vfat` making the FAT32 ESP at `start_sector` of the raw file, `kib` long.
pub fn mkfs_vfat(tool: &Path, start_sector: u64, volume_id: &str, raw: &Path, kib: u64) -> Command {
    let mut cmd = Command::new(tool);
    cmd.arg(format!("--offset={start_sector}"))
        // FAT32 as the UEFI spec asks of an ESP; 512-byte clusters give 62 MiB enough of them.
        .args(["-F", "32", "-s", "1", "-n", "ESP", "-i", volume_id])
        // Fixed times (the volume label's directory entry) instead of the clock; `-i` still
        // sets the volume id.
        .args(["--invariant", "--"])
        .arg(operand(raw))
        .arg(kib.to_string());
    cmd
}

/// mtools' `-i` image argument: the FAT at byte `offset` of the raw file.
pub fn mtools_image(raw: &Path, offset: u64) -> OsString {
    let mut image = operand(raw).into_os_string();
    image.push(format!("@@{offset}"));
    image
}

/// `mmd` making `dirs` (`::/EFI`, ...) in the FAT `image`, dated `epoch` (mtools reads
/// `SOURCE_DATE_EPOCH` as its clock).
pub fn mmd(tool: &Path, image: &OsStr, dirs: &[&str], epoch: u64) -> Command {
    let mut cmd = Command::new(tool);
    cmd.env("MTOOLS_SKIP_CHECK", "1")
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        .arg("-i")
        .arg(image)
        .arg("--")
        .args(dirs);
    cmd
}

/// `mcopy` copying host file `from` to `to` (`::/EFI/BOOT/BOOTX64.EFI`) in the FAT `image`,
/// dated `epoch`.
pub fn mcopy(tool: &Path, image: &OsStr, from: &Path, to: &str, epoch: u64) -> Command {
    let mut cmd = Command::new(tool);
    cmd.env("MTOOLS_SKIP_CHECK", "1")
        .env("SOURCE_DATE_EPOCH", epoch.to_string())
        .arg("-i")
        .arg(image)
        .arg("--")
        .arg(operand(from))
        .arg(to);
    cmd
}

/// `e2fsck -fn` of the ext4 filesystem at byte `offset` of the raw file (unix_io's `?offset=`
/// option): read-only, answering no to every repair.
pub fn e2fsck(tool: &Path, raw: &Path, offset: u64) -> Command {
    let mut device = operand(raw).into_os_string();
    device.push(format!("?offset={offset}"));
    let mut cmd = Command::new(tool);
    cmd.args(["-f", "-n", "--"]).arg(device);
    cmd
}

/// `qemu-img convert` of the raw file to qcow2. Uncompressed: compressed clusters are slower to
/// read and not every VMM's qcow2 reader handles them; the store keeps one copy however many VMs
/// use it.
pub fn qemu_img_convert(tool: &Path, raw: &Path, qcow2: &Path) -> Command {
    let mut cmd = Command::new(tool);
    cmd.args(["convert", "-f", "raw", "-O", "qcow2", "--"])
        .arg(operand(raw))
        .arg(operand(qcow2));
    cmd
}

/// `-cPATH`-style single argument, so the path cannot be taken for the next option.
fn join(flag: &str, p: &Path) -> OsString {
    let mut a = OsString::from(flag);
    a.push(operand(p));
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A relative path that looks like an option, as a user's `--cache-dir` or store might be.
    const HOSTILE: &str = "-oProxyCommand=x";

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect()
    }

    /// The arguments after `--`: where operands belong.
    fn after_dashes(args: &[String]) -> &[String] {
        let at = args.iter().position(|a| a == "--").expect("options end with --");
        &args[at + 1..]
    }

    #[test]
    fn operand_relative_option_shaped_is_dot_prefixed() {
        assert_eq!(
            operand(Path::new("--customize-hook=touch /tmp/x")),
            Path::new("./--customize-hook=touch /tmp/x")
        );
    }

    #[test]
    fn operand_absolute_is_unchanged() {
        assert_eq!(operand(Path::new("/w/disk.raw")), Path::new("/w/disk.raw"));
    }

    #[test]
    fn sfdisk_option_shaped_raw_lands_as_operand() {
        let a = args(&sfdisk(Path::new("/sbin/sfdisk"), Path::new(HOSTILE)));

        assert_eq!(after_dashes(&a), ["./-oProxyCommand=x"]);
    }

    #[test]
    fn mkfs_ext4_args_option_shaped_paths_land_as_operands() {
        let a: Vec<String> = mkfs_ext4_args("u", "s", 512, Path::new("-x"), Path::new(HOSTILE), 1024)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();

        assert!(a.contains(&"-d./-x".to_string()), "{a:?}");
        assert!(a.contains(&"offset=512,nodiscard,hash_seed=s".to_string()), "{a:?}");
        assert_eq!(after_dashes(&a), ["./-oProxyCommand=x", "1024k"]);
    }

    #[test]
    fn mkfs_ext4_env_fixes_both_clocks() {
        assert_eq!(
            mkfs_ext4_env(42),
            [
                ("E2FSPROGS_FAKE_TIME", "42".to_string()),
                ("SOURCE_DATE_EPOCH", "42".to_string())
            ]
        );
    }

    #[test]
    fn grub_mkimage_paths_are_joined_and_modules_after_dashes() {
        let a = args(&grub_mkimage(
            Path::new("/usr/bin/grub-mkimage"),
            "i386-pc",
            "/usr/lib/grub/i386-pc",
            Path::new("-x"),
            Path::new(HOSTILE),
            &["part_gpt", "ext2"],
        ));

        assert!(
            a.contains(&"-c./-x".to_string()) && a.contains(&"-o./-oProxyCommand=x".to_string()),
            "{a:?}"
        );
        assert_eq!(after_dashes(&a), ["part_gpt", "ext2"]);
    }

    #[test]
    fn mkfs_vfat_option_shaped_raw_lands_as_operand() {
        let a = args(&mkfs_vfat(
            Path::new("/sbin/mkfs.vfat"),
            4096,
            "ABCD1234",
            Path::new(HOSTILE),
            63488,
        ));

        assert_eq!(after_dashes(&a), ["./-oProxyCommand=x", "63488"]);
        assert!(a.contains(&"--invariant".to_string()) && a.contains(&"ABCD1234".to_string()));
    }

    #[test]
    fn mtools_image_option_shaped_raw_is_dot_prefixed() {
        assert_eq!(mtools_image(Path::new("-x"), 2048), OsString::from("./-x@@2048"));
    }

    #[test]
    fn mmd_dirs_after_dashes() {
        let a = args(&mmd(
            Path::new("/usr/bin/mmd"),
            OsStr::new("/w/d@@1"),
            &["::/EFI", "::/EFI/BOOT"],
            7,
        ));

        assert_eq!(a[..2], ["-i", "/w/d@@1"]);
        assert_eq!(after_dashes(&a), ["::/EFI", "::/EFI/BOOT"]);
    }

    #[test]
    fn mcopy_option_shaped_source_lands_as_operand() {
        let a = args(&mcopy(
            Path::new("/usr/bin/mcopy"),
            OsStr::new("/w/d@@1"),
            Path::new("--customize-hook=touch /tmp/x"),
            "::/EFI/BOOT/BOOTX64.EFI",
            7,
        ));

        assert_eq!(
            after_dashes(&a),
            ["./--customize-hook=touch /tmp/x", "::/EFI/BOOT/BOOTX64.EFI"]
        );
    }

    #[test]
    fn mcopy_clock_is_epoch() {
        let cmd = mcopy(
            Path::new("mcopy"),
            OsStr::new("d@@1"),
            Path::new("/e"),
            "::/E",
            1_700_000_000,
        );

        assert!(cmd
            .get_envs()
            .any(|(k, v)| k == "SOURCE_DATE_EPOCH" && v == Some(OsStr::new("1700000000"))));
    }

    #[test]
    fn e2fsck_checks_at_offset_read_only() {
        let a = args(&e2fsck(Path::new("/sbin/e2fsck"), Path::new(HOSTILE), 512));

        assert_eq!(a[..2], ["-f", "-n"]);
        assert_eq!(after_dashes(&a), ["./-oProxyCommand=x?offset=512"]);
    }

    #[test]
    fn qemu_img_convert_option_shaped_paths_land_as_operands() {
        let a = args(&qemu_img_convert(
            Path::new("/usr/bin/qemu-img"),
            Path::new(HOSTILE),
            Path::new("-x"),
        ));

        assert_eq!(after_dashes(&a), ["./-oProxyCommand=x", "./-x"]);
    }
}
