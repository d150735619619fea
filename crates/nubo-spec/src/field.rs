//! Every field path [`crate::VmSpec::validate`] and [`crate::admit`] can report. The CLI maps each
//! to the flag that sets it, a manifest to the file position of the key; both match on [`Field`]
//! without a wildcard arm, so a new field cannot go unmapped.

use std::fmt;

/// A field of a [`crate::VmSpec`]. [`Field::path`] is its path in a manifest (camelCase, under
/// `spec.`); an error about one element adds a suffix to it (`spec.cloudInit.sshKeys[1]`,
/// `spec.overrides.qemu.machine`), see [`crate::FieldError::path`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    Name,
    SourceImageReference,
    SourceDiskPath,
    SourceUrl,
    SourceUrlChecksum,
    SourceUrlInsecureNoChecksum,
    SourceUrlAllowHttp,
    ResourcesVcpus,
    ResourcesMemory,
    ResourcesDiskSize,
    Firmware,
    BootKernel,
    BootInitrd,
    BootCmdline,
    Machine,
    Overrides,
    Network,
    Ports,
    CloudInitHostname,
    CloudInitSshKeys,
    CloudInitUserData,
    CloudInitNetworkConfig,
    CloudInitVendorData,
    CloudInitSeed,
    Backend,
    SshUser,
    BootTimeout,
    Mounts,
}

impl Field {
    /// Every field, in declaration order.
    pub const ALL: &'static [Field] = &[
        Field::Name,
        Field::SourceImageReference,
        Field::SourceDiskPath,
        Field::SourceUrl,
        Field::SourceUrlChecksum,
        Field::SourceUrlInsecureNoChecksum,
        Field::SourceUrlAllowHttp,
        Field::ResourcesVcpus,
        Field::ResourcesMemory,
        Field::ResourcesDiskSize,
        Field::Firmware,
        Field::BootKernel,
        Field::BootInitrd,
        Field::BootCmdline,
        Field::Machine,
        Field::Overrides,
        Field::Network,
        Field::Ports,
        Field::CloudInitHostname,
        Field::CloudInitSshKeys,
        Field::CloudInitUserData,
        Field::CloudInitNetworkConfig,
        Field::CloudInitVendorData,
        Field::CloudInitSeed,
        Field::Backend,
        Field::SshUser,
        Field::BootTimeout,
        Field::Mounts,
    ];

    /// The field's path as its serialised (manifest) form names it.
    pub fn path(self) -> &'static str {
        match self {
            Field::Name => "spec.name",
            Field::SourceImageReference => "spec.source.image.reference",
            Field::SourceDiskPath => "spec.source.disk.path",
            Field::SourceUrl => "spec.source.url.url",
            Field::SourceUrlChecksum => "spec.source.url.checksum",
            Field::SourceUrlInsecureNoChecksum => "spec.source.url.insecureNoChecksum",
            Field::SourceUrlAllowHttp => "spec.source.url.allowHttp",
            Field::ResourcesVcpus => "spec.resources.vcpus",
            Field::ResourcesMemory => "spec.resources.memory",
            Field::ResourcesDiskSize => "spec.resources.diskSize",
            Field::Firmware => "spec.firmware",
            Field::BootKernel => "spec.boot.kernel",
            Field::BootInitrd => "spec.boot.initrd",
            Field::BootCmdline => "spec.boot.cmdline",
            Field::Machine => "spec.machine",
            Field::Overrides => "spec.overrides",
            Field::Network => "spec.network",
            Field::Ports => "spec.ports",
            Field::CloudInitHostname => "spec.cloudInit.hostname",
            Field::CloudInitSshKeys => "spec.cloudInit.sshKeys",
            Field::CloudInitUserData => "spec.cloudInit.userData",
            Field::CloudInitNetworkConfig => "spec.cloudInit.networkConfig",
            Field::CloudInitVendorData => "spec.cloudInit.vendorData",
            Field::CloudInitSeed => "spec.cloudInit.seed",
            Field::Backend => "spec.backend",
            Field::SshUser => "spec.sshUser",
            Field::BootTimeout => "spec.bootTimeout",
            Field::Mounts => "spec.mounts",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_paths_are_unique() {
        let mut paths: Vec<&str> = Field::ALL.iter().map(|f| f.path()).collect();

        paths.sort_unstable();
        paths.dedup();

        assert_eq!(paths.len(), Field::ALL.len());
    }
}
