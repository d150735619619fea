//! Clamps every inode time of a freshly made ext4 filesystem to the build's `SOURCE_DATE_EPOCH`.
//!
//! `mkfs.ext4 -d` copies each file's atime, mtime and ctime from the tree, and the tree's ctimes
//! (and the atimes mkfs itself just bumped by reading) are the build's wall clock; e2fsprogs
//! 1.47.0 (Debian 12) has no option to clamp them. So after mkfs this pass walks the inode tables
//! of the filesystem nubo itself just wrote: mtime is clamped to the epoch (a file shipped in a
//! package keeps its own, older time, which `.pyc` files check their source against), atime,
//! ctime and crtime become the epoch, sub-second parts are zeroed, and the inode checksum is
//! recomputed (`metadata_csum`). Bitmaps, block-group descriptors and directories are untouched.
//!
//! The parsing is defensive all the same (bounds-checked reads, no arithmetic overflow), and the
//! build runs `e2fsck -fn` after it.

use std::fs::File;
use std::os::unix::fs::FileExt;

const SUPERBLOCK_OFFSET: u64 = 1024;
const EXT4_MAGIC: u16 = 0xEF53;
const GOOD_OLD_INODE_SIZE: usize = 128;
const INCOMPAT_64BIT: u32 = 0x80;
const INCOMPAT_CSUM_SEED: u32 = 0x2000;
const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
/// Block group flag: the inode table and bitmap were never initialised (no inode in use).
const BG_INODE_UNINIT: u16 = 0x1;
const ROOT_INO: u32 = 2;

// Inode field offsets (struct ext4_inode).
const I_MODE: usize = 0x00;
const I_ATIME: usize = 0x08;
const I_CTIME: usize = 0x0C;
const I_MTIME: usize = 0x10;
const I_GENERATION: usize = 0x64;
const I_CHECKSUM_LO: usize = 0x7C;
const I_EXTRA_ISIZE: usize = 0x80;
const I_CHECKSUM_HI: usize = 0x82;
const I_CTIME_EXTRA: usize = 0x84;
const I_MTIME_EXTRA: usize = 0x88;
const I_ATIME_EXTRA: usize = 0x8C;
const I_CRTIME: usize = 0x90;
const I_CRTIME_EXTRA: usize = 0x94;

/// What the pass needs from the superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub block_size: u64,
    pub first_data_block: u64,
    pub groups: u64,
    pub inodes_per_group: u32,
    pub inode_size: usize,
    pub first_ino: u32,
    pub desc_size: usize,
    /// The crc32c seed of every metadata checksum, when `metadata_csum` is on.
    pub csum_seed: Option<u32>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

impl Geometry {
    /// Reads the 1024-byte superblock.
    pub fn parse(sb: &[u8; 1024]) -> Result<Geometry, String> {
        if u16_at(sb, 0x38) != EXT4_MAGIC {
            return Err("no ext4 superblock (bad magic)".into());
        }
        let log_block = u32_at(sb, 0x18);
        if log_block > 6 {
            return Err(format!("block size 2^{} KiB is not ext4's", log_block));
        }
        let block_size = 1024u64 << log_block;
        let blocks = u64::from(u32_at(sb, 0x04));
        let first_data_block = u64::from(u32_at(sb, 0x14));
        let blocks_per_group = u64::from(u32_at(sb, 0x20));
        let inodes_per_group = u32_at(sb, 0x28);
        let incompat = u32_at(sb, 0x60);
        let ro_compat = u32_at(sb, 0x64);
        // Revision 0 has fixed 128-byte inodes and no first_ino field.
        let (first_ino, inode_size) = if u32_at(sb, 0x4C) == 0 {
            (11, GOOD_OLD_INODE_SIZE)
        } else {
            (u32_at(sb, 0x54), usize::from(u16_at(sb, 0x58)))
        };
        let desc_size = if incompat & INCOMPAT_64BIT != 0 {
            usize::from(u16_at(sb, 0xFE))
        } else {
            32
        };
        if blocks_per_group == 0
            || inodes_per_group == 0
            || !(GOOD_OLD_INODE_SIZE..=4096).contains(&inode_size)
            || !inode_size.is_power_of_two()
            || !(32..=1024).contains(&desc_size)
            || blocks <= first_data_block
        {
            return Err("inconsistent ext4 superblock geometry".into());
        }
        let groups = (blocks - first_data_block).div_ceil(blocks_per_group);
        let csum_seed = (ro_compat & RO_COMPAT_METADATA_CSUM != 0).then(|| {
            if incompat & INCOMPAT_CSUM_SEED != 0 {
                u32_at(sb, 0x270)
            } else {
                crc32c(!0, &sb[0x68..0x78])
            }
        });
        Ok(Geometry {
            block_size,
            first_data_block,
            groups,
            inodes_per_group,
            inode_size,
            first_ino,
            desc_size,
            csum_seed,
        })
    }
}

