//! Per-backend configuration, built once by whoever builds the registry (the CLI from its
//! settings and flags, a daemon from its own), never read from the process by a backend.
//!
//! Each backend defines its own configuration type in its own folder (libvirt's
//! [`crate::libvirt::LibvirtConfig`]: the connection URI) and takes it out of the
//! [`BackendConfig`] by its id; the shared part is the host environment. A new backend
//! (Proxmox: an API endpoint and a token file) adds a type in its folder, not a field here.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::HostEnv;

/// The host environment and each backend's own configuration, by backend id.
#[derive(Clone, Default)]
pub struct BackendConfig {
    /// What every local backend reads from the host (`$PATH`, firmware overrides).
    pub host: HostEnv,
    by_id: BTreeMap<&'static str, Arc<dyn Any + Send + Sync>>,
}

impl std::fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendConfig")
            .field("host", &self.host)
            .field("configured", &self.by_id.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl BackendConfig {
    pub fn new(host: HostEnv) -> BackendConfig {
        BackendConfig {
            host,
            by_id: BTreeMap::new(),
        }
    }

    /// Sets backend `id`'s configuration (replacing any before).
    pub fn with<T: Any + Send + Sync>(mut self, id: &'static str, config: T) -> BackendConfig {
        self.by_id.insert(id, Arc::new(config));
        self
    }

    /// Backend `id`'s configuration, or `T`'s default when none of that type was set.
    pub fn get<T: Any + Clone + Default>(&self, id: &str) -> T {
        self.by_id
            .get(id)
            .and_then(|c| c.downcast_ref::<T>())
            .cloned()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Default, PartialEq)]
    struct Endpoint(String);

    #[test]
    fn get_set_config_is_returned() {
        let c = BackendConfig::default().with("proxmox", Endpoint("https://pve:8006".into()));

        assert_eq!(c.get::<Endpoint>("proxmox"), Endpoint("https://pve:8006".into()));
    }

    #[test]
    fn get_unset_or_other_backend_is_default() {
        let c = BackendConfig::default().with("proxmox", Endpoint("x".into()));

        assert_eq!(c.get::<Endpoint>("vsphere"), Endpoint::default());
        assert_eq!(c.get::<u32>("proxmox"), 0);
    }
}
