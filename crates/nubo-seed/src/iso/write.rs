//! The writer: descriptors, path tables and directories are laid out in memory (a few sectors),
//! then file data streams straight from the caller's buffers into `w`.

use std::io::Write;

use super::names::{joliet, primary_all, primary_order};
use super::{sectors_for, FIRST_DESCRIPTOR, FLAG_DIRECTORY, SECTOR, STANDARD_ID, VOLUME_ID};
use crate::error::SeedError;
use crate::SeedFile;

/// Largest seed file ([`nubo_core::limits::MAX_SEED_FILE_SIZE`], shared with the spec's checks):
/// the brief's 16 MiB of user-data, comfortably inside one ISO9660 extent (4 GiB), and a bound on
/// what a build holds in memory. Larger payloads belong in the image.
pub const MAX_FILE_SIZE: u64 = nubo_core::limits::MAX_SEED_FILE_SIZE;

/// Every timestamp in the image: 2020-01-01 00:00:00 UTC. A constant, so builds are reproducible
/// and the crate never reads the clock.
const YEAR: u16 = 2020;
const DIR_DATE: [u8; 7] = [(YEAR - 1900) as u8, 1, 1, 0, 0, 0, 0];
const VD_DATE: &[u8; 16] = b"2020010100000000";
const VD_DATE_UNSET: &[u8; 16] = b"0000000000000000";

const PATH_TABLE_LEN: usize = 10;
const L_PRIMARY: usize = 19;
const M_PRIMARY: usize = 20;
const L_JOLIET: usize = 21;
const M_JOLIET: usize = 22;
const FIRST_DIR: usize = 23;

/// One file as both trees name it.
struct Entry<'a> {
    primary: Vec<u8>,
    joliet: Vec<u8>,
    data: &'a [u8],
    extent: usize,
}

/// Writes `files` as an ISO9660 + Joliet image labelled CIDATA. Names must be unique, valid
/// Joliet names; each file at most [`MAX_FILE_SIZE`]. Input order does not matter.
pub fn write_iso_files<W: Write>(files: &[SeedFile], mut w: W) -> Result<(), SeedError> {
    let mut sorted: Vec<&SeedFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    if let Some(pair) = sorted.windows(2).find(|p| p[0].name == p[1].name) {
        return Err(SeedError::DuplicateFile {
            name: pair[0].name.clone(),
        });
    }
    if let Some(f) = sorted.iter().find(|f| f.data.len() as u64 > MAX_FILE_SIZE) {
        return Err(SeedError::FileTooLarge {
            name: f.name.clone(),
            size: f.data.len() as u64,
            max: MAX_FILE_SIZE,
        });
    }
    let names: Vec<&str> = sorted.iter().map(|f| f.name.as_str()).collect();
    let mut entries = Vec::with_capacity(sorted.len());
    for (f, primary) in sorted.iter().zip(primary_all(&names)) {
        entries.push(Entry {
            primary,
            joliet: joliet(&f.name)?,
            data: &f.data,
            extent: 0,
        });
    }

    let primary_dir_sectors = dir_sectors(entries.iter().map(|e| e.primary.len()));
    let joliet_dir_sectors = dir_sectors(entries.iter().map(|e| e.joliet.len()));
    let primary_dir = FIRST_DIR;
    let joliet_dir = primary_dir + primary_dir_sectors;
    let mut next = joliet_dir + joliet_dir_sectors;
    // Data goes in Joliet (real-name) order; an empty file points at the next free sector and
    // takes none, as genisoimage does.
    entries.sort_by(|a, b| a.joliet.cmp(&b.joliet));
    for e in &mut entries {
        e.extent = next;
        next += sectors_for(e.data.len());
    }
    let total_sectors = next;

    let mut head = vec![0u8; (joliet_dir + joliet_dir_sectors) * SECTOR];
    let dirs = [
        (primary_dir, primary_dir_sectors, L_PRIMARY, M_PRIMARY),
        (joliet_dir, joliet_dir_sectors, L_JOLIET, M_JOLIET),
    ];
    volume_descriptor(&mut head, FIRST_DESCRIPTOR, false, total_sectors, dirs[0]);
    volume_descriptor(&mut head, FIRST_DESCRIPTOR + 1, true, total_sectors, dirs[1]);
    terminator(&mut head);
    for (dir, _, l, m) in dirs {
        path_table(&mut head, l, dir, false);
        path_table(&mut head, m, dir, true);
    }
    entries.sort_by(|a, b| primary_order(&a.primary, &b.primary));
    directory(
        &mut head,
        primary_dir,
        primary_dir_sectors,
        entries.iter().map(|e| (&e.primary[..], e)),
    );
    entries.sort_by(|a, b| a.joliet.cmp(&b.joliet));
    directory(
        &mut head,
        joliet_dir,
        joliet_dir_sectors,
        entries.iter().map(|e| (&e.joliet[..], e)),
    );

    w.write_all(&head).map_err(SeedError::Write)?;
    let zeros = [0u8; SECTOR];
    for e in &entries {
        w.write_all(e.data).map_err(SeedError::Write)?;
        let pad = sectors_for(e.data.len()) * SECTOR - e.data.len();
        w.write_all(&zeros[..pad]).map_err(SeedError::Write)?;
    }
    w.flush().map_err(SeedError::Write)
}

