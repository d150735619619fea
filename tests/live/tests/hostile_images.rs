//! Hostile disk images (issue 9, item 1): every way a disk image could make nubo, QEMU or
//! qemu-img read a host file, or hang nubo, made with qemu-img and by hand. For each one:
//! - the inspector (`nubo_disk::inspect`) refuses it, naming the format or cause;
//! - `nubo_image::import` fails and leaves nothing in the store (no blob, ref or temp file);
//! - `nubo_image::convert` fails and leaves no output or temp directory;
//! - the file the image points at (the "secret") is never opened: inotify watches it for
//!   `IN_OPEN`/`IN_ACCESS` from the moment the image exists to the end of the checks;
//! - the `nubo` CLI (`image import`, `image convert`) exits 1 saying why, within a timeout
//!   (when the binary is built).
//!
//! Positive controls: qemu-img's qcow2, raw, monolithicSparse and streamOptimized VMDK are
//! accepted as bases and imported; its VDI, VHDX and VHD only for conversion.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use nubo_core::error::chain;
use nubo_disk::{DiskError, Format, Usage};
use nubo_image::{convert, import, ConvertSpec, ImageRef, ImageStore, ImportRequest};
use nubo_live::watch::Watch;
use nubo_live::{LiveTest, TestResult};

const QEMU_IMG: &[&str] = &["qemu-img"];
const NONE: &[&str] = &[];
/// The size of every image made here, and of the secret.
const SIZE: &str = "1M";
const SECTORS: u64 = 2048;

type Build = fn(&Path, &Path) -> Result<Made, String>;

/// A hostile image and the host file it points at (what must never be opened).
struct Made {
    image: PathBuf,
    target: PathBuf,
}

