use std::time::SystemTime;

use nubo_engine::Engine;

use crate::cli::vm::LsArgs;
use crate::output::{print_json, print_table, Format};

pub fn run(a: &LsArgs, engine: &Engine) -> anyhow::Result<()> {
    let vms = engine.list()?;
    if a.output == Format::Json {
        return print_json(&vms);
    }
    let now = SystemTime::now();
    let rows: Vec<Vec<String>> = vms
        .iter()
        .map(|v| {
            vec![
                v.name.clone(),
                v.state.clone(),
                v.backend.clone(),
                v.image.clone().unwrap_or_else(|| "-".into()),
                v.vcpus.to_string(),
                nubo_core::ByteSize(v.memory_mib << 20).to_string(),
                v.ssh.clone().unwrap_or_else(|| "-".into()),
                if v.ports.is_empty() {
                    "-".into()
                } else {
                    v.ports.join(",")
                },
                age(&v.created, now),
            ]
        })
        .collect();
    print_table(
        &[
            "NAME", "STATE", "BACKEND", "IMAGE", "VCPUS", "MEMORY", "SSH", "PORTS", "AGE",
        ],
        &rows,
    )?;
    Ok(())
}

/// `3m`, `2h`, `5d`: the largest whole unit, like kubectl's AGE.
fn age(created: &str, now: SystemTime) -> String {
    let Ok(t) = humantime::parse_rfc3339(created) else {
        return "-".into();
    };
    let s = now.duration_since(t).map(|d| d.as_secs()).unwrap_or(0);
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m", s / 60),
        3600..=86399 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn age_minutes_and_days() {
        let t = humantime::parse_rfc3339("2026-12-01T00:00:00Z").unwrap();

        assert_eq!(age("2026-12-01T00:00:00Z", t + Duration::from_secs(150)), "2m");
        assert_eq!(age("2026-12-01T00:00:00Z", t + Duration::from_secs(3 * 86400)), "3d");
    }

    #[test]
    fn age_unparsable_is_dash() {
        assert_eq!(age("", SystemTime::now()), "-");
    }
}
