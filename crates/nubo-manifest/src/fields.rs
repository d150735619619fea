//! Which manifest key sets each [`Field`] of a [`nubo_spec::VmSpec`], per kind: spec
//! validation and the engine report field paths, and a manifest error must point at the key the
//! user wrote. Like `vm create`'s `flag()`, every field is matched without a wildcard arm, so a
//! new field cannot go unmapped.

use nubo_spec::Field;

use crate::types::Kind;

/// The manifest paths that may set `field`, the one the user wrote first when there are two
/// (`userData` or `userDataFile`).
pub fn manifest_paths(kind: Kind, field: Field) -> &'static [&'static str] {
    match kind {
        Kind::VirtualMachine => vm_paths(field),
        Kind::Workload => workload_paths(field),
    }
}

fn vm_paths(field: Field) -> &'static [&'static str] {
    match field {
        Field::Name => &["metadata.name"],
        Field::SourceImageReference => &["spec.image"],
        Field::SourceDiskPath => &["spec.disk"],
        Field::SourceUrl => &["spec.url"],
        Field::SourceUrlChecksum => &["spec.checksum"],
        Field::SourceUrlInsecureNoChecksum => &["spec.insecureNoChecksum"],
        Field::SourceUrlAllowHttp => &["spec.allowHttp"],
        Field::ResourcesVcpus => &["spec.resources.vcpus"],
        Field::ResourcesMemory => &["spec.resources.memory"],
        Field::ResourcesDiskSize => &["spec.resources.diskSize"],
        Field::Firmware => &["spec.firmware"],
        Field::BootKernel => &["spec.boot.kernel"],
        Field::BootInitrd => &["spec.boot.initrd"],
        Field::BootCmdline => &["spec.boot.cmdline"],
        Field::Machine => &["spec.machine"],
        Field::Overrides => &["spec.overrides"],
        Field::Network => &["spec.network"],
        Field::Ports => &["spec.ports"],
        Field::CloudInitHostname => &["spec.cloudInit.hostname"],
        Field::CloudInitSshKeys => &["spec.cloudInit.sshKeys"],
        Field::CloudInitUserData => &["spec.cloudInit.userData", "spec.cloudInit.userDataFile"],
        Field::CloudInitNetworkConfig => &["spec.cloudInit.networkConfig", "spec.cloudInit.networkConfigFile"],
        Field::CloudInitVendorData => &["spec.cloudInit.vendorData", "spec.cloudInit.vendorDataFile"],
        Field::CloudInitSeed => &["spec.cloudInit.seed"],
        Field::Backend => &["spec.backend"],
        Field::SshUser => &["spec.sshUser"],
        Field::BootTimeout => &["spec.bootTimeout"],
        Field::Mounts => &["spec.mounts"],
    }
}

fn workload_paths(field: Field) -> &'static [&'static str] {
    match field {
        Field::Name => &["metadata.name"],
        Field::SourceImageReference => &["spec.microvm.image"],
        Field::SourceDiskPath => &["spec.microvm.disk"],
        Field::SourceUrl => &["spec.microvm.url"],
        Field::SourceUrlChecksum => &["spec.microvm.checksum"],
        Field::SourceUrlInsecureNoChecksum => &["spec.microvm.insecureNoChecksum"],
        Field::SourceUrlAllowHttp => &["spec.microvm.allowHttp"],
        Field::ResourcesVcpus => &["spec.microvm.vcpus"],
        Field::ResourcesMemory => &["spec.microvm.memory"],
        Field::ResourcesDiskSize => &["spec.microvm.diskSize"],
        // A microvm has no firmware and its machine is its type.
        Field::Firmware => &["spec.type"],
        Field::BootKernel => &["spec.microvm.kernel"],
        Field::BootInitrd => &["spec.microvm.initrd"],
        Field::BootCmdline => &["spec.microvm.cmdline"],
        Field::Machine => &["spec.type"],
        Field::Overrides => &["spec.microvm.overrides"],
        Field::Network => &["spec.microvm.network"],
        // A microvm Workload has no `ports:`; nothing sets the field there.
        Field::Ports => &["spec.microvm"],
        Field::CloudInitHostname => &["spec.microvm.cloudInit.hostname"],
        Field::CloudInitSshKeys => &["spec.microvm.cloudInit.sshKeys"],
        Field::CloudInitUserData => &["spec.microvm.cloudInit.userData", "spec.microvm.cloudInit.userDataFile"],
        Field::CloudInitNetworkConfig => &[
            "spec.microvm.cloudInit.networkConfig",
            "spec.microvm.cloudInit.networkConfigFile",
        ],
        Field::CloudInitVendorData => &[
            "spec.microvm.cloudInit.vendorData",
            "spec.microvm.cloudInit.vendorDataFile",
        ],
        Field::CloudInitSeed => &["spec.microvm.cloudInit.seed"],
        Field::Backend => &["spec.backend"],
        Field::SshUser => &["spec.microvm.sshUser"],
        Field::BootTimeout => &["spec.microvm.bootTimeout"],
        Field::Mounts => &["spec.microvm.mounts"],
    }
}

/// The manifest suffix for a spec error's element suffix: `.path` of a firmware path and
/// `.named` of a named network are the value itself in a manifest.
pub fn manifest_suffix(field: Field, suffix: &str) -> &str {
    match (field, suffix) {
        (Field::Firmware, ".path") | (Field::Network, ".named") => "",
        _ => suffix,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_paths_every_field_has_one_per_kind() {
        for kind in [Kind::VirtualMachine, Kind::Workload] {
            for f in Field::ALL {
                let paths = manifest_paths(kind, *f);

                assert!(!paths.is_empty(), "{kind:?} {f:?}");
                assert!(paths
                    .iter()
                    .all(|p| p.starts_with("spec.") || p.starts_with("metadata.")));
            }
        }
    }
}
