//! `--format iso`: a hybrid ISO (El Torito for BIOS, an EFI system partition image for UEFI,
//! and an MBR/GPT so the same file boots as a USB disk) that boots the container image's own
//! kernel and initramfs with the root filesystem read-only from the ISO under a tmpfs overlay.
//!
//! The image is not changed to boot live. Debian's initramfs-tools sources `/scripts/${BOOT}`
//! for the `boot=` kernel argument, and Linux unpacks concatenated initramfs archives one over
//! the other; so GRUB loads the image's initramfs followed by a small cpio of nubo's
//! (`/scripts/nubolive` and the kernel modules a CD-ROM and an overlay need, taken from the
//! image's own `/usr/lib/modules/<version>`), and the kernel line says `boot=nubolive`. The
//! script finds the ISO by the id nubo wrote in it, attaches `/live/root.img` (the disk's ext4
//! root, shrunk to its contents) to a loop device, and mounts an overlay with a tmpfs upper.
//! A baked NoCloud seed (`--iso-cloud-config`) is copied into the overlay's
//! `/var/lib/cloud/seed/nocloud/`, which cloud-init's NoCloud datasource reads first.
//!
//! The pure parts (modules.dep, load order, cpio, the script, grub.cfg) are unit tested; the
//! ISO itself is written by `grub-mkrescue` (xorriso, mtools) and proven by the live test.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::commands::operand;
use crate::error::{io_err, BootstrapError};
use crate::host::find_tool;

/// Kernel modules the live boot needs, when the kernel has them as modules: the loop device,
/// the ISO's filesystem, the overlay, and the CD-ROM driver.
pub const REQUIRED_MODULES: &[&str] = &["loop", "isofs", "overlay", "cdrom", "sr_mod"];
/// The CD-ROM's controller on QEMU's pc (IDE) and q35 (AHCI) machines; a kernel may lack one.
pub const OPTIONAL_MODULES: &[&str] = &["ata_piix", "ahci"];

/// Tools the ISO needs beyond the disk's, with their Debian packages.
pub const ISO_TOOLS: &[(&str, &str)] = &[
    ("grub-mkrescue", "grub-common"),
    ("xorriso", "xorriso"),
    ("mformat", "mtools"),
    ("resize2fs", "e2fsprogs"),
];

/// Where the live boot finds its parts on the ISO.
pub const ROOT_IMG: &str = "live/root.img";
pub const ID_FILE: &str = "live/nubolive.id";

/// The resolved paths of [`ISO_TOOLS`], or every missing one named with its package.
pub fn probe_tools() -> Result<BTreeMap<&'static str, PathBuf>, BootstrapError> {
    let mut found = BTreeMap::new();
    let mut missing = Vec::new();
    for (cmd, pkg) in ISO_TOOLS {
        match find_tool(cmd) {
            Some(p) => {
                found.insert(*cmd, p);
            }
            None => missing.push((cmd.to_string(), pkg.to_string())),
        }
    }
    if missing.is_empty() {
        Ok(found)
    } else {
        Err(BootstrapError::MissingTools(missing))
    }
}

/// A module's name as modprobe knows it: the file name without `.ko[.xz|.zst|.gz]`, `-` as `_`.
pub fn module_name(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    let stem = [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))?;
    (!stem.is_empty()).then(|| stem.replace('-', "_"))
}

/// `modules.dep`: each module's name to its path and its dependencies' paths (as listed:
/// modprobe loads them last first).
pub fn parse_modules_dep(text: &str) -> BTreeMap<String, (String, Vec<String>)> {
    let mut map = BTreeMap::new();
    for line in text.lines() {
        let Some((path, deps)) = line.split_once(':') else {
            continue;
        };
        let path = path.trim();
        if let Some(name) = module_name(path) {
            let deps = deps.split_whitespace().map(str::to_owned).collect();
            map.insert(name, (path.to_owned(), deps));
        }
    }
    map
}

