//! The console recorders of the running VMs this controller manages.
//!
//! A remote libvirt domain's serial console reaches this host only as libvirt's console
//! stream: a [`ConsoleRecorder`] writes it into the VM's console log under the host's state
//! directory, which `Engine::observe` reads for `CloudInitDone` (cloud-init's closing line is
//! the evidence). One recorder per running VM, opened when a reconcile finds the domain meant
//! to run, kept across reconciles (`keep` opens the stream again after libvirtd or the domain
//! restarted), dropped when the VM is stopped or deleted. What the guest prints while no
//! recorder runs (the controller restarting) is not kept.

use std::collections::HashMap;
use std::sync::Mutex;

use nubo_engine::{ConsoleRecorder, Engine};

#[derive(Default)]
pub struct Consoles {
    /// By host key directory and domain name.
    recorders: Mutex<HashMap<(String, String), ConsoleRecorder>>,
}

impl Consoles {
    /// Records `name`'s console while `running`, else drops its recorder. Blocking (it may
    /// open a stream): call it on the blocking pool. A console that cannot be opened now is
    /// tried again on the next call; `observe` says why meanwhile (ConsoleUnreadable).
    pub fn follow(&self, host: &str, engine: &Engine, name: &str, running: bool) {
        let key = (host.to_owned(), name.to_owned());
        if !running {
            self.forget(host, name);
            return;
        }
        // Out of the map while it (maybe) opens a stream: other VMs' reconciles do not wait.
        let held = self.recorders.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        let kept = match held {
            // A VM whose record is gone (removed meanwhile) has nothing to record.
            Some(mut r) => r.keep(engine).is_ok().then_some(r),
            None => engine.record_console(name).ok().flatten(),
        };
        if let Some(r) = kept {
            self.recorders.lock().unwrap_or_else(|p| p.into_inner()).insert(key, r);
        }
    }

    /// Stops recording `name` (stopped or deleted). Dropping a recorder may wait half a second
    /// for its thread: call it on the blocking pool.
    pub fn forget(&self, host: &str, name: &str) {
        let gone = self
            .recorders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(host.to_owned(), name.to_owned()));
        drop(gone);
    }

    /// How many VMs' consoles are being followed.
    pub fn len(&self) -> usize {
        self.recorders.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
