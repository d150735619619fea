//! `nubo vm status NAME [-o json]`: what `Engine::observe` sees, as a controller would copy it.

use nubo_engine::Engine;

use crate::cli::vm::StatusArgs;
use crate::output::{print_json, print_table, Format};

pub fn run(a: &StatusArgs, engine: &Engine) -> anyhow::Result<()> {
    let s = engine.observe(&a.name)?;
    if a.output == Format::Json {
        return print_json(&s);
    }
    let state = s
        .domain
        .state
        .clone()
        .or_else(|| s.domain.error.as_ref().map(|e| format!("unknown ({e})")))
        .unwrap_or_default();
    println!("vm `{}` ({} backend, uuid {}): {state}", s.name, s.backend, s.uuid);
    if let Some(ssh) = &s.addresses.ssh {
        println!("  ssh: {ssh}");
    }
    if !s.addresses.guest.is_empty() {
        let how = if s.addresses.predicted { " (predicted)" } else { "" };
        println!("  addresses: {}{how}", s.addresses.guest.join(", "));
    }
    if s.snapshots.count > 0 {
        println!(
            "  snapshots: {} (latest {})",
            s.snapshots.count,
            s.snapshots.latest.as_deref().unwrap_or("-")
        );
    }
    let rows: Vec<Vec<String>> = s
        .conditions
        .iter()
        .map(|c| {
            vec![
                format!("{:?}", c.kind),
                format!("{:?}", c.status),
                c.reason.clone(),
                nubo_core::file::escape_control(&c.message),
            ]
        })
        .collect();
    print_table(&["CONDITION", "STATUS", "REASON", "MESSAGE"], &rows)?;
    Ok(())
}
