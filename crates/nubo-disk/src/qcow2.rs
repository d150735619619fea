//! The qcow2 header codec (docs/interop/qcow2.txt in QEMU's tree). Pure and bounds-checked:
//! the bytes come from images nubo did not make, so every offset is checked before use and no
//! input makes it panic (the fuzz target in `fuzz/` holds it to that).

use serde::Serialize;

use crate::error::HeaderError;
use crate::Format;

pub const MAGIC: &[u8; 4] = b"QFI\xfb";

pub(crate) const V2_HEADER_LEN: usize = 72;
pub(crate) const V3_MIN_HEADER_LEN: usize = 104;
/// qemu stores at most this many bytes of a backing file name (`bs->backing_file` is 1024).
pub const MAX_BACKING_NAME: usize = 1023;
/// qemu keeps the backing format in a 16-byte C string.
const MAX_BACKING_FORMAT: u32 = 15;
const MIN_CLUSTER_BITS: u32 = 9;
const MAX_CLUSTER_BITS: u32 = 21;

pub(crate) const EXT_END: u32 = 0;
pub(crate) const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
pub(crate) const EXT_FEATURE_TABLE: u32 = 0x6803_f857;
pub(crate) const EXT_DATA_FILE: u32 = 0x4441_5441;
const FEATURE_ENTRY_LEN: usize = 48;

/// Incompatible feature bits qemu 10 defines; any other set bit means "do not open".
pub const INCOMPAT_DIRTY: u64 = 1 << 0;
pub const INCOMPAT_CORRUPT: u64 = 1 << 1;
pub const INCOMPAT_DATA_FILE: u64 = 1 << 2;
pub const INCOMPAT_COMPRESSION: u64 = 1 << 3;
pub const INCOMPAT_EXTL2: u64 = 1 << 4;
pub const INCOMPAT_KNOWN: u64 =
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTL2;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CryptMethod {
    None,
    Aes,
    Luks,
    Unknown(u32),
}

impl CryptMethod {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => CryptMethod::None,
            1 => CryptMethod::Aes,
            2 => CryptMethod::Luks,
            other => CryptMethod::Unknown(other),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureKind {
    Incompatible,
    Compatible,
    Autoclear,
    Unknown(u8),
}

/// One entry of the feature name table extension: how the image names its own feature bits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FeatureName {
    pub kind: FeatureKind,
    pub bit: u8,
    pub name: String,
}

/// A header extension seen, known or not (qemu ignores unknown ones; so does nubo).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Extension {
    pub kind: u32,
    pub offset: usize,
    pub len: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Qcow2Header {
    pub version: u32,
    pub backing_file_offset: u64,
    /// The backing file name exactly as stored; relative names are relative to the image's dir.
    pub backing_file: Option<String>,
    /// The backing-format extension (`qcow2`, `raw`, ...), when the image records one.
    pub backing_format: Option<String>,
    pub cluster_bits: u32,
    pub virtual_size: u64,
    pub crypt_method: CryptMethod,
    pub l1_size: u32,
    pub l1_table_offset: u64,
    pub refcount_table_offset: u64,
    pub refcount_table_clusters: u32,
    pub nb_snapshots: u32,
    pub snapshots_offset: u64,
    pub incompatible_features: u64,
    pub compatible_features: u64,
    pub autoclear_features: u64,
    /// log2 of the refcount width in bits; version 2 images are always 4 (16-bit).
    pub refcount_order: u32,
    pub header_length: u32,
    /// 0 = zlib, 1 = zstd; meaningful only with [`INCOMPAT_COMPRESSION`].
    pub compression_type: u8,
    /// The external data file name (with [`INCOMPAT_DATA_FILE`]).
    pub data_file: Option<String>,
    pub feature_names: Vec<FeatureName>,
    pub extensions: Vec<Extension>,
}

impl Qcow2Header {
    pub fn cluster_size(&self) -> u32 {
        1 << self.cluster_bits
    }

    /// qemu-img's `compat` string.
    pub fn compat(&self) -> &'static str {
        if self.version == 2 {
            "0.10"
        } else {
            "1.1"
        }
    }

    /// Incompatible feature bits qemu 10 does not define.
    pub fn unknown_incompatible(&self) -> u64 {
        self.incompatible_features & !INCOMPAT_KNOWN
    }
}

