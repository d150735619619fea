//! `qemu-img convert`, the right tool for writing vmdk/vdi/vhdx/vhd and for flattening chains.
//! Output goes to a temp name beside the target and is renamed only once complete, so a failed or
//! interrupted conversion never leaves a plausible-looking file.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use nubo_core::ErrorKind;
use nubo_disk::Format;

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

/// The `qemu-img convert` arguments for `spec`, writing to `tmp_out`. Pure.
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
    args.push(spec.src.clone().into());
    args.push(tmp_out.into());
    Ok(args)
}

/// `.<name>.tmp.<pid>` beside `out`: same filesystem, so the final rename is atomic.
pub fn temp_beside(out: &Path) -> PathBuf {
    let mut name = OsString::from(".");
    name.push(out.file_name().unwrap_or_default());
    name.push(format!(".tmp.{}", std::process::id()));
    out.with_file_name(name)
}

/// Runs the conversion; the result appears at `spec.out` only when complete.
pub fn convert(spec: &ConvertSpec) -> Result<(), ConvertError> {
    if spec.out.exists() {
        return Err(ConvertError::Exists(spec.out.clone()));
    }
    let tmp = temp_beside(&spec.out);
    let args = convert_args(spec, &tmp)?;
    let result = run_qemu_img(&spec.src, &args).and_then(|()| {
        fs::rename(&tmp, &spec.out).map_err(|source| ConvertError::Io {
            path: spec.out.clone(),
            source,
        })
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn run_qemu_img(src: &Path, args: &[OsString]) -> Result<(), ConvertError> {
    let out = Command::new("qemu-img")
        .args(args)
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
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
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

        assert_eq!(args, ["convert", "-f", "qcow2", "-O", "vpc", "/s/a.qcow2", "/o/t"]);
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
}
