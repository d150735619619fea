//! nubo-image's import and convert against qemu-img: imports convert raw to qcow2 with the same
//! guest-visible bytes, every conversion target is the format qemu-img says and compares equal,
//! conversions flatten backing chains, and overlays are refused at import.

use std::fs;
use std::path::Path;
use std::process::{Command, ExitCode};

use nubo_disk::Format;
use nubo_image::{convert, import, ConvertError, ConvertSpec, ImageRef, ImageStore, ImportError, ImportRequest};
use nubo_live::{LiveTest, TestResult};
use serde_json::Value;

const NEEDS: &[&str] = &["qemu-img"];
const MIB: u64 = 1 << 20;

fn main() -> ExitCode {
    nubo_live::run(vec![
        LiveTest::new("image_import_raw_becomes_equal_qcow2_appliance", NEEDS, import_raw),
        LiveTest::new("image_import_overlay_is_refused", NEEDS, import_overlay),
        LiveTest::new("image_convert_every_target_compares_equal", NEEDS, convert_targets),
        LiveTest::new(
            "image_convert_compressed_qcow2_and_vmdk_compare_equal",
            NEEDS,
            convert_compressed,
        ),
        LiveTest::new("image_convert_refuses_overlay", NEEDS, convert_refuses_overlay),
        LiveTest::new("image_convert_existing_output_is_refused", NEEDS, convert_exists),
    ])
}

/// Runs qemu-img, bounded by coreutils' `timeout` so a wedged tool cannot hang the suite.
fn qemu_img(args: &[&str]) -> Result<String, String> {
    let out = Command::new("timeout")
        .arg("60")
        .arg("qemu-img")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run qemu-img: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "qemu-img {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn info(p: &Path) -> Result<Value, String> {
    let s = qemu_img(&["info", "--output=json", p.to_str().ok_or("non-UTF-8 path")?])?;
    serde_json::from_str(&s).map_err(|e| e.to_string())
}

/// A raw disk with recognisable data at a few offsets and holes elsewhere.
fn raw_disk(p: &Path) -> Result<(), String> {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = fs::File::create(p).map_err(|e| e.to_string())?;
    f.set_len(16 * MIB).map_err(|e| e.to_string())?;
    for (i, off) in [0, 3 * MIB + 17, 15 * MIB].into_iter().enumerate() {
        f.seek(SeekFrom::Start(off)).map_err(|e| e.to_string())?;
        f.write_all(&vec![i as u8 + 1; 70_000]).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

fn import_raw() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = ImageStore::open(&dir.path().join("images")).map_err(|e| e.to_string())?;
    let raw = dir.path().join("disk.raw");
    raw_disk(&raw)?;
    let req = ImportRequest {
        file: raw.clone(),
        reference: ImageRef::parse("app:1").map_err(|e| e.to_string())?,
        appliance: true,
        default_vcpus: Some(4),
        default_memory_mib: Some(512),
        force: false,
    };

    let rec = import(&store, &req).map_err(|e| format!("{e:#?}"))?.record;

    let i = info(&rec.path)?;
    if i["format"] != "qcow2" || rec.format != "qcow2" || rec.cloud_init || rec.default_vcpus != 4 {
        return Err(format!("unexpected record {rec:?} / info {i}"));
    }
    if rec.virtual_size != 16 * MIB {
        return Err(format!("virtual size {} != 16 MiB", rec.virtual_size));
    }
    qemu_img(&["compare", "-f", "raw", "-F", "qcow2", s(&raw), s(&rec.path)])?;
    if fs::read_dir(store.tmp_dir()).map_err(|e| e.to_string())?.count() != 0 {
        return Err("tmp/ not empty after import".into());
    }
    Ok(())
}

fn import_overlay() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let store = ImageStore::open(&dir.path().join("images")).map_err(|e| e.to_string())?;
    let base = dir.path().join("base.qcow2");
    nubo_disk::create_qcow2(&base, 16 * MIB).map_err(|e| e.to_string())?;
    let top = dir.path().join("top.qcow2");
    nubo_disk::create_overlay(&base, Format::Qcow2, &top, None).map_err(|e| e.to_string())?;
    let req = ImportRequest {
        file: top,
        reference: ImageRef::parse("top:1").map_err(|e| e.to_string())?,
        appliance: false,
        default_vcpus: None,
        default_memory_mib: None,
        force: false,
    };

    match import(&store, &req) {
        Err(ImportError::Disk {
            source:
                nubo_disk::DiskError::Refused {
                    reason: nubo_disk::Rejection::Backing(_),
                    ..
                },
            ..
        }) => Ok(()),
        other => Err(format!("expected a backing-file refusal, got {other:?}")),
    }
}

