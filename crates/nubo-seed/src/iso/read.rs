//! The reader: the files of an ISO9660 image's root directory, by the names a Linux guest sees
//! (the Joliet tree when there is one, else primary names lower-cased without `;1`, as Linux's
//! default `map=normal` shows them). Every offset is bounds-checked: images are untrusted input.

use super::{
    sectors_for, FIRST_DESCRIPTOR, FLAG_ASSOCIATED, FLAG_DIRECTORY, FLAG_MULTI_EXTENT, JOLIET_ESCAPES, SECTOR,
    STANDARD_ID,
};
use crate::error::SeedError;
use crate::SeedFile;

/// A real image has a handful of descriptors; this bounds a hostile chain without a terminator.
const MAX_DESCRIPTORS: usize = 64;

struct Root {
    extent: usize,
    len: usize,
    joliet: bool,
}

/// Reads the root directory's files of the ISO9660 image `image`.
pub fn read_iso(image: &[u8]) -> Result<Vec<SeedFile>, SeedError> {
    let root = find_root(image)?;
    let dir = extent(image, root.extent, root.len, "root directory")?;
    let mut files = Vec::new();
    let mut total = 0usize;
    let mut at = 0;
    while at < dir.len() {
        let len = dir[at] as usize;
        if len == 0 {
            // Records never cross a sector: a zero length byte means "continue at the next sector".
            at = (at / SECTOR + 1) * SECTOR;
            continue;
        }
        let rec = dir
            .get(at..at + len)
            .filter(|r| r.len() >= 34 && 33 + r[32] as usize <= r.len())
            .ok_or_else(|| SeedError::malformed(format!("directory record at byte {at} of the root is truncated")))?;
        at += len;
        let id = &rec[33..33 + rec[32] as usize];
        let flags = rec[25];
        if id == [0] || id == [1] || flags & (FLAG_DIRECTORY | FLAG_ASSOCIATED) != 0 {
            continue;
        }
        let name = if root.joliet {
            joliet_name(id)?
        } else {
            primary_name(id)
        };
        if flags & FLAG_MULTI_EXTENT != 0 {
            return Err(SeedError::UnsupportedImage {
                what: format!("a multi-extent file (`{name}`)"),
            });
        }
        let data_len = le32(rec, 10) as usize;
        let data = if data_len == 0 {
            &[][..]
        } else {
            extent(image, le32(rec, 2) as usize, data_len, &name)?
        };
        // Records may share extents; capping the total at the image size stops a crafted
        // image from expanding a small input into gigabytes.
        total += data.len();
        if total > image.len() {
            return Err(SeedError::malformed("file extents overlap beyond the image's size"));
        }
        files.push(SeedFile {
            name,
            data: data.to_vec(),
        });
    }
    Ok(files)
}

/// The Joliet root if a Joliet descriptor exists, else the primary root.
fn find_root(image: &[u8]) -> Result<Root, SeedError> {
    let mut primary = None;
    for i in 0..MAX_DESCRIPTORS {
        let at = (FIRST_DESCRIPTOR + i) * SECTOR;
        let d = image
            .get(at..at + SECTOR)
            .ok_or_else(|| SeedError::malformed("the volume descriptors end without a terminator"))?;
        if &d[1..6] != STANDARD_ID {
            return Err(SeedError::malformed(format!(
                "volume descriptor in sector {} lacks `CD001`",
                FIRST_DESCRIPTOR + i
            )));
        }
        match d[0] {
            1 | 2 => {
                let block = u16::from_le_bytes([d[128], d[129]]) as usize;
                if block != SECTOR {
                    return Err(SeedError::UnsupportedImage {
                        what: format!("a logical block size of {block} bytes"),
                    });
                }
                let joliet = d[0] == 2 && JOLIET_ESCAPES.iter().any(|e| &d[88..91] == *e);
                let root = Root {
                    extent: le32(d, 156 + 2) as usize,
                    len: le32(d, 156 + 10) as usize,
                    joliet,
                };
                if joliet {
                    return Ok(root);
                }
                if d[0] == 1 && primary.is_none() {
                    primary = Some(root);
                }
            }
            255 => break,
            _ => {}
        }
    }
    primary.ok_or_else(|| SeedError::malformed("no primary volume descriptor"))
}

