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
/// mmdebstrap's unshare helper.
pub fn mkfs_ext4_args(root_uuid: &str, offset: u64, tree: &Path, raw: &Path, size_kib: u64) -> Vec<OsString> {
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
        format!("offset={offset},nodiscard").into(),
        tree_arg,
        "--".into(),
        operand(raw).into(),
        format!("{size_kib}k").into(),
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
        .args(["-F", "32", "-s", "1", "-n", "ESP", "-i", volume_id, "--"])
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

/// `mmd` making `dirs` (`::/EFI`, ...) in the FAT `image`.
pub fn mmd(tool: &Path, image: &OsStr, dirs: &[&str]) -> Command {
    let mut cmd = Command::new(tool);
    cmd.env("MTOOLS_SKIP_CHECK", "1")
        .arg("-i")
        .arg(image)
        .arg("--")
        .args(dirs);
    cmd
}

/// `mcopy` copying host file `from` to `to` (`::/EFI/BOOT/BOOTX64.EFI`) in the FAT `image`.
pub fn mcopy(tool: &Path, image: &OsStr, from: &Path, to: &str) -> Command {
    let mut cmd = Command::new(tool);
    cmd.env("MTOOLS_SKIP_CHECK", "1")
        .arg("-i")
        .arg(image)
        .arg("--")
        .arg(operand(from))
        .arg(to);
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
        let a: Vec<String> = mkfs_ext4_args("u", 512, Path::new("-x"), Path::new(HOSTILE), 1024)
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();

        assert!(a.contains(&"-d./-x".to_string()), "{a:?}");
        assert_eq!(after_dashes(&a), ["./-oProxyCommand=x", "1024k"]);
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
        ));

        assert_eq!(
            after_dashes(&a),
            ["./--customize-hook=touch /tmp/x", "::/EFI/BOOT/BOOTX64.EFI"]
        );
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
