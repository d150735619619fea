//! Crate-level tests: the public API end to end (build -> read), determinism, and properties.

use proptest::prelude::*;

use super::*;

fn spec() -> SeedSpec {
    SeedSpec {
        instance_id: "iid-local01".into(),
        local_hostname: "web-1".into(),
        user_data: Some(b"#cloud-config\nruncmd:\n  - [touch, /run/nubo-marker]\n".to_vec()),
        network_config: Some(b"version: 2\nethernets: {}\n".to_vec()),
        vendor_data: None,
    }
}

fn names(files: &[SeedFile]) -> Vec<&str> {
    files.iter().map(|f| f.name.as_str()).collect()
}

/// FNV-1a: a dependency-free digest for the golden image below.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[test]
fn build_iso_reads_back_spec_files() {
    let img = build(&spec(), SeedFormat::Iso).unwrap();

    let files = read(&img).unwrap();

    assert_eq!(names(&files), ["meta-data", "network-config", "user-data"]);
    assert_eq!(files[0].data, b"instance-id: iid-local01\nlocal-hostname: web-1\n");
    assert_eq!(files[2].data, spec().user_data.unwrap());
}

#[test]
fn build_iso_golden_bytes_are_stable() {
    let img = build(&spec(), SeedFormat::Iso).unwrap();

    // Changes only when the layout changes on purpose: update it then, and say why in the commit.
    assert_eq!((img.len(), fnv1a(&img)), (28 * 2048, 0x7d4c_45ff_f273_62ad));
}

#[test]
fn build_iso_twice_gives_identical_bytes() {
    let (a, b) = (
        build(&spec(), SeedFormat::Iso).unwrap(),
        build(&spec(), SeedFormat::Iso).unwrap(),
    );

    assert_eq!(a, b);
}

#[test]
fn build_iso_no_user_data_writes_empty_user_data() {
    let s = SeedSpec {
        user_data: None,
        network_config: None,
        ..spec()
    };

    let files = read(&build(&s, SeedFormat::Iso).unwrap()).unwrap();

    assert_eq!(names(&files), ["meta-data", "user-data"]);
    assert!(files[1].data.is_empty());
}

#[test]
fn build_iso_non_ascii_hostname_is_refused() {
    let s = SeedSpec {
        local_hostname: "héllo".into(),
        ..spec()
    };

    let err = build(&s, SeedFormat::Iso).unwrap_err();

    assert!(matches!(err, SeedError::InvalidHostname { .. }), "{err}");
}

#[test]
fn write_iso_matches_build() {
    let mut streamed = Vec::new();

    write_iso(&spec(), &mut streamed).unwrap();

    assert_eq!(streamed, build(&spec(), SeedFormat::Iso).unwrap());
}

#[test]
fn build_vfat_reads_back_spec_files() {
    let img = build(&spec(), SeedFormat::Vfat).unwrap();

    let files = read(&img).unwrap();

    assert_eq!(names(&files), ["meta-data", "network-config", "user-data"]);
    assert_eq!(files[2].data, spec().user_data.unwrap());
}

#[test]
fn sniff_iso_and_vfat_are_told_apart() {
    let iso = build(&spec(), SeedFormat::Iso).unwrap();
    let vfat = build(&spec(), SeedFormat::Vfat).unwrap();

    assert_eq!(
        (SeedFormat::sniff(&iso), SeedFormat::sniff(&vfat)),
        (Some(SeedFormat::Iso), Some(SeedFormat::Vfat))
    );
}

#[test]
fn read_garbage_is_unknown_image() {
    let err = read(b"not an image").unwrap_err();

    assert!(matches!(err, SeedError::UnknownImage { .. }), "{err}");
}

#[test]
fn seed_format_serde_is_lowercase() {
    assert_eq!(serde_json_like(SeedFormat::Vfat), "vfat");
}

fn serde_json_like(f: SeedFormat) -> String {
    f.to_string()
}

fn payload() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop::option::of(prop::collection::vec(any::<u8>(), 0..5000))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn build_then_read_returns_inputs(
        user_data in payload(),
        network_config in payload(),
        vendor_data in payload(),
        vfat in any::<bool>(),
    ) {
        let s = SeedSpec { user_data: user_data.clone(), network_config: network_config.clone(), vendor_data: vendor_data.clone(), ..spec() };
        let format = if vfat { SeedFormat::Vfat } else { SeedFormat::Iso };

        let files = read(&build(&s, format).unwrap()).unwrap();

        let mut want = seed_files(&s).unwrap();
        want.sort_by(|a, b| a.name.cmp(&b.name));
        prop_assert_eq!(files, want);
    }

    #[test]
    fn iso_arbitrary_names_round_trip(names in prop::collection::btree_set("[a-zA-Z0-9._ -]{1,40}", 1..40)) {
        let files: Vec<SeedFile> = names.iter().filter(|n| !n.ends_with('.'))
            .map(|n| SeedFile { name: n.clone(), data: n.as_bytes().to_vec() }).collect();
        let mut img = Vec::new();

        write_iso_files(&files, &mut img).unwrap();

        prop_assert_eq!(read_iso(&img).unwrap(), files);
    }
}
