//! Independent readers agree with nubo's seeds, and nubo's reader agrees with other tools' seeds.
//!
//! Every test walks the same table of inputs (the edge cases of sector-sized data and of names):
//! nubo builds the image in-process, then xorriso, isoinfo, blkid, 7z, bsdtar, pycdlib (ISO) or
//! blkid and mtools (VFAT) must see exactly the files and bytes nubo put there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output};

use nubo_live::{prereq, LiveTest, TestResult};
use nubo_seed::{SeedFile, SeedFormat, SeedSpec};

/// Every external tool gets this long before `timeout` kills it; all take milliseconds.
const TOOL_TIMEOUT_SECS: &str = "60";

struct Case {
    name: &'static str,
    spec: SeedSpec,
}

fn spec(user_data: Option<Vec<u8>>) -> SeedSpec {
    SeedSpec {
        instance_id: "iid-interop".into(),
        local_hostname: "interop-1".into(),
        user_data,
        network_config: Some(
            b"version: 2\nethernets:\n  nic0:\n    match: {macaddress: \"52:54:00:12:34:56\"}\n    dhcp4: true\n"
                .to_vec(),
        ),
        vendor_data: None,
    }
}

fn cases() -> Vec<Case> {
    let sized = |n: usize| Some((0..n).map(|i| b"#cloud-config\n"[i % 14]).collect::<Vec<u8>>());
    vec![
        Case {
            name: "empty user-data",
            spec: spec(Some(Vec::new())),
        },
        Case {
            name: "no user-data",
            spec: SeedSpec {
                network_config: None,
                ..spec(None)
            },
        },
        Case {
            name: "1-byte user-data",
            spec: spec(Some(b"x".to_vec())),
        },
        Case {
            name: "2048-byte user-data",
            spec: spec(sized(2048)),
        },
        Case {
            name: "2049-byte user-data",
            spec: spec(sized(2049)),
        },
        Case {
            name: "1 MiB user-data",
            spec: spec(sized(1 << 20)),
        },
        Case {
            name: "CRLF user-data",
            spec: spec(Some(
                b"#cloud-config\r\nhostname: a\r\nruncmd:\r\n  - [true]\r\n".to_vec(),
            )),
        },
        Case {
            name: "vendor-data and binary bytes",
            spec: SeedSpec {
                vendor_data: Some((0..=255u8).collect()),
                ..spec(Some(vec![0x1f, 0x8b, 0, 0xff]))
            },
        },
    ]
}

