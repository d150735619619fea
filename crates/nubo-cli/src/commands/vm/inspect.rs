use nubo_engine::Engine;

use crate::output::print_json;

pub fn run(name: &str, engine: &Engine) -> anyhow::Result<()> {
    let rec = engine.load(name)?;
    let state = engine.state(&rec)?;
    let mut v = serde_json::to_value(&rec)?;
    v["state"] = serde_json::Value::String(state.to_string());
    print_json(&v)
}
