//! A small, bounded FAT12/16/32 reader for the root directory of a seed. Written for the purpose
//! rather than reading through fatfs: fuzzing showed fatfs panics on crafted boot sectors
//! (cluster arithmetic overflow) and it would follow a cyclic FAT32 root chain forever, while
//! `nubo seed inspect` reads files anyone can hand it.

use crate::error::SeedError;
use crate::SeedFile;

const DIR_ENTRY: usize = 32;
const ATTR_LFN: u8 = 0x0f;
const ATTR_VOLUME: u8 = 0x08;
const ATTR_DIRECTORY: u8 = 0x10;
/// The FAT type is decided by the cluster count alone (Microsoft's FAT specification, 3.5).
const MAX_FAT12_CLUSTERS: u32 = 4084;
const MAX_FAT16_CLUSTERS: u32 = 65524;

#[derive(Clone, Copy, PartialEq, Eq)]
enum FatType {
    Fat12,
    Fat16,
    Fat32,
}

struct Volume<'a> {
    image: &'a [u8],
    fat_type: FatType,
    cluster_size: usize,
    fat_start: usize,
    data_start: usize,
    clusters: u32,
    /// FAT12/16: the fixed root region (offset, length). FAT32: None, the root is a chain.
    root_region: Option<(usize, usize)>,
    root_cluster: u32,
}

/// Whether `image` starts with a FAT boot sector (signature and a sane geometry).
pub(crate) fn looks_like_fat(image: &[u8]) -> bool {
    image.len() >= 512
        && image[510..512] == [0x55, 0xaa]
        && matches!(u16::from_le_bytes([image[11], image[12]]), 512 | 1024 | 2048 | 4096)
        && image[13].is_power_of_two()
}