/// Bytes the image of `files` will take, for callers that preallocate.
pub(crate) fn image_len_hint(files: &[SeedFile]) -> usize {
    let data: usize = files.iter().map(|f| sectors_for(f.data.len())).sum();
    (FIRST_DIR + 2 + data) * SECTOR
}

/// A directory record: 33 fixed bytes, the identifier, and a pad byte to keep records even.
fn record_len(id_len: usize) -> usize {
    33 + id_len + (1 - id_len % 2)
}

/// Sectors a root directory takes: `.` and `..` then one record per file, none crossing a sector.
fn dir_sectors(id_lens: impl Iterator<Item = usize>) -> usize {
    let mut sectors = 1;
    let mut used = 2 * record_len(1);
    for len in id_lens {
        let r = record_len(len);
        if used + r > SECTOR {
            sectors += 1;
            used = 0;
        }
        used += r;
    }
    sectors
}

fn directory<'a>(
    head: &mut [u8],
    sector: usize,
    sectors: usize,
    files: impl Iterator<Item = (&'a [u8], &'a Entry<'a>)>,
) {
    let start = sector * SECTOR;
    let size = sectors * SECTOR;
    let mut at = start;
    for id in [&[0u8][..], &[1u8][..]] {
        at += put_record(&mut head[at..], id, sector, size, FLAG_DIRECTORY);
    }
    for (id, e) in files {
        if (at - start) % SECTOR + record_len(id.len()) > SECTOR {
            at = start + (at - start).div_ceil(SECTOR) * SECTOR;
        }
        at += put_record(&mut head[at..], id, e.extent, e.data.len(), 0);
    }
}

fn put_record(buf: &mut [u8], id: &[u8], extent: usize, len: usize, flags: u8) -> usize {
    let n = record_len(id.len());
    buf[0] = n as u8;
    both32(&mut buf[2..10], extent as u32);
    both32(&mut buf[10..18], len as u32);
    buf[18..25].copy_from_slice(&DIR_DATE);
    buf[25] = flags;
    both16(&mut buf[28..32], 1);
    buf[32] = id.len() as u8;
    buf[33..33 + id.len()].copy_from_slice(id);
    n
}

/// The root's one path-table record: L tables are little-endian, M tables big-endian.
fn path_table(head: &mut [u8], sector: usize, dir: usize, big_endian: bool) {
    let b = &mut head[sector * SECTOR..sector * SECTOR + PATH_TABLE_LEN];
    b[0] = 1;
    let (loc, parent) = if big_endian {
        ((dir as u32).to_be_bytes(), 1u16.to_be_bytes())
    } else {
        ((dir as u32).to_le_bytes(), 1u16.to_le_bytes())
    };
    b[2..6].copy_from_slice(&loc);
    b[6..8].copy_from_slice(&parent);
}

fn volume_descriptor(
    head: &mut [u8],
    sector: usize,
    joliet: bool,
    total_sectors: usize,
    (dir, dir_sectors, l_table, m_table): (usize, usize, usize, usize),
) {
    let d = &mut head[sector * SECTOR..(sector + 1) * SECTOR];
    d[0] = if joliet { 2 } else { 1 };
    d[1..6].copy_from_slice(STANDARD_ID);
    d[6] = 1;
    let text = |d: &mut [u8], at: usize, len: usize, s: &str| {
        if joliet {
            put_ucs2_padded(&mut d[at..at + len], s)
        } else {
            put_ascii_padded(&mut d[at..at + len], s)
        }
    };
    text(d, 8, 32, "");
    text(d, 40, 32, VOLUME_ID);
    both32(&mut d[80..88], total_sectors as u32);
    if joliet {
        d[88..91].copy_from_slice(b"%/E");
    }
    both16(&mut d[120..124], 1);
    both16(&mut d[124..128], 1);
    both16(&mut d[128..132], SECTOR as u16);
    both32(&mut d[132..140], PATH_TABLE_LEN as u32);
    d[140..144].copy_from_slice(&(l_table as u32).to_le_bytes());
    d[148..152].copy_from_slice(&(m_table as u32).to_be_bytes());
    put_record(&mut d[156..190], &[0], dir, dir_sectors * SECTOR, FLAG_DIRECTORY);
    for (at, len) in [
        (190, 128),
        (318, 128),
        (446, 128),
        (574, 128),
        (702, 37),
        (739, 37),
        (776, 37),
    ] {
        text(d, at, len, "");
    }
    for (at, date) in [
        (813, VD_DATE),
        (830, VD_DATE),
        (847, VD_DATE_UNSET),
        (864, VD_DATE_UNSET),
    ] {
        d[at..at + 16].copy_from_slice(date);
    }
    d[881] = 1;
}

