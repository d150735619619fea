//! Shared folders (`--mount`): the spec's [`MountSpec`]s resolved against the host and the
//! chosen backend into the machine's [`SharedDir`]s, and the seed's `mounts:` entries.
//!
//! Host directories are canonicalised here, once, before any file exists: the VMM and
//! virtiofsd get a path with no symlink left to swap, and a missing or non-directory path is
//! refused naming the mount. The guest mounts them through cloud-init's mounts module, so a
//! seed nubo does not make (`--seed`) or an appliance without cloud-init cannot carry them.

use std::path::Path;

use nubo_backend::{mount_tag, Backend, SharedDir};
use nubo_spec::{Field, MountSpec, VmSpec};

use crate::plan::{Plan, SeedPlan};
use crate::EngineError;

/// The machine's shared folders for `spec` on `backend`, and notes (a fallback transport).
pub(crate) fn resolve(
    spec: &VmSpec,
    plan: &Plan,
    backend: &dyn Backend,
) -> Result<(Vec<SharedDir>, Vec<String>), EngineError> {
    if spec.mounts.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    match &plan.seed {
        SeedPlan::Generated => {}
        SeedPlan::Own(_) => {
            return Err(EngineError::spec(
                Field::Mounts,
                "cannot be added to your own seed (--seed), which is attached as is: add a `mounts:` entry to its user-data, or let nubo make the seed",
            ))
        }
        SeedPlan::None => {
            return Err(EngineError::spec(
                Field::Mounts,
                "the image has no cloud-init to mount them in the guest: mount them yourself, or use a cloud image",
            ))
        }
    }
    if spec.cloud_init.user_data.is_some() && spec.cloud_init.vendor_data.is_some() {
        return Err(EngineError::spec(
            Field::Mounts,
            "nubo puts the mounts in vendor-data when you give user-data, and you gave vendor-data too: add the `mounts:` entries to your user-data yourself, or drop the vendor-data",
        ));
    }
    let (transport, note) = backend.mount_transport()?;
    let mut out = Vec::with_capacity(spec.mounts.len());
    for (i, m) in spec.mounts.iter().enumerate() {
        out.push(SharedDir {
            tag: mount_tag(i),
            host: host_dir(i, &m.host_path)?,
            guest: m.guest().to_path_buf(),
            read_only: m.read_only,
            transport,
        });
    }
    Ok((out, note.into_iter().collect()))
}

/// The canonical host directory of mount `i`: it exists, is a directory, and its real path is
/// as printable as the one given.
fn host_dir(i: usize, given: &Path) -> Result<std::path::PathBuf, EngineError> {
    let at = format!("[{i}].hostPath");
    let refuse = |msg: String| EngineError::spec_at(Field::Mounts, &at, msg);
    let real = std::fs::canonicalize(given).map_err(|e| {
        refuse(match e.kind() {
            std::io::ErrorKind::NotFound => {
                format!(
                    "host directory {} does not exist: create it, or give another",
                    given.display()
                )
            }
            _ => format!("host directory {} cannot be resolved: {e}", given.display()),
        })
    })?;
    let meta = std::fs::metadata(&real)
        .map_err(|e| refuse(format!("host directory {} cannot be read: {e}", real.display())))?;
    if !meta.is_dir() {
        return Err(refuse(format!(
            "{} is not a directory: share the directory that holds it",
            real.display()
        )));
    }
    let printable = real
        .to_str()
        .is_some_and(|s| !s.chars().any(|c| c.is_control() || c.is_whitespace()));
    if !printable {
        return Err(refuse(format!(
            "host directory {} resolves to {}, which has control characters or whitespace: share another directory",
            given.display(),
            nubo_core::file::escape_control(&real.to_string_lossy())
        )));
    }
    Ok(real)
}

/// The seed's `mounts:` cloud-config lines for the machine's folders (empty for none).
pub(crate) fn cloud_config(dirs: &[SharedDir]) -> String {
    let guest: Vec<nubo_seed::GuestMount> = dirs
        .iter()
        .map(|d| nubo_seed::GuestMount {
            tag: d.tag.clone(),
            path: d.guest.to_string_lossy().into_owned(),
            fs_type: d.transport.fs_type().to_owned(),
            read_only: d.read_only,
        })
        .collect();
    nubo_seed::render_mounts(&guest)
}

/// Appends `mounts` (cloud-config lines) to a generated `#cloud-config` document.
pub(crate) fn append(doc: Vec<u8>, mounts: &str) -> Vec<u8> {
    let mut doc = doc;
    doc.extend_from_slice(mounts.as_bytes());
    doc
}

impl crate::Engine {
    /// `vm mount`: shares another host directory with an existing VM through the backend's
    /// hot-plug, then records it. No backend hot-plugs one yet; each refuses by name with the
    /// alternative (recreate the VM with `--mount`).
    pub fn mount(&self, name: &str, m: &MountSpec) -> Result<(), EngineError> {
        nubo_spec::check_mounts(std::slice::from_ref(m))?;
        let (_lock, mut rec) = self.lock_existing(name, "mount")?;
        let backend = self.backend_of(&rec)?;
        let dir = self.roots.vm_dir(name);
        let index = rec.machine.mounts.len();
        if rec.machine.mounts.iter().any(|d| d.guest == m.guest()) {
            return Err(EngineError::spec(
                Field::Mounts,
                format!(
                    "vm `{name}` already has a shared folder at {}: give another guest directory",
                    m.guest().display()
                ),
            ));
        }
        let (transport, _) = backend.mount_transport()?;
        let shared = SharedDir {
            tag: mount_tag(index),
            host: host_dir(index, &m.host_path)?,
            guest: m.guest().to_path_buf(),
            read_only: m.read_only,
            transport,
        };
        backend.mount_running(&rec.vm_ref(&dir), &shared)?;
        rec.machine.mounts.push(shared);
        rec.spec.mounts.push(m.clone());
        crate::record::save(&dir, &rec)
    }

    /// `vm umount`: stops sharing the folder mounted at `guest` with a running VM.
    pub fn umount(&self, name: &str, guest: &Path) -> Result<(), EngineError> {
        let (_lock, mut rec) = self.lock_existing(name, "umount")?;
        let backend = self.backend_of(&rec)?;
        let dir = self.roots.vm_dir(name);
        let Some(i) = rec.machine.mounts.iter().position(|d| d.guest == guest) else {
            return Err(EngineError::spec(
                Field::Mounts,
                format!(
                    "vm `{name}` has no shared folder at {}: `nubo vm inspect {name}` lists them under machine.mounts",
                    guest.display()
                ),
            ));
        };
        backend.unmount_running(&rec.vm_ref(&dir), &rec.machine.mounts[i].tag)?;
        rec.machine.mounts.remove(i);
        rec.spec.mounts.retain(|m| m.guest() != guest);
        crate::record::save(&dir, &rec)
    }
}