/// The module files to load, dependencies first, for `required` (each must be a module or
/// built in) and `optional` (skipped when neither); `builtin` is `modules.builtin`'s text.
pub fn load_order(
    deps: &BTreeMap<String, (String, Vec<String>)>,
    builtin: &str,
    required: &[&str],
    optional: &[&str],
) -> Result<Vec<String>, String> {
    let builtin: BTreeSet<String> = builtin.lines().filter_map(module_name).collect();
    let by_path: BTreeMap<&str, &Vec<String>> = deps.values().map(|(p, d)| (p.as_str(), d)).collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    let mut missing = Vec::new();
    for (name, must) in required
        .iter()
        .map(|n| (n, true))
        .chain(optional.iter().map(|n| (n, false)))
    {
        match deps.get(*name) {
            Some((path, listed)) => {
                for d in listed.iter().rev() {
                    // modules.dep lists the whole closure; a dependency's own line may order
                    // more of it, so it is visited too.
                    for dd in by_path.get(d.as_str()).into_iter().flat_map(|v| v.iter().rev()) {
                        if seen.insert(dd.clone()) {
                            order.push(dd.clone());
                        }
                    }
                    if seen.insert(d.clone()) {
                        order.push(d.clone());
                    }
                }
                if seen.insert(path.clone()) {
                    order.push(path.clone());
                }
            }
            None if builtin.contains(*name) || !must => {}
            None => missing.push(*name),
        }
    }
    if missing.is_empty() {
        Ok(order)
    } else {
        Err(format!(
            "its kernel has no {} module (neither in modules.dep nor built in), which the ISO's live boot needs",
            missing.join(", ")
        ))
    }
}

/// One file or directory of a newc cpio archive.
#[derive(Debug, Clone)]
pub struct CpioEntry {
    pub name: String,
    /// Full mode, type bits included (`0o040755`, `0o100644`).
    pub mode: u32,
    pub data: Vec<u8>,
}

/// A newc ("070701") cpio archive of `entries`, owned by root, every time `mtime`: the form
/// Linux unpacks as an initramfs.
pub fn cpio_newc(entries: &[CpioEntry], mtime: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let put = |ino: u32, name: &str, mode: u32, data: &[u8], out: &mut Vec<u8>| {
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let header = format!(
            "070701{ino:08x}{mode:08x}{:08x}{:08x}{nlink:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            0,
            0,
            mtime as u32,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.resize(out.len().div_ceil(4) * 4, 0);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(4) * 4, 0);
    };
    for (i, e) in entries.iter().enumerate() {
        put(i as u32 + 1, &e.name, e.mode, &e.data, &mut out);
    }
    put(0, "TRAILER!!!", 0, &[], &mut out);
    out
}