fn terminator(head: &mut [u8]) {
    let d = &mut head[(FIRST_DESCRIPTOR + 2) * SECTOR..(FIRST_DESCRIPTOR + 3) * SECTOR];
    d[0] = 255;
    d[1..6].copy_from_slice(STANDARD_ID);
    d[6] = 1;
}

fn put_ascii_padded(b: &mut [u8], s: &str) {
    b.fill(b' ');
    b[..s.len()].copy_from_slice(s.as_bytes());
}

/// UCS-2 BE text padded with UCS-2 spaces; an odd-length field ends in one ASCII space byte.
fn put_ucs2_padded(b: &mut [u8], s: &str) {
    for (i, pair) in b.chunks_mut(2).enumerate() {
        let unit = s.encode_utf16().nth(i).unwrap_or(u16::from(b' '));
        if pair.len() == 2 {
            pair.copy_from_slice(&unit.to_be_bytes());
        } else {
            pair[0] = b' ';
        }
    }
}

fn both16(b: &mut [u8], v: u16) {
    b[..2].copy_from_slice(&v.to_le_bytes());
    b[2..4].copy_from_slice(&v.to_be_bytes());
}

fn both32(b: &mut [u8], v: u32) {
    b[..4].copy_from_slice(&v.to_le_bytes());
    b[4..8].copy_from_slice(&v.to_be_bytes());
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

    fn image(files: &[SeedFile]) -> Vec<u8> {
        let mut out = Vec::new();
        write_iso_files(files, &mut out).unwrap();
        out
    }

    #[test]
    fn write_iso_files_two_small_files_is_27_sectors() {
        let img = image(&[file("meta-data", b"m"), file("user-data", b"u")]);

        assert_eq!(img.len(), 27 * SECTOR);
    }

    #[test]
    fn write_iso_files_descriptors_carry_cidata_and_joliet_escape() {
        let img = image(&[file("meta-data", b"m")]);

        assert_eq!(&img[16 * SECTOR + 1..16 * SECTOR + 6], b"CD001");
        assert_eq!(&img[16 * SECTOR + 40..16 * SECTOR + 46], b"CIDATA");
        assert_eq!(&img[17 * SECTOR + 88..17 * SECTOR + 91], b"%/E");
        assert_eq!(&img[17 * SECTOR + 40..17 * SECTOR + 52], b"\0C\0I\0D\0A\0T\0A");
        assert_eq!(img[18 * SECTOR], 255);
    }

    #[test]
    fn write_iso_files_volume_size_matches_length() {
        let img = image(&[file("user-data", &[7u8; 5000])]);

        let size = u32::from_le_bytes(img[16 * SECTOR + 80..16 * SECTOR + 84].try_into().unwrap());
        assert_eq!(size as usize * SECTOR, img.len());
    }

    #[test]
    fn write_iso_files_input_order_gives_same_bytes() {
        let a = image(&[file("meta-data", b"m"), file("user-data", b"u")]);

        let b = image(&[file("user-data", b"u"), file("meta-data", b"m")]);

        assert_eq!(a, b);
    }

    #[test]
    fn write_iso_files_exactly_max_size_is_accepted() {
        let big = vec![0u8; MAX_FILE_SIZE as usize];

        let result = write_iso_files(
            &[SeedFile {
                name: "user-data".into(),
                data: big,
            }],
            std::io::sink(),
        );

        assert!(result.is_ok());
    }

    #[test]
    fn write_iso_files_over_max_size_is_refused() {
        let big = vec![0u8; MAX_FILE_SIZE as usize + 1];

        let err = write_iso_files(
            &[SeedFile {
                name: "user-data".into(),
                data: big,
            }],
            std::io::sink(),
        )
        .unwrap_err();

        assert!(matches!(err, SeedError::FileTooLarge { .. }));
    }

    #[test]
    fn write_iso_files_duplicate_name_is_refused() {
        let err = write_iso_files(&[file("a", b""), file("a", b"")], std::io::sink()).unwrap_err();

        assert!(matches!(err, SeedError::DuplicateFile { .. }));
    }

    #[test]
    fn write_iso_files_many_files_spill_directory_into_more_sectors() {
        let files: Vec<SeedFile> = (0..100).map(|i| file(&format!("file-number-{i:03}"), b"x")).collect();

        let img = image(&files);

        // primary: 68 + 100 * 44 bytes = 3 sectors; Joliet: 30, 32, 32 and 6 records of 64 = 4 sectors
        assert_eq!(img.len(), image_len_hint(&files) + (2 + 3) * SECTOR);
    }

    #[test]
    fn dir_sectors_fills_one_sector_exactly() {
        let n = (SECTOR - 68) / record_len(1);

        assert_eq!(
            (
                dir_sectors(std::iter::repeat_n(1, n)),
                dir_sectors(std::iter::repeat_n(1, n + 1))
            ),
            (1, 2)
        );
    }
}
