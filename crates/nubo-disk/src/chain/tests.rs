//! Regression (issue 21): `vm start` trusted whatever the disk chain was by then. Every way a
//! chain can change between create and boot is refused here, before any VMM sees it.

use super::*;
use crate::create::{create_overlay, create_qcow2, write_new, Sync};
use crate::inspector::Rejection;
use crate::layout::{layout, BackingRef};

const MIB: u64 = 1 << 20;

/// A qcow2 at `path` whose backing name is stored verbatim (chains nubo would never make).
fn qcow2_backed_by(path: &Path, name: &str, driver: &str) {
    let _ = fs::remove_file(path);
    write_new(
        path,
        &layout(MIB, Some(BackingRef { name, driver })).unwrap(),
        Sync::Durable,
    )
    .unwrap();
}

/// A VM's chain as `vm create --disk b.qcow2` makes it: `b.qcow2` (1 MiB) and the overlay.
struct Vm {
    _dir: tempfile::TempDir,
    base: PathBuf,
    overlay: PathBuf,
}

fn vm() -> Vm {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("b.qcow2");
    create_qcow2(&base, MIB).unwrap();
    let overlay = dir.path().join("disk.qcow2");
    create_overlay(&base, Format::Qcow2, &overlay, None).unwrap();
    Vm {
        base,
        overlay,
        _dir: dir,
    }
}

impl Vm {
    fn expected(&self) -> ExpectedBase<'_> {
        ExpectedBase {
            path: &self.base,
            format: Format::Qcow2,
            size: Some(MIB),
        }
    }

    fn verify(&self) -> Result<VerifiedChain, DiskError> {
        verify_vm_chain(&self.overlay, &self.expected())
    }
}

#[test]
fn verify_vm_chain_unchanged_chain_is_accepted_with_base_resolved() {
    let v = vm();

    let chain = v.verify().unwrap();

    assert_eq!(chain.base, fs::canonicalize(&v.base).unwrap());
    assert_eq!((chain.base_info.virtual_size, chain.overlay.chain_depth), (MIB, 0));
}

#[test]
fn verify_vm_chain_record_without_size_is_accepted() {
    let v = vm();

    let chain = verify_vm_chain(
        &v.overlay,
        &ExpectedBase {
            size: None,
            ..v.expected()
        },
    );

    assert!(chain.is_ok(), "{chain:?}");
}

/// The example and its class: the base replaced by a qcow2 whose backing file is any
/// host file, named absolutely, relatively, as a protocol or as a JSON object.
#[test]
fn verify_vm_chain_base_replaced_by_backed_qcow2_is_refused_naming_base() {
    let v = vm();
    let names = [
        "/etc/shadow",
        "../../../../etc/passwd",
        "disk.qcow2",
        "nbd:127.0.0.1:10809",
        "json:{\"file.driver\":\"file\",\"file.filename\":\"/etc/shadow\"}",
    ];
    for name in names {
        qcow2_backed_by(&v.base, name, "raw");

        let err = v.verify().unwrap_err();

        let base = fs::canonicalize(&v.base).unwrap();
        let refused_backing =
            matches!(&err, DiskError::Refused { reason, path } if reason.is_backing() && path == &base);
        assert!(refused_backing, "{name}: {err}");
        assert!(err.to_string().contains("b.qcow2"), "{err}");
    }
}

