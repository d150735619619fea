//! Shared folders (`--mount`): the spec's [`MountSpec`]s resolved against the host and the
//! chosen backend into the machine's [`SharedDir`]s, and the seed's `mounts:` entries.
//!
//! Host directories are canonicalised here, once, before any file exists: the VMM and
//! virtiofsd get a path with no symlink left to swap, and a missing or non-directory path is
//! refused naming the mount. The guest mounts them through cloud-init's mounts module, so a
//! seed nubo does not make (`--seed`) or an appliance without cloud-init cannot carry them.

use std::path::Path;

use nubo_backend::{free_mount_tag, mount_tag, Backend, SharedDir};
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
    /// `vm mount`: shares another host directory with a running VM. The backend hot-plugs the
    /// device (or refuses by name where it cannot), then nubo mounts it in the guest over SSH
    /// and writes its `/etc/fstab` line, so it is mounted again on the next boot, when the
    /// backend attaches it from the record as a folder given at creation. A guest-side failure
    /// unplugs the device again: nothing is left half-made, and the record changes only at
    /// the end.
    pub fn mount(&self, name: &str, m: &MountSpec) -> Result<(), EngineError> {
        nubo_spec::check_mounts(std::slice::from_ref(m))?;
        let (_lock, mut rec) = self.lock_existing(name, "mount")?;
        let backend = self.backend_of(&rec)?;
        let dir = self.roots.vm_dir(name);
        if rec.machine.mounts.iter().any(|d| d.guest == m.guest()) {
            return Err(EngineError::spec(
                Field::Mounts,
                format!(
                    "vm `{name}` already has a shared folder at {}: give another guest directory",
                    m.guest().display()
                ),
            ));
        }
        self.require_running(&rec, "mount")?;
        let (transport, _) = backend.mount_transport()?;
        let shared = SharedDir {
            tag: free_mount_tag(&rec.machine.mounts),
            host: host_dir(rec.machine.mounts.len(), &m.host_path)?,
            guest: m.guest().to_path_buf(),
            read_only: m.read_only,
            transport,
        };
        // Before the device: what the backend cannot plug, and a VM the host cannot reach
        // over SSH (which could not mount it), are refused with nothing changed.
        backend.check_hot_plug(&rec.machine, &shared)?;
        let ssh = self.ssh_argv(name, &[])?;
        backend.mount_running(&rec.vm_ref(&dir), &rec.machine, &shared)?;
        if let Err(e) = self.in_guest(name, ssh, &guest_mount_script(&shared)) {
            let _ = backend.unmount_running(&rec.vm_ref(&dir), &rec.machine, &shared);
            return Err(e);
        }
        rec.machine.mounts.push(shared);
        rec.spec.mounts.push(m.clone());
        crate::record::save(&dir, &rec)
    }

    /// `vm umount`: stops sharing the folder mounted at `guest` with a running VM: unmounted in
    /// the guest and dropped from its `/etc/fstab` over SSH, then unplugged by the backend.
    /// Each step converges when run again after an interruption.
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
        self.require_running(&rec, "umount")?;
        let shared = rec.machine.mounts[i].clone();
        // The backend's refusal first, before the guest loses the folder.
        backend.check_hot_plug(&rec.machine, &shared)?;
        let ssh = self.ssh_argv(name, &[])?;
        self.in_guest(name, ssh, &guest_umount_script(&shared))?;
        backend.unmount_running(&rec.vm_ref(&dir), &rec.machine, &shared)?;
        rec.machine.mounts.remove(i);
        rec.spec.mounts.retain(|m| m.guest() != guest);
        crate::record::save(&dir, &rec)
    }

    fn require_running(&self, rec: &crate::record::VmRecord, verb: &str) -> Result<(), EngineError> {
        let state = self.state(rec)?;
        if state == nubo_core::VmState::Running {
            return Ok(());
        }
        let name = &rec.name;
        Err(EngineError::InvalidState {
            name: name.clone(),
            state: state.to_string(),
            fix: match state {
                nubo_core::VmState::Paused => {
                    format!("resume it first (`nubo vm resume {name}`), then `nubo vm {verb}` again")
                }
                _ => format!("start it first (`nubo vm start {name}`), then `nubo vm {verb}` again"),
            },
        })
    }

    /// Runs `script` as root in the guest through `ssh` (the VM's ssh command line), bounded by
    /// [`GUEST_TIMEOUT`]; its error names the guest and what it said.
    fn in_guest(&self, name: &str, mut ssh: Vec<String>, script: &str) -> Result<(), EngineError> {
        use std::io::Read;
        // Never a password or passphrase prompt (nubo's key or nothing), and no connection
        // sharing from the user's ssh config: a ControlPersist master would outlive this ssh
        // holding its stderr.
        ssh.splice(
            1..1,
            ["BatchMode=yes", "ControlMaster=no", "ControlPath=none"]
                .into_iter()
                .flat_map(|o| ["-o".to_owned(), o.to_owned()]),
        );
        ssh.push(format!("sudo -n sh -c {}", sh_quote(script)));
        let fail = |detail: String| {
            EngineError::Backend(nubo_backend::BackendError::Remote {
                what: format!("the guest of vm `{name}`"),
                detail,
            })
        };
        let mut child = std::process::Command::new(&ssh[0])
            .args(&ssh[1..])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("starting ssh: {e}")))?;
        let mut stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = (&mut stderr).take(16 << 10).read_to_end(&mut out);
            let _ = tx.send(out);
        });
        let status = nubo_core::child::wait_bounded(&mut child, GUEST_TIMEOUT);
        // Bounded: whatever else holds the pipe open cannot keep nubo waiting.
        let said = rx.recv_timeout(std::time::Duration::from_secs(2)).unwrap_or_default();
        let said = nubo_core::file::escape_control(String::from_utf8_lossy(&said).trim());
        match status {
            Some(st) if st.success() => Ok(()),
            Some(st) if st.code() == Some(255) => Err(fail(format!(
                "ssh could not reach it ({said}): check `nubo vm ssh {name}` works, then run the command again"
            ))),
            Some(st) => Err(fail(format!("the command failed ({st}): {said}"))),
            None => Err(fail(format!(
                "no answer within {} s: check `nubo vm ssh {name}` works, then run the command again",
                GUEST_TIMEOUT.as_secs()
            ))),
        }
    }
}

