//! GRUB for both firmwares without grub-install: no loop device, no mount, no device map.
//!
//! BIOS: what `grub-bios-setup` does for a GPT disk, done on bytes — boot.img goes in the MBR
//! (keeping the protective partition table), core.img in the BIOS-boot partition, and the two are
//! linked by patching the sector numbers. UEFI: a standalone `BOOTX64.EFI` on the ESP. Both embed
//! the same early config, which finds the root filesystem by UUID and reads its `/boot/grub/grub.cfg`.

/// GRUB's boot.img layout (grub `include/grub/i386/pc/boot.h`).
const BPB_START: usize = 0x3;
const BPB_END: usize = 0x5a;
const KERNEL_SECTOR: usize = 0x5c;
const BOOT_DRIVE: usize = 0x64;
const DRIVE_CHECK: usize = 0x66;
const WINDOWS_NT_MAGIC: usize = 0x1b8;
const PART_END: usize = 0x1fe;
/// diskboot.img's first blocklist entry: the last 12 bytes of core.img's first sector.
const BLOCKLIST: usize = 512 - 12;
/// Segment core.img's second sector is loaded at: GRUB_BOOT_I386_PC_KERNEL_SEG + 512/16.
const CORE_SEGMENT: u16 = 0x820;

/// Modules linked into both images: enough to find root by UUID on GPT/ext4, read the config,
/// talk on the serial line and boot Linux without loading anything from disk.
const COMMON_MODULES: &[&str] = &[
    "part_gpt",
    "part_msdos",
    "ext2",
    "fat",
    "search",
    "search_fs_uuid",
    "normal",
    "configfile",
    "linux",
    "echo",
    "test",
    "serial",
    "terminal",
    "gzio",
    "sleep",
];
pub const BIOS_MODULES: &[&str] = &["biosdisk"];
pub const EFI_MODULES: &[&str] = &["efi_gop", "all_video"];

