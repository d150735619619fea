use nubo_engine::Engine;

use crate::output::print_json;

/// The record as JSON, with the VM's state from its backend and its launch description read
/// fresh where the backend has one (libvirt's domain XML); `launch_source` says which; and
/// `status`, what [`Engine::observe`] sees (conditions `Provisioned`, `Running`,
/// `CloudInitDone`, `SeedCurrent`).
pub fn run(name: &str, engine: &Engine) -> anyhow::Result<()> {
    let rec = engine.load(name)?;
    let state = engine.state(&rec)?;
    let launch = engine.launch(&rec)?;
    let mut v = serde_json::to_value(&rec)?;
    v["state"] = serde_json::Value::String(state.to_string());
    v["launch"] = serde_json::to_value(&launch.launch)?;
    v["launch_source"] = serde_json::to_value(launch.source)?;
    v["ports"] = serde_json::to_value(
        rec.machine
            .ports
            .iter()
            .map(nubo_backend::ports::shown)
            .collect::<Vec<_>>(),
    )?;
    // The typed status a controller reads (`Engine::observe`): conditions with reasons.
    v["status"] = serde_json::to_value(engine.observe(name)?)?;
    if let Some(note) = &launch.note {
        eprintln!("note: {note}");
        v["launch_note"] = serde_json::Value::String(note.clone());
    }
    print_json(&v)
}