/// How long the guest-side step of `vm mount` / `vm umount` may take.
const GUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A word for a POSIX shell: single-quoted, each `'` closed, escaped and reopened.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The `/etc/fstab` line of a shared folder: the options the seed's `mounts:` entry gives
/// (guest paths hold no whitespace: `nubo_spec::check_mounts`).
fn fstab_line(d: &SharedDir) -> String {
    let ro = if d.read_only { ",ro" } else { "" };
    format!(
        "{} {} {} defaults{ro},nofail 0 0",
        d.tag,
        d.guest.display(),
        d.transport.fs_type()
    )
}

/// Drops the `/etc/fstab` lines of tag `t` (cloud-init's for a folder given at creation, or
/// nubo's own), leaving every other line as it was.
const FSTAB_DROP: &str = "awk -v t=\"$tag\" '$1 != t' /etc/fstab > /etc/fstab.nubo && cat /etc/fstab.nubo > /etc/fstab && rm -f /etc/fstab.nubo";

/// The top filesystem mounted at `$dir` in the guest, or nothing (shell).
const TOP_MOUNT: &str = "top=$(findmnt -n -o SOURCE --mountpoint \"$dir\" | tail -n 1)";

/// The guest side of `vm mount` (pure): refused when another filesystem is mounted at the
/// directory; a mount of this tag that an interrupted `vm mount` left (on a device since
/// unplugged) is taken down; then the directory made, the folder mounted by its tag, and its
/// fstab line in place of any earlier one for that tag.
pub(crate) fn guest_mount_script(d: &SharedDir) -> String {
    let ro = if d.read_only { "-o ro " } else { "" };
    format!(
        "set -e; tag={tag}; dir={dir}; {TOP_MOUNT}; \
         if [ -n \"$top\" ] && [ \"$top\" != \"$tag\" ]; then echo \"$dir is already a mount point in the guest ($top): give another guest directory\" >&2; exit 3; fi; \
         if [ -n \"$top\" ]; then umount -l \"$dir\"; fi; \
         mkdir -p \"$dir\"; mount -t {fs} {ro}\"$tag\" \"$dir\"; {FSTAB_DROP}; echo {line} >> /etc/fstab",
        tag = sh_quote(&d.tag),
        dir = sh_quote(&d.guest.to_string_lossy()),
        fs = d.transport.fs_type(),
        line = sh_quote(&fstab_line(d)),
    )
}