pub fn modules(extra: &[&'static str]) -> Vec<&'static str> {
    COMMON_MODULES.iter().chain(extra).copied().collect()
}

/// Embedded in core.img and BOOTX64.EFI: the one place that knows which filesystem is root.
pub fn early_config(root_uuid: &str) -> String {
    format!(
        "search --no-floppy --fs-uuid --set=root {root_uuid}\n\
         set prefix=($root)/boot/grub\n\
         configfile ($root)/boot/grub/grub.cfg\n"
    )
}

/// `/boot/grub/grub.cfg` in the root filesystem. It boots `/vmlinuz` and `/initrd.img`, the
/// symlinks Debian's kernel packages keep pointing at the newest kernel, so a kernel upgrade in
/// the guest needs no GRUB update.
pub fn grub_cfg(root_uuid: &str) -> String {
    grub_cfg_for(root_uuid, "/vmlinuz", "/initrd.img")
}

/// [`grub_cfg`] booting the kernel and initrd at these paths of the root filesystem (a
/// container image's `/boot/vmlinuz-<version>`, which has no `/vmlinuz` symlink to rely on).
pub fn grub_cfg_for(root_uuid: &str, kernel: &str, initrd: &str) -> String {
    format!(
        "serial --unit=0 --speed=115200\n\
         terminal_input serial console\n\
         terminal_output serial console\n\
         set timeout=1\n\
         menuentry 'Debian GNU/Linux' {{\n\
         \x20   linux {kernel} {cmdline} console=tty0 console=ttyS0,115200\n\
         \x20   initrd {initrd}\n\
         }}\n",
        cmdline = kernel_cmdline(root_uuid)
    )
}

/// The command line that boots this image's root, without `console=`: a direct-kernel backend
/// adds its own console for its own serial device.
pub fn kernel_cmdline(root_uuid: &str) -> String {
    format!("root=UUID={root_uuid} ro")
}

/// Makes the MBR from GRUB's `boot_img` and the disk's existing sector 0 (the protective MBR
/// sfdisk wrote), pointing it at core.img's first sector.
pub fn patch_boot_img(boot_img: &[u8; 512], existing_mbr: &[u8; 512], core_lba: u64) -> [u8; 512] {
    let mut mbr = *boot_img;
    // Keep what is not GRUB's: the BPB area and the disk signature + partition table.
    mbr[BPB_START..BPB_END].copy_from_slice(&existing_mbr[BPB_START..BPB_END]);
    mbr[WINDOWS_NT_MAGIC..PART_END].copy_from_slice(&existing_mbr[WINDOWS_NT_MAGIC..PART_END]);
    mbr[KERNEL_SECTOR..KERNEL_SECTOR + 8].copy_from_slice(&core_lba.to_le_bytes());
    // 0xff: use the drive number the BIOS passed in DL.
    mbr[BOOT_DRIVE] = 0xff;
    // A hard disk: replace the floppy-probing jump with NOPs, as grub-bios-setup does, for BIOSes
    // that pass a wrong drive number.
    mbr[DRIVE_CHECK] = 0x90;
    mbr[DRIVE_CHECK + 1] = 0x90;
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    mbr
}

/// Patches core.img's blocklist so diskboot loads the rest of core.img from the sectors after
/// `core_lba` (core.img is written contiguously). Fails when core.img does not fit `max_sectors`.
pub fn patch_core_img(core: &mut [u8], core_lba: u64, max_sectors: u64) -> Result<(), String> {
    let sectors = core.len().div_ceil(512) as u64;
    if core.len() < 512 || sectors > max_sectors || sectors - 1 > u64::from(u16::MAX) {
        return Err(format!(
            "core.img is {} bytes; the BIOS-boot partition holds {} sectors",
            core.len(),
            max_sectors
        ));
    }
    let entry = &mut core[BLOCKLIST..512];
    entry[0..8].copy_from_slice(&(core_lba + 1).to_le_bytes());
    entry[8..10].copy_from_slice(&((sectors - 1) as u16).to_le_bytes());
    entry[10..12].copy_from_slice(&CORE_SEGMENT.to_le_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_boot_img_keeps_partition_table() {
        let boot = [0xaau8; 512];
        let mut existing = [0u8; 512];
        existing[0x1be..0x1ce].copy_from_slice(&[0xee; 16]);

        let mbr = patch_boot_img(&boot, &existing, 2048);

        assert_eq!(&mbr[0x1be..0x1ce], &[0xee; 16]);
        assert_eq!(&mbr[KERNEL_SECTOR..KERNEL_SECTOR + 8], &2048u64.to_le_bytes());
        assert_eq!(&mbr[510..], &[0x55, 0xaa]);
    }

    #[test]
    fn patch_boot_img_nops_drive_check() {
        let mbr = patch_boot_img(&[0u8; 512], &[0u8; 512], 2048);

        assert_eq!(
            (mbr[BOOT_DRIVE], mbr[DRIVE_CHECK], mbr[DRIVE_CHECK + 1]),
            (0xff, 0x90, 0x90)
        );
    }

    #[test]
    fn patch_core_img_points_at_following_sectors() {
        let mut core = vec![0u8; 512 * 100 + 7];

        patch_core_img(&mut core, 2048, 2048).unwrap();

        assert_eq!(&core[500..508], &2049u64.to_le_bytes());
        assert_eq!(&core[508..510], &100u16.to_le_bytes());
        assert_eq!(&core[510..512], &0x820u16.to_le_bytes());
    }

    #[test]
    fn patch_core_img_too_big_refused() {
        let mut core = vec![0u8; 512 * 3000];

        assert!(patch_core_img(&mut core, 2048, 2048).is_err());
    }

    #[test]
    fn grub_cfg_boots_root_by_uuid_on_serial() {
        let cfg = grub_cfg("1234");

        assert!(
            cfg.contains("linux /vmlinuz root=UUID=1234 ro console=tty0 console=ttyS0,115200\n"),
            "{cfg}"
        );
        assert!(cfg.contains("terminal_output serial console"));
    }

    #[test]
    fn early_config_searches_uuid() {
        assert!(early_config("abcd").starts_with("search --no-floppy --fs-uuid --set=root abcd\n"));
    }
}