/// `/scripts/nubolive`, sourced by initramfs-tools' `/init` for `boot=nubolive`: loads
/// `modules` (file names under `/nubolive/modules`, in order), finds the device whose ISO holds
/// `id` in `/live/nubolive.id`, and mounts `/live/root.img` read-only under a tmpfs overlay.
pub fn live_script(id: &str, modules: &[String]) -> String {
    format!(
        r#"# nubo live boot: the root filesystem image on the ISO, read-only, under a tmpfs overlay.
# Sourced by initramfs-tools' /init for boot=nubolive.

nubolive_id={id}
nubolive_modules="{modules}"

mount_top() {{ :; }}
mount_premount() {{ :; }}
mount_bottom() {{ :; }}

nubolive_find()
{{
	for dev in /dev/sr* /dev/vd* /dev/sd* /dev/nvme*n*; do
		[ -b "$dev" ] || continue
		mount -t iso9660 -o ro "$dev" /run/nubolive/iso 2>/dev/null || continue
		if [ "$(cat /run/nubolive/iso/{ID_FILE} 2>/dev/null)" = "$nubolive_id" ]; then
			return 0
		fi
		umount /run/nubolive/iso
	done
	return 1
}}

mountroot()
{{
	for m in $nubolive_modules; do
		insmod "/nubolive/modules/$m" 2>/dev/null || true
	done
	mkdir -p /run/nubolive/iso /run/nubolive/root /run/nubolive/rw
	tries=0
	until nubolive_find; do
		tries=$((tries + 1))
		[ "$tries" -lt 120 ] || panic "nubolive: no device holds the ISO with /{ID_FILE} $nubolive_id"
		sleep 1
	done
	tries=0
	until loop=$(losetup -f 2>/dev/null) && [ -b "$loop" ]; do
		tries=$((tries + 1))
		[ "$tries" -lt 30 ] || panic "nubolive: no free loop device"
		sleep 1
	done
	losetup "$loop" /run/nubolive/iso/{ROOT_IMG} || panic "nubolive: cannot attach /{ROOT_IMG} to $loop"
	mount -t ext4 -o ro "$loop" /run/nubolive/root || panic "nubolive: cannot mount /{ROOT_IMG}"
	mount -t tmpfs -o mode=0755 tmpfs /run/nubolive/rw || panic "nubolive: cannot mount the tmpfs"
	mkdir -p /run/nubolive/rw/upper /run/nubolive/rw/work
	mount -t overlay -o lowerdir=/run/nubolive/root,upperdir=/run/nubolive/rw/upper,workdir=/run/nubolive/rw/work overlay "${{rootmnt}}" || panic "nubolive: cannot mount the overlay root"
	# The disk's fstab names a root partition this boot does not have.
	echo "overlay / overlay rw 0 0" > "${{rootmnt}}/etc/fstab"
	if [ -f /run/nubolive/iso/nocloud/meta-data ]; then
		mkdir -p "${{rootmnt}}/var/lib/cloud/seed/nocloud"
		for f in meta-data user-data network-config vendor-data; do
			if [ -f "/run/nubolive/iso/nocloud/$f" ]; then
				cat "/run/nubolive/iso/nocloud/$f" > "${{rootmnt}}/var/lib/cloud/seed/nocloud/$f"
			fi
		done
	fi
}}
"#,
        modules = modules.join(" ")
    )
}

/// The ISO's `/boot/grub/grub.cfg`: the image's kernel, its initramfs then nubo's, on the
/// serial console and the screen.
pub fn iso_grub_cfg(title: &str) -> String {
    format!(
        "serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         set timeout=1\n\
         menuentry '{title}' {{\n\
         \x20   linux /live/vmlinuz boot=nubolive console=tty0 console=ttyS0,115200\n\
         \x20   initrd /live/initrd.img /live/nubolive.img\n\
         }}\n"
    )
}

/// The NoCloud `meta-data` baked beside a cloud-config: an instance id of the config's digest,
/// so a changed config is a new instance to cloud-init.
pub fn nocloud_meta_data(user_data: &[u8]) -> String {
    let hex = crate::digest::hex(ring::digest::digest(&ring::digest::SHA256, user_data).as_ref());
    format!("instance-id: nubo-iso-{}\n", &hex[..16])
}

/// nubo's initramfs addition for the kernel whose modules are under `modules_dir` (the
/// image's `/usr/lib/modules/<version>`, a real directory: the caller checked).
pub fn live_cpio(modules_dir: &Path, id: &str, epoch: u64) -> Result<Vec<u8>, String> {
    let read = |name: &str| -> Result<String, String> {
        let p = modules_dir.join(name);
        let mut s = String::new();
        File::open(&p)
            .and_then(|f| f.take(16 << 20).read_to_string(&mut s))
            .map_err(|e| format!("cannot read the kernel's {name}: {e}"))?;
        Ok(s)
    };
    let deps = parse_modules_dep(&read("modules.dep")?);
    let builtin = read("modules.builtin").unwrap_or_default();
    let order = load_order(&deps, &builtin, REQUIRED_MODULES, OPTIONAL_MODULES)?;
    let dir = |name: &str| CpioEntry {
        name: name.into(),
        mode: 0o040755,
        data: Vec::new(),
    };
    let mut entries = vec![dir("scripts"), dir("nubolive"), dir("nubolive/modules")];
    let mut names = Vec::new();
    for rel in &order {
        if rel.starts_with('/') || rel.split('/').any(|c| c == ".." || c.is_empty()) {
            return Err(format!(
                "modules.dep names {rel:?}, not a path under the modules directory"
            ));
        }
        let file = rel.rsplit('/').next().unwrap_or(rel).to_owned();
        let data = read_module(&modules_dir.join(rel)).map_err(|e| format!("cannot read module {rel}: {e}"))?;
        entries.push(CpioEntry {
            name: format!("nubolive/modules/{file}"),
            mode: 0o100644,
            data,
        });
        names.push(file);
    }
    entries.push(CpioEntry {
        name: "scripts/nubolive".into(),
        mode: 0o100755,
        data: live_script(id, &names).into_bytes(),
    });
    Ok(cpio_newc(&entries, epoch))
}