fn main() -> ExitCode {
    let cases: Vec<(&'static str, &'static [&'static str], Build, &'static str)> = vec![
        ("qcow_v1_is_refused", QEMU_IMG, qcow_v1, "qcow (version 1)"),
        (
            "qcow_v1_with_backing_is_refused",
            QEMU_IMG,
            qcow_v1_backed,
            "qcow (version 1)",
        ),
        ("qed_with_backing_is_refused", QEMU_IMG, qed_backed, "QED"),
        ("parallels_is_refused", QEMU_IMG, parallels, "Parallels"),
        ("luks_is_refused", QEMU_IMG, luks, "LUKS"),
        ("qcow2_backing_file_is_refused", QEMU_IMG, qcow2_backed, "backing file"),
        (
            "qcow2_external_data_file_is_refused",
            QEMU_IMG,
            qcow2_data_file,
            "external data file",
        ),
        (
            "vmdk_monolithic_flat_is_refused",
            QEMU_IMG,
            |d, _| vmdk_split(d, "monolithicFlat", "img-flat.vmdk"),
            "VMDK descriptor",
        ),
        (
            "vmdk_two_gb_sparse_is_refused",
            QEMU_IMG,
            |d, _| vmdk_split(d, "twoGbMaxExtentSparse", "img-s001.vmdk"),
            "VMDK descriptor",
        ),
        (
            "vmdk_two_gb_flat_is_refused",
            QEMU_IMG,
            |d, _| vmdk_split(d, "twoGbMaxExtentFlat", "img-f001.vmdk"),
            "VMDK descriptor",
        ),
        ("vmdk_with_parent_is_refused", QEMU_IMG, vmdk_backed, "with a parent"),
        (
            "vmdk_descriptor_from_issue_is_refused",
            NONE,
            vmdk_issue_descriptor,
            "VMDK descriptor",
        ),
        (
            "vmdk_descriptor_after_comments_is_refused",
            NONE,
            vmdk_commented_descriptor,
            "VMDK descriptor",
        ),
        (
            "vmdk_sparse_with_flat_extent_is_refused",
            QEMU_IMG,
            vmdk_sparse_flat_extent,
            "names extent",
        ),
        (
            "vmdk_sparse_with_parent_hint_is_refused",
            QEMU_IMG,
            vmdk_sparse_parent_hint,
            "with a parent",
        ),
        (
            "vmdk_sparse_capacity_0_descriptor_is_refused",
            QEMU_IMG,
            vmdk_sparse_capacity_0,
            "of 0 bytes",
        ),
        ("vmdk_cowd_is_refused", NONE, |d, s| magic(d, s, 0, b"COWD"), "COWD"),
        (
            "dmg_is_refused",
            NONE,
            |d, s| magic(d, s, (1 << 20) - 512, b"koly"),
            "DMG",
        ),
        (
            "cloop_is_refused",
            NONE,
            |d, s| {
                magic(
                    d,
                    s,
                    0,
                    b"#!/bin/sh\n#V2.0 Format\nmodprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n",
                )
            },
            "cloop",
        ),
        (
            "bochs_is_refused",
            NONE,
            |d, s| magic(d, s, 0, b"Bochs Virtual HD Image\0"),
            "Bochs",
        ),
        (
            "raw_with_qcow2_magic_is_refused",
            NONE,
            |d, s| magic(d, s, 0, b"QFI\xfb\0\0\0\x09"),
            "not a valid qcow2 image",
        ),
        ("truncated_qcow2_is_refused", QEMU_IMG, truncated_qcow2, "past the end"),
        (
            "qcow2_claiming_2_pow_63_bytes_is_refused",
            QEMU_IMG,
            huge_qcow2,
            "9223372036854775808 bytes",
        ),
        ("empty_file_is_refused", NONE, empty, "is empty"),
        (
            "dev_null_is_refused",
            NONE,
            |_, s| {
                Ok(Made {
                    image: "/dev/null".into(),
                    target: s.into(),
                })
            },
            "character device",
        ),
        (
            "dev_zero_is_refused",
            NONE,
            |_, s| {
                Ok(Made {
                    image: "/dev/zero".into(),
                    target: s.into(),
                })
            },
            "character device",
        ),
        ("fifo_is_refused_without_hanging", NONE, fifo, "FIFO"),
        ("symlink_to_device_is_refused", NONE, device_link, "character device"),
        (
            "directory_is_refused",
            NONE,
            |d, s| {
                Ok(Made {
                    image: d.to_path_buf(),
                    target: s.into(),
                })
            },
            "a directory",
        ),
    ];
    let mut tests: Vec<LiveTest> = cases
        .into_iter()
        .map(|(name, needs, build, expect)| LiveTest::new(name, needs, move || refused(build, expect)))
        .collect();
    tests.push(LiveTest::new("watch_sees_an_open", NONE, watch_sees_an_open));
    tests.push(LiveTest::new(
        "qemu_img_bases_are_accepted_and_imported",
        QEMU_IMG,
        bases_accepted,
    ));
    tests.push(LiveTest::new(
        "qemu_img_vdi_vhdx_vhd_are_convert_only",
        QEMU_IMG,
        convert_only,
    ));
    nubo_live::run(tests)
}

// ---------------------------------------------------------------------------------------------
// The checks.

fn refused(build: Build, expect: &str) -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let d = dir.path();
    let secret = d.join("secret");
    fs::write(&secret, b"root:$6$hash:19000:0:99999:7:::\n".repeat(32768)).map_err(|e| e.to_string())?;
    let made = build(d, &secret)?;
    let watch = Watch::new(&made.target)?;

    let inspected = nubo_disk::inspect(&made.image);
    let store_dir = d.join("store");
    let store = ImageStore::open(&store_dir).map_err(|e| e.to_string())?;
    let imported = import(&store, &import_request(&made.image)?);
    let out = d.join("converted.qcow2");
    let converted = convert(&ConvertSpec {
        src: made.image.clone(),
        src_format: Format::Qcow2,
        to: Format::Qcow2,
        out: out.clone(),
        compress: false,
    });
    let cli = cli_refuses(d, &made.image, expect);

    let msg = match inspected {
        Ok(info) => return Err(format!("inspect accepted it: {info:?}")),
        Err(e) => chain(&e),
    };
    ensure(
        msg.to_lowercase().contains(&expect.to_lowercase()),
        format!("inspect's refusal does not say `{expect}`: {msg}"),
    )?;
    match imported {
        Ok(added) => return Err(format!("import accepted it: {added:?}")),
        Err(e) => ensure(
            chain(&e).to_lowercase().contains(&expect.to_lowercase()),
            format!("import's refusal does not say `{expect}`: {}", chain(&e)),
        )?,
    }
    let left = files_under(&store_dir)?;
    ensure(left.is_empty(), format!("import left files in the store: {left:?}"))?;
    ensure(converted.is_err(), format!("convert accepted it: {converted:?}"))?;
    ensure(!out.exists(), "convert left its output")?;
    let stray: Vec<_> = fs::read_dir(d)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".converted") || n.starts_with(".cli-out"))
        .collect();
    ensure(stray.is_empty(), format!("convert left temp files: {stray:?}"))?;
    cli?;
    watch.untouched("while the image was handled")
}

