//! The image `vm create NAME` boots when no source is given (`nubo image default`), kept in
//! `$NUBO_ROOT/settings.json` beside the default backend, written atomically under a lock.

use crate::{Engine, EngineError, StoredSettings};

/// The default image until the user sets another: nubo's own bootstrap recipe builds it
/// offline (`nubo image bootstrap debian:12`), and the catalog can pull it.
pub const DEFAULT_IMAGE: &str = "debian:12";

/// The lock file beside settings.json (hidden: `$NUBO_ROOT` is the user's to look at).
const SETTINGS_LOCK: &str = ".settings.lock";

impl Engine {
    /// The image new VMs use when none is named: the one set, else [`DEFAULT_IMAGE`].
    pub fn default_image(&self) -> Result<String, EngineError> {
        Ok(self
            .settings()?
            .default_image
            .unwrap_or_else(|| DEFAULT_IMAGE.to_owned()))
    }

    /// Whether a default image was set (`None`: [`DEFAULT_IMAGE`] applies).
    pub fn default_image_set(&self) -> Result<Option<String>, EngineError> {
        Ok(self.settings()?.default_image)
    }

    /// Sets (`Some`) or clears (`None`) the default image. The reference must parse as
    /// `vm create --image` takes it; it need not be local yet (first use pulls it).
    pub fn set_default_image(&self, reference: Option<&str>) -> Result<(), EngineError> {
        if let Some(r) = reference {
            nubo_image::AnyRef::parse(r)
                .map_err(|e| EngineError::spec(nubo_spec::Field::SourceImageReference, e.to_string()))?;
        }
        // A corrupt file is refused rather than replaced: it may hold the other setting.
        self.update_settings(false, |s| s.default_image = reference.map(str::to_owned))
    }

    /// Reads the settings, changes them and writes them back atomically, all under
    /// `$NUBO_ROOT/.settings.lock` (threads of this process and other processes alike), so
    /// two writers of different settings never lose each other's change. A corrupt file is
    /// replaced by defaults when `replace_corrupt`, else refused.
    pub(crate) fn update_settings(
        &self,
        replace_corrupt: bool,
        change: impl FnOnce(&mut StoredSettings),
    ) -> Result<(), EngineError> {
        nubo_core::fsmode::create_dir_all(&self.roots.root, nubo_core::fsmode::DIR)
            .map_err(EngineError::io("", format!("creating {}", self.roots.root.display())))?;
        let _lock = crate::lock::FileLock::acquire(
            &self.roots.root.join(SETTINGS_LOCK),
            "nubo's settings",
            "settings",
            nubo_core::Deadline::after(self.lock_wait),
            &self.cancel,
        )?;
        let mut s = match self.settings() {
            Ok(s) => s,
            Err(EngineError::CorruptSettings { .. }) if replace_corrupt => StoredSettings::default(),
            Err(e) => return Err(e),
        };
        change(&mut s);
        let path = self.roots.config_file();
        nubo_core::write_json_atomic(&path, &s).map_err(EngineError::io("", format!("writing {}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(dir: &std::path::Path) -> Engine {
        let roots = nubo_core::Roots {
            root: dir.join("root"),
            run_dir: dir.join("run"),
        };
        Engine::new(roots, nubo_backend::Registry::new(Vec::new()), None)
    }

    #[test]
    fn default_image_unset_is_debian_12() {
        let d = tempfile::tempdir().unwrap();

        assert_eq!(engine(d.path()).default_image().unwrap(), "debian:12");
    }

    #[test]
    fn default_image_set_then_cleared_keeps_default_backend() {
        let d = tempfile::tempdir().unwrap();
        let e = engine(d.path());
        std::fs::create_dir_all(d.path().join("root")).unwrap();
        std::fs::write(e.roots.config_file(), r#"{"default_backend":"qemu"}"#).unwrap();

        e.set_default_image(Some("ubuntu:24.04")).unwrap();
        let set = e.default_image().unwrap();
        e.set_default_image(None).unwrap();

        assert_eq!(set, "ubuntu:24.04");
        assert_eq!(e.default_image().unwrap(), "debian:12");
        assert_eq!(e.settings().unwrap().default_backend.as_deref(), Some("qemu"));
    }

    #[test]
    fn update_settings_sixteen_threads_lose_no_change() {
        let d = tempfile::tempdir().unwrap();
        let e = engine(d.path());

        // Each thread appends its own mark to the same setting: a read-modify-write without
        // the lock loses some of them.
        std::thread::scope(|s| {
            for i in 0..16 {
                let e = &e;
                s.spawn(move || {
                    for j in 0..5 {
                        e.update_settings(false, |st| {
                            let mut v = st.default_image.take().unwrap_or_default();
                            v.push_str(&format!("{i}.{j},"));
                            st.default_image = Some(v);
                        })
                        .unwrap();
                    }
                });
            }
        });

        let all = e.default_image_set().unwrap().unwrap();
        assert_eq!(all.split(',').filter(|m| !m.is_empty()).count(), 16 * 5);
    }

    #[test]
    fn set_default_image_bad_reference_refused_and_nothing_written() {
        let d = tempfile::tempdir().unwrap();
        let e = engine(d.path());

        assert!(e.set_default_image(Some("a b")).is_err());
        assert!(!e.roots.config_file().exists());
    }
}