/// A module file, never through a symlink, at most 64 MiB.
fn read_module(p: &Path) -> std::io::Result<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(p)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mut v = Vec::new();
    f.take(64 << 20).read_to_end(&mut v)?;
    Ok(v)
}

/// The size of the ext4 filesystem at the start of `file` (its superblock's block count).
pub fn ext4_bytes(file: &File) -> Result<u64, String> {
    let mut sb = [0u8; 1024];
    file.read_exact_at(&mut sb, 1024)
        .map_err(|e| format!("cannot read the superblock: {e}"))?;
    let u32_at = |at: usize| u32::from_le_bytes(sb[at..at + 4].try_into().expect("4 bytes"));
    if u16::from_le_bytes([sb[0x38], sb[0x39]]) != 0xEF53 {
        return Err("no ext4 superblock".into());
    }
    let log = u32_at(0x18);
    if log > 6 {
        return Err(format!("block size 1024<<{log} is not one ext4 uses"));
    }
    let mut blocks = u64::from(u32_at(0x04));
    if u32_at(0x60) & 0x80 != 0 {
        blocks |= u64::from(u32_at(0x150)) << 32;
    }
    blocks
        .checked_mul(1024 << log)
        .ok_or_else(|| "block count overflows".to_owned())
}

/// Copies `len` bytes at `offset` of `src` into the new file `dst`, leaving holes where the
/// source reads zeros (the root partition of a sparse raw disk).
pub fn copy_sparse(src: &Path, offset: u64, len: u64, dst: &Path) -> Result<(), BootstrapError> {
    let s = File::open(src).map_err(io_err("cannot open", src))?;
    let d = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(io_err("cannot create", dst))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = buf.len().min((len - done) as usize);
        s.read_exact_at(&mut buf[..n], offset + done)
            .map_err(io_err("cannot read", src))?;
        if buf[..n].iter().any(|b| *b != 0) {
            d.write_all_at(&buf[..n], done).map_err(io_err("cannot write", dst))?;
        }
        done += n as u64;
    }
    d.set_len(len).map_err(io_err("cannot size", dst))?;
    d.sync_all().map_err(io_err("cannot sync", dst))
}

/// `resize2fs -M`: the filesystem in `img` shrunk to its contents, clock fixed at `epoch`.
pub fn resize2fs_min(tool: &Path, img: &Path, epoch: u64) -> Command {
    let mut cmd = Command::new(tool);
    cmd.envs(crate::commands::mkfs_ext4_env(epoch))
        .args(["-f", "-M", "--"])
        .arg(operand(img));
    cmd
}

