//! The libvirt backend's configuration ([`crate::BackendConfig`] holds it under `libvirt`).

use nubo_spec::ConnectUri;

/// Where new VMs' domains go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LibvirtConfig {
    /// The connection URI new VMs use (`NUBO_LIBVIRT_URI`, or `--connect` with `--tls-dir`);
    /// `None`: `qemu:///system` for root, `qemu:///session` otherwise.
    pub uri: Option<ConnectUri>,
}