/// Clamps the times of inode number `ino` (`raw` is its on-disk record) to `epoch`; `false` when
/// the inode is not one to touch (free, or reserved other than the root directory).
///
/// `epoch` is at most `i32::MAX` (2038): the times are written without the extra epoch bits.
pub fn clamp_inode(raw: &mut [u8], ino: u32, g: &Geometry, epoch: u32) -> bool {
    if u16_at(raw, I_MODE) == 0 || (ino != ROOT_INO && ino < g.first_ino) {
        return false;
    }
    let extra = extra_isize(raw, g);
    // A time is the signed 32-bit field plus, in the extra field's low two bits, bits 32-33.
    let epoch_bits = if fits(extra, I_MTIME_EXTRA, 4) {
        i64::from(u32_at(raw, I_MTIME_EXTRA) & 3) << 32
    } else {
        0
    };
    let mtime = (i64::from(u32_at(raw, I_MTIME) as i32) + epoch_bits).min(i64::from(epoch));
    // In i32 range: at most `epoch`, and at least the field's own i32 value.
    put_u32(raw, I_MTIME, mtime as i32 as u32);
    put_u32(raw, I_ATIME, epoch);
    put_u32(raw, I_CTIME, epoch);
    for (field, value) in [
        (I_CTIME_EXTRA, 0),
        (I_MTIME_EXTRA, 0),
        (I_ATIME_EXTRA, 0),
        (I_CRTIME, epoch),
        (I_CRTIME_EXTRA, 0),
    ] {
        if fits(extra, field, 4) {
            put_u32(raw, field, value);
        }
    }
    if let Some(seed) = g.csum_seed {
        let csum = inode_checksum(raw, ino, g, seed);
        put_u16(raw, I_CHECKSUM_LO, csum as u16);
        if fits(extra, I_CHECKSUM_HI, 2) {
            put_u16(raw, I_CHECKSUM_HI, (csum >> 16) as u16);
        }
    }
    true
}

/// `i_extra_isize`, 0 for 128-byte inodes, bounded by the inode size.
fn extra_isize(raw: &[u8], g: &Geometry) -> usize {
    if g.inode_size <= GOOD_OLD_INODE_SIZE {
        return 0;
    }
    usize::from(u16_at(raw, I_EXTRA_ISIZE)).min(g.inode_size - GOOD_OLD_INODE_SIZE)
}

/// Whether a field of the large inode (at `at`, `len` bytes) lies within `i_extra_isize`.
fn fits(extra: usize, at: usize, len: usize) -> bool {
    at + len <= GOOD_OLD_INODE_SIZE + extra
}

/// The kernel's `ext4_inode_csum`: crc32c over the inode number, the generation and the inode
/// with both checksum fields read as zero.
pub fn inode_checksum(raw: &[u8], ino: u32, g: &Geometry, seed: u32) -> u32 {
    let mut c = crc32c(seed, &ino.to_le_bytes());
    c = crc32c(c, &raw[I_GENERATION..I_GENERATION + 4]);
    c = crc32c(c, &raw[..I_CHECKSUM_LO]);
    c = crc32c(c, &[0, 0]);
    c = crc32c(c, &raw[I_CHECKSUM_LO + 2..GOOD_OLD_INODE_SIZE]);
    if g.inode_size > GOOD_OLD_INODE_SIZE {
        c = crc32c(c, &raw[GOOD_OLD_INODE_SIZE..I_CHECKSUM_HI]);
        let mut rest = I_CHECKSUM_HI;
        if fits(extra_isize(raw, g), I_CHECKSUM_HI, 2) {
            c = crc32c(c, &[0, 0]);
            rest += 2;
        }
        c = crc32c(c, &raw[rest..g.inode_size]);
    }
    c
}