/// `grub-mkrescue` writing the hybrid ISO of `dir` to `out`: GRUB for BIOS (El Torito, and
/// boot_hybrid.img in the MBR for USB) and for UEFI (an ESP image, also a GPT partition).
/// Reproducible but for the ESP image's FAT volume id (see [`set_efi_boot_serial`]):
/// grub-mkrescue passes xorriso `--modification-date=` of the wall clock, which the same option
/// given later overrides (the volume times, and GRUB finds the ISO as its boot device, not by
/// that date); `--set_all_file_dates` replaces the mtimes of the files grub-mkrescue writes
/// into its temporary tree; the GPT disk GUID is `disk_guid`, not random; and
/// `SOURCE_DATE_EPOCH` fixes mtools' FAT times and xorriso's own clock. The live boot finds the
/// ISO by its id file, not its volume id, so grub-mkrescue's volume id stays.
pub fn grub_mkrescue(tool: &Path, xorriso: &Path, dir: &Path, out: &Path, epoch: u64, disk_guid: &str) -> Command {
    let date = iso_timestamp(epoch);
    let mut cmd = Command::new(tool);
    cmd.env("SOURCE_DATE_EPOCH", epoch.to_string())
        .env("MTOOLS_SKIP_CHECK", "1")
        .arg(format!("--xorriso={}", xorriso.display()))
        .arg("-o")
        .arg(operand(out))
        // Options grub-mkrescue does not know go to `xorriso -as mkisofs`, after its own.
        .arg(format!("--modification-date={date}"))
        .args(["--set_all_file_dates", &date, "--gpt_disk_guid", disk_guid])
        .arg(operand(dir));
    cmd
}

/// `epoch` as xorriso's 16-digit `YYYYMMDDhhmmsscc` (UTC; days-to-civil from Howard Hinnant's
/// date algorithms), clamped to the year 2999 xorriso accepts at most.
pub fn iso_timestamp(epoch: u64) -> String {
    const MAX: u64 = 32_503_680_000 - 1; // 2999-12-31T23:59:59Z
    let secs = epoch.min(MAX);
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}{:02}{:02}{:02}00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

const SECTOR: u64 = 2048;
/// El Torito's platform id for UEFI.
const PLATFORM_EFI: u8 = 0xEF;

/// Sets the FAT volume id of every UEFI El Torito boot image of the ISO `iso` to `serial`.
/// mformat, which grub-mkrescue runs to make that image, draws the id from a generator seeded
/// with the wall clock's seconds and has no way to be given one through grub-mkrescue; the
/// image is stored once (the GPT's ESP partition points at the same blocks) and no checksum
/// covers it. Returns how many images were set; an ISO without one is an error.
pub fn set_efi_boot_serial(iso: &File, serial: [u8; 4]) -> Result<usize, String> {
    let mut brvd = [0u8; 2048];
    iso.read_exact_at(&mut brvd, 17 * SECTOR)
        .map_err(|e| format!("cannot read the El Torito boot record: {e}"))?;
    if brvd[0] != 0 || &brvd[1..6] != b"CD001" || !brvd[7..].starts_with(b"EL TORITO SPECIFICATION") {
        return Err("sector 17 is not an El Torito boot record".into());
    }
    let catalog = u64::from(u32::from_le_bytes(brvd[0x47..0x4B].try_into().expect("4 bytes")));
    let mut cat = [0u8; 2048];
    iso.read_exact_at(&mut cat, catalog * SECTOR)
        .map_err(|e| format!("cannot read the El Torito boot catalog at sector {catalog}: {e}"))?;
    let mut set = 0;
    for rba in efi_boot_images(&cat)? {
        let at = u64::from(rba) * SECTOR;
        let mut bs = [0u8; 512];
        iso.read_exact_at(&mut bs, at)
            .map_err(|e| format!("cannot read the EFI boot image at sector {rba}: {e}"))?;
        let off = fat_serial_offset(&bs)
            .ok_or_else(|| format!("the EFI boot image at sector {rba} is not a FAT filesystem"))?;
        iso.write_all_at(&serial, at + off as u64)
            .map_err(|e| format!("cannot write the EFI boot image's volume id: {e}"))?;
        set += 1;
    }
    if set == 0 {
        return Err("the El Torito catalog has no UEFI boot image".into());
    }
    Ok(set)
}

