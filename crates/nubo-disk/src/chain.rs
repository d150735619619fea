//! The chain a VM boots, checked again before every boot (issue 21). A VM's disk is nubo's
//! qcow2 overlay over a base; the base may be a user's own file (`vm create --disk`), which can
//! be replaced between create and the next start. [`verify_vm_chain`] proves, just before the
//! VMM gets the disk, that the chain is still the one nubo made: the overlay names exactly the
//! recorded base, with the recorded format, and the base passes the untrusted inspector again
//! (self-contained: no backing file, data file, extent or parent of its own), with the size
//! recorded at create. Nothing below the base is opened: a base that names a backing file is
//! refused, never followed.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::DiskError;
use crate::inspect::{inspect_as, inspect_one, DiskInfo};
use crate::inspector::{Policy, Usage};
use crate::qcow2::CryptMethod;
use crate::Format;

/// The base a VM was created over, as nubo recorded it.
#[derive(Debug, Clone, Copy)]
pub struct ExpectedBase<'a> {
    /// The path recorded for the base (absolute; it may pass through symlinks).
    pub path: &'a Path,
    /// The format nubo proved at create; formats QEMU reads with one driver (raw, ISO) match.
    pub format: Format,
    /// The base's virtual size at create, when the record holds it (records before issue 21 do
    /// not).
    pub size: Option<u64>,
}

/// A chain [`verify_vm_chain`] accepted: exactly two files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedChain {
    pub overlay: DiskInfo,
    /// The base, resolved (no symlinks): the path a VMM should be handed.
    pub base: PathBuf,
    pub base_info: DiskInfo,
}

/// Re-inspects a VM's chain before a boot: `overlay` (nubo's own qcow2) must have exactly one
/// backing file, `expected.path` (resolved, or as recorded), recorded with `expected.format`;
/// the base must pass [`check_base`] (the untrusted inspector, usable as a base, not
/// encrypted) and keep its recorded size. Opens the overlay and the base, nothing else.
pub fn verify_vm_chain(overlay: &Path, expected: &ExpectedBase<'_>) -> Result<VerifiedChain, DiskError> {
    let (top, _, _) = inspect_one(overlay, Policy::OwnOverlay)?;
    let changed = |why: String| DiskError::ChainChanged {
        overlay: overlay.to_path_buf(),
        why,
    };
    if top.format != Format::Qcow2 {
        return Err(changed(format!(
            "it is a {} image, not the qcow2 overlay nubo made",
            top.format
        )));
    }
    let Some(backing) = top.backing.clone() else {
        return Err(changed(format!(
            "it has no backing file, and nubo made it over `{}`",
            expected.path.display()
        )));
    };
    let base = fs::canonicalize(expected.path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => DiskError::MissingBacking {
            image: overlay.to_path_buf(),
            backing: expected.path.to_path_buf(),
        },
        _ => DiskError::io("resolve", expected.path, e),
    })?;
    if backing.file != base && backing.file != expected.path {
        return Err(changed(format!(
            "its backing file is `{}`, and nubo made it over `{}`",
            backing.file.display(),
            expected.path.display()
        )));
    }
    let recorded = backing.format.map(Format::qemu_driver);
    if recorded != Some(expected.format.qemu_driver()) {
        return Err(changed(format!(
            "it records its backing file's format as {}, and nubo made it over a {} base",
            recorded.unwrap_or("nothing"),
            expected.format.qemu_driver()
        )));
    }
    let base_info = check_base(&base, expected.format)?;
    if let Some(size) = expected.size.filter(|s| *s != base_info.virtual_size) {
        return Err(DiskError::BaseResized {
            path: base,
            recorded: size,
            found: base_info.virtual_size,
        });
    }
    Ok(VerifiedChain {
        overlay: top,
        base,
        base_info,
    })
}

/// What makes `base` (resolved) a base nubo puts an overlay on, at create and before every
/// boot: it passes the untrusted inspector as `format` (self-contained, on the allowlist), is
/// usable as a base, and is not encrypted.
pub(crate) fn check_base(base: &Path, format: Format) -> Result<DiskInfo, DiskError> {
    let info = inspect_as(base, format)?;
    if info.usage != Usage::Base {
        return Err(DiskError::NotBase {
            path: base.to_path_buf(),
            format: info.format,
        });
    }
    if info.qcow2.as_ref().is_some_and(|h| h.crypt_method != CryptMethod::None) {
        return Err(DiskError::Encrypted {
            path: base.to_path_buf(),
        });
    }
    Ok(info)
}

#[cfg(test)]
mod tests;