fn extent<'a>(image: &'a [u8], sector: usize, len: usize, what: &str) -> Result<&'a [u8], SeedError> {
    let start = sector.checked_mul(SECTOR);
    start
        .and_then(|s| image.get(s..s.checked_add(len)?))
        .filter(|_| sectors_for(len) > 0)
        .ok_or_else(|| {
            SeedError::malformed(format!(
                "`{what}` ({len} bytes at sector {sector}) lies outside the {}-byte image",
                image.len()
            ))
        })
}

fn joliet_name(id: &[u8]) -> Result<String, SeedError> {
    if !id.len().is_multiple_of(2) {
        return Err(SeedError::malformed("a Joliet name has an odd number of bytes"));
    }
    let units = id.chunks_exact(2).map(|p| u16::from_be_bytes([p[0], p[1]]));
    let name: String = char::decode_utf16(units)
        .collect::<Result<_, _>>()
        .map_err(|_| SeedError::malformed("a Joliet name is not valid UCS-2"))?;
    Ok(strip_version(&name).to_owned())
}

fn primary_name(id: &[u8]) -> String {
    strip_version(&String::from_utf8_lossy(id)).to_ascii_lowercase()
}

/// `NAME.EXT;1` -> `NAME.EXT`, `NAME.;1` -> `NAME`.
fn strip_version(name: &str) -> &str {
    let name = name.split_once(';').map_or(name, |(n, _)| n);
    name.strip_suffix('.').unwrap_or(name)
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iso::write_iso_files;

    fn file(name: &str, data: &[u8]) -> SeedFile {
        SeedFile {
            name: name.into(),
            data: data.to_vec(),
        }
    }

    fn image(files: &[SeedFile]) -> Vec<u8> {
        let mut out = Vec::new();
        write_iso_files(files, &mut out).unwrap();
        out
    }

    #[test]
    fn read_iso_written_files_come_back_sorted() {
        let img = image(&[
            file("user-data", b"#cloud-config\n"),
            file("meta-data", b"instance-id: i\n"),
        ]);

        let files = read_iso(&img).unwrap();

        assert_eq!(
            files,
            [
                file("meta-data", b"instance-id: i\n"),
                file("user-data", b"#cloud-config\n")
            ]
        );
    }

    #[test]
    fn read_iso_empty_file_comes_back_empty() {
        let img = image(&[file("user-data", b"")]);

        let files = read_iso(&img).unwrap();

        assert_eq!(files, [file("user-data", b"")]);
    }

    #[test]
    fn read_iso_many_files_across_directory_sectors_come_back() {
        let files: Vec<SeedFile> = (0..100)
            .map(|i| file(&format!("file-number-{i:03}"), &[i as u8; 3]))
            .collect();

        let read = read_iso(&image(&files)).unwrap();

        assert_eq!(read, files);
    }

    #[test]
    fn read_iso_without_joliet_uses_lowercased_primary_names() {
        let mut img = image(&[file("meta-data", b"m")]);
        img[17 * SECTOR + 88..17 * SECTOR + 91].copy_from_slice(b"   ");

        let files = read_iso(&img).unwrap();

        assert_eq!(files, [file("meta_dat", b"m")]);
    }

    #[test]
    fn read_iso_truncated_image_is_malformed() {
        let img = image(&[file("meta-data", &[1u8; 4096])]);

        let err = read_iso(&img[..img.len() - 1]).unwrap_err();

        assert!(matches!(err, SeedError::Malformed { .. }), "{err}");
    }

    #[test]
    fn read_iso_missing_terminator_is_malformed() {
        let img = vec![0u8; 17 * SECTOR];

        let err = read_iso(&img).unwrap_err();

        assert!(matches!(err, SeedError::Malformed { .. }), "{err}");
    }

    #[test]
    fn strip_version_removes_version_and_trailing_dot() {
        assert_eq!(
            (
                strip_version("USER_DAT.;1"),
                strip_version("A.TXT;1"),
                strip_version("x")
            ),
            ("USER_DAT", "A.TXT", "x")
        );
    }
}
