//! `qemu-img convert`, the right tool for writing vmdk/vdi/vhdx/vhd and for turning an import
//! into qcow2. The source is hostile until inspected: it is opened once, without blocking, must
//! be a regular file the inspector accepts as self-contained (no backing file, data file, VMDK
//! extent or parent: qemu-img would read those host files into the output), and qemu-img reads
//! that same open file (`/proc/self/fd/0`), told its format (`-f`), never probing. The output
//! is written into a private (0700) directory beside the target, made 0600 (a disk may hold
//! anything its guest wrote, so nubo never widens it), and linked into place only when complete
//! and only if the target is still absent, so a failed conversion leaves nothing behind.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nubo_core::ErrorKind;
use nubo_disk::Format;

/// Where qemu-img finds the source: the inspected descriptor, handed over as its stdin. A path
/// nubo writes itself, so no user path is ever parsed as a qemu-img option or protocol.
pub const SOURCE_ARG: &str = "/proc/self/fd/0";
/// The converted image's mode: owner only.
pub const OUTPUT_MODE: u32 = 0o600;

#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("`qemu-img` not found: install qemu-utils")]
    QemuImgMissing,
    #[error("qemu-img convert of {} failed ({status}): {stderr}", src.display())]
    QemuImg {
        src: PathBuf,
        status: String,
        stderr: String,
    },
    #[error("--compress works only for qcow2 and vmdk, not {0}: drop --compress or pick one of those")]
    CompressUnsupported(Format),
    #[error("{0} cannot be a conversion target: choose raw, qcow2, vmdk, vdi, vhdx or vhd")]
    BadTarget(Format),
    #[error("{} already exists: nubo never overwrites; remove it or choose another -o", .0.display())]
    Exists(PathBuf),
    #[error("checking the conversion output")]
    Output(#[source] nubo_core::FileError),
    #[error("inspecting {}", path.display())]
    Disk {
        path: PathBuf,
        #[source]
        source: nubo_disk::DiskError,
    },
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl ConvertError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            ConvertError::QemuImgMissing => ErrorKind::Unavailable,
            ConvertError::QemuImg { .. } | ConvertError::Io { .. } => ErrorKind::Io,
            ConvertError::CompressUnsupported(_) | ConvertError::BadTarget(_) => ErrorKind::InvalidInput,
            ConvertError::Exists(_) => ErrorKind::AlreadyExists,
            ConvertError::Output(e) => e.kind(),
            ConvertError::Disk { source, .. } => source.kind(),
        }
    }
}

/// A conversion, resolved: source and its (sniffed) format, target format and path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvertSpec {
    pub src: PathBuf,
    pub src_format: Format,
    pub to: Format,
    pub out: PathBuf,
    pub compress: bool,
}

/// The `qemu-img convert` arguments for `spec`, writing to `tmp_out` (absolute) and reading
/// [`SOURCE_ARG`]. Both formats are explicit and `--` ends the options, so neither file name is
/// probed or parsed as an option. Pure.
pub fn convert_args(spec: &ConvertSpec, tmp_out: &Path) -> Result<Vec<OsString>, ConvertError> {
    if spec.to == Format::Iso {
        return Err(ConvertError::BadTarget(spec.to));
    }
    if spec.compress && !matches!(spec.to, Format::Qcow2 | Format::Vmdk) {
        return Err(ConvertError::CompressUnsupported(spec.to));
    }
    let mut args: Vec<OsString> = [
        "convert",
        "-f",
        spec.src_format.qemu_driver(),
        "-O",
        spec.to.qemu_driver(),
    ]
    .iter()
    .map(OsString::from)
    .collect();
    if spec.compress {
        args.push("-c".into());
        if spec.to == Format::Vmdk {
            // qemu's vmdk driver compresses only the streamOptimized subformat.
            args.extend(["-o".into(), "subformat=streamOptimized".into()]);
        }
    }
    args.extend(["--".into(), SOURCE_ARG.into(), tmp_out.into()]);
    Ok(args)
}

/// `.<name>.tmp.<pid>` beside `out`: same filesystem, so the final link is atomic (the name
/// cut short to stay a legal file name, see [`nubo_core::file::temp_beside`]).
pub fn temp_beside(out: &Path) -> PathBuf {
    nubo_core::file::temp_beside(out)
}

/// Runs the conversion; the result appears at `spec.out` (mode 0600) only when complete.
pub fn convert(spec: &ConvertSpec) -> Result<(), ConvertError> {
    let io_at = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConvertError::Io { path, source }
    };
    let out = std::path::absolute(&spec.out).map_err(io_at(&spec.out))?;
    nubo_core::file::check_output(&out).map_err(ConvertError::Output)?;
    if fs::symlink_metadata(&out).is_ok() {
        return Err(ConvertError::Exists(spec.out.clone()));
    }
    let disk = |source| ConvertError::Disk {
        path: spec.src.clone(),
        source,
    };
    let (info, src) = nubo_disk::open_inspected(&spec.src).map_err(disk)?;
    let same = info.format == spec.src_format
        || (info.format.qemu_driver() == "raw" && spec.src_format.qemu_driver() == "raw");
    if !same {
        return Err(disk(nubo_disk::DiskError::FormatMismatch {
            path: spec.src.clone(),
            expected: spec.src_format,
            found: info.format,
        }));
    }
    let dir = temp_beside(&out);
    let tmp = dir.join("image");
    let args = convert_args(spec, &tmp)?;
    nubo_core::fsmode::create_dir(&dir, nubo_core::fsmode::PRIVATE_DIR).map_err(io_at(&dir))?;
    let result = run_qemu_img(&spec.src, src, &args).and_then(|()| publish(&tmp, &out, &spec.out));
    let _ = fs::remove_file(&tmp);
    let _ = fs::remove_dir(&dir);
    result
}

