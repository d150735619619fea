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
/// boot_hybrid.img in the MBR for USB) and for UEFI (an ESP image, also a GPT partition),
/// xorriso's clock fixed by `SOURCE_DATE_EPOCH`. The live boot finds the ISO by its id file,
/// not its volume id, so grub-mkrescue's own volume id stays.
pub fn grub_mkrescue(tool: &Path, xorriso: &Path, dir: &Path, out: &Path, epoch: u64) -> Command {
    let mut cmd = Command::new(tool);
    cmd.env("SOURCE_DATE_EPOCH", epoch.to_string())
        .env("MTOOLS_SKIP_CHECK", "1")
        .arg(format!("--xorriso={}", xorriso.display()))
        .arg("-o")
        .arg(operand(out))
        .arg(operand(dir));
    cmd
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
    fn ext4_bytes_not_ext4_refused() {
        let f = tempfile::tempfile().unwrap();
        f.set_len(4096).unwrap();

        assert!(ext4_bytes(&f).is_err());
    }
}