/// Parses a qcow2 header from the start of an image. `bytes` must hold the header, its
/// extensions and the backing file name; the whole first cluster always suffices, since qcow2
/// keeps all of them there.
pub fn parse_qcow2_header(bytes: &[u8]) -> Result<Qcow2Header, HeaderError> {
    let r = Reader(bytes);
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(HeaderError::BadMagic { format: Format::Qcow2 });
    }
    let version = r.be32(4)?;
    if version != 2 && version != 3 {
        return Err(HeaderError::Version(version));
    }
    r.need(V2_HEADER_LEN)?;
    let cluster_bits = r.be32(20)?;
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&cluster_bits) {
        return Err(HeaderError::ClusterBits(cluster_bits));
    }
    let cluster = 1u32 << cluster_bits;
    let mut h = Qcow2Header {
        version,
        backing_file_offset: r.be64(8)?,
        backing_file: None,
        backing_format: None,
        cluster_bits,
        virtual_size: r.be64(24)?,
        crypt_method: CryptMethod::from_raw(r.be32(32)?),
        l1_size: r.be32(36)?,
        l1_table_offset: r.be64(40)?,
        refcount_table_offset: r.be64(48)?,
        refcount_table_clusters: r.be32(56)?,
        nb_snapshots: r.be32(60)?,
        snapshots_offset: r.be64(64)?,
        incompatible_features: 0,
        compatible_features: 0,
        autoclear_features: 0,
        refcount_order: 4,
        header_length: V2_HEADER_LEN as u32,
        compression_type: 0,
        data_file: None,
        feature_names: Vec::new(),
        extensions: Vec::new(),
    };
    if version == 3 {
        r.need(V3_MIN_HEADER_LEN)?;
        h.incompatible_features = r.be64(72)?;
        h.compatible_features = r.be64(80)?;
        h.autoclear_features = r.be64(88)?;
        h.refcount_order = r.be32(96)?;
        h.header_length = r.be32(100)?;
        let len = h.header_length;
        if (len as usize) < V3_MIN_HEADER_LEN || !len.is_multiple_of(8) || len > cluster {
            return Err(HeaderError::HeaderLength { len, cluster });
        }
        r.need(len as usize)?;
        if len as usize > V3_MIN_HEADER_LEN {
            h.compression_type = r.u8(V3_MIN_HEADER_LEN)?;
        }
        if h.refcount_order > 6 {
            return Err(HeaderError::RefcountOrder(h.refcount_order));
        }
    }
    let backing_len = r.be32(16)?;
    // Extensions run from the end of the header to the backing file name, or to the end of
    // the first cluster when there is none (qemu's `ext_end`).
    let ext_end = if h.backing_file_offset != 0 {
        let end = h.backing_file_offset.checked_add(u64::from(backing_len));
        let fits = backing_len as usize <= MAX_BACKING_NAME
            && h.backing_file_offset >= u64::from(h.header_length)
            && end.is_some_and(|e| e <= u64::from(cluster));
        if !fits {
            return Err(HeaderError::BackingName {
                offset: h.backing_file_offset,
                len: backing_len,
            });
        }
        let start = h.backing_file_offset as usize;
        let name = r.slice(start, backing_len as usize)?;
        h.backing_file = Some(text(name, "backing file name")?);
        start
    } else {
        cluster as usize
    };
    parse_extensions(&r, &mut h, ext_end)?;
    Ok(h)
}

