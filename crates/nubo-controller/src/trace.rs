//! Per-reconcile phase timings on stderr, when `NUBO_CONTROLLER_TRACE` is set (non-empty):
//! where a reconcile's time goes (API reads, status writes, Events, the engine), for
//! `scripts/bench.sh k8s` and for an operator asking why reconciles are slow. Names only: no
//! spec, Secret or status content is printed.
//!
//! Also the test hook `NUBO_CONTROLLER_TEST_PAUSE` ([`test_pause`]): a create stopped at a
//! named phase, so a test can kill the controller exactly there.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Whether tracing is on (read once).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("NUBO_CONTROLLER_TRACE").is_some_and(|v| !v.is_empty()))
}

/// The phases of one reconcile, each timed from the previous mark.
pub struct Phases {
    on: bool,
    start: Instant,
    last: Instant,
    spent: Vec<(&'static str, Duration)>,
}

impl Phases {
    pub fn start() -> Phases {
        let now = Instant::now();
        Phases {
            on: enabled(),
            start: now,
            last: now,
            spent: Vec::new(),
        }
    }

    /// The time since the previous mark goes to `phase` (added up when a phase repeats).
    pub fn mark(&mut self, phase: &'static str) {
        if !self.on {
            return;
        }
        let now = Instant::now();
        let d = now - self.last;
        self.last = now;
        match self.spent.iter_mut().find(|(p, _)| *p == phase) {
            Some((_, t)) => *t += d,
            None => self.spent.push((phase, d)),
        }
    }

    /// One line: `trace <kind> <key>: <phase> <ms>ms, ... total <ms>ms (<outcome>)`.
    pub fn report(&self, kind: &str, key: &str, outcome: &str) {
        if !self.on {
            return;
        }
        let parts: Vec<String> = self
            .spent
            .iter()
            .map(|(p, d)| format!("{p} {}ms", d.as_millis()))
            .collect();
        eprintln!(
            "nubo-controller: trace {kind} {key}: {} total {}ms ({outcome})",
            parts.join(", "),
            self.start.elapsed().as_millis()
        );
    }
}

/// The engine's create steps a VM create passes through on a libvirt host, named from the
/// engine's step messages: `defined` (the domain exists, its disk and seed do not), `disk` (the
/// OS disk volume is stored, the seed is not), `seed` (the seed volume is stored; the VM is
/// not yet recorded as created, nor started).
pub fn create_phase(e: &nubo_engine::Event) -> Option<&'static str> {
    let nubo_engine::Event::Step(s) = e else { return None };
    if s.contains(" assigned the VM its UUID ") {
        Some("defined")
    } else if s.starts_with("OS disk stored by the ") {
        Some("disk")
    } else if s.starts_with("seed stored by the ") {
        Some("seed")
    } else {
        None
    }
}

/// `NUBO_CONTROLLER_TEST_PAUSE`: `<phase>:<namespace>/<name>`, comma-separated (read once).
fn pauses() -> &'static [(String, String)] {
    static P: OnceLock<Vec<(String, String)>> = OnceLock::new();
    P.get_or_init(|| parse_pauses(&std::env::var("NUBO_CONTROLLER_TEST_PAUSE").unwrap_or_default()))
}

pub fn parse_pauses(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|p| p.trim().split_once(':'))
        .filter(|(phase, key)| !phase.is_empty() && key.contains('/'))
        .map(|(phase, key)| (phase.to_owned(), key.to_owned()))
        .collect()
}

/// A test hook, inert unless `NUBO_CONTROLLER_TEST_PAUSE` names this phase ([`create_phase`])
/// of this VirtualMachine (`namespace/name`): then the reconcile logs `test hook: paused at
/// <phase> of <key>` and never returns, holding what the engine made so far, until the test
/// kills the process. The live test uses it to kill the controller at several points of a
/// create. Never set it in a deployment.
pub fn test_pause(phase: &str, key: &str) {
    if !pauses().iter().any(|(p, k)| p == phase && k == key) {
        return;
    }
    eprintln!("nubo-controller: test hook: paused at {phase} of {key}");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_pauses_phases_and_keys() {
        assert_eq!(
            parse_pauses("defined:ns/vk, seed:ns/vk3"),
            [("defined".into(), "ns/vk".into()), ("seed".into(), "ns/vk3".into())]
        );
        for inert in ["", "defined", ":ns/vk", "defined:vk", ",,"] {
            assert!(parse_pauses(inert).is_empty(), "{inert:?}");
        }
    }

    #[test]
    fn create_phase_names_the_libvirt_create_steps() {
        use nubo_engine::Event;
        let step = |s: &str| create_phase(&Event::Step(s.into()));
        assert_eq!(step("libvirt assigned the VM its UUID 0f0e"), Some("defined"));
        assert_eq!(
            step("OS disk stored by the libvirt backend at /p/x.qcow2 (thin qcow2 over /b)"),
            Some("disk")
        );
        assert_eq!(
            step("seed stored by the libvirt backend at /p/x-cidata.iso (NoCloud, instance-id u)"),
            Some("seed")
        );
        assert_eq!(step("pulling http://h/d.qcow2"), None);
        assert_eq!(create_phase(&Event::Note("seed stored by the x".into())), None);
    }
}