/// The load sectors of the UEFI entries of an El Torito boot catalog (its first sector).
pub fn efi_boot_images(cat: &[u8; 2048]) -> Result<Vec<u32>, String> {
    let entry = |i: usize| &cat[i * 32..i * 32 + 32];
    let rba = |e: &[u8]| u32::from_le_bytes(e[8..12].try_into().expect("4 bytes"));
    let v = entry(0);
    if v[0] != 1 || v[0x1E..0x20] != [0x55, 0xAA] {
        return Err("the El Torito boot catalog has no validation entry".into());
    }
    let mut out = Vec::new();
    if v[1] == PLATFORM_EFI && entry(1)[0] == 0x88 {
        out.push(rba(entry(1)));
    }
    let mut i = 2;
    while i < 64 {
        let h = entry(i);
        if h[0] != 0x90 && h[0] != 0x91 {
            break;
        }
        let (platform, count) = (h[1], usize::from(u16::from_le_bytes([h[2], h[3]])));
        i += 1;
        let mut seen = 0;
        while seen < count && i < 64 {
            let e = entry(i);
            i += 1;
            if e[0] == 0x44 {
                continue; // a section entry extension
            }
            seen += 1;
            if platform == PLATFORM_EFI && e[0] == 0x88 {
                out.push(rba(e));
            }
        }
        if h[0] == 0x91 {
            break;
        }
    }
    Ok(out)
}

/// Where a FAT boot sector keeps its volume id: after the extended boot signature, at 39 for
/// FAT12/16 and 67 for FAT32 (sectors per FAT 0 in the BPB); `None` when `bs` is not one.
pub fn fat_serial_offset(bs: &[u8; 512]) -> Option<usize> {
    if bs[510..512] != [0x55, 0xAA] {
        return None;
    }
    let sig = if u16::from_le_bytes([bs[22], bs[23]]) == 0 {
        66
    } else {
        38
    };
    matches!(bs[sig], 0x28 | 0x29).then_some(sig + 1)
}