/// Makes `tmp` owner-only and durable, then links it at `out` (failing if anything appeared
/// there meanwhile: link(2) never replaces).
fn publish(tmp: &Path, out: &Path, shown: &Path) -> Result<(), ConvertError> {
    let io_at = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ConvertError::Io { path, source }
    };
    let f = File::open(tmp).map_err(io_at(tmp))?;
    f.set_permissions(fs::Permissions::from_mode(OUTPUT_MODE))
        .map_err(io_at(tmp))?;
    f.sync_all().map_err(io_at(tmp))?;
    fs::hard_link(tmp, out).map_err(|e| match e.kind() {
        io::ErrorKind::AlreadyExists => ConvertError::Exists(shown.to_path_buf()),
        _ => ConvertError::Io {
            path: shown.to_path_buf(),
            source: e,
        },
    })
}

fn run_qemu_img(src: &Path, input: File, args: &[OsString]) -> Result<(), ConvertError> {
    let out = Command::new("qemu-img")
        .args(args)
        .stdin(Stdio::from(input))
        .output()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ConvertError::QemuImgMissing,
            _ => ConvertError::Io {
                path: "qemu-img".into(),
                source: e,
            },
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(ConvertError::QemuImg {
        src: src.to_path_buf(),
        status: out.status.to_string(),
        stderr: nubo_core::file::escape_control(String::from_utf8_lossy(&out.stderr).trim()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(to: Format, compress: bool) -> ConvertSpec {
        ConvertSpec {
            src: "/s/a.qcow2".into(),
            src_format: Format::Qcow2,
            to,
            out: "/o/b".into(),
            compress,
        }
    }

    fn strs(v: Vec<OsString>) -> Vec<String> {
        v.into_iter().map(|s| s.into_string().unwrap()).collect()
    }

    #[test]
    fn convert_args_vhd_uses_vpc_driver() {
        let args = strs(convert_args(&spec(Format::Vpc, false), Path::new("/o/t")).unwrap());

        assert_eq!(args, ["convert", "-f", "qcow2", "-O", "vpc", "--", SOURCE_ARG, "/o/t"]);
    }

    #[test]
    fn convert_args_compressed_vmdk_is_stream_optimized() {
        let args = strs(convert_args(&spec(Format::Vmdk, true), Path::new("/o/t")).unwrap());

        assert_eq!(args[5..8], ["-c", "-o", "subformat=streamOptimized"]);
    }

    #[test]
    fn convert_args_compressed_raw_is_refused() {
        let err = convert_args(&spec(Format::Raw, true), Path::new("/o/t")).unwrap_err();

        assert!(matches!(err, ConvertError::CompressUnsupported(Format::Raw)));
    }

    #[test]
    fn temp_beside_is_hidden_in_same_dir() {
        let t = temp_beside(Path::new("/o/disk.vmdk"));

        assert_eq!(t.parent(), Some(Path::new("/o")));
        assert!(t.file_name().unwrap().to_string_lossy().starts_with(".disk.vmdk.tmp."));
    }

    fn spec_at(src: &Path, out: &Path) -> ConvertSpec {
        ConvertSpec {
            src: src.to_path_buf(),
            src_format: Format::Qcow2,
            to: Format::Raw,
            out: out.to_path_buf(),
            compress: false,
        }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn convert_args_end_options_before_file_names() {
        let args = strs(convert_args(&spec(Format::Raw, false), Path::new("/o/-t")).unwrap());

        assert_eq!(args[args.len() - 3..], ["--", SOURCE_ARG, "/o/-t"]);
    }

    /// Regression (issue 9): the import refusal sent users to `nubo image convert`, which wrote
    /// the backing file (/etc/shadow) into a 0644 image.
    #[test]
    fn convert_backed_qcow2_is_refused_leaving_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base.raw");
        fs::write(&base, vec![1u8; 4096]).unwrap();
        let top = dir.path().join("top.qcow2");
        nubo_disk::create_overlay(&base, Format::Raw, &top, None).unwrap();
        let out = dir.path().join("flat.qcow2");

        let err = convert(&spec_at(&top, &out)).unwrap_err();

        assert!(
            matches!(
                &err,
                ConvertError::Disk {
                    source: nubo_disk::DiskError::Refused { .. },
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(entries(dir.path()), ["base.raw", "top.qcow2"]);
    }

    #[test]
    fn convert_fifo_source_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();

        let err = convert(&spec_at(&fifo, &dir.path().join("o.raw"))).unwrap_err();

        assert!(
            format!("{:?}", err).contains("FIFO") || err.kind() == ErrorKind::InvalidInput,
            "{err:?}"
        );
        assert_eq!(entries(dir.path()), ["fifo"]);
    }

    #[test]
    fn convert_output_symlink_is_refused_and_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.qcow2");
        nubo_disk::create_qcow2(&src, 1 << 20).unwrap();
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        let link = dir.path().join("out.raw");
        std::os::unix::fs::symlink(&victim, &link).unwrap();

        let err = convert(&spec_at(&src, &link)).unwrap_err();

        assert!(matches!(err, ConvertError::Output(_)), "{err:?}");
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
    }

    #[test]
    fn convert_declared_format_not_the_files_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("a.raw");
        fs::write(&src, vec![0u8; 4096]).unwrap();

        let err = convert(&spec_at(&src, &dir.path().join("o.raw"))).unwrap_err();

        assert!(
            matches!(
                &err,
                ConvertError::Disk {
                    source: nubo_disk::DiskError::FormatMismatch { .. },
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