fn qcow2_source(dir: &Path) -> Result<std::path::PathBuf, String> {
    let raw = dir.join("src.raw");
    raw_disk(&raw)?;
    let q = dir.join("src.qcow2");
    qemu_img(&["convert", "-f", "raw", "-O", "qcow2", s(&raw), s(&q)])?;
    Ok(q)
}

fn convert_to(src: &Path, to: Format, out: &Path, compress: bool) -> Result<(), String> {
    let spec = ConvertSpec {
        src: src.to_path_buf(),
        src_format: Format::Qcow2,
        to,
        out: out.to_path_buf(),
        compress,
    };
    convert(&spec).map_err(|e| format!("{e:#?}"))
}

fn convert_targets() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let src = qcow2_source(dir.path())?;
    for to in [
        Format::Raw,
        Format::Qcow2,
        Format::Vmdk,
        Format::Vdi,
        Format::Vhdx,
        Format::Vpc,
    ] {
        let out = dir.path().join(format!("out.{}", to.as_str()));

        convert_to(&src, to, &out, false)?;

        let i = info(&out)?;
        if i["format"] != to.qemu_driver() {
            return Err(format!("{to}: qemu-img says {}", i["format"]));
        }
        qemu_img(&["compare", "-f", "qcow2", "-F", to.qemu_driver(), s(&src), s(&out)])?;
    }
    Ok(())
}

fn convert_compressed() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let src = qcow2_source(dir.path())?;
    for to in [Format::Qcow2, Format::Vmdk] {
        let out = dir.path().join(format!("c.{}", to.as_str()));

        convert_to(&src, to, &out, true)?;

        qemu_img(&["compare", "-f", "qcow2", "-F", to.qemu_driver(), s(&src), s(&out)])?;
    }
    match convert_to(&src, Format::Vdi, &dir.path().join("c.vdi"), true) {
        Err(e) if e.contains("CompressUnsupported") => Ok(()),
        other => Err(format!("compressed vdi should be refused, got {other:?}")),
    }
}

/// An image with a backing file names another host file: convert refuses it like import does
/// (issue 9: convert used to write the backing file's content into its output).
fn convert_refuses_overlay() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let base = qcow2_source(dir.path())?;
    let top = dir.path().join("top.qcow2");
    nubo_disk::create_overlay(&base, Format::Qcow2, &top, None).map_err(|e| e.to_string())?;
    let out = dir.path().join("flat.qcow2");

    let r = convert_to(&top, Format::Qcow2, &out, false);

    match r {
        Err(e) if e.to_lowercase().contains("backing") && !out.exists() => Ok(()),
        other => Err(format!("expected a backing-file refusal and no output, got {other:?}")),
    }
}

fn convert_exists() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let src = qcow2_source(dir.path())?;
    let out = dir.path().join("taken.raw");
    fs::write(&out, b"keep").map_err(|e| e.to_string())?;

    let r = convert(&ConvertSpec {
        src,
        src_format: Format::Qcow2,
        to: Format::Raw,
        out: out.clone(),
        compress: false,
    });

    match r {
        Err(ConvertError::Exists(_)) if fs::read(&out).map_err(|e| e.to_string())? == b"keep" => Ok(()),
        other => Err(format!("expected refusal to overwrite, got {other:?}")),
    }
}
