//! Hand-made headers for every format: what is accepted, and every refusal naming its cause.

use super::*;
use crate::layout::{layout, BackingRef};

fn put(b: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    if b.len() < at + bytes.len() {
        b.resize(at + bytes.len(), 0);
    }
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The bytes of a qcow2 image nubo's own layout makes (sparse regions as zeros).
fn qcow2_image(size: u64, backing: Option<BackingRef<'_>>) -> Vec<u8> {
    let l = layout(size, backing).unwrap();
    let mut b = vec![0u8; l.len as usize];
    for (at, data) in &l.writes {
        put(&mut b, *at as usize, data);
    }
    b
}

fn rejected(bytes: &[u8]) -> Rejection {
    match inspect_image(bytes) {
        Err(InspectError::Rejected(r)) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// A VDI header of `image_type` (1 dynamic, 2 static, 4 differencing) and `size` bytes.
pub(crate) fn vdi_image(image_type: u32, size: u64) -> Vec<u8> {
    let mut b = vec![0u8; 0x400];
    put(&mut b, 0x40, &VDI_SIGNATURE);
    put(&mut b, 0x44, &0x0001_0001u32.to_le_bytes());
    put(&mut b, 0x4c, &image_type.to_le_bytes());
    put(&mut b, 0x154, &0x200u32.to_le_bytes());
    put(&mut b, 0x158, &0x400u32.to_le_bytes());
    put(&mut b, 0x170, &size.to_le_bytes());
    put(&mut b, 0x178, &(1u32 << 20).to_le_bytes());
    put(&mut b, 0x180, &1u32.to_le_bytes());
    b
}

const DESCRIPTOR: &str = "# Disk DescriptorFile\nversion=1\nCID=12345678\nparentCID=ffffffff\ncreateType=\"monolithicSparse\"\n\n# Extent description\nRW 2048 SPARSE \"disk.vmdk\"\n";

/// A monolithicSparse VMDK of 2048 sectors with `descriptor` embedded at sector 1.
fn vmdk_image(descriptor: &str, capacity: u64) -> Vec<u8> {
    let mut b = b"KDMV".to_vec();
    put(&mut b, 4, &1u32.to_le_bytes());
    put(&mut b, 12, &capacity.to_le_bytes());
    put(&mut b, 20, &128u64.to_le_bytes());
    put(&mut b, 28, &1u64.to_le_bytes());
    put(&mut b, 36, &20u64.to_le_bytes());
    put(&mut b, 56, &21u64.to_le_bytes());
    put(&mut b, 512, descriptor.as_bytes());
    put(&mut b, 22 * 512, &[0]);
    b
}

#[test]
fn inspect_image_nubo_qcow2_is_accepted_as_base() {
    let img = qcow2_image(1 << 30, None);

    let found = inspect_image(&img[..]).unwrap();

    assert_eq!(
        (found.format, found.usage, found.virtual_size, found.cluster_size),
        (Format::Qcow2, Usage::Base, 1 << 30, Some(65536))
    );
}

#[test]
fn inspect_image_qcow2_with_backing_is_refused_naming_it() {
    let img = qcow2_image(
        1 << 20,
        Some(BackingRef {
            name: "/etc/shadow",
            driver: "raw",
        }),
    );

    let r = rejected(&img);

    assert_eq!(r, Rejection::Backing("/etc/shadow".into()));
    assert!(r.to_string().contains("/etc/shadow"), "{r}");
}

#[test]
fn inspect_with_own_overlay_policy_reports_backing() {
    let img = qcow2_image(
        1 << 20,
        Some(BackingRef {
            name: "/var/lib/nubo/base",
            driver: "raw",
        }),
    );

    let found = inspect_with(&img[..], Policy::OwnOverlay).unwrap();

    assert_eq!(found.backing, Some(("/var/lib/nubo/base".into(), Format::Raw)));
}

#[test]
fn inspect_image_qcow2_data_file_bit_is_refused() {
    let mut img = qcow2_image(1 << 20, None);
    img[79] |= crate::qcow2::INCOMPAT_DATA_FILE as u8;

    assert!(matches!(rejected(&img), Rejection::DataFile(_)));
}

#[test]
fn inspect_image_qcow2_encrypted_is_refused() {
    let mut img = qcow2_image(1 << 20, None);
    img[35] = 2;

    assert_eq!(rejected(&img), Rejection::Encrypted);
}

#[test]
fn inspect_image_qcow2_unknown_incompatible_bit_is_refused() {
    let mut img = qcow2_image(1 << 20, None);
    img[78] = 1;

    assert_eq!(rejected(&img), Rejection::UnknownFeatures(0x100));
}

#[test]
fn inspect_image_qcow2_claiming_2_pow_63_bytes_is_refused() {
    let mut img = qcow2_image(1 << 20, None);
    put(&mut img, 24, &(1u64 << 63).to_be_bytes());

    assert!(matches!(rejected(&img), Rejection::VirtualSize { size, .. } if size == 1 << 63));
}

#[test]
fn inspect_image_qcow2_zero_size_is_refused() {
    let img = qcow2_image(0, None);

    assert!(matches!(rejected(&img), Rejection::VirtualSize { size: 0, .. }));
}

#[test]
fn inspect_image_truncated_qcow2_is_refused() {
    let img = qcow2_image(1 << 30, None);

    let r = rejected(&img[..70_000]);

    assert!(matches!(r, Rejection::OutOfBounds { .. }), "{r}");
}

#[test]
fn inspect_image_raw_with_qcow2_magic_says_invalid_qcow2() {
    let mut img = b"QFI\xfb\0\0\0\x07".to_vec();
    img.resize(4096, 0);

    let r = rejected(&img);

    assert!(matches!(r, Rejection::InvalidQcow2(_)));
    assert!(r.to_string().contains("not a valid qcow2 image"), "{r}");
    assert!(!r.to_string().contains("convert"), "{r}");
}

#[test]
fn inspect_image_qcow_v1_is_refused() {
    let mut img = b"QFI\xfb\0\0\0\x01".to_vec();
    img.resize(4096, 0);

    assert_eq!(rejected(&img), Rejection::Unsupported(Detected::QcowV1));
}

#[test]
fn inspect_image_every_refused_magic_is_named() {
    let cases: [(&[u8], usize, Detected); 9] = [
        (b"QED\0", 0, Detected::Qed),
        (b"COWD", 0, Detected::VmdkCowd),
        (b"WithoutFreeSpace", 0, Detected::Parallels),
        (b"WithouFreSpacExt", 0, Detected::Parallels),
        (b"LUKS\xba\xbe\0\x01", 0, Detected::Luks),
        (b"Bochs Virtual HD Image", 0, Detected::Bochs),
        (CLOOP_MAGIC, 0, Detected::Cloop),
        (b"koly", 4096 - 512, Detected::Dmg),
        (b"# Disk DescriptorFile\nversion=1\n", 0, Detected::VmdkDescriptor),
    ];
    for (magic, at, detected) in cases {
        let mut img = vec![0u8; 4096];
        put(&mut img, at, magic);

        let r = rejected(&img);

        assert_eq!(r, Rejection::Unsupported(detected));
        assert!(r.to_string().contains(detected.name()), "{r}");
    }
}

#[test]
fn inspect_image_flat_vmdk_descriptor_from_issue_is_refused() {
    let text = "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\nRW 1 FLAT \"/etc/shadow\" 0\n";

    let r = rejected(text.as_bytes());

    assert_eq!(r, Rejection::Unsupported(Detected::VmdkDescriptor));
}

#[test]
fn identify_descriptor_after_comments_and_blank_lines_is_vmdk() {
    let text = b"# made by hand\n\n   \n# more\nversion=2\r\nRW 1 FLAT \"/etc/shadow\" 0\n";

    assert_eq!(identify(text, text, text.len() as u64), Detected::VmdkDescriptor);
}

#[test]
fn inspect_image_sparse_vmdk_is_accepted() {
    let img = vmdk_image(DESCRIPTOR, 2048);

    let found = inspect_image(&img[..]).unwrap();

    assert_eq!(
        (found.format, found.usage, found.virtual_size),
        (Format::Vmdk, Usage::Base, 1 << 20)
    );
}

#[test]
fn inspect_image_sparse_vmdk_flat_extent_is_refused() {
    let desc = DESCRIPTOR.replace("RW 2048 SPARSE \"disk.vmdk\"", "RW 2048 FLAT \"/etc/shadow\" 0");

    let r = rejected(&vmdk_image(&desc, 2048));

    assert!(
        matches!(&r, Rejection::VmdkExtent(l) if l.contains("/etc/shadow")),
        "{r}"
    );
}

#[test]
fn inspect_image_sparse_vmdk_second_extent_is_refused() {
    let desc = format!("{DESCRIPTOR}RW 2048 SPARSE \"other.vmdk\"\n");

    assert!(matches!(rejected(&vmdk_image(&desc, 2048)), Rejection::VmdkExtent(_)));
}

#[test]
fn inspect_image_sparse_vmdk_parent_hint_is_refused() {
    let desc = DESCRIPTOR.replace(
        "parentCID=ffffffff",
        "parentCID=12345678\nparentFileNameHint=\"/etc/shadow\"",
    );

    assert!(matches!(rejected(&vmdk_image(&desc, 2048)), Rejection::VmdkParent(_)));
}

#[test]
fn inspect_image_sparse_vmdk_parent_hint_outside_descriptor_is_refused() {
    let mut img = vmdk_image(DESCRIPTOR, 2048);
    put(&mut img, 512 + 4000, b"parentFileNameHint=\"/etc/shadow\"");

    assert!(matches!(rejected(&img), Rejection::VmdkParent(_)));
}

#[test]
fn inspect_image_sparse_vmdk_other_create_type_is_refused() {
    let desc = DESCRIPTOR.replace("monolithicSparse", "twoGbMaxExtentSparse");

    assert_eq!(
        rejected(&vmdk_image(&desc, 2048)),
        Rejection::VmdkCreateType("twoGbMaxExtentSparse".into())
    );
}

/// QEMU reads a sparse header with capacity 0 and a descriptor offset as a descriptor file,
/// extents and all (the OpenStack CVE path).
#[test]
fn inspect_image_sparse_vmdk_zero_capacity_is_refused() {
    let desc = DESCRIPTOR.replace("RW 2048 SPARSE \"disk.vmdk\"", "RW 1 FLAT \"/etc/shadow\" 0");

    let r = rejected(&vmdk_image(&desc, 0));

    assert!(matches!(r, Rejection::VirtualSize { size: 0, .. }), "{r}");
}

#[test]
fn inspect_image_vdi_static_is_convert_only() {
    let found = inspect_image(&vdi_image(2, 64 << 20)[..]).unwrap();

    assert_eq!(
        (found.format, found.usage, found.virtual_size),
        (Format::Vdi, Usage::ConvertOnly, 64 << 20)
    );
}

#[test]
fn inspect_image_vdi_differencing_is_refused() {
    assert_eq!(
        rejected(&vdi_image(4, 64 << 20)),
        Rejection::Differencing(Detected::Vdi)
    );
}

fn vpc_footer(disk_type: u32) -> Vec<u8> {
    let mut b = b"conectix".to_vec();
    put(&mut b, 16, &512u64.to_be_bytes());
    put(&mut b, 28, b"win ");
    put(&mut b, 48, &(8u64 << 20).to_be_bytes());
    put(&mut b, 60, &disk_type.to_be_bytes());
    put(&mut b, 511, &[0]);
    b
}

#[test]
fn inspect_image_fixed_vhd_footer_at_end_is_convert_only() {
    let mut img = vec![0u8; 8 << 20];
    img.extend(vpc_footer(2));

    let found = inspect_image(&img[..]).unwrap();

    assert_eq!(
        (found.format, found.usage, found.virtual_size),
        (Format::Vpc, Usage::ConvertOnly, 8 << 20)
    );
}

#[test]
fn inspect_image_differencing_vhd_is_refused() {
    let mut img = vpc_footer(4);
    img.resize(4096, 0);

    assert_eq!(rejected(&img), Rejection::Differencing(Detected::Vpc));
}

#[test]
fn inspect_image_dynamic_vhd_table_past_end_is_refused() {
    let mut img = vpc_footer(3);
    put(&mut img, 512, b"cxsparse");
    put(&mut img, 512 + 16, &1536u64.to_be_bytes());
    put(&mut img, 512 + 28, &1_000_000u32.to_be_bytes());
    img.resize(4096, 0);

    assert!(matches!(rejected(&img), Rejection::OutOfBounds { .. }));
}

#[test]
fn inspect_image_vhdx_without_region_table_is_refused() {
    let mut img = b"vhdxfile".to_vec();
    img.resize(4096, 0);

    assert!(matches!(rejected(&img), Rejection::OutOfBounds { .. }));
}

#[test]
fn inspect_image_empty_is_refused() {
    assert_eq!(rejected(&[]), Rejection::Empty);
}

#[test]
fn inspect_image_raw_is_accepted_at_its_length() {
    let found = inspect_image(&[0x55u8; 3000][..]).unwrap();

    assert_eq!((found.format, found.virtual_size), (Format::Raw, 3000));
}

#[test]
fn inspect_image_iso_is_accepted_as_iso() {
    let mut img = vec![0u8; 40_000];
    put(&mut img, ISO_MAGIC_AT, b"CD001");

    assert_eq!(inspect_image(&img[..]).unwrap().format, Format::Iso);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    /// Any bytes: refused or accepted, never a panic; what is accepted is within bounds.
    #[test]
    fn inspect_image_any_bytes_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..4096)) {
        if let Ok(found) = inspect_image(&bytes[..]) {
            proptest::prop_assert!(found.virtual_size > 0 && found.virtual_size <= MAX_VIRTUAL_SIZE);
        }
    }

    /// Any magic followed by any bytes: every format's checker faces garbage.
    #[test]
    fn inspect_image_magic_then_garbage_never_panics(
        which in 0usize..8,
        rest in proptest::collection::vec(proptest::num::u8::ANY, 0..2048),
    ) {
        let magic: &[u8] = [&b"QFI\xfb\0\0\0\x03"[..], b"KDMV", b"vhdxfile", b"conectix", b"QED\0", b"COWD", b"LUKS\xba\xbe", b"QFI\xfb\0\0\0\x02"][which];
        let mut bytes = magic.to_vec();
        bytes.extend(rest);

        let _ = inspect_image(&bytes[..]);
    }

    /// A valid qcow2 cut anywhere before the end of its last table (the L1, 16 bytes at
    /// cluster 3) is refused, never accepted with tables past its end.
    #[test]
    fn inspect_image_truncated_qcow2_anywhere_is_refused(cut in 1usize..(3 * 65536 + 16)) {
        let img = qcow2_image(1 << 30, None);

        proptest::prop_assert!(inspect_image(&img[..cut]).is_err());
    }
}
