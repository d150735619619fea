//! The disk layout of a bootstrapped image: GPT with BIOS-boot, ESP and root, as distro cloud
//! images have it. Pure arithmetic and the `sfdisk` script that writes it.

use nubo_core::size::MIB;

use crate::identity::Ids;

pub const SECTOR: u64 = 512;

/// One partition, in 512-byte sectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Part {
    pub start: u64,
    pub sectors: u64,
}

impl Part {
    pub fn offset(&self) -> u64 {
        self.start * SECTOR
    }

    pub fn bytes(&self) -> u64 {
        self.sectors * SECTOR
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub disk_bytes: u64,
    /// GRUB's core.img for BIOS boot (GPT has no post-MBR gap to embed it in).
    pub bios_boot: Part,
    pub esp: Part,
    /// Last, so cloud-init's growpart can extend it to a larger disk.
    pub root: Part,
}

/// 1 MiB alignment, as every partitioning tool does: first partition at 1 MiB.
const ALIGN: u64 = MIB / SECTOR;
/// core.img with the modules nubo embeds is ~150 KiB; 1 MiB is GRUB's recommendation.
const BIOS_BOOT_SECTORS: u64 = MIB / SECTOR;
/// FAT32 holding one ~4 MiB BOOTX64.EFI; 62 MiB ends the ESP on the 64 MiB boundary.
const ESP_SECTORS: u64 = 62 * MIB / SECTOR;
/// The backup GPT: 32 sectors of entries plus its header.
const BACKUP_GPT_SECTORS: u64 = 33;

impl Layout {
    /// The layout for a disk of `disk_bytes` (a whole number of MiB, at least 1 GiB).
    pub fn for_size(disk_bytes: u64) -> Layout {
        let total = disk_bytes / SECTOR;
        let bios_boot = Part {
            start: ALIGN,
            sectors: BIOS_BOOT_SECTORS,
        };
        let esp = Part {
            start: bios_boot.start + bios_boot.sectors,
            sectors: ESP_SECTORS,
        };
        let root_start = esp.start + esp.sectors;
        let usable_end = total - BACKUP_GPT_SECTORS;
        let root = Part {
            start: root_start,
            sectors: (usable_end - root_start) / ALIGN * ALIGN,
        };
        Layout {
            disk_bytes,
            bios_boot,
            esp,
            root,
        }
    }

    /// Input for `sfdisk <raw file>`: every boundary explicit, so the offsets nubo writes the
    /// filesystems at are exactly the partitions'; the disk and partition GUIDs given, as
    /// sfdisk would otherwise draw them at random.
    pub fn sfdisk_script(&self, ids: &Ids) -> String {
        let line = |p: &Part, ty: &str, uuid: &str, name: &str| {
            format!(
                "start={}, size={}, type={ty}, uuid={uuid}, name=\"{name}\"\n",
                p.start, p.sectors
            )
        };
        let mut s = format!(
            "label: gpt\nlabel-id: {}\nunit: sectors\nsector-size: 512\n",
            ids.disk_guid
        );
        s += &line(
            &self.bios_boot,
            "21686148-6449-6E6F-744E-656564454649",
            &ids.bios_boot_partition,
            "bios-boot",
        );
        s += &line(
            &self.esp,
            "C12A7328-F81F-11D2-BA4B-00A0C93EC93B",
            &ids.esp_partition,
            "esp",
        );
        s += &line(
            &self.root,
            "0FC63DAF-8483-4772-8E79-3D69D8477DE4",
            &ids.root_partition,
            "root",
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nubo_core::size::GIB;

    #[test]
    fn for_size_partitions_are_contiguous_and_aligned() {
        let l = Layout::for_size(2 * GIB);

        assert_eq!(l.bios_boot.start, 2048);
        assert_eq!(l.esp.start, l.bios_boot.start + l.bios_boot.sectors);
        assert_eq!(l.root.start, 64 * MIB / SECTOR);
        assert_eq!(l.root.sectors % 2048, 0);
    }

    #[test]
    fn for_size_root_leaves_room_for_backup_gpt() {
        let l = Layout::for_size(2 * GIB);

        assert!(l.root.start + l.root.sectors <= 2 * GIB / SECTOR - 33);
    }

    #[test]
    fn sfdisk_script_golden() {
        let l = Layout::for_size(GIB);
        let ids = Ids {
            disk_guid: "d".into(),
            bios_boot_partition: "b".into(),
            esp_partition: "e".into(),
            root_partition: "r".into(),
            ..Ids::derive("sha256:test")
        };

        assert_eq!(
            l.sfdisk_script(&ids),
            "label: gpt\nlabel-id: d\nunit: sectors\nsector-size: 512\n\
             start=2048, size=2048, type=21686148-6449-6E6F-744E-656564454649, uuid=b, name=\"bios-boot\"\n\
             start=4096, size=126976, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, uuid=e, name=\"esp\"\n\
             start=131072, size=1964032, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, uuid=r, name=\"root\"\n"
        );
    }
}
