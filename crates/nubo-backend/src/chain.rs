//! The VM's disk chain, proven again before a VMM gets it (issue 21): the one check the engine
//! makes before every boot and restore, and the Cloud Hypervisor driver again right before it
//! hands Cloud Hypervisor an overlay whose backing file it opens itself.

use std::path::Path;

use nubo_disk::{DiskError, ExpectedBase, Format, VerifiedChain};

use crate::spec::Disk;

/// Verifies that `overlay` (the VM's overlay, or a copy of it that is about to replace it) is
/// nubo's qcow2 over exactly `disk`'s recorded base, and that the base is still self-contained,
/// of the recorded format and size ([`nubo_disk::verify_vm_chain`]).
pub fn verify(disk: &Disk, overlay: &Path) -> Result<VerifiedChain, DiskError> {
    let format = disk
        .base_format
        .parse::<Format>()
        .map_err(|_| DiskError::ChainChanged {
            overlay: overlay.to_path_buf(),
            why: format!(
                "the VM's record names base format `{}`, which nubo does not know",
                nubo_core::file::escape_control(&disk.base_format)
            ),
        })?;
    nubo_disk::verify_vm_chain(
        overlay,
        &ExpectedBase {
            path: &disk.base,
            format,
            size: disk.base_size,
        },
    )
}

/// `disk` as a VMM may be handed it after [`verify`] accepted `chain`: the base by its resolved
/// path (the file inspected, whatever symlink led to it), marked inspected.
pub fn inspected(disk: &Disk, chain: &VerifiedChain) -> Disk {
    Disk {
        base: chain.base.clone(),
        chain_inspected: true,
        ..disk.clone()
    }
}
