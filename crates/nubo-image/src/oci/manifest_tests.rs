use std::path::PathBuf;

use super::*;

const DISK: &str = "sha256:47060dc6c11b1684e7a6a1bed27dbe4f7268586f9a69e038b853ed197c0d0443";
const KERNEL_D: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const INITRD_D: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn record() -> ImageRecord {
    ImageRecord {
        reference: "debian:12".into(),
        digest: DISK.into(),
        path: PathBuf::from("/store/blobs/x.qcow2"),
        format: "qcow2".into(),
        size: 500367360,
        virtual_size: 2147483648,
        cloud_init: true,
        os: Some("debian".into()),
        release: Some("12".into()),
        arch: "x86_64".into(),
        firmware: vec![Firmware::Bios, Firmware::Efi],
        boot: Some(BootFiles {
            kernel: PathBuf::from("/store/boot/x/vmlinuz"),
            initrd: Some(PathBuf::from("/store/boot/x/initrd.img")),
            cmdline: "root=UUID=f648c552-979a-44a2-9ba2-0399dcfe7ff1 ro".into(),
        }),
        default_vcpus: 2,
        default_memory_mib: 1024,
        default_user: Some("debian".into()),
        hypervisor: None,
        source: ImageSource {
            url: Some("http://deb.example/debian".into()),
            recipe: Some("sha256:a77f".into()),
            ..ImageSource::new(SourceKind::Bootstrap)
        },
        verified: true,
        created: "2026-12-02T06:31:57Z".into(),
        build_seconds: Some(63.6),
        labels: Default::default(),
        build: None,
    }
}

fn blobs() -> Blobs {
    Blobs {
        disk: Descriptor::new(DISK_QCOW2, DISK, 500367360),
        kernel: Some(Descriptor::new(KERNEL, KERNEL_D, 8_000_000)),
        initrd: Some(Descriptor::new(INITRD, INITRD_D, 30_000_000)),
    }
}

#[test]
fn render_bootstrapped_image_matches_golden() {
    let m = render(&record(), &blobs());

    let text = serde_json::to_string_pretty(&m).unwrap();

    assert_eq!(text, include_str!("testdata/debian-12.manifest.json").trim_end());
}

#[test]
fn render_same_inputs_same_bytes() {
    assert_eq!(
        render(&record(), &blobs()).to_bytes(),
        render(&record(), &blobs()).to_bytes()
    );
}

#[test]
fn classify_rendered_round_trips_metadata() {
    let bytes = render(&record(), &blobs()).to_bytes();

    let art = classify(&bytes).unwrap();

    assert_eq!(art.blobs, {
        let mut b = blobs();
        b.disk.annotations.insert(key::TITLE.into(), "disk.qcow2".into());
        b.kernel
            .as_mut()
            .unwrap()
            .annotations
            .insert(key::TITLE.into(), "vmlinuz".into());
        b.initrd
            .as_mut()
            .unwrap()
            .annotations
            .insert(key::TITLE.into(), "initrd.img".into());
        b
    });
    assert_eq!(art.format, "qcow2");
    assert!(art.meta.cloud_init);
    assert_eq!(art.meta.default_vcpus, Some(2));
    assert_eq!(art.meta.default_memory_mib, Some(1024));
    assert_eq!(art.meta.virtual_size, Some(2147483648));
    assert_eq!(art.meta.firmware, vec![Firmware::Bios, Firmware::Efi]);
    assert_eq!(art.meta.default_user.as_deref(), Some("debian"));
    assert_eq!(art.meta.origin.as_ref().unwrap().kind, SourceKind::Bootstrap);
    assert_eq!(art.meta.origin.as_ref().unwrap().recipe.as_deref(), Some("sha256:a77f"));
}

#[test]
fn classify_appliance_type_is_not_cloud_init() {
    let mut r = record();
    r.cloud_init = false;

    let art = classify(&render(&r, &blobs()).to_bytes()).unwrap();

    assert!(!art.meta.cloud_init);
}

#[test]
fn classify_container_image_says_what_it_is() {
    let bytes = include_bytes!("testdata/container.manifest.json");

    let err = classify(bytes).unwrap_err();

    assert!(matches!(err, ManifestError::Container { .. }), "{err:?}");
    assert!(err.to_string().contains("container image"), "{err}");
}

#[test]
fn classify_index_refused_as_manifest_list() {
    let bytes = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:1111111111111111111111111111111111111111111111111111111111111111","size":1}]}"#;

    let err = classify(bytes).unwrap_err();

    assert_eq!(err, ManifestError::Index { count: 1 });
}

#[test]
fn classify_other_artifact_names_its_type() {
    let mut m = render(&record(), &blobs());
    m.artifact_type = Some("application/vnd.cncf.helm.chart".into());

    let err = classify(&m.to_bytes()).unwrap_err();

    assert!(err.to_string().contains("application/vnd.cncf.helm.chart"), "{err}");
}