/// A directory removed when dropped, so a failing test leaves nothing behind either.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let unique = format!(
            "nubo-seed-interop-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        );
        let dir = std::env::temp_dir().join(unique.replace(['(', ')'], ""));
        std::fs::create_dir_all(&dir).expect("temp dir is creatable");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(cmd: &str, args: &[&str]) -> Result<Output, String> {
    let out = Command::new("timeout")
        .arg(TOOL_TIMEOUT_SECS)
        .arg(cmd)
        .args(args)
        .env("MTOOLS_SKIP_CHECK", "1")
        .output()
        .map_err(|e| format!("running {cmd}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out)
}

fn stdout(cmd: &str, args: &[&str]) -> Result<String, String> {
    run(cmd, args).map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// nubo's files for `spec`, by name.
fn expected(spec: &SeedSpec) -> BTreeMap<String, Vec<u8>> {
    nubo_seed::seed_files(spec)
        .expect("table specs are valid")
        .into_iter()
        .map(|f| (f.name, f.data))
        .collect()
}

fn sizes(files: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, usize> {
    files.iter().map(|(n, d)| (n.clone(), d.len())).collect()
}

/// Builds each case's image in `format` and hands it to `check` with the files expected in it.
fn each_case(format: SeedFormat, check: impl Fn(&Path, &BTreeMap<String, Vec<u8>>) -> TestResult) -> TestResult {
    let tmp = TempDir::new(format.as_str());
    for case in cases() {
        let image = nubo_seed::build(&case.spec, format).map_err(|e| format!("{}: build: {e}", case.name))?;
        let path = tmp.0.join(format!("seed.{format}"));
        std::fs::write(&path, &image).map_err(|e| e.to_string())?;
        check(&path, &expected(&case.spec)).map_err(|e| format!("case `{}`: {e}", case.name))?;
    }
    Ok(())
}

fn agree<T: PartialEq + std::fmt::Debug>(tool: &str, got: T, want: T) -> TestResult {
    if got == want {
        Ok(())
    } else {
        Err(format!(
            "{tool} disagrees with nubo:\n  tool: {got:?}\n  nubo: {want:?}"
        ))
    }
}

fn xorriso(img: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let img = img.to_str().expect("temp paths are UTF-8");
    let out = stdout(
        "xorriso",
        &["-abort_on", "FAILURE", "-indev", img, "-find", "/", "-type", "f"],
    )?;
    let names: Vec<String> = out
        .lines()
        .map(|l| l.trim().trim_matches('\'').trim_start_matches('/').to_owned())
        .collect();
    agree("xorriso -find", names, want.keys().cloned().collect())
}

fn isoinfo(img: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let img = img.to_str().expect("temp paths are UTF-8");
    let listing = stdout("isoinfo", &["-J", "-l", "-i", img])?;
    let mut got = BTreeMap::new();
    for line in listing.lines().filter(|l| l.starts_with('-')) {
        let (meta, name) = line
            .split_once(']')
            .ok_or(format!("isoinfo line without extent: {line}"))?;
        let size: usize = meta
            .split_whitespace()
            .nth(4)
            .and_then(|s| s.parse().ok())
            .ok_or(format!("no size in: {line}"))?;
        got.insert(name.trim().to_owned(), size);
    }
    agree("isoinfo -J -l", &got, &sizes(want))?;
    for (name, data) in want {
        let out = run("isoinfo", &["-J", "-i", img, "-x", &format!("/{name}")])?;
        agree(
            &format!("isoinfo -J -x /{name} (bytes)"),
            out.stdout.as_slice(),
            data.as_slice(),
        )?;
    }
    Ok(())
}

fn blkid(img: &Path, fs_type: &str) -> TestResult {
    let out = stdout(
        "blkid",
        &["-p", "-o", "export", img.to_str().expect("temp paths are UTF-8")],
    )?;
    let tags: BTreeMap<&str, &str> = out.lines().filter_map(|l| l.split_once('=')).collect();
    agree(
        "blkid LABEL/TYPE",
        (tags.get("LABEL").copied(), tags.get("TYPE").copied()),
        (Some("CIDATA"), Some(fs_type)),
    )
}

fn seven_zip(img: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let out = stdout("7z", &["l", "-slt", img.to_str().expect("temp paths are UTF-8")])?;
    let mut got = BTreeMap::new();
    let mut path = None;
    for line in out.lines() {
        if let Some(p) = line.strip_prefix("Path = ") {
            path = Some(p.to_owned());
        } else if let Some(s) = line.strip_prefix("Size = ") {
            if let Some(p) = path.take() {
                got.insert(p, s.parse::<usize>().map_err(|e| format!("7z size `{s}`: {e}"))?);
            }
        }
    }
    got.retain(|name, _| !name.ends_with(".iso") && !name.ends_with(".vfat"));
    agree("7z l", &got, &sizes(want))
}

fn bsdtar(img: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let img = img.to_str().expect("temp paths are UTF-8");
    let out = stdout("bsdtar", &["tf", img])?;
    let mut names: Vec<String> = out
        .lines()
        .map(|l| l.trim_start_matches("./").to_owned())
        .filter(|l| l != ".")
        .collect();
    names.sort();
    agree("bsdtar tf", names, want.keys().cloned().collect())?;
    for (name, data) in want {
        let out = run("bsdtar", &["xOf", img, name])?;
        agree(
            &format!("bsdtar xOf {name} (bytes)"),
            out.stdout.as_slice(),
            data.as_slice(),
        )?;
    }
    Ok(())
}

/// Reads both trees with pycdlib and extracts every Joliet file into a directory.
const PYCDLIB_SCRIPT: &str = r#"
import json, os, sys, pycdlib
iso = pycdlib.PyCdlib()
iso.open(sys.argv[1])
out = {"joliet": {}, "iso9660": {}, "label": iso.pvd.volume_identifier.decode().strip(),
       "joliet_label": iso.joliet_vd.volume_identifier.decode("utf-16-be").strip(), "rock_ridge": iso.has_rock_ridge()}
for child in iso.list_children(joliet_path="/"):
    name = child.file_identifier().decode("utf-16-be")
    if child.is_dir():
        continue
    out["joliet"][name] = child.data_length
    with open(os.path.join(sys.argv[2], name), "wb") as f:
        iso.get_file_from_iso_fp(f, joliet_path="/" + name)
for child in iso.list_children(iso_path="/"):
    if not child.is_dir():
        out["iso9660"][child.file_identifier().decode()] = child.data_length
iso.close()
print(json.dumps(out))
"#;

fn pycdlib(img: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let python = prereq::pycdlib_python()?;
    let tmp = TempDir::new("pycdlib");
    let out = stdout(
        &python,
        &[
            "-c",
            PYCDLIB_SCRIPT,
            img.to_str().expect("temp paths are UTF-8"),
            tmp.0.to_str().expect("utf-8"),
        ],
    )?;
    let v: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("pycdlib output `{out}`: {e}"))?;
    let labels = (
        v["label"].as_str(),
        v["joliet_label"].as_str(),
        v["rock_ridge"].as_bool(),
    );
    agree(
        "pycdlib labels / Rock Ridge",
        labels,
        (Some("CIDATA"), Some("CIDATA"), Some(false)),
    )?;
    let joliet: BTreeMap<String, usize> =
        serde_json::from_value(v["joliet"].clone()).map_err(|e| format!("pycdlib joliet: {e}"))?;
    agree("pycdlib Joliet tree", &joliet, &sizes(want))?;
    let primary: BTreeMap<String, usize> =
        serde_json::from_value(v["iso9660"].clone()).map_err(|e| format!("pycdlib iso9660: {e}"))?;
    agree(
        "pycdlib primary tree (file count)",
        primary.values().copied().collect::<Vec<_>>().len(),
        want.len(),
    )?;
    if let Some(bad) = primary.keys().find(|n| !n.ends_with(";1") || n.len() > 12) {
        return Err(format!("pycdlib primary name `{bad}` is not a level-1 8.3 name"));
    }
    for (name, data) in want {
        let got = std::fs::read(tmp.0.join(name)).map_err(|e| format!("pycdlib extracted {name}: {e}"))?;
        agree(&format!("pycdlib {name} (bytes)"), got.as_slice(), data.as_slice())?;
    }
    Ok(())
}

fn mtools(img: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let img = img.to_str().expect("temp paths are UTF-8");
    let out = stdout("mdir", &["-b", "-i", img, "::"])?;
    let mut names: Vec<String> = out
        .lines()
        .map(|l| l.trim().trim_start_matches("::/").to_owned())
        .collect();
    names.sort();
    agree("mdir -b", names, want.keys().cloned().collect())?;
    for (name, data) in want {
        let out = run("mtype", &["-i", img, &format!("::{name}")])?;
        agree(&format!("mtype {name} (bytes)"), out.stdout.as_slice(), data.as_slice())?;
    }
    Ok(())
}

/// Writes `files` into a directory for the peer tools to pack.
fn write_dir(dir: &Path, files: &BTreeMap<String, Vec<u8>>) -> Result<Vec<String>, String> {
    files
        .iter()
        .map(|(name, data)| {
            let p = dir.join(name);
            std::fs::write(&p, data).map_err(|e| e.to_string())?;
            Ok(p.to_str().expect("temp paths are UTF-8").to_owned())
        })
        .collect()
}

fn read_with_nubo(img: &Path) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let bytes = std::fs::read(img).map_err(|e| e.to_string())?;
    let files = nubo_seed::read(&bytes).map_err(|e| format!("nubo's reader: {e}"))?;
    Ok(files.into_iter().map(|SeedFile { name, data }| (name, data)).collect())
}

/// genisoimage's image of the same files: nubo reads it, and nubo's own is no larger.
fn genisoimage_made(_: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let tmp = TempDir::new("genisoimage");
    let paths = write_dir(&tmp.0, want)?;
    let img = tmp.0.join("peer.iso");
    let mut args = vec!["-quiet", "-J", "-V", "cidata", "-o", img.to_str().expect("utf-8")];
    args.extend(paths.iter().map(String::as_str));
    run("genisoimage", &args)?;
    agree("nubo reading genisoimage's image", &read_with_nubo(&img)?, want)?;
    let files: Vec<SeedFile> = want
        .iter()
        .map(|(n, d)| SeedFile {
            name: n.clone(),
            data: d.clone(),
        })
        .collect();
    let mut ours = Vec::new();
    nubo_seed::write_iso_files(&files, &mut ours).map_err(|e| e.to_string())?;
    let theirs = std::fs::metadata(&img).map_err(|e| e.to_string())?.len() as usize;
    if ours.len() > theirs {
        return Err(format!("nubo's image is {} bytes, genisoimage's {theirs}", ours.len()));
    }
    Ok(())
}

/// cloud-localds' image (Rock Ridge + Joliet): nubo reads the Joliet names and the bytes.
fn cloud_localds_made(_: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let tmp = TempDir::new("cloud-localds");
    write_dir(&tmp.0, want)?;
    let img = tmp.0.join("peer.iso");
    let d = |n: &str| tmp.0.join(n).to_str().expect("utf-8").to_owned();
    let mut args = vec![img.to_str().expect("utf-8").to_owned(), d("user-data"), d("meta-data")];
    if want.contains_key("network-config") {
        args.insert(0, format!("--network-config={}", d("network-config")));
    }
    if want.contains_key("vendor-data") {
        args.insert(0, format!("--vendor-data={}", d("vendor-data")));
    }
    run("cloud-localds", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
    agree("nubo reading cloud-localds' image", &read_with_nubo(&img)?, want)
}

/// mkfs.vfat + mcopy's image of the same files: nubo's own FAT reader reads names and bytes.
fn mkfs_vfat_made(_: &Path, want: &BTreeMap<String, Vec<u8>>) -> TestResult {
    let tmp = TempDir::new("mkfs-vfat");
    let paths = write_dir(&tmp.0, want)?;
    let img = tmp.0.join("peer.vfat");
    let img_s = img.to_str().expect("utf-8");
    run("mkfs.vfat", &["-n", "CIDATA", "-C", img_s, "4096"])?;
    for (name, path) in want.keys().zip(&paths) {
        run("mcopy", &["-i", img_s, path, &format!("::{name}")])?;
    }
    agree("nubo reading mkfs.vfat's image", &read_with_nubo(&img)?, want)
}

fn non_ascii_hostname_is_refused() -> TestResult {
    let s = SeedSpec {
        local_hostname: "hôte".into(),
        ..spec(None)
    };
    match nubo_seed::build(&s, SeedFormat::Iso) {
        Err(e) if e.to_string().contains("punycode") => Ok(()),
        other => Err(format!(
            "a non-ASCII hostname must be refused with a punycode hint, got {other:?}"
        )),
    }
}

fn main() -> ExitCode {
    use SeedFormat::{Iso, Vfat};
    nubo_live::run(vec![
        LiveTest::new("seed_iso_xorriso_finds_joliet_names", &["iso-tools"], || {
            each_case(Iso, xorriso)
        }),
        LiveTest::new("seed_iso_isoinfo_lists_and_extracts_joliet", &["iso-tools"], || {
            each_case(Iso, isoinfo)
        }),
        LiveTest::new("seed_iso_blkid_sees_cidata_iso9660", &["iso-tools"], || {
            each_case(Iso, |p, _| blkid(p, "iso9660"))
        }),
        LiveTest::new("seed_iso_7z_lists_names_and_sizes", &["7z"], || {
            each_case(Iso, seven_zip)
        }),
        LiveTest::new("seed_iso_bsdtar_lists_and_extracts", &["bsdtar"], || {
            each_case(Iso, bsdtar)
        }),
        LiveTest::new("seed_iso_pycdlib_reads_both_trees_and_bytes", &["pycdlib"], || {
            each_case(Iso, pycdlib)
        }),
        LiveTest::new("seed_vfat_blkid_sees_cidata_vfat", &["iso-tools"], || {
            each_case(Vfat, |p, _| blkid(p, "vfat"))
        }),
        LiveTest::new("seed_vfat_mtools_lists_and_types", &["mtools"], || {
            each_case(Vfat, mtools)
        }),
        LiveTest::new(
            "seed_reader_reads_genisoimage_images_and_is_no_larger",
            &["genisoimage"],
            || each_case(Iso, genisoimage_made),
        ),
        LiveTest::new("seed_reader_reads_cloud_localds_images", &["cloud-localds"], || {
            each_case(Iso, cloud_localds_made)
        }),
        LiveTest::new("seed_reader_reads_mkfs_vfat_images", &["mtools", "dosfstools"], || {
            each_case(Vfat, mkfs_vfat_made)
        }),
        LiveTest::new("seed_non_ascii_hostname_is_refused", &[], non_ascii_hostname_is_refused),
    ])
}