fn parse_extensions(r: &Reader<'_>, h: &mut Qcow2Header, ext_end: usize) -> Result<(), HeaderError> {
    let mut off = h.header_length as usize;
    while off.checked_add(8).is_some_and(|e| e <= ext_end) {
        let kind = r.be32(off)?;
        let len = r.be32(off + 4)?;
        if kind == EXT_END {
            break;
        }
        let data_at = off + 8;
        let padded = (len as usize).checked_next_multiple_of(8);
        let next = padded.and_then(|p| data_at.checked_add(p)).filter(|&n| n <= ext_end);
        let Some(next) = next else {
            return Err(HeaderError::Extension { kind, offset: off, len });
        };
        let data = r.slice(data_at, len as usize)?;
        if h.extensions.iter().any(|e| e.kind == kind) && kind != 0 {
            return Err(HeaderError::DuplicateExtension { kind });
        }
        h.extensions.push(crate::qcow2::Extension { kind, offset: off, len });
        match kind {
            EXT_BACKING_FORMAT => {
                if len > MAX_BACKING_FORMAT {
                    return Err(HeaderError::BackingFormatLength(len));
                }
                h.backing_format = Some(text(data, "backing format name")?);
            }
            EXT_DATA_FILE => h.data_file = Some(text(data, "data file name")?),
            EXT_FEATURE_TABLE => h.feature_names = feature_table(data),
            _ => {}
        }
        off = next;
    }
    Ok(())
}

fn feature_table(data: &[u8]) -> Vec<FeatureName> {
    data.chunks_exact(FEATURE_ENTRY_LEN)
        .map(|e| {
            let kind = match e[0] {
                0 => FeatureKind::Incompatible,
                1 => FeatureKind::Compatible,
                2 => FeatureKind::Autoclear,
                other => FeatureKind::Unknown(other),
            };
            let name = &e[2..];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            FeatureName {
                kind,
                bit: e[1],
                name: String::from_utf8_lossy(name).into_owned(),
            }
        })
        .collect()
}