/// The `nubo` CLI on the same image: `image import` and `image convert` exit 1 saying why and
/// leave nothing behind. Skipped (with a line saying so) when the binary is not built.
fn cli_refuses(d: &Path, image: &Path, expect: &str) -> TestResult {
    let bin = match nubo_live::nubo_bin() {
        Ok(b) => b,
        Err(why) => {
            println!("(CLI checks skipped: {why})");
            return Ok(());
        }
    };
    let root = d.join("cli-root");
    let run = d.join("cli-run");
    let out = d.join("cli-out.qcow2");
    let runs: [Vec<&std::ffi::OsStr>; 2] = [
        vec![
            "image".as_ref(),
            "import".as_ref(),
            image.as_os_str(),
            "-t".as_ref(),
            "evil:v".as_ref(),
        ],
        vec![
            "image".as_ref(),
            "convert".as_ref(),
            image.as_os_str(),
            "--to".as_ref(),
            "qcow2".as_ref(),
            "-o".as_ref(),
            out.as_os_str(),
        ],
    ];
    for args in runs {
        let o = Command::new("timeout")
            .arg("60")
            .arg(&bin)
            .args(&args)
            .env("NUBO_ROOT", &root)
            .env("NUBO_RUN_DIR", &run)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
        let stderr = String::from_utf8_lossy(&o.stderr);
        ensure(
            o.status.code() == Some(1),
            format!("nubo {args:?} exited {:?} (124: hung): {stderr}", o.status.code()),
        )?;
        ensure(
            stderr.to_lowercase().contains(&expect.to_lowercase()),
            format!("nubo {args:?} does not say `{expect}`: {stderr}"),
        )?;
    }
    ensure(!out.exists(), "nubo image convert left its output")?;
    let left = files_under(&root.join("images"))?;
    ensure(left.is_empty(), format!("nubo image import left files: {left:?}"))
}

/// The watch is not vacuous: an open of the watched file is seen.
fn watch_sees_an_open() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let secret = dir.path().join("secret");
    write(&secret, b"x")?;
    let watch = Watch::new(&secret)?;

    fs::read(&secret).map_err(|e| e.to_string())?;

    ensure(
        watch.untouched("while the image was handled").is_err(),
        "an open of the watched file went unseen",
    )
}

fn bases_accepted() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let d = dir.path();
    let store = ImageStore::open(&d.join("store")).map_err(|e| e.to_string())?;
    let cases: [(&str, &[&str], Format); 4] = [
        ("q.qcow2", &["-f", "qcow2"], Format::Qcow2),
        ("r.raw", &["-f", "raw"], Format::Raw),
        (
            "sparse.vmdk",
            &["-f", "vmdk", "-o", "subformat=monolithicSparse"],
            Format::Vmdk,
        ),
        (
            "stream.vmdk",
            &["-f", "vmdk", "-o", "subformat=streamOptimized"],
            Format::Vmdk,
        ),
    ];
    for (i, (name, opts, format)) in cases.into_iter().enumerate() {
        let p = d.join(name);
        qemu_img_create(opts, &p, "64M")?;

        let info = nubo_disk::inspect_base(&p).map_err(|e| format!("{name}: {}", chain(&e)))?;
        let mut req = import_request(&p)?;
        req.reference = ImageRef::parse(&format!("ok:{i}")).map_err(|e| e.to_string())?;
        let added = import(&store, &req).map_err(|e| format!("{name}: import: {}", chain(&e)))?;

        ensure(
            (info.format, info.usage, info.virtual_size) == (format, Usage::Base, 64 << 20),
            format!("{name}: {info:?}"),
        )?;
        let stored = nubo_disk::inspect(&added.record.path).map_err(|e| chain(&e))?;
        ensure(
            stored.format == Format::Qcow2,
            format!("{name}: stored as {:?}", stored.format),
        )?;
    }
    Ok(())
}

