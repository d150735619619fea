//! Prometheus text metrics: reconciles, errors, durations, VMs by phase.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket bounds, seconds.
const BUCKETS: [f64; 8] = [0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0];

#[derive(Default)]
struct Kind {
    reconciles: u64,
    errors: u64,
    sum: f64,
    buckets: [u64; BUCKETS.len()],
}

#[derive(Default)]
pub struct Metrics {
    kinds: Mutex<BTreeMap<String, Kind>>,
    phases: Mutex<BTreeMap<(String, String), String>>,
}

impl Metrics {
    pub fn observe(&self, kind: &str, took: Duration, error: bool) {
        let mut k = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        let e = k.entry(kind.to_owned()).or_default();
        e.reconciles += 1;
        e.errors += u64::from(error);
        let s = took.as_secs_f64();
        e.sum += s;
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                e.buckets[i] += 1;
            }
        }
    }

    pub fn set_phase(&self, ns: &str, name: &str, phase: &str) {
        let mut p = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        p.insert((ns.to_owned(), name.to_owned()), phase.to_owned());
    }

    pub fn forget(&self, ns: &str, name: &str) {
        let mut p = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        p.remove(&(ns.to_owned(), name.to_owned()));
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let k = self.kinds.lock().unwrap_or_else(|p| p.into_inner());
        out.push_str("# HELP nubo_reconciles_total Reconciles run, by kind.\n# TYPE nubo_reconciles_total counter\n");
        for (kind, e) in k.iter() {
            let _ = writeln!(out, "nubo_reconciles_total{{kind=\"{kind}\"}} {}", e.reconciles);
        }
        out.push_str("# HELP nubo_reconcile_errors_total Reconciles that ended in an API error, by kind.\n# TYPE nubo_reconcile_errors_total counter\n");
        for (kind, e) in k.iter() {
            let _ = writeln!(out, "nubo_reconcile_errors_total{{kind=\"{kind}\"}} {}", e.errors);
        }
        out.push_str("# HELP nubo_reconcile_duration_seconds Reconcile durations, by kind.\n# TYPE nubo_reconcile_duration_seconds histogram\n");
        for (kind, e) in k.iter() {
            for (i, b) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "nubo_reconcile_duration_seconds_bucket{{kind=\"{kind}\",le=\"{b}\"}} {}",
                    e.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "nubo_reconcile_duration_seconds_bucket{{kind=\"{kind}\",le=\"+Inf\"}} {}",
                e.reconciles
            );
            let _ = writeln!(out, "nubo_reconcile_duration_seconds_sum{{kind=\"{kind}\"}} {}", e.sum);
            let _ = writeln!(
                out,
                "nubo_reconcile_duration_seconds_count{{kind=\"{kind}\"}} {}",
                e.reconciles
            );
        }
        drop(k);
        out.push_str("# HELP nubo_virtualmachines VirtualMachines by phase.\n# TYPE nubo_virtualmachines gauge\n");
        let p = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        let mut by: BTreeMap<&str, u64> = ["Pending", "Provisioning", "Running", "Stopped", "Failed"]
            .into_iter()
            .map(|p| (p, 0))
            .collect();
        for phase in p.values() {
            *by.entry(phase.as_str()).or_default() += 1;
        }
        for (phase, n) in by {
            let _ = writeln!(out, "nubo_virtualmachines{{phase=\"{phase}\"}} {n}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_counts_reconciles_and_phases() {
        let m = Metrics::default();
        m.observe("virtualmachine", Duration::from_millis(20), false);
        m.observe("virtualmachine", Duration::from_secs(2), true);
        m.set_phase("a", "x", "Running");
        m.set_phase("a", "y", "Stopped");
        m.set_phase("a", "y", "Running");
        let t = m.render();
        assert!(t.contains("nubo_reconciles_total{kind=\"virtualmachine\"} 2"), "{t}");
        assert!(
            t.contains("nubo_reconcile_errors_total{kind=\"virtualmachine\"} 1"),
            "{t}"
        );
        assert!(t.contains("le=\"0.05\"} 1"), "{t}");
        assert!(t.contains("nubo_virtualmachines{phase=\"Running\"} 2"), "{t}");
        assert!(t.contains("nubo_virtualmachines{phase=\"Stopped\"} 0"), "{t}");
    }
}