/// Names nubo hands to qemu or prints must be UTF-8 with no NUL, which would cut a C string.
fn text(bytes: &[u8], what: &'static str) -> Result<String, HeaderError> {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.contains('\0') => Ok(s.to_owned()),
        _ => Err(HeaderError::Encoding { what }),
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn need(&self, n: usize) -> Result<(), HeaderError> {
        if self.0.len() < n {
            return Err(HeaderError::Truncated {
                format: Format::Qcow2,
                need: n,
                got: self.0.len(),
            });
        }
        Ok(())
    }

    fn slice(&self, at: usize, len: usize) -> Result<&[u8], HeaderError> {
        let end = at.checked_add(len).ok_or(HeaderError::Truncated {
            format: Format::Qcow2,
            need: usize::MAX,
            got: self.0.len(),
        })?;
        self.need(end)?;
        Ok(&self.0[at..end])
    }

    fn u8(&self, at: usize) -> Result<u8, HeaderError> {
        Ok(self.slice(at, 1)?[0])
    }

    fn be32(&self, at: usize) -> Result<u32, HeaderError> {
        let b = self.slice(at, 4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn be64(&self, at: usize) -> Result<u64, HeaderError> {
        let b = self.slice(at, 8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-made header: `fields` are (offset, big-endian bytes) over a zeroed buffer.
    fn header(len: usize, fields: &[(usize, &[u8])]) -> Vec<u8> {
        let mut b = vec![0u8; len];
        b[..4].copy_from_slice(MAGIC);
        for (at, bytes) in fields {
            b[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        b
    }

    fn v3(extra: &[(usize, &[u8])]) -> Vec<u8> {
        let mut fields: Vec<(usize, &[u8])> = vec![
            (4, &[0, 0, 0, 3]),
            (20, &[0, 0, 0, 16]),
            (24, &[0, 0, 0, 1, 0, 0, 0, 0]), // 4 GiB
            (96, &[0, 0, 0, 4]),
            (100, &[0, 0, 0, 112]),
        ];
        fields.extend_from_slice(extra);
        header(4096, &fields)
    }

    #[test]
    fn parse_v2_header_reads_fields_and_backing() {
        let bytes = header(
            512,
            &[
                (4, &[0, 0, 0, 2]),
                (8, &[0, 0, 0, 0, 0, 0, 0, 72]),
                (16, &[0, 0, 0, 8]),
                (20, &[0, 0, 0, 12]),
                (24, &[0, 0, 0, 0, 0, 0x10, 0, 0]),
                (72, b"base.img"),
            ],
        );

        let h = parse_qcow2_header(&bytes).unwrap();

        assert_eq!(h.version, 2);
        assert_eq!(h.compat(), "0.10");
        assert_eq!(h.cluster_size(), 4096);
        assert_eq!(h.virtual_size, 1 << 20);
        assert_eq!(h.backing_file.as_deref(), Some("base.img"));
        assert_eq!(h.refcount_order, 4);
        assert_eq!(h.header_length, 72);
    }

    #[test]
    fn parse_v3_header_reads_features_and_extensions() {
        let mut ext = Vec::new();
        ext.extend_from_slice(&EXT_BACKING_FORMAT.to_be_bytes());
        ext.extend_from_slice(&5u32.to_be_bytes());
        ext.extend_from_slice(b"qcow2\0\0\0");
        ext.extend_from_slice(&EXT_FEATURE_TABLE.to_be_bytes());
        ext.extend_from_slice(&48u32.to_be_bytes());
        let mut entry = [0u8; 48];
        entry[0] = 1;
        entry[2..16].copy_from_slice(b"lazy refcounts");
        ext.extend_from_slice(&entry);
        ext.extend_from_slice(&[0u8; 8]);
        let name_at = (112 + ext.len()) as u64;
        let bytes = v3(&[
            (8, &name_at.to_be_bytes()),
            (16, &[0, 0, 0, 4]),
            (72, &[0, 0, 0, 0, 0, 0, 0, 1]),
            (80, &[0, 0, 0, 0, 0, 0, 0, 1]),
            (104, &[1]),
            (112, &ext),
            (name_at as usize, b"/b/x"),
        ]);

        let h = parse_qcow2_header(&bytes).unwrap();

        assert_eq!(h.compat(), "1.1");
        assert_eq!(h.virtual_size, 4 << 30);
        assert_eq!(h.backing_file.as_deref(), Some("/b/x"));
        assert_eq!(h.backing_format.as_deref(), Some("qcow2"));
        assert_eq!(h.incompatible_features, INCOMPAT_DIRTY);
        assert_eq!(h.compatible_features, 1);
        assert_eq!(h.compression_type, 1);
        assert_eq!(
            h.feature_names,
            vec![FeatureName {
                kind: FeatureKind::Compatible,
                bit: 0,
                name: "lazy refcounts".into()
            }]
        );
        assert_eq!(h.extensions.len(), 2);
    }

    #[test]
    fn parse_unknown_extension_is_skipped() {
        let bytes = v3(&[(112, &[0x12, 0x34, 0x56, 0x78, 0, 0, 0, 3]), (120, b"abc")]);

        let h = parse_qcow2_header(&bytes).unwrap();

        assert_eq!(
            h.extensions,
            vec![Extension {
                kind: 0x1234_5678,
                offset: 112,
                len: 3
            }]
        );
        assert_eq!(h.backing_format, None);
    }

    #[test]
    fn parse_bad_magic_is_rejected() {
        assert_eq!(
            parse_qcow2_header(b"QFI\xfa\0\0\0\x03"),
            Err(HeaderError::BadMagic { format: Format::Qcow2 })
        );
    }

    #[test]
    fn parse_version_4_is_unsupported() {
        let err = parse_qcow2_header(&header(512, &[(4, &[0, 0, 0, 4])])).unwrap_err();

        assert_eq!(err, HeaderError::Version(4));
        assert_eq!(err.kind(), nubo_core::ErrorKind::Unsupported);
    }

    #[test]
    fn parse_cluster_bits_out_of_range_is_rejected() {
        let bytes = v3(&[(20, &[0, 0, 0, 22])]);

        assert_eq!(parse_qcow2_header(&bytes), Err(HeaderError::ClusterBits(22)));
    }

    #[test]
    fn parse_truncated_v3_is_rejected() {
        let bytes = &v3(&[])[..80];

        assert!(matches!(
            parse_qcow2_header(bytes),
            Err(HeaderError::Truncated { need: 104, got: 80, .. })
        ));
    }

    #[test]
    fn parse_header_length_not_multiple_of_8_is_rejected() {
        let bytes = v3(&[(100, &[0, 0, 0, 108])]);

        assert!(matches!(
            parse_qcow2_header(&bytes),
            Err(HeaderError::HeaderLength { len: 108, .. })
        ));
    }

    /// Regression (fuzz crash-0e906c09): a header_length equal to the cluster size, past the end
    /// of the input, was accepted because the extension loop had no room to run.
    #[test]
    fn parse_header_length_past_input_is_truncated() {
        let bytes = &v3(&[(100, &[0, 0, 0x10, 0])])[..1024];

        assert!(matches!(
            parse_qcow2_header(bytes),
            Err(HeaderError::Truncated {
                need: 4096,
                got: 1024,
                ..
            })
        ));
    }

    #[test]
    fn parse_refcount_order_7_is_rejected() {
        let bytes = v3(&[(96, &[0, 0, 0, 7])]);

        assert_eq!(parse_qcow2_header(&bytes), Err(HeaderError::RefcountOrder(7)));
    }

    #[test]
    fn parse_backing_name_past_cluster_is_rejected() {
        let bytes = v3(&[(8, &65530u64.to_be_bytes()), (16, &[0, 0, 0, 10])]);

        assert!(matches!(
            parse_qcow2_header(&bytes),
            Err(HeaderError::BackingName { offset: 65530, len: 10 })
        ));
    }

    #[test]
    fn parse_backing_name_over_1023_bytes_is_rejected() {
        let bytes = v3(&[(8, &512u64.to_be_bytes()), (16, &1024u32.to_be_bytes())]);

        assert!(matches!(
            parse_qcow2_header(&bytes),
            Err(HeaderError::BackingName { len: 1024, .. })
        ));
    }

    #[test]
    fn parse_backing_name_with_nul_is_rejected() {
        let bytes = v3(&[(8, &512u64.to_be_bytes()), (16, &[0, 0, 0, 3]), (512, b"a\0b")]);

        assert_eq!(
            parse_qcow2_header(&bytes),
            Err(HeaderError::Encoding {
                what: "backing file name"
            })
        );
    }

    #[test]
    fn parse_backing_name_inside_header_is_rejected() {
        let bytes = v3(&[(8, &8u64.to_be_bytes()), (16, &[0, 0, 0, 4])]);

        assert!(matches!(
            parse_qcow2_header(&bytes),
            Err(HeaderError::BackingName { offset: 8, .. })
        ));
    }

    #[test]
    fn parse_extension_overrunning_area_is_rejected() {
        let bytes = v3(&[(112, &[0, 0, 0, 9, 0xff, 0xff, 0xff, 0xff])]);

        assert!(matches!(
            parse_qcow2_header(&bytes),
            Err(HeaderError::Extension {
                kind: 9,
                offset: 112,
                ..
            })
        ));
    }

    #[test]
    fn parse_duplicate_backing_format_is_rejected() {
        let one: &[u8] = &[0xe2, 0x79, 0x2a, 0xca, 0, 0, 0, 3, b'r', b'a', b'w', 0, 0, 0, 0, 0];
        let bytes = v3(&[(112, one), (128, one)]);

        assert_eq!(
            parse_qcow2_header(&bytes),
            Err(HeaderError::DuplicateExtension {
                kind: EXT_BACKING_FORMAT
            })
        );
    }

    #[test]
    fn parse_backing_format_over_15_bytes_is_rejected() {
        let bytes = v3(&[(112, &[0xe2, 0x79, 0x2a, 0xca, 0, 0, 0, 16])]);

        assert_eq!(parse_qcow2_header(&bytes), Err(HeaderError::BackingFormatLength(16)));
    }

    #[test]
    fn parse_extensions_running_to_truncated_input_are_rejected() {
        let bytes = &v3(&[(112, &[0, 0, 0, 9, 0, 0, 0, 8])])[..124];

        assert!(matches!(parse_qcow2_header(bytes), Err(HeaderError::Truncated { .. })));
    }

    #[test]
    fn parse_crypt_method_and_unknown_features_are_reported() {
        let bytes = v3(&[(32, &[0, 0, 0, 2]), (72, &[0, 0, 0, 0, 0, 0, 1, 0])]);

        let h = parse_qcow2_header(&bytes).unwrap();

        assert_eq!(h.crypt_method, CryptMethod::Luks);
        assert_eq!(h.unknown_incompatible(), 0x100);
    }
}
