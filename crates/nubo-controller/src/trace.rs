//! Per-reconcile phase timings on stderr, when `NUBO_CONTROLLER_TRACE` is set (non-empty):
//! where a reconcile's time goes (API reads, status writes, Events, the engine), for
//! `scripts/bench.sh k8s` and for an operator asking why reconciles are slow. Names only: no
//! spec, Secret or status content is printed.

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