/// Writes `contents` to `dir/rel`, parents made.
pub fn put(dir: &Path, rel: &str, contents: &[u8]) -> Result<(), BootstrapError> {
    let p = dir.join(rel);
    if let Some(parent) = p.parent() {
        fs::create_dir_all(parent).map_err(io_err("cannot create", parent))?;
    }
    let mut f = File::create(&p).map_err(io_err("cannot create", &p))?;
    f.write_all(contents).map_err(io_err("cannot write", &p))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "kernel/drivers/scsi/scsi_common.ko:\n\
        kernel/drivers/scsi/scsi_mod.ko: kernel/drivers/scsi/scsi_common.ko\n\
        kernel/drivers/cdrom/cdrom.ko:\n\
        kernel/drivers/scsi/sr_mod.ko: kernel/drivers/scsi/scsi_mod.ko kernel/drivers/cdrom/cdrom.ko kernel/drivers/scsi/scsi_common.ko\n\
        kernel/fs/isofs/isofs.ko: kernel/drivers/cdrom/cdrom.ko\n\
        kernel/drivers/block/loop.ko:\n\
        kernel/fs/overlayfs/overlay.ko.xz:\n\
        kernel/drivers/ata/libata.ko: kernel/drivers/scsi/scsi_mod.ko kernel/drivers/scsi/scsi_common.ko\n\
        kernel/drivers/ata/ata_piix.ko: kernel/drivers/ata/libata.ko kernel/drivers/scsi/scsi_mod.ko kernel/drivers/scsi/scsi_common.ko\n";

    #[test]
    fn module_name_strips_compression_and_dashes() {
        assert_eq!(
            module_name("kernel/fs/overlayfs/overlay.ko.xz").as_deref(),
            Some("overlay")
        );
        assert_eq!(module_name("kernel/x/ata-piix.ko").as_deref(), Some("ata_piix"));
        assert_eq!(module_name("kernel/x/readme.txt"), None);
    }

    #[test]
    fn load_order_dependencies_first_each_once() {
        let deps = parse_modules_dep(DEP);

        let order = load_order(&deps, "", REQUIRED_MODULES, OPTIONAL_MODULES).unwrap();

        let pos = |m: &str| order.iter().position(|p| p.ends_with(m)).unwrap();
        assert!(pos("scsi_common.ko") < pos("scsi_mod.ko"));
        assert!(pos("scsi_mod.ko") < pos("sr_mod.ko"));
        assert!(pos("cdrom.ko") < pos("isofs.ko"));
        assert!(pos("libata.ko") < pos("ata_piix.ko"));
        let unique: BTreeSet<_> = order.iter().collect();
        assert_eq!(unique.len(), order.len());
    }

    #[test]
    fn load_order_builtin_required_skipped() {
        let deps = parse_modules_dep("kernel/fs/isofs/isofs.ko:\n");

        let order = load_order(
            &deps,
            "kernel/drivers/block/loop.ko\nkernel/fs/overlayfs/overlay.ko\n",
            &["loop", "isofs", "overlay"],
            &["ahci"],
        )
        .unwrap();

        assert_eq!(order, vec!["kernel/fs/isofs/isofs.ko".to_owned()]);
    }

    #[test]
    fn load_order_missing_required_named() {
        let deps = parse_modules_dep("kernel/fs/isofs/isofs.ko:\n");

        let err = load_order(&deps, "", &["isofs", "overlay"], &[]).unwrap_err();

        assert!(err.contains("no overlay module"), "{err}");
    }

    #[test]
    fn cpio_newc_header_fields_and_alignment() {
        let a = cpio_newc(
            &[CpioEntry {
                name: "scripts/nubolive".into(),
                mode: 0o100755,
                data: b"abc".to_vec(),
            }],
            7,
        );

        assert!(a.starts_with(b"070701"));
        assert_eq!(&a[14..22], b"000081ed");
        assert_eq!(&a[46..54], b"00000007");
        assert_eq!(&a[54..62], b"00000003");
        // 110-byte header + 17-byte name padded to 128, then the data.
        assert_eq!(&a[128..131], b"abc");
        assert_eq!(a.len() % 4, 0);
        assert!(a.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    #[test]
    fn live_script_loads_modules_and_overlays_root() {
        let s = live_script("abc123", &["loop.ko".into(), "isofs.ko".into()]);

        assert!(s.contains("nubolive_id=abc123\n"), "{s}");
        assert!(s.contains("nubolive_modules=\"loop.ko isofs.ko\""), "{s}");
        assert!(s.contains("mountroot()"), "{s}");
        assert!(s.contains("lowerdir=/run/nubolive/root"), "{s}");
        assert!(s.contains("/var/lib/cloud/seed/nocloud"), "{s}");
    }

    #[test]
    fn iso_grub_cfg_boots_both_initramfs_on_serial() {
        let cfg = iso_grub_cfg("nubo live");

        assert!(
            cfg.contains("linux /live/vmlinuz boot=nubolive console=tty0 console=ttyS0,115200\n"),
            "{cfg}"
        );
        assert!(cfg.contains("initrd /live/initrd.img /live/nubolive.img\n"), "{cfg}");
    }

    #[test]
    fn nocloud_meta_data_id_follows_config() {
        assert_ne!(nocloud_meta_data(b"a"), nocloud_meta_data(b"b"));
        assert!(nocloud_meta_data(b"a").starts_with("instance-id: nubo-iso-"));
    }

    #[test]
    fn ext4_bytes_reads_block_count() {
        let f = tempfile::tempfile().unwrap();
        let mut sb = [0u8; 1024];
        sb[0x04..0x08].copy_from_slice(&1000u32.to_le_bytes());
        sb[0x18..0x1c].copy_from_slice(&2u32.to_le_bytes());
        sb[0x38..0x3a].copy_from_slice(&0xEF53u16.to_le_bytes());
        f.write_all_at(&sb, 1024).unwrap();

        assert_eq!(ext4_bytes(&f).unwrap(), 4096 * 1000);
    }

    #[test]
    fn iso_timestamp_epoch_leap_day_and_clamp() {
        assert_eq!(iso_timestamp(0), "1970010100000000");
        assert_eq!(iso_timestamp(951_782_400 + 3661), "2000022901010100");
        assert_eq!(iso_timestamp(u64::MAX), "2999123123595900");
    }

    #[test]
    fn grub_mkrescue_dates_and_guid_fixed() {
        let cmd = grub_mkrescue(
            Path::new("grub-mkrescue"),
            Path::new("/usr/bin/xorriso"),
            Path::new("/w/tree"),
            Path::new("/w/out.iso"),
            1_700_000_000,
            "0b7c0000-0000-8000-8000-000000000000",
        );

        let args: Vec<_> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(
            args.contains(&"--modification-date=2023111422132000".to_owned()),
            "{args:?}"
        );
        let at = |flag: &str| args.iter().position(|a| a == flag).map(|i| args[i + 1].clone());
        assert_eq!(at("--set_all_file_dates").as_deref(), Some("2023111422132000"));
        assert_eq!(
            at("--gpt_disk_guid").as_deref(),
            Some("0b7c0000-0000-8000-8000-000000000000")
        );
        assert_eq!(args.last().map(String::as_str), Some("/w/tree"));
    }

    /// An ISO of 40 sectors: boot record at 17, catalog at 20 (a BIOS default entry, then an
    /// EFI section whose image, a FAT12 boot sector, is at sector 30).
    fn el_torito(fat_sig: u8) -> File {
        let f = tempfile::tempfile().unwrap();
        f.set_len(40 * SECTOR).unwrap();
        let mut br = [0u8; 2048];
        br[1..6].copy_from_slice(b"CD001");
        br[6] = 1;
        br[7..30].copy_from_slice(b"EL TORITO SPECIFICATION");
        br[0x47..0x4B].copy_from_slice(&20u32.to_le_bytes());
        f.write_all_at(&br, 17 * SECTOR).unwrap();
        let mut cat = [0u8; 2048];
        cat[0] = 1;
        cat[0x1E] = 0x55;
        cat[0x1F] = 0xAA;
        cat[32] = 0x88;
        cat[40..44].copy_from_slice(&25u32.to_le_bytes());
        cat[64] = 0x91;
        cat[65] = PLATFORM_EFI;
        cat[66] = 1;
        cat[96] = 0x88;
        cat[104..108].copy_from_slice(&30u32.to_le_bytes());
        f.write_all_at(&cat, 20 * SECTOR).unwrap();
        let mut bs = [0u8; 512];
        bs[22] = 9;
        bs[38] = fat_sig;
        bs[39..43].copy_from_slice(&[1, 2, 3, 4]);
        bs[510] = 0x55;
        bs[511] = 0xAA;
        f.write_all_at(&bs, 30 * SECTOR).unwrap();
        f
    }

    #[test]
    fn set_efi_boot_serial_writes_the_efi_image_only() {
        let f = el_torito(0x29);

        let n = set_efi_boot_serial(&f, [0xDE, 0xAD, 0xBE, 0xEF]).unwrap();

        let mut got = [0u8; 4];
        f.read_exact_at(&mut got, 30 * SECTOR + 39).unwrap();
        let mut bios = [0u8; 4];
        f.read_exact_at(&mut bios, 25 * SECTOR + 39).unwrap();
        assert_eq!((n, got, bios), (1, [0xDE, 0xAD, 0xBE, 0xEF], [0; 4]));
    }

    #[test]
    fn set_efi_boot_serial_not_fat_refused() {
        let f = el_torito(0);

        let err = set_efi_boot_serial(&f, [0; 4]).unwrap_err();

        assert!(err.contains("not a FAT filesystem"), "{err}");
    }

    #[test]
    fn set_efi_boot_serial_no_boot_record_refused() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(40 * SECTOR).unwrap();

        let err = set_efi_boot_serial(&f, [0; 4]).unwrap_err();

        assert!(err.contains("not an El Torito boot record"), "{err}");
    }

    #[test]
    fn fat_serial_offset_fat32_after_its_signature() {
        let mut bs = [0u8; 512];
        bs[66] = 0x29;
        bs[510] = 0x55;
        bs[511] = 0xAA;

        assert_eq!(fat_serial_offset(&bs), Some(67));
    }

    #[test]
    fn ext4_bytes_not_ext4_refused() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(4096).unwrap();

        assert!(ext4_bytes(&f).is_err());
    }
}