/// The files in the root directory of the FAT image `image`, sorted by name.
pub fn read_vfat(image: &[u8]) -> Result<Vec<SeedFile>, SeedError> {
    let v = Volume::parse(image)?;
    let root = match v.root_region {
        Some((at, len)) => v.slice(at, len, "root directory")?.to_vec(),
        None => v.chain_bytes(v.root_cluster, None)?,
    };
    let mut files = Vec::new();
    let mut total = 0usize;
    for (name, first_cluster, size) in root_entries(&root)? {
        total = total.saturating_add(size);
        if total > image.len() {
            return Err(SeedError::malformed("FAT file sizes add up to more than the image"));
        }
        let data = if size == 0 {
            Vec::new()
        } else {
            v.chain_bytes(first_cluster, Some(size))?
        };
        files.push(SeedFile { name, data });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

fn u16_at(b: &[u8], at: usize) -> usize {
    usize::from(u16::from_le_bytes([b[at], b[at + 1]]))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl<'a> Volume<'a> {
    fn parse(image: &'a [u8]) -> Result<Volume<'a>, SeedError> {
        if !looks_like_fat(image) {
            return Err(SeedError::malformed("no FAT boot sector"));
        }
        let bytes_per_sector = u16_at(image, 11);
        let cluster_size = bytes_per_sector * usize::from(image[13]);
        let reserved = u16_at(image, 14);
        let fats = usize::from(image[16]);
        let root_entries = u16_at(image, 17);
        let total_sectors = match u16_at(image, 19) {
            0 => u32_at(image, 32) as usize,
            n => n,
        };
        let fat_sectors = match u16_at(image, 22) {
            0 => u32_at(image, 36) as usize,
            n => n,
        };
        if reserved == 0 || fats == 0 || fat_sectors == 0 {
            return Err(SeedError::malformed(
                "FAT boot sector has no reserved sectors or no FAT",
            ));
        }
        let root_sectors = (root_entries * DIR_ENTRY).div_ceil(bytes_per_sector);
        let data_sector = reserved + fats * fat_sectors + root_sectors;
        let data_sectors = total_sectors
            .checked_sub(data_sector)
            .ok_or_else(|| SeedError::malformed("FAT boot sector: the data region starts past the volume's end"))?;
        let clusters = u32::try_from(data_sectors / usize::from(image[13]))
            .map_err(|_| SeedError::malformed("FAT boot sector: too many clusters"))?;
        let fat_type = if clusters <= MAX_FAT12_CLUSTERS {
            FatType::Fat12
        } else if clusters <= MAX_FAT16_CLUSTERS {
            FatType::Fat16
        } else {
            FatType::Fat32
        };
        let root_region = (fat_type != FatType::Fat32).then(|| {
            (
                (reserved + fats * fat_sectors) * bytes_per_sector,
                root_sectors * bytes_per_sector,
            )
        });
        Ok(Volume {
            image,
            fat_type,
            cluster_size,
            fat_start: reserved * bytes_per_sector,
            data_start: data_sector * bytes_per_sector,
            clusters,
            root_region,
            root_cluster: u32_at(image, 44),
        })
    }

    fn slice(&self, at: usize, len: usize, what: &str) -> Result<&'a [u8], SeedError> {
        at.checked_add(len)
            .and_then(|end| self.image.get(at..end))
            .ok_or_else(|| SeedError::malformed(format!("FAT {what} lies outside the image")))
    }

    /// The FAT entry of `cluster`: the next cluster of its chain, or an end/bad marker.
    fn next(&self, cluster: u32) -> Result<u32, SeedError> {
        let c = cluster as usize;
        let entry = match self.fat_type {
            FatType::Fat12 => {
                let b = self.slice(self.fat_start + c + c / 2, 2, "table")?;
                let pair = u16::from_le_bytes([b[0], b[1]]);
                u32::from(if c.is_multiple_of(2) { pair & 0x0fff } else { pair >> 4 })
            }
            FatType::Fat16 => u32::from(u16::from_le_bytes(
                self.slice(self.fat_start + c * 2, 2, "table")?
                    .try_into()
                    .expect("2 bytes"),
            )),
            FatType::Fat32 => u32_at(self.slice(self.fat_start + c * 4, 4, "table")?, 0) & 0x0fff_ffff,
        };
        Ok(entry)
    }

    fn is_data_cluster(&self, c: u32) -> bool {
        (2..self.clusters.saturating_add(2)).contains(&c)
    }

    /// The bytes of the chain starting at `first`, cut to `size` when given. A chain can visit
    /// each cluster at most once, so a cycle ends in an error rather than a loop.
    fn chain_bytes(&self, first: u32, size: Option<usize>) -> Result<Vec<u8>, SeedError> {
        let mut out = Vec::new();
        let mut c = first;
        for _ in 0..=self.clusters {
            if !self.is_data_cluster(c) {
                return Err(SeedError::malformed(format!(
                    "FAT chain points at cluster {c}, outside the volume"
                )));
            }
            let at = self.data_start + (c as usize - 2) * self.cluster_size;
            out.extend_from_slice(self.slice(at, self.cluster_size, "cluster")?);
            if size.is_some_and(|s| out.len() >= s) {
                out.truncate(size.unwrap_or_default());
                return Ok(out);
            }
            c = self.next(c)?;
            let end_of_chain = match self.fat_type {
                FatType::Fat12 => c >= 0x0ff8,
                FatType::Fat16 => c >= 0xfff8,
                FatType::Fat32 => c >= 0x0fff_fff8,
            };
            if end_of_chain {
                return match size {
                    Some(s) => Err(SeedError::malformed(format!(
                        "FAT chain ends before the file's {s} bytes"
                    ))),
                    None => Ok(out),
                };
            }
        }
        Err(SeedError::malformed("FAT chain loops"))
    }
}

/// (name, first cluster, size) of each file: long names where their checksum matches the short
/// entry, else the short name as Linux shows it (lower-cased per the NT case bits).
fn root_entries(dir: &[u8]) -> Result<Vec<(String, u32, usize)>, SeedError> {
    let mut out = Vec::new();
    let mut lfn: Vec<(u8, [u16; 13])> = Vec::new();
    for e in dir.chunks_exact(DIR_ENTRY) {
        match e[0] {
            0x00 => break,
            0xe5 => {
                lfn.clear();
                continue;
            }
            _ => {}
        }
        let attr = e[11];
        if attr & 0x3f == ATTR_LFN {
            let mut units = [0u16; 13];
            for (i, at) in [1, 3, 5, 7, 9, 14, 16, 18, 20, 22, 24, 28, 30].iter().enumerate() {
                units[i] = u16::from_le_bytes([e[*at], e[at + 1]]);
            }
            lfn.push((e[13], units));
            continue;
        }
        let pieces = std::mem::take(&mut lfn);
        if attr & (ATTR_VOLUME | ATTR_DIRECTORY) != 0 {
            continue;
        }
        let short: [u8; 11] = e[..11].try_into().expect("11 bytes");
        let name = long_name(&pieces, &short).unwrap_or_else(|| short_name(&short, e[12]));
        let cluster =
            (u32::from(u16::from_le_bytes([e[20], e[21]])) << 16) | u32::from(u16::from_le_bytes([e[26], e[27]]));
        out.push((name, cluster, u32_at(e, 28) as usize));
    }
    Ok(out)
}

fn lfn_checksum(short: &[u8; 11]) -> u8 {
    short
        .iter()
        .fold(0u8, |sum, b| ((sum & 1) << 7).wrapping_add(sum >> 1).wrapping_add(*b))
}

/// LFN pieces come last-first on disk; each carries the short name's checksum.
fn long_name(pieces: &[(u8, [u16; 13])], short: &[u8; 11]) -> Option<String> {
    if pieces.is_empty() || pieces.iter().any(|(sum, _)| *sum != lfn_checksum(short)) {
        return None;
    }
    let units: Vec<u16> = pieces
        .iter()
        .rev()
        .flat_map(|(_, u)| u.iter().copied())
        .take_while(|u| *u != 0 && *u != 0xffff)
        .collect();
    String::from_utf16(&units).ok().filter(|n| !n.is_empty())
}

fn short_name(short: &[u8; 11], case_bits: u8) -> String {
    let part = |b: &[u8], lower: bool| {
        let s: String = b
            .iter()
            .map(|c| char::from(*c))
            .collect::<String>()
            .trim_end()
            .to_owned();
        if lower {
            s.to_ascii_lowercase()
        } else {
            s
        }
    };
    let base = part(&short[..8], case_bits & 0x08 != 0);
    let ext = part(&short[8..], case_bits & 0x10 != 0);
    if ext.is_empty() {
        base
    } else {
        format!("{base}.{ext}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_name_case_bits_lower_base_and_ext() {
        assert_eq!(short_name(b"README  TXT", 0x18), "readme.txt");
    }

    #[test]
    fn short_name_no_extension_has_no_dot() {
        assert_eq!(short_name(b"HOSTS      ", 0), "HOSTS");
    }

    /// Regression: the fuzzer's first finding, a root entry whose first cluster is below 2. fatfs
    /// panicked on it (cluster arithmetic underflow); this reader must refuse it.
    #[test]
    fn read_vfat_fuzz_cluster_underflow_is_an_error_not_a_panic() {
        let img = include_bytes!("testdata/fuzz-cluster-underflow.img");

        let result = read_vfat(img);

        assert!(result.is_err() || result.is_ok_and(|f| f.iter().all(|f| f.data.len() <= img.len())));
    }

    #[test]
    fn read_vfat_boot_sector_only_is_malformed() {
        let mut img = vec![0u8; 512];
        img[11..13].copy_from_slice(&512u16.to_le_bytes());
        img[13] = 1;
        img[510] = 0x55;
        img[511] = 0xaa;

        let err = read_vfat(&img).unwrap_err();

        assert!(matches!(err, SeedError::Malformed { .. }), "{err}");
    }
}