#[test]
fn verify_vm_chain_base_replaced_by_data_file_qcow2_is_refused() {
    let v = vm();
    let mut bytes = fs::read(&v.base).unwrap();
    bytes[79] |= crate::qcow2::INCOMPAT_DATA_FILE as u8;
    fs::write(&v.base, bytes).unwrap();

    let err = v.verify().unwrap_err();

    assert!(
        matches!(
            err,
            DiskError::Refused {
                reason: Rejection::DataFile(_),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn verify_vm_chain_base_replaced_by_vmdk_descriptor_is_refused() {
    let v = vm();
    fs::write(
        &v.base,
        "# Disk DescriptorFile\nversion=1\nCID=1\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\nRW 2048 FLAT \"/etc/shadow\" 0\n",
    )
    .unwrap();

    let err = v.verify().unwrap_err();

    assert!(matches!(err, DiskError::Refused { .. }), "{err}");
}

#[test]
fn verify_vm_chain_base_replaced_by_raw_file_is_a_format_mismatch() {
    let v = vm();
    fs::write(&v.base, vec![0u8; MIB as usize]).unwrap();

    let err = v.verify().unwrap_err();

    assert!(
        matches!(
            err,
            DiskError::FormatMismatch {
                expected: Format::Qcow2,
                found: Format::Raw,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn verify_vm_chain_base_resized_is_refused_naming_both_sizes() {
    let v = vm();
    fs::remove_file(&v.base).unwrap();
    create_qcow2(&v.base, 2 * MIB).unwrap();

    let err = v.verify().unwrap_err();

    assert!(
        matches!(err, DiskError::BaseResized { recorded: MIB, found, .. } if found == 2 * MIB),
        "{err}"
    );
}

#[test]
fn verify_vm_chain_base_symlink_repointed_at_backed_qcow2_is_refused() {
    let v = vm();
    let dir = v.base.parent().unwrap();
    let link = dir.join("link.qcow2");
    std::os::unix::fs::symlink(&v.base, &link).unwrap();
    let evil = dir.join("evil.qcow2");
    qcow2_backed_by(&evil, "/etc/shadow", "raw");
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&evil, &link).unwrap();

    let err = verify_vm_chain(
        &v.overlay,
        &ExpectedBase {
            path: &link,
            ..v.expected()
        },
    )
    .unwrap_err();

    // The overlay names b.qcow2, the record's link now resolves to evil.qcow2.
    assert!(matches!(err, DiskError::ChainChanged { .. }), "{err}");
}

#[test]
fn verify_vm_chain_base_missing_names_overlay_and_base() {
    let v = vm();
    fs::remove_file(&v.base).unwrap();

    let err = v.verify().unwrap_err();

    assert!(matches!(err, DiskError::MissingBacking { .. }), "{err}");
    assert!(err.to_string().contains("b.qcow2"), "{err}");
}

#[test]
fn verify_vm_chain_overlay_rebased_onto_host_file_is_refused() {
    let v = vm();
    qcow2_backed_by(&v.overlay, "/etc/passwd", "raw");

    let err = v.verify().unwrap_err();

    assert!(matches!(err, DiskError::ChainChanged { .. }), "{err}");
    assert!(err.to_string().contains("/etc/passwd"), "{err}");
}

#[test]
fn verify_vm_chain_overlay_recording_other_base_format_is_refused() {
    let v = vm();
    let name = fs::canonicalize(&v.base).unwrap();
    qcow2_backed_by(&v.overlay, name.to_str().unwrap(), "raw");

    let err = v.verify().unwrap_err();

    assert!(matches!(err, DiskError::ChainChanged { .. }), "{err}");
}

#[test]
fn verify_vm_chain_overlay_without_backing_is_refused() {
    let v = vm();
    fs::remove_file(&v.overlay).unwrap();
    create_qcow2(&v.overlay, MIB).unwrap();

    let err = v.verify().unwrap_err();

    assert!(matches!(err, DiskError::ChainChanged { .. }), "{err}");
}

#[test]
fn verify_vm_chain_overlay_replaced_by_raw_is_refused() {
    let v = vm();
    fs::write(&v.overlay, vec![0u8; 4096]).unwrap();

    let err = v.verify().unwrap_err();

    assert!(matches!(err, DiskError::ChainChanged { .. }), "{err}");
}

#[test]
fn verify_vm_chain_raw_base_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.raw");
    fs::write(&base, vec![1u8; 4096]).unwrap();
    let overlay = dir.path().join("o.qcow2");
    create_overlay(&base, Format::Raw, &overlay, None).unwrap();

    let chain = verify_vm_chain(
        &overlay,
        &ExpectedBase {
            path: &base,
            format: Format::Raw,
            size: Some(4096),
        },
    );

    assert!(chain.is_ok(), "{chain:?}");
}
