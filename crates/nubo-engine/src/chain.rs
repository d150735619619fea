//! Every boot re-proves the disk chain (issue 21): a VM's base may be a user's own file
//! (`vm create --disk`), replaced between create and the next start by one whose backing file
//! is a host file. Before a backend gets the disk, for every create, start, restart, restore
//! and image-build step (and snapshot verbs on a stopped VM), the overlay must still name exactly the recorded base and the base
//! must pass the untrusted inspector again ([`nubo_backend::chain::verify`]). The backend is
//! handed the base by the path that was inspected, marked inspected.

use nubo_backend::MachineSpec;
use nubo_core::VmState;

use crate::record::VmRecord;
use crate::{Engine, EngineError};

impl Engine {
    /// `rec`'s machine with its disk chain proven just now, for one boot or restore.
    pub(crate) fn inspected_machine(&self, rec: &VmRecord) -> Result<MachineSpec, EngineError> {
        let disk = &rec.machine.disk;
        // A remote host's overlay volume cannot be opened here: the backend checks its chain
        // where it is (libvirt: it backs onto the digest-verified base volume), before the boot.
        if disk.remote {
            return Ok(rec.machine.clone());
        }
        let chain = nubo_backend::chain::verify(disk, &disk.overlay).map_err(|e| EngineError::DiskChain {
            name: rec.name.clone(),
            base: disk.base.clone(),
            detail: e.to_string(),
        })?;
        Ok(MachineSpec {
            disk: nubo_backend::chain::inspected(disk, &chain),
            ..rec.machine.clone()
        })
    }

    /// The machine for a snapshot verb on `rec` in `state`: a VM that is not running has its
    /// disk handed to a program that opens the chain (a new VMM, libvirt's qemu-img), so the
    /// chain is proven first; a running VMM keeps the chain it was booted with.
    pub(crate) fn machine_in(&self, rec: &VmRecord, state: VmState) -> Result<MachineSpec, EngineError> {
        if state.is_active() {
            Ok(rec.machine.clone())
        } else {
            self.inspected_machine(rec)
        }
    }
}

#[cfg(test)]
mod tests;