#[test]
fn classify_disk_digest_annotation_disagreeing_refused() {
    let mut m = render(&record(), &blobs());
    m.annotations.insert(key::DISK_DIGEST.into(), KERNEL_D.into());

    let err = classify(&m.to_bytes()).unwrap_err();

    assert!(matches!(err, ManifestError::Malformed(_)), "{err:?}");
}

#[test]
fn classify_sha512_layer_refused() {
    let mut m = render(&record(), &blobs());
    m.layers[0].digest = format!("sha512:{}", "a".repeat(128));

    assert!(matches!(classify(&m.to_bytes()), Err(ManifestError::Malformed(_))));
}

#[test]
fn classify_traversal_digest_refused() {
    let mut m = render(&record(), &blobs());
    m.layers[0].digest = "sha256:../../../etc/passwd".into();

    assert!(classify(&m.to_bytes()).is_err());
}

#[test]
fn classify_no_disk_layer_refused() {
    let mut m = render(&record(), &blobs());
    m.layers.remove(0);

    let err = classify(&m.to_bytes()).unwrap_err();

    assert!(err.to_string().contains("no disk layer"), "{err}");
}

#[test]
fn classify_zero_vcpus_refused() {
    let mut m = render(&record(), &blobs());
    m.annotations.insert(key::VCPUS.into(), "0".into());

    assert!(classify(&m.to_bytes()).is_err());
}

#[test]
fn classify_huge_kernel_refused() {
    let mut m = render(&record(), &blobs());
    m.layers[1].size = MAX_BOOT_FILE + 1;

    assert!(classify(&m.to_bytes()).is_err());
}

#[test]
fn classify_garbage_is_not_json() {
    assert!(matches!(classify(b"\x00\xff"), Err(ManifestError::NotJson(_))));
}

proptest::proptest! {
    #[test]
    fn classify_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let _ = classify(&bytes);
    }
}

const ZST: &str = "sha256:3333333333333333333333333333333333333333333333333333333333333333";

fn compressed_blobs() -> Blobs {
    Blobs {
        disk: Descriptor::new(DISK_QCOW2_ZSTD, ZST, 200_000_000),
        ..blobs()
    }
}

#[test]
fn classify_compressed_disk_stores_under_annotated_digest() {
    let bytes = render(&record(), &compressed_blobs()).to_bytes();

    let art = classify(&bytes).unwrap();

    assert_eq!(art.blobs.disk.digest, ZST);
    assert_eq!(art.format, "qcow2");
    assert_eq!(
        art.disk,
        StoredDisk {
            digest: DISK.into(),
            compressed_to: Some(500367360),
        }
    );
    assert_eq!(art.disk_size(), 500367360);
}

#[test]
fn classify_uncompressed_disk_stores_under_layer_digest() {
    let art = classify(&render(&record(), &blobs()).to_bytes()).unwrap();

    assert_eq!(art.disk.compressed_to, None);
    assert_eq!(art.disk.digest, DISK);
}

#[test]
fn classify_compressed_disk_without_size_refused() {
    let mut m = render(&record(), &compressed_blobs());
    m.annotations.remove(key::DISK_SIZE);

    let r = classify(&m.to_bytes());

    assert!(matches!(r, Err(ManifestError::Malformed(s)) if s.contains(key::DISK_SIZE)));
}

#[test]
fn classify_compressed_disk_without_digest_refused() {
    let mut m = render(&record(), &compressed_blobs());
    m.annotations.remove(key::DISK_DIGEST);

    let r = classify(&m.to_bytes());

    assert!(matches!(r, Err(ManifestError::Malformed(s)) if s.contains(key::DISK_DIGEST)));
}

#[test]
fn classify_compressed_disk_size_beyond_virtual_refused() {
    let mut m = render(&record(), &compressed_blobs());
    m.annotations.insert(key::DISK_SIZE.into(), (1u64 << 40).to_string());

    let r = classify(&m.to_bytes());

    assert!(matches!(r, Err(ManifestError::Malformed(s)) if s.contains("more than a disk of virtual size")));
}

#[test]
fn classify_iso_disk_round_trips_format() {
    let mut r = record();
    r.format = "iso".into();
    r.boot = None;
    let b = Blobs {
        disk: Descriptor::new(disk_media_type("iso", false).unwrap(), DISK, 500367360),
        kernel: None,
        initrd: None,
    };

    let art = classify(&render(&r, &b).to_bytes()).unwrap();

    assert_eq!(
        (art.format.as_str(), art.blobs.disk.media_type.as_str()),
        ("iso", DISK_ISO)
    );
    assert_eq!(disk_media_type("iso", true), Some(DISK_ISO_ZSTD));
}