/// The guest side of `vm umount` (pure): unmounted if it is the top mount there (refused when
/// the guest mounted something else over it), its fstab lines dropped.
pub(crate) fn guest_umount_script(d: &SharedDir) -> String {
    format!(
        "set -e; tag={tag}; dir={dir}; {TOP_MOUNT}; \
         if [ \"$top\" = \"$tag\" ]; then umount \"$dir\"; \
         elif [ -n \"$top\" ]; then echo \"another filesystem ($top) is mounted over $dir in the guest: unmount it there first\" >&2; exit 3; fi; \
         {FSTAB_DROP}",
        tag = sh_quote(&d.tag),
        dir = sh_quote(&d.guest.to_string_lossy()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use nubo_backend::MountTransport;

    fn shared(guest: &str, ro: bool) -> SharedDir {
        SharedDir {
            tag: "mount2".into(),
            host: "/srv/x".into(),
            guest: guest.into(),
            read_only: ro,
            transport: MountTransport::Virtiofs,
        }
    }

    fn sh(script: &str) -> std::process::Output {
        std::process::Command::new("sh").arg("-c").arg(script).output().unwrap()
    }

    #[test]
    fn sh_quote_survives_a_shell() {
        let hostile = "/mnt/it's $(touch /tmp/x) `id` \\ \"q\"";

        let out = sh(&format!("printf %s {}", sh_quote(hostile)));

        assert_eq!(String::from_utf8_lossy(&out.stdout), hostile);
    }

    #[test]
    fn fstab_line_matches_the_seeds_options() {
        assert_eq!(
            fstab_line(&shared("/mnt/a", false)),
            "mount2 /mnt/a virtiofs defaults,nofail 0 0"
        );
        assert_eq!(
            fstab_line(&shared("/mnt/a", true)),
            "mount2 /mnt/a virtiofs defaults,ro,nofail 0 0"
        );
    }

    #[test]
    fn guest_scripts_parse_and_quote_the_directory() {
        for script in [
            guest_mount_script(&shared("/mnt/o'k", true)),
            guest_umount_script(&shared("/mnt/o'k", false)),
        ] {
            let out = sh(&format!("sh -n -c {}", sh_quote(&script)));
            assert!(
                out.status.success(),
                "{script}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(script.contains(r"dir='/mnt/o'\''k'"), "{script}");
        }
        assert!(guest_mount_script(&shared("/mnt/a", true)).contains("mount -t virtiofs -o ro \"$tag\" \"$dir\""));
        assert!(!guest_mount_script(&shared("/mnt/a", false)).contains("-o ro"));
    }

    #[test]
    fn fstab_drop_keeps_every_other_line() {
        let dir = tempfile::tempdir().unwrap();
        let fstab = dir.path().join("fstab");
        std::fs::write(
            &fstab,
            "UUID=1 / ext4 defaults 0 1\nmount2\t/mnt/a\tvirtiofs\tdefaults,nofail,comment=cloudconfig\t0\t0\nmount20 /mnt/b virtiofs defaults 0 0\n",
        )
        .unwrap();
        let script = FSTAB_DROP.replace("/etc/fstab", &fstab.display().to_string());

        let out = sh(&format!("tag=mount2; {script}"));

        assert!(out.status.success());
        assert_eq!(
            std::fs::read_to_string(&fstab).unwrap(),
            "UUID=1 / ext4 defaults 0 1\nmount20 /mnt/b virtiofs defaults 0 0\n"
        );
    }
}
