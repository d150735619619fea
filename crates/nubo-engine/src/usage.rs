//! Which VMs use an image, from their records (`vms/<name>/vm.json`, written by the engine).
//! Read loosely as JSON values: this check must not break when the VM record gains fields.

use std::fs;
use std::io;
use std::path::Path;

use nubo_image::ImageRecord;

/// Names of the VMs whose record refers to `image` by reference or by digest. A missing
/// `vms/` directory means no VMs; an unreadable or corrupt record is skipped, since `rm` of the
/// image is refused only for VMs that provably use it.
pub fn vms_using(vms_dir: &Path, image: &ImageRecord) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(vms_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        let dir = entry?.path();
        let Ok(bytes) = fs::read(dir.join("vm.json")) else {
            continue;
        };
        let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        if uses(&v, image) {
            let fallback = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            names.push(v.get("name").and_then(|n| n.as_str()).map_or(fallback, str::to_owned));
        }
    }
    names.sort();
    Ok(names)
}

fn uses(vm: &serde_json::Value, image: &ImageRecord) -> bool {
    let Some(img) = vm.get("image") else { return false };
    let field = |k: &str| img.get(k).and_then(|v| v.as_str());
    field("digest") == Some(image.digest.as_str()) || field("reference") == Some(image.reference.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nubo_image::{ImageSource, SourceKind};

    fn image() -> ImageRecord {
        ImageRecord {
            reference: "debian:12".into(),
            digest: format!("sha256:{}", "1".repeat(64)),
            path: "/x".into(),
            format: "qcow2".into(),
            size: 1,
            virtual_size: 1,
            cloud_init: true,
            os: None,
            release: None,
            arch: "x86_64".into(),
            firmware: vec![],
            boot: None,
            default_vcpus: 1,
            default_memory_mib: 1024,
            default_user: None,
            hypervisor: None,
            source: ImageSource::new(SourceKind::Pull),
            verified: true,
            created: String::new(),
            build_seconds: None,
            labels: Default::default(),
            build: None,
        }
    }

    fn write_vm(dir: &Path, name: &str, json: &str) {
        fs::create_dir_all(dir.join(name)).unwrap();
        fs::write(dir.join(name).join("vm.json"), json).unwrap();
    }

    #[test]
    fn vms_using_matches_reference_or_digest() {
        let dir = tempfile::tempdir().unwrap();
        write_vm(dir.path(), "a", r#"{"name":"a","image":{"reference":"debian:12"}}"#);
        let digest = format!(
            r#"{{"name":"b","image":{{"reference":"old:1","digest":"sha256:{}"}}}}"#,
            "1".repeat(64)
        );
        write_vm(dir.path(), "b", &digest);
        write_vm(dir.path(), "c", r#"{"name":"c","image":{"reference":"ubuntu:24.04"}}"#);
        write_vm(dir.path(), "d", "not json");

        let names = vms_using(dir.path(), &image()).unwrap();

        assert_eq!(names, vec!["a", "b"]);
    }

    #[test]
    fn vms_using_missing_dir_is_empty() {
        let dir = tempfile::tempdir().unwrap();

        assert!(vms_using(&dir.path().join("vms"), &image()).unwrap().is_empty());
    }
}