/// crc32c (Castagnoli) without the customary pre- and post-inversion, as ext4 chains it.
pub fn crc32c(mut crc: u32, data: &[u8]) -> u32 {
    for &b in data {
        crc = CRC32C_TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    crc
}

const CRC32C_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0x82F6_3B78 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// Clamps every in-use inode's times of the ext4 filesystem at byte `offset` of `file` to
/// `epoch`. Returns how many inodes it rewrote.
pub fn clamp_times(file: &File, offset: u64, epoch: u32) -> Result<u64, String> {
    if i32::try_from(epoch).is_err() {
        return Err(format!(
            "epoch {epoch} is past 2038, which needs ext4's extra time bits"
        ));
    }
    let read = |at: u64, buf: &mut [u8]| {
        let pos = offset.checked_add(at).ok_or("offset overflows")?;
        file.read_exact_at(buf, pos)
            .map_err(|e| format!("cannot read {} bytes at {pos}: {e}", buf.len()))
    };
    let mut sb = [0u8; 1024];
    read(SUPERBLOCK_OFFSET, &mut sb)?;
    let g = Geometry::parse(&sb)?;
    let gdt_at = (g.first_data_block + 1) * g.block_size;
    let mut gdt = vec![0u8; usize::try_from(g.groups).map_err(|_| "too many groups")? * g.desc_size];
    read(gdt_at, &mut gdt)?;
    let per_group = g.inodes_per_group as usize;
    let table_len = per_group
        .checked_mul(g.inode_size)
        .filter(|n| *n <= 1 << 28)
        .ok_or("inode table too large")?;
    let mut bitmap = vec![0u8; g.block_size as usize];
    let mut table = vec![0u8; table_len];
    let mut touched = 0;
    for group in 0..g.groups {
        let d = &gdt[group as usize * g.desc_size..][..g.desc_size];
        if u16_at(d, 0x12) & BG_INODE_UNINIT != 0 {
            continue;
        }
        let hi = |at: usize| {
            if g.desc_size >= 64 {
                u64::from(u32_at(d, at)) << 32
            } else {
                0
            }
        };
        let bitmap_block = u64::from(u32_at(d, 0x04)) | hi(0x24);
        let table_block = u64::from(u32_at(d, 0x08)) | hi(0x28);
        let block = |b: u64| b.checked_mul(g.block_size).ok_or("block number overflows");
        read(block(bitmap_block)?, &mut bitmap)?;
        read(block(table_block)?, &mut table)?;
        let mut changed = false;
        for i in 0..per_group.min(bitmap.len() * 8) {
            if bitmap[i / 8] & (1 << (i % 8)) == 0 {
                continue;
            }
            let ino = (group as u32)
                .checked_mul(g.inodes_per_group)
                .and_then(|n| n.checked_add(i as u32 + 1))
                .ok_or("inode number overflows")?;
            if clamp_inode(&mut table[i * g.inode_size..][..g.inode_size], ino, &g, epoch) {
                touched += 1;
                changed = true;
            }
        }
        if changed {
            let pos = offset + block(table_block)?;
            file.write_all_at(&table, pos)
                .map_err(|e| format!("cannot write the inode table at {pos}: {e}"))?;
        }
    }
    Ok(touched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(csum: bool) -> Geometry {
        Geometry {
            block_size: 4096,
            first_data_block: 0,
            groups: 1,
            inodes_per_group: 16,
            inode_size: 256,
            first_ino: 11,
            desc_size: 64,
            csum_seed: csum.then_some(0x1234_5678),
        }
    }

    fn inode(mode: u16, mtime: u32) -> Vec<u8> {
        let mut raw = vec![0u8; 256];
        put_u16(&mut raw, I_MODE, mode);
        put_u32(&mut raw, I_MTIME, mtime);
        put_u32(&mut raw, I_ATIME, mtime + 7);
        put_u32(&mut raw, I_CTIME, mtime + 9);
        put_u16(&mut raw, I_EXTRA_ISIZE, 32);
        put_u32(&mut raw, I_MTIME_EXTRA, 0x3fff_fffc);
        raw
    }

    /// The standard check value of CRC-32C (with the usual inversions applied around it).
    #[test]
    fn crc32c_check_value() {
        assert_eq!(!crc32c(!0, b"123456789"), 0xE306_9283);
    }

    #[test]
    fn clamp_inode_newer_mtime_clamped_all_times_epoch() {
        let mut raw = inode(0o100644, 2_000_000_000);

        assert!(clamp_inode(&mut raw, 12, &geometry(false), 1_700_000_000));

        for f in [I_MTIME, I_ATIME, I_CTIME, I_CRTIME] {
            assert_eq!(u32_at(&raw, f), 1_700_000_000, "field {f:#x}");
        }
        assert_eq!(u32_at(&raw, I_MTIME_EXTRA), 0);
    }

    #[test]
    fn clamp_inode_mtime_past_2038_clamped() {
        let mut raw = inode(0o100644, 100);
        put_u32(&mut raw, I_MTIME_EXTRA, 1);

        clamp_inode(&mut raw, 12, &geometry(false), 1_700_000_000);

        assert_eq!((u32_at(&raw, I_MTIME), u32_at(&raw, I_MTIME_EXTRA)), (1_700_000_000, 0));
    }

    #[test]
    fn clamp_inode_mtime_before_1970_kept() {
        let mut raw = inode(0o100644, 0);
        put_u32(&mut raw, I_MTIME, (-86_400i32) as u32);
        put_u32(&mut raw, I_MTIME_EXTRA, 0);

        clamp_inode(&mut raw, 12, &geometry(false), 1_700_000_000);

        assert_eq!(u32_at(&raw, I_MTIME) as i32, -86_400);
    }

    #[test]
    fn clamp_times_epoch_past_2038_refused() {
        let f = tempfile::tempfile().unwrap();

        assert!(clamp_times(&f, 0, u32::MAX).unwrap_err().contains("2038"));
    }

    #[test]
    fn clamp_inode_older_mtime_kept() {
        let mut raw = inode(0o100644, 1_600_000_000);

        clamp_inode(&mut raw, 12, &geometry(false), 1_700_000_000);

        assert_eq!(u32_at(&raw, I_MTIME), 1_600_000_000);
    }

    #[test]
    fn clamp_inode_free_or_reserved_untouched() {
        let (mut free, mut journal) = (inode(0, 2_000_000_000), inode(0o100600, 2_000_000_000));
        let (free0, journal0) = (free.clone(), journal.clone());

        assert!(!clamp_inode(&mut free, 12, &geometry(true), 1));
        assert!(!clamp_inode(&mut journal, 8, &geometry(true), 1));
        assert_eq!((free, journal), (free0, journal0));
    }

    #[test]
    fn clamp_inode_same_input_times_differ_same_bytes() {
        let (mut a, mut b) = (inode(0o40755, 2_000_000_000), inode(0o40755, 2_000_000_500));

        clamp_inode(&mut a, 2, &geometry(true), 1_700_000_000);
        clamp_inode(&mut b, 2, &geometry(true), 1_700_000_000);

        assert_eq!(a, b);
    }

    #[test]
    fn clamp_inode_checksum_covers_result() {
        let g = geometry(true);
        let mut raw = inode(0o100644, 2_000_000_000);

        clamp_inode(&mut raw, 12, &g, 1_700_000_000);

        let stored = u32::from(u16_at(&raw, I_CHECKSUM_LO)) | u32::from(u16_at(&raw, I_CHECKSUM_HI)) << 16;
        assert_eq!(stored, inode_checksum(&raw, 12, &g, 0x1234_5678));
    }

    #[test]
    fn parse_bad_magic_refused() {
        assert!(Geometry::parse(&[0u8; 1024]).is_err());
    }

    #[test]
    fn parse_zero_inodes_per_group_refused() {
        let mut sb = [0u8; 1024];
        put_u16(&mut sb, 0x38, EXT4_MAGIC);
        put_u32(&mut sb, 0x04, 100);
        put_u32(&mut sb, 0x20, 8);

        assert!(Geometry::parse(&sb).is_err());
    }
}
