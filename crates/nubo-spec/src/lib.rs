//! nubo-spec: [`VmSpec`], the one pure, typed description of a VM. `vm create` flags, a manifest
//! and (later) a Kubernetes object all produce one; the engine plans from it; a dry run prints it.
//!
//! Pure: no filesystem, environment or clock. [`VmSpec::validate`] reports every problem at its
//! field path ([`Field`], `spec.resources.memory`), which the CLI maps to a flag and a manifest to
//! `file:line:col`. [`admit`] compares resolved resources with [`HostFacts`] the caller measured.
//!
//! Serialised (`serde_json::to_string_pretty`), a spec round-trips to an equal spec, except that
//! payloads (user-data, network-config, vendor-data) keep only their digest and length: records
//! and dry runs never hold user-data, which may carry passwords.

mod admit;
mod diff;
mod error;
mod field;
pub mod limits;
mod mount;
mod payload;
mod ports;
mod spec;
pub mod uri;
mod validate;

pub use admit::{admit, HostFacts, ResolvedResources};
pub use error::{FieldError, SpecErrors};
pub use field::Field;
pub use mount::{check_mounts, MountSpec, MAX_MOUNTS};
pub use payload::Payload;
pub use spec::{CloudInitSpec, DiskSource, Firmware, KernelBoot, Machine, Network, Resources, VmSpec};
pub use uri::{ConnectUri, UriError};
pub use validate::{check_boot_timeout, check_ssh_user, PayloadCheck, PayloadChecks};

#[cfg(test)]
mod tests;
