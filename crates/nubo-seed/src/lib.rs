//! nubo-seed: the NoCloud seed cloud-init reads on first boot, built in-process.
//!
//! Pure: no filesystem, process or clock access. [`build`] returns the image bytes,
//! [`write_iso`] streams an ISO into any `impl Write`, [`read`] lists an image's files (ISO9660
//! or VFAT, nubo's or another tool's). The same [`SeedSpec`] always gives the same bytes.

mod cloud_config;
mod error;
mod iso;
mod meta;
mod mounts;
mod network;
mod user_data;
mod vfat;
pub mod yaml;

pub use cloud_config::{render_cloud_config, CloudConfig};
pub use error::SeedError;
pub use iso::{read_iso, write_iso_files, MAX_FILE_SIZE, VOLUME_ID};
pub use meta::{render_meta_data, validate_hostname, validate_instance_id};
pub use mounts::{render_mounts, GuestMount};
pub use network::{render_network_config_dhcp, render_network_config_static};
pub use user_data::{validate_network_config, validate_user_data, validate_vendor_data};
pub use vfat::{build_vfat, read_vfat};

/// The file names cloud-init's NoCloud datasource looks for.
pub const META_DATA: &str = "meta-data";
pub const USER_DATA: &str = "user-data";
pub const NETWORK_CONFIG: &str = "network-config";
pub const VENDOR_DATA: &str = "vendor-data";

/// The most bytes nubo reads from each file a user names for a seed. A seed file's own limit
/// ([`MAX_FILE_SIZE`]) for the payloads, so a file nubo would refuse later is refused before it
/// is read in full (and `/dev/zero` is refused at once for not being a regular file).
pub const MAX_USER_DATA: u64 = MAX_FILE_SIZE;
pub const MAX_NETWORK_CONFIG: u64 = MAX_FILE_SIZE;
pub const MAX_VENDOR_DATA: u64 = MAX_FILE_SIZE;
pub const MAX_META_DATA: u64 = MAX_FILE_SIZE;
/// An `authorized_keys`-style file of public keys (`--ssh-key @FILE`): a key line is under
/// 1 KiB even for RSA-16384, so 1 MiB is a thousand keys.
pub const MAX_SSH_KEY_FILE: u64 = 1024 * 1024;
/// A seed image to inspect: four files at [`MAX_FILE_SIZE`] plus the filesystem's own
/// structures fit well inside it.
pub const MAX_SEED_IMAGE: u64 = 128 * 1024 * 1024;

/// What goes into a seed. User-data, network-config and vendor-data are passed through byte for
/// byte (never parsed and re-serialised: YAML 1.1 would turn `0644` into a number).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedSpec {
    /// cloud-init runs its per-instance modules once per id; nubo uses the VM's UUID.
    pub instance_id: String,
    /// Empty leaves `local-hostname` out of meta-data (the image keeps its own hostname).
    pub local_hostname: String,
    /// `None` still writes an empty `user-data`: NoCloud requires the file to exist.
    pub user_data: Option<Vec<u8>>,
    /// Network config version 1 or 2, passed through.
    pub network_config: Option<Vec<u8>>,
    pub vendor_data: Option<Vec<u8>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SeedFormat {
    /// ISO9660 + Joliet: what every NoCloud guest reads; attach as a CD-ROM or a disk.
    Iso,
    /// FAT labelled CIDATA: for VMMs without CD-ROM emulation (Cloud Hypervisor).
    Vfat,
}

impl SeedFormat {
    /// The format of `image`, judged by its magic bytes.
    pub fn sniff(image: &[u8]) -> Option<SeedFormat> {
        let iso_magic = image.get(16 * 2048 + 1..16 * 2048 + 6) == Some(b"CD001");
        if iso_magic {
            Some(SeedFormat::Iso)
        } else if vfat::looks_like_fat(image) {
            Some(SeedFormat::Vfat)
        } else {
            None
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SeedFormat::Iso => "iso",
            SeedFormat::Vfat => "vfat",
        }
    }
}

impl std::fmt::Display for SeedFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One file of a seed image, by the name the guest sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedFile {
    pub name: String,
    pub data: Vec<u8>,
}

/// The files of `spec`'s seed: `meta-data` and `user-data` always, the others when given.
/// Validates instance-id and hostname; passes the payloads through untouched.
pub fn seed_files(spec: &SeedSpec) -> Result<Vec<SeedFile>, SeedError> {
    let mut files = vec![
        SeedFile {
            name: META_DATA.into(),
            data: render_meta_data(&spec.instance_id, &spec.local_hostname)?,
        },
        SeedFile {
            name: USER_DATA.into(),
            data: spec.user_data.clone().unwrap_or_default(),
        },
    ];
    for (name, data) in [(NETWORK_CONFIG, &spec.network_config), (VENDOR_DATA, &spec.vendor_data)] {
        if let Some(d) = data {
            files.push(SeedFile {
                name: name.into(),
                data: d.clone(),
            });
        }
    }
    Ok(files)
}

/// The seed image of `spec` in `format`.
pub fn build(spec: &SeedSpec, format: SeedFormat) -> Result<Vec<u8>, SeedError> {
    let files = seed_files(spec)?;
    match format {
        SeedFormat::Iso => {
            let mut out = Vec::with_capacity(iso::image_len_hint(&files));
            write_iso_files(&files, &mut out)?;
            Ok(out)
        }
        SeedFormat::Vfat => build_vfat(&files),
    }
}

/// Streams `spec`'s ISO seed into `w`.
pub fn write_iso<W: std::io::Write>(spec: &SeedSpec, w: W) -> Result<(), SeedError> {
    write_iso_files(&seed_files(spec)?, w)
}

/// The files of a seed image, ISO9660 (Joliet names when present) or VFAT, sorted by name.
pub fn read(image: &[u8]) -> Result<Vec<SeedFile>, SeedError> {
    match SeedFormat::sniff(image) {
        Some(SeedFormat::Iso) => read_iso(image),
        Some(SeedFormat::Vfat) => read_vfat(image),
        None => Err(SeedError::UnknownImage {
            why: format!(
                "no `CD001` at byte 32769 and no FAT boot sector ({} bytes)",
                image.len()
            ),
        }),
    }
}

#[cfg(test)]
mod tests;