fn convert_only() -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let d = dir.path();
    let store = ImageStore::open(&d.join("store")).map_err(|e| e.to_string())?;
    let cases: [(&str, &[&str], Format); 4] = [
        ("d.vdi", &["-f", "vdi"], Format::Vdi),
        ("d.vhdx", &["-f", "vhdx"], Format::Vhdx),
        ("d.vhd", &["-f", "vpc"], Format::Vpc),
        ("fixed.vhd", &["-f", "vpc", "-o", "subformat=fixed"], Format::Vpc),
    ];
    for (i, (name, opts, format)) in cases.into_iter().enumerate() {
        let p = d.join(name);
        qemu_img_create(opts, &p, "64M")?;

        let info = nubo_disk::inspect(&p).map_err(|e| format!("{name}: {}", chain(&e)))?;
        let base = nubo_disk::inspect_base(&p);
        let mut req = import_request(&p)?;
        req.reference = ImageRef::parse(&format!("conv:{i}")).map_err(|e| e.to_string())?;
        let added = import(&store, &req).map_err(|e| format!("{name}: import: {}", chain(&e)))?;

        ensure(
            (info.format, info.usage) == (format, Usage::ConvertOnly),
            format!("{name}: {info:?}"),
        )?;
        ensure(
            matches!(base, Err(DiskError::NotBase { .. })),
            format!("{name}: inspect_base: {base:?}"),
        )?;
        let stored = nubo_disk::inspect(&added.record.path).map_err(|e| chain(&e))?;
        ensure(
            stored.format == Format::Qcow2,
            format!("{name}: stored as {:?}", stored.format),
        )?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The corpus. Each builder makes its image in `d`; `s` is the secret it may point at.

fn qcow_v1(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("img.qcow");
    qemu_img_create(&["-f", "qcow"], &image, SIZE)?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn qcow_v1_backed(d: &Path, s: &Path) -> Result<Made, String> {
    backed(d, s, "qcow", "img.qcow")
}

fn qed_backed(d: &Path, s: &Path) -> Result<Made, String> {
    backed(d, s, "qed", "img.qed")
}

fn qcow2_backed(d: &Path, s: &Path) -> Result<Made, String> {
    backed(d, s, "qcow2", "img.qcow2")
}

/// `qemu-img create -f FMT -u -b SECRET -F raw`: `-u` so qemu-img itself does not open it.
fn backed(d: &Path, s: &Path, fmt: &str, name: &str) -> Result<Made, String> {
    let image = d.join(name);
    qemu_img_create(&["-f", fmt, "-u", "-b", p(s), "-F", "raw"], &image, SIZE)?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn parallels(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("img.hdd");
    qemu_img_create(&["-f", "parallels"], &image, SIZE)?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn luks(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("img.luks");
    let opts = [
        "-f",
        "luks",
        "--object",
        "secret,id=s0,data=x",
        "-o",
        "key-secret=s0,iter-time=10",
    ];
    qemu_img_create(&opts, &image, SIZE)?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

/// An external data file: qemu-img creates it, so it is a file of the test's own (not the
/// secret, which qemu-img would truncate); it is what must never be opened.
fn qcow2_data_file(d: &Path, _: &Path) -> Result<Made, String> {
    let image = d.join("img.qcow2");
    let data = d.join("data.raw");
    let opt = format!("data_file={},data_file_raw=on", p(&data));
    qemu_img_create(&["-f", "qcow2", "-o", &opt], &image, SIZE)?;
    Ok(Made { image, target: data })
}

/// A VMDK whose descriptor (`img.vmdk`) names extents in other files; `extent` must stay shut.
fn vmdk_split(d: &Path, subformat: &str, extent: &str) -> Result<Made, String> {
    let image = d.join("img.vmdk");
    qemu_img_create(&["-f", "vmdk", "-o", &format!("subformat={subformat}")], &image, SIZE)?;
    Ok(Made {
        image,
        target: d.join(extent),
    })
}

/// A sparse VMDK whose parent (`parentFileNameHint`) is another VMDK.
fn vmdk_backed(d: &Path, _: &Path) -> Result<Made, String> {
    let parent = d.join("parent.vmdk");
    qemu_img_create(&["-f", "vmdk"], &parent, SIZE)?;
    let image = d.join("img.vmdk");
    qemu_img_create(&["-f", "vmdk", "-u", "-b", p(&parent), "-F", "vmdk"], &image, SIZE)?;
    Ok(Made { image, target: parent })
}

/// The issue's reproducer, verbatim but for the path.
fn vmdk_issue_descriptor(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("flat.vmdk");
    let text = format!(
        "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\nRW 1 FLAT \"{}\" 0\n",
        p(s)
    );
    write(&image, text.as_bytes())?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

/// What QEMU's probe accepts too: comments and blank lines before `version=`.
fn vmdk_commented_descriptor(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("commented.vmdk");
    let text = format!(
        "# hello\n\n  \nversion=1\ncreateType=\"monolithicFlat\"\nRW 2048 FLAT \"{}\" 0\n",
        p(s)
    );
    write(&image, text.as_bytes())?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

/// qemu-img's monolithicSparse with its embedded descriptor (sector 1, 20 sectors) replaced.
fn sparse_with_descriptor(d: &Path, descriptor: &str, capacity: Option<u64>) -> Result<PathBuf, String> {
    let image = d.join("img.vmdk");
    qemu_img_create(&["-f", "vmdk", "-o", "subformat=monolithicSparse"], &image, SIZE)?;
    let mut bytes = fs::read(&image).map_err(|e| e.to_string())?;
    let region = &mut bytes[512..512 + 20 * 512];
    region.fill(0);
    region[..descriptor.len()].copy_from_slice(descriptor.as_bytes());
    if let Some(c) = capacity {
        bytes[12..20].copy_from_slice(&c.to_le_bytes());
    }
    write(&image, &bytes)?;
    Ok(image)
}

fn vmdk_sparse_flat_extent(d: &Path, s: &Path) -> Result<Made, String> {
    let desc = format!(
        "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicSparse\"\nRW {SECTORS} FLAT \"{}\" 0\n",
        p(s)
    );
    let image = sparse_with_descriptor(d, &desc, None)?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn vmdk_sparse_parent_hint(d: &Path, s: &Path) -> Result<Made, String> {
    let desc = format!(
        "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=12345678\ncreateType=\"monolithicSparse\"\nparentFileNameHint=\"{}\"\nRW {SECTORS} SPARSE \"img.vmdk\"\n",
        p(s)
    );
    let image = sparse_with_descriptor(d, &desc, None)?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

/// Capacity 0 with a descriptor offset: QEMU reads the embedded descriptor as a descriptor
/// file, extents and all (the path behind OpenStack's VMDK CVE).
fn vmdk_sparse_capacity_0(d: &Path, s: &Path) -> Result<Made, String> {
    let desc = format!(
        "# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\nRW {SECTORS} FLAT \"{}\" 0\n",
        p(s)
    );
    let image = sparse_with_descriptor(d, &desc, Some(0))?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

/// 1 MiB of zeros with `bytes` at `at`.
fn magic(d: &Path, s: &Path, at: usize, bytes: &[u8]) -> Result<Made, String> {
    let image = d.join("img.bin");
    let mut b = vec![0u8; 1 << 20];
    b[at..at + bytes.len()].copy_from_slice(bytes);
    write(&image, &b)?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn truncated_qcow2(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("img.qcow2");
    qemu_img_create(&["-f", "qcow2"], &image, "100M")?;
    let f = fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .map_err(|e| e.to_string())?;
    f.set_len(65536).map_err(|e| e.to_string())?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn huge_qcow2(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("img.qcow2");
    qemu_img_create(&["-f", "qcow2"], &image, SIZE)?;
    let mut bytes = fs::read(&image).map_err(|e| e.to_string())?;
    bytes[24..32].copy_from_slice(&(1u64 << 63).to_be_bytes());
    write(&image, &bytes)?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn empty(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("empty.img");
    write(&image, b"")?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn fifo(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("fifo.img");
    nix::unistd::mkfifo(&image, nix::sys::stat::Mode::S_IRWXU).map_err(|e| e.to_string())?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

fn device_link(d: &Path, s: &Path) -> Result<Made, String> {
    let image = d.join("link.qcow2");
    symlink("/dev/zero", &image).map_err(|e| e.to_string())?;
    Ok(Made {
        image,
        target: s.into(),
    })
}

// ---------------------------------------------------------------------------------------------
// Helpers.

fn import_request(image: &Path) -> Result<ImportRequest, String> {
    Ok(ImportRequest {
        file: image.to_path_buf(),
        reference: ImageRef::parse("evil:v").map_err(|e| e.to_string())?,
        appliance: false,
        default_vcpus: None,
        default_memory_mib: None,
        force: false,
    })
}

/// Regular files under `dir`, except the store's lock file (which carries no image).
fn files_under(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(out);
    };
    for e in entries {
        let path = e.map_err(|e| e.to_string())?.path();
        let meta = fs::symlink_metadata(&path).map_err(|e| e.to_string())?;
        if meta.is_dir() {
            out.extend(files_under(&path)?);
        } else if path.file_name().is_none_or(|n| n != "store.lock") {
            out.push(path);
        }
    }
    Ok(out)
}

fn qemu_img_create(opts: &[&str], out: &Path, size: &str) -> TestResult {
    let o = Command::new("timeout")
        .args(["60", "qemu-img", "create", "-q"])
        .args(opts)
        .arg(out)
        .arg(size)
        .output()
        .map_err(|e| format!("cannot run qemu-img: {e}"))?;
    ensure(
        o.status.success(),
        format!(
            "qemu-img create {opts:?} failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

fn write(path: &Path, bytes: &[u8]) -> TestResult {
    fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn p(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

fn ensure(ok: bool, why: impl Into<String>) -> TestResult {
    if ok {
        Ok(())
    } else {
        Err(why.into())
    }
}
