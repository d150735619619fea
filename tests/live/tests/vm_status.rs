//! `Engine::observe` and the readiness state machine on ONE cloud-init boot of the qemu backend
//! (issue 22, item 3):
//! - `vm create --wait` steps the engine's `Readiness` from the CLI: the phases are printed once
//!   each, in order, ending at cloud-init finished;
//! - `vm status -o json` then says every condition is True (`Provisioned`, `Running`,
//!   `CloudInitDone` with the NoCloud datasource and the seed device, `SeedCurrent`), in
//!   `metav1.Condition`'s shape; `vm status` prints them as a table and `vm inspect` carries the
//!   same under `status`;
//! - after `vm stop`, `Running` is False (`Stopped`) and `CloudInitDone` Unknown (`NotRunning`);
//! - `vm status` of a VM that does not exist is refused naming it.
//!
//! Every command is bounded; the VM is removed by `nubo vm rm --force` and any QEMU left under
//! the test's root is killed by PID on every path ([`Cleanup`]).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use nubo_live::cli::{inspect, json, nubo, Cleanup};
use nubo_live::{LiveTest, TestResult, TestRoot};

/// One boot to cloud-init under TCG on a shared 2-core machine (as day_one's).
const BOOT: Duration = Duration::from_secs(900);
const QUICK: Duration = Duration::from_secs(180);
const VM: &str = "observed";

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "vm_status_conditions_through_create_wait_and_stop",
        &["qemu", "bootstrap"],
        || nubo_live::timed("vm_status", vm_status),
    )])
}

/// `(status, reason)` of each condition, by type.
fn conditions(v: &serde_json::Value) -> Vec<(String, String, String)> {
    v["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
            (s("type"), s("status"), s("reason"))
        })
        .collect()
}

fn expect(v: &serde_json::Value, want: &[(&str, &str, &str)], when: &str) -> TestResult {
    let got = conditions(v);
    let want: Vec<(String, String, String)> = want
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    if got != want {
        return Err(format!("{when}: conditions {got:?}, expected {want:?}\n{v:#}"));
    }
    Ok(())
}

fn status_json(root: &TestRoot) -> Result<serde_json::Value, String> {
    let out = nubo(root, &["vm", "status", VM, "-o", "json"], QUICK)?.require()?;
    json(&out.stdout, "`vm status -o json`")
}

fn vm_status() -> TestResult {
    let root = TestRoot::new()?;
    root.with_debian_image()?;
    let _cleanup = Cleanup::new(&root, &[VM]);

    nubo(&root, &["vm", "status", "ghost"], QUICK)?.refused(&["ghost", "does not exist"])?;

    let t = Instant::now();
    let out = nubo(
        &root,
        &[
            "vm",
            "create",
            VM,
            "--image",
            "debian:12",
            "--restrict-network",
            "--wait",
            "--boot-timeout",
            "900s",
        ],
        BOOT + QUICK,
    )?
    .require()?;
    println!("timing boot (create --wait): {:.1}s", t.elapsed().as_secs_f64());
    // The phases the CLI printed while stepping the engine's state machine, in order, once each.
    let phases: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with('[') && l.contains("s] "))
        .filter_map(|l| l.split_once("s] ").map(|(_, p)| p.trim()))
        .collect();
    let first = |p: &str| phases.iter().position(|x| *x == p);
    let order = [
        first("VMM running"),
        first("kernel booting"),
        first("cloud-init finished"),
    ];
    let mut sorted = phases.clone();
    sorted.dedup();
    if order.iter().any(Option::is_none) || !order.windows(2).all(|w| w[0] < w[1]) || sorted.len() != phases.len() {
        return Err(format!("create --wait printed the phases {phases:?}:\n{}", out.stderr));
    }
    if !out.stderr.contains("is ready: cloud-init") {
        return Err(format!("create --wait did not end ready:\n{}", out.stderr));
    }

    let v = status_json(&root)?;
    expect(
        &v,
        &[
            ("Provisioned", "True", "Created"),
            ("Running", "True", "Running"),
            ("CloudInitDone", "True", "Finished"),
            ("SeedCurrent", "True", "InputsUnchanged"),
        ],
        "after create --wait",
    )?;
    let finished = &v["readiness"]["finished"];
    if finished["datasource"] != "DataSourceNoCloud" || !finished["seed"].is_string() {
        return Err(format!("`vm status` readiness lacks the NoCloud closing line: {v:#}"));
    }
    if v["domain"]["state"] != "running" || v["phase"] != "created" || v["snapshots"]["count"] != 0 {
        return Err(format!("`vm status` domain/phase/snapshots: {v:#}"));
    }
    let text = nubo(&root, &["vm", "status", VM], QUICK)?.require()?;
    let row = text
        .stdout
        .lines()
        .find(|l| l.starts_with("CloudInitDone"))
        .unwrap_or_default();
    if !(row.contains("True") && row.contains("Finished") && row.contains("DataSourceNoCloud")) {
        return Err(format!("`vm status` table:\n{}", text.stdout));
    }
    let rec = inspect(&root, VM)?;
    if conditions(&rec["status"]) != conditions(&v) {
        return Err(format!(
            "`vm inspect` status differs from `vm status`: {:#}",
            rec["status"]
        ));
    }

    nubo(&root, &["vm", "stop", VM, "--force"], QUICK)?.require()?;
    let v = status_json(&root)?;
    expect(
        &v,
        &[
            ("Provisioned", "True", "Created"),
            ("Running", "False", "Stopped"),
            ("CloudInitDone", "Unknown", "NotRunning"),
            ("SeedCurrent", "True", "InputsUnchanged"),
        ],
        "after vm stop",
    )?;
    nubo(&root, &["vm", "rm", VM], QUICK)?.require()?;
    Ok(())
}
