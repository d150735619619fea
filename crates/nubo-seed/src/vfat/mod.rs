//! VFAT seeds, through the `fatfs` crate: cloud-init accepts a FAT filesystem labelled CIDATA too,
//! and some VMMs (Cloud Hypervisor) attach disks more readily than CD-ROMs.
//!
//! Deterministic: fatfs is built without its clock feature (every timestamp is the DOS epoch,
//! 1980-01-01), and the volume id and size are functions of the inputs.

use std::io::{Cursor, Write};

mod read;

pub(crate) use read::looks_like_fat;
pub use read::read_vfat;

use fatfs::{FileSystem, FormatVolumeOptions, FsOptions};

use crate::error::SeedError;
use crate::iso::MAX_FILE_SIZE;
use crate::SeedFile;

/// "CIDATA" padded to the 11 bytes of a FAT label.
const LABEL: [u8; 11] = *b"CIDATA     ";
/// A fixed volume serial (mkfs.fat derives it from the clock): ASCII "nubo".
const VOLUME_SERIAL: u32 = 0x6e75_626f;
/// Boot sector, two FATs and a 512-entry root directory with room to spare.
const OVERHEAD: usize = 128 * 1024;
/// Size a FAT image grows in, so small changes in content rarely change its geometry.
const GRANULE: usize = 64 * 1024;
/// Each retry doubles the image when the estimate proved too small.
const ATTEMPTS: usize = 4;
/// Characters FAT long names cannot hold, besides controls.
const FAT_FORBIDDEN: &[char] = &['"', '*', '/', ':', '<', '>', '?', '\\', '|'];

/// The VFAT image of `files`, labelled CIDATA.
pub fn build_vfat(files: &[SeedFile]) -> Result<Vec<u8>, SeedError> {
    for f in files {
        check_name(&f.name)?;
        if f.data.len() as u64 > MAX_FILE_SIZE {
            return Err(SeedError::FileTooLarge {
                name: f.name.clone(),
                size: f.data.len() as u64,
                max: MAX_FILE_SIZE,
            });
        }
    }
    let mut sorted: Vec<&SeedFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = sorted.windows(2).find(|p| p[0].name == p[1].name) {
        return Err(SeedError::DuplicateFile {
            name: pair[0].name.clone(),
        });
    }
    // Room for each file rounded to a generous cluster, plus an eighth for FAT growth.
    let data: usize = sorted.iter().map(|f| f.data.len().div_ceil(4096) * 4096).sum();
    let mut size = (OVERHEAD + data + data / 8).div_ceil(GRANULE) * GRANULE;
    let mut last_err = None;
    for _ in 0..ATTEMPTS {
        match try_build(&sorted, size) {
            Ok(image) => return Ok(image),
            Err(e) => last_err = Some(e),
        }
        size *= 2;
    }
    Err(SeedError::Vfat(
        last_err.unwrap_or_else(|| std::io::Error::other("no attempt was made")),
    ))
}

fn try_build(files: &[&SeedFile], size: usize) -> std::io::Result<Vec<u8>> {
    let mut disk = Cursor::new(vec![0u8; size]);
    let options = FormatVolumeOptions::new().volume_label(LABEL).volume_id(VOLUME_SERIAL);
    fatfs::format_volume(&mut disk, options)?;
    {
        let fs = FileSystem::new(&mut disk, FsOptions::new())?;
        for f in files {
            fs.root_dir().create_file(&f.name)?.write_all(&f.data)?;
        }
        fs.unmount()?;
    }
    Ok(disk.into_inner())
}

fn check_name(name: &str) -> Result<(), SeedError> {
    let fail = |why: String| {
        Err(SeedError::InvalidFileName {
            name: name.to_owned(),
            why,
        })
    };
    if name.is_empty() || name == "." || name == ".." || name.len() > 255 {
        return fail("a FAT long name needs 1 to 255 characters and cannot be `.` or `..`".into());
    }
    if let Some(c) = name.chars().find(|c| c.is_control() || FAT_FORBIDDEN.contains(c)) {
        return fail(format!("FAT names cannot contain `{}`", c.escape_debug()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, data: &[u8]) -> SeedFile {
        SeedFile {
            name: name.into(),
            data: data.to_vec(),
        }
    }

    #[test]
    fn build_vfat_same_input_gives_same_bytes() {
        let files = [
            file("meta-data", b"instance-id: i\n"),
            file("user-data", b"#cloud-config\n"),
        ];

        let (a, b) = (build_vfat(&files).unwrap(), build_vfat(&files).unwrap());

        assert_eq!(a, b);
    }

    #[test]
    fn build_vfat_reads_back_with_long_names() {
        let files = [
            file("meta-data", b"m"),
            file("network-config", b""),
            file("user-data", &[9u8; 70_000]),
        ];

        let read = read_vfat(&build_vfat(&files).unwrap()).unwrap();

        assert_eq!(read, files);
    }

    #[test]
    fn build_vfat_label_is_cidata() {
        let img = build_vfat(&[file("meta-data", b"m")]).unwrap();

        let fs = FileSystem::new(Cursor::new(img), FsOptions::new()).unwrap();
        assert_eq!(fs.volume_label(), "CIDATA");
    }

    #[test]
    fn build_vfat_colon_in_name_is_refused() {
        let err = build_vfat(&[file("a:b", b"")]).unwrap_err();

        assert!(matches!(err, SeedError::InvalidFileName { .. }));
    }

    #[test]
    fn looks_like_fat_zeros_is_false() {
        assert!(!looks_like_fat(&[0u8; 1024]));
    }

    #[test]
    fn read_vfat_fat16_image_reads_back() {
        let files = [file("meta-data", b"m"), file("user-data", &vec![3u8; 5 << 20])];

        let img = build_vfat(&files).unwrap();

        assert_eq!(read_vfat(&img).unwrap(), files);
    }
}
