//! Every identifier a build would otherwise draw at random, derived from the recipe key, so two
//! builds of one recipe from the same package versions give the same bytes. Pure.
//!
//! The derivation: `sha256("nubo-bootstrap id\n" + PURPOSE + "\n" + RECIPE_KEY)`, its first 16
//! bytes made an RFC 9562 version-8 ("custom") UUID, or its first 4 bytes a FAT volume id. One
//! purpose string per identifier (see [`Purpose`]), so no two identifiers of one image are
//! equal, and images of different recipes share none.

use ring::digest::{digest, SHA256};

/// What an identifier is for: the text hashed with the key. Changing one changes that id in
/// every image: bump `RECIPE_VERSION` with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// GPT disk GUID (sfdisk `label-id:`).
    DiskGuid,
    BiosBootPartition,
    EspPartition,
    RootPartition,
    /// ext4 filesystem UUID (`mkfs.ext4 -U`).
    RootFs,
    /// ext4 directory-index hash seed (`mkfs.ext4 -E hash_seed=`).
    RootHashSeed,
    /// FAT volume id of the ESP (`mkfs.vfat -i`).
    EspVolume,
    /// GPT disk GUID of a hybrid ISO (xorriso `--gpt_disk_guid`).
    IsoDiskGuid,
    /// FAT volume id of a hybrid ISO's EFI boot image (patched over mformat's random one).
    IsoEspVolume,
}

impl Purpose {
    fn label(self) -> &'static str {
        match self {
            Purpose::DiskGuid => "gpt-disk-guid",
            Purpose::BiosBootPartition => "gpt-partition-bios-boot",
            Purpose::EspPartition => "gpt-partition-esp",
            Purpose::RootPartition => "gpt-partition-root",
            Purpose::RootFs => "ext4-uuid-root",
            Purpose::RootHashSeed => "ext4-hash-seed-root",
            Purpose::EspVolume => "fat-volume-id-esp",
            Purpose::IsoDiskGuid => "gpt-disk-guid-iso",
            Purpose::IsoEspVolume => "fat-volume-id-iso-esp",
        }
    }
}

/// The identifiers of one image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids {
    pub disk_guid: String,
    pub bios_boot_partition: String,
    pub esp_partition: String,
    pub root_partition: String,
    /// ext4 UUID of root, e.g. `0b7c…`: in fstab, grub.cfg and the kernel command line.
    pub root_uuid: String,
    pub root_hash_seed: String,
    /// FAT volume id of the ESP as fstab spells it, `ABCD-1234`.
    pub esp_id: String,
}

impl Ids {
    /// The identifiers of the image whose recipe key is `key` (`sha256:<hex>`).
    pub fn derive(key: &str) -> Ids {
        let uuid = |p| derived_uuid(key, p);
        Ids {
            disk_guid: uuid(Purpose::DiskGuid),
            bios_boot_partition: uuid(Purpose::BiosBootPartition),
            esp_partition: uuid(Purpose::EspPartition),
            root_partition: uuid(Purpose::RootPartition),
            root_uuid: uuid(Purpose::RootFs),
            root_hash_seed: uuid(Purpose::RootHashSeed),
            esp_id: fat_volume_id(key),
        }
    }

    /// The ESP's volume id as `mkfs.vfat -i` takes it: 8 hex digits.
    pub fn esp_volume_hex(&self) -> String {
        self.esp_id.replace('-', "")
    }
}

fn derived_bytes(key: &str, purpose: Purpose) -> [u8; 32] {
    let text = format!("nubo-bootstrap id\n{}\n{key}", purpose.label());
    digest(&SHA256, text.as_bytes())
        .as_ref()
        .try_into()
        .expect("sha256 is 32 bytes")
}

/// A UUID derived from `key` for `purpose`, lowercase hyphenated.
pub fn derived_uuid(key: &str, purpose: Purpose) -> String {
    let b = derived_bytes(key, purpose);
    let bytes: [u8; 16] = b[..16].try_into().expect("16 of 32 bytes");
    uuid::Builder::from_custom_bytes(bytes).into_uuid().to_string()
}

/// The FAT volume id of a hybrid ISO's EFI boot image derived from `key`, as the 4 bytes the
/// boot sector holds.
pub fn iso_esp_serial(key: &str) -> [u8; 4] {
    let b = derived_bytes(key, Purpose::IsoEspVolume);
    b[..4].try_into().expect("4 of 32 bytes")
}

/// The ESP's FAT volume id derived from `key`, `XXXX-XXXX` as blkid and fstab spell it.
pub fn fat_volume_id(key: &str) -> String {
    let b = derived_bytes(key, Purpose::EspVolume);
    let hex = nubo_core::hex(&b[..4]).to_uppercase();
    format!("{}-{}", &hex[..4], &hex[4..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "sha256:aaaa";
    const KEY_B: &str = "sha256:bbbb";

    fn all(ids: &Ids) -> Vec<&str> {
        vec![
            &ids.disk_guid,
            &ids.bios_boot_partition,
            &ids.esp_partition,
            &ids.root_partition,
            &ids.root_uuid,
            &ids.root_hash_seed,
            &ids.esp_id,
        ]
    }

    #[test]
    fn derive_same_key_same_ids() {
        assert_eq!(Ids::derive(KEY_A), Ids::derive(KEY_A));
    }

    #[test]
    fn derive_different_key_shares_no_id() {
        let (a, b) = (Ids::derive(KEY_A), Ids::derive(KEY_B));

        for (x, y) in all(&a).into_iter().zip(all(&b)) {
            assert_ne!(x, y);
        }
    }

    #[test]
    fn derive_ids_of_one_image_are_distinct() {
        let ids = Ids::derive(KEY_A);
        let mut v = all(&ids);

        v.sort();
        v.dedup();
        assert_eq!(v.len(), 7);
    }

    #[test]
    fn derived_uuid_is_version_8_rfc_variant() {
        let u = uuid::Uuid::parse_str(&derived_uuid(KEY_A, Purpose::RootFs)).unwrap();

        assert_eq!((u.get_version_num(), u.get_variant()), (8, uuid::Variant::RFC4122));
    }

    /// Pins the derivation (values computed independently, with Python's hashlib and uuid): a
    /// change here changes every published image's bytes and needs a `RECIPE_VERSION` bump.
    #[test]
    fn derive_golden() {
        let ids = Ids::derive("sha256:0");

        assert_eq!(ids.root_uuid, "7a971bb9-0c66-877f-83c6-01660fd870a5");
        assert_eq!(ids.esp_id, "3643-7F68");
    }

    #[test]
    fn fat_volume_id_is_two_hex_groups() {
        let id = fat_volume_id(KEY_A);

        assert!(
            id.len() == 9
                && id.as_bytes()[4] == b'-'
                && id
                    .chars()
                    .filter(|c| *c != '-')
                    .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase()),
            "{id}"
        );
    }

    #[test]
    fn esp_volume_hex_drops_dash() {
        let ids = Ids::derive(KEY_A);

        assert_eq!(ids.esp_volume_hex().len(), 8);
    }
}
