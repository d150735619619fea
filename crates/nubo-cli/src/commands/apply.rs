//! `nubo apply -f`: converge the VMs manifests describe. Every document is read, lowered,
//! validated and checked against what it references before anything is made; a VM that exists
//! with another spec is shown field by field and refused unless `--recreate`. Creates run in
//! parallel, bounded by the host's CPUs; `--wait` waits for every VM at once. The diff and the
//! action per VM are the engine's (`Engine::plan_apply`, `Engine::converge`); this file renders
//! them and adds the CLI's policy. `--dry-run` plans through the same call: nothing is written,
//! locked or pulled.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use nubo_engine::apply::{host_parallelism, parallel, Action, References};
use nubo_engine::{Engine, Event, Plan, WaitFor};
use nubo_manifest::{Kind, Lowered};
use serde::Serialize;

use crate::cli::apply::ApplyArgs;
use crate::output::Format;
use crate::settings::Settings;

/// `vm create --wait`'s default, for a manifest without `bootTimeout`.
const DEFAULT_BOOT_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Report {
    file: String,
    kind: Kind,
    name: String,
    action: Action,
    /// `path: old -> new` for a VM whose spec differs.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    differences: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backend: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    backend_reason: Option<String>,
    spec: nubo_spec::VmSpec,
    /// The dry run's plan (absent when the image must be pulled first).
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<Plan>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    notes: Vec<String>,
    /// What happened: `created`, `unchanged`, `recreated`, or the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ready: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

pub fn run(a: &ApplyArgs, settings: &Settings) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let engine = super::vm::engine(settings);
    let lowered = super::manifest::read(&a.file, settings, a.load_restrictor)?;
    let notes = super::manifest::check(&lowered, &engine)?;
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    for (l, notes) in lowered.iter().zip(notes) {
        match report(l, notes, &engine) {
            Ok(r) => reports.push(r),
            Err(e) => errors.push(e),
        }
    }
    if !errors.is_empty() {
        anyhow::bail!("{}\nnothing was applied", errors.join("\n"));
    }
    let changed: Vec<&Report> = reports.iter().filter(|r| !r.differences.is_empty()).collect();
    if !changed.is_empty() && !a.recreate {
        let mut msg = String::new();
        for r in changed {
            msg.push_str(&format!("{}: vm `{}` exists with a different spec:\n", r.file, r.name));
            for d in &r.differences {
                msg.push_str(&format!("  {d}\n"));
            }
        }
        msg.push_str("nothing was applied: `nubo apply --recreate` replaces these VMs (their disks are lost); changed user-data never re-applies to an existing instance, since cloud-init runs it once, at the first boot");
        anyhow::bail!(msg);
    }
    if a.dry_run {
        return print(&reports, a.output);
    }
    // Creates (and recreates) in parallel, bounded by the host's CPUs.
    let todo: Vec<usize> = (0..reports.len())
        .filter(|i| reports[*i].action != Action::Unchanged)
        .collect();
    if !todo.is_empty() {
        // nubo's own SSH key is made once, before the parallel creates: each create would
        // otherwise race to make it (same temporary name within one process).
        nubo_engine::ssh::ensure_key(&engine.roots.ssh_dir())?;
    }
    let results = parallel(&todo, host_parallelism(), |i| {
        let l = &lowered[*i];
        let r = &reports[*i];
        converge(l, r.action, &engine)
    });
    for (i, res) in todo.iter().zip(results) {
        match res {
            Ok(what) => reports[*i].result = Some(what),
            Err(e) => reports[*i].error = Some(e),
        }
    }
    for r in reports.iter_mut().filter(|r| r.action == Action::Unchanged) {
        r.result = Some("unchanged".into());
    }
    if a.wait {
        let ready = parallel(&lowered, lowered.len(), |l| wait(l, &engine, t0));
        for (r, res) in reports.iter_mut().zip(ready) {
            if r.error.is_some() {
                continue;
            }
            match res {
                Ok(s) => r.ready = Some(s),
                Err(e) => r.error = Some(e),
            }
        }
    }
    print(&reports, a.output)?;
    let failed: Vec<String> = reports
        .iter()
        .filter_map(|r| r.error.as_ref().map(|e| format!("vm `{}`: {e}", r.name)))
        .collect();
    if !failed.is_empty() {
        anyhow::bail!("{}", failed.join("\n"));
    }
    Ok(())
}

/// Observes and (for a dry run) plans one document; an error is a finished message.
fn report(l: &Lowered, refs: References, engine: &Engine) -> Result<Report, String> {
    let err = |e| super::manifest::engine_error_line(l, e);
    // Planned through the engine's own path minus writes: capabilities, backend checks and
    // admission are refused here, before anything of any VM is made. An unchanged VM is not
    // planned again: it keeps what it was made with, backend included.
    let p = engine.plan_apply(&l.spec, refs.pull_first).map_err(err)?;
    let (action, differences, plan) = (p.action, p.differences, p.plan);
    let (backend, backend_reason) = match (&plan, p.recorded_backend) {
        (Some(p), _) => (Some(p.backend.to_owned()), Some(reason(l, p))),
        (None, Some(b)) => {
            let why = format!("backend {b} (recorded for the existing VM, which keeps it)");
            (Some(b), Some(why))
        }
        (None, None) => (None, None),
    };
    Ok(Report {
        file: l.doc.file.clone(),
        kind: l.kind(),
        name: l.spec.name.to_string(),
        action,
        differences,
        backend,
        backend_reason,
        spec: l.spec.clone(),
        plan,
        notes: refs.notes,
        result: None,
        ready: None,
        error: None,
    })
}

/// Which precedence rule chose the backend, in a manifest's words.
fn reason(l: &Lowered, p: &Plan) -> String {
    let by = match p.backend_source {
        nubo_backend::Source::Heuristic if l.kind() == Kind::Workload => {
            "the built-in heuristic: a microvm runs on cloud-hypervisor where it is installed and can run it, else on qemu's microvm machine".to_owned()
        }
        nubo_backend::Source::Flag => "the manifest's spec.backend".to_owned(),
        other => other.describe().to_owned(),
    };
    format!("backend {} (chosen by {by})", p.backend)
}

fn converge(l: &Lowered, action: Action, engine: &Engine) -> Result<String, String> {
    let name = l.spec.name.to_string();
    let out = Mutex::new(());
    let mut events = |e: Event| {
        let _guard = out.lock();
        match e {
            Event::Step(s) => eprintln!("{name}: {s}"),
            Event::Note(s) => eprintln!("{name}: note: {s}"),
            Event::Phase(p, t) => eprintln!("{name}: [{:.1}s] {}", t.as_secs_f64(), p.label()),
            Event::Output(s) => eprint!("{name}: {s}"),
        }
    };
    let err = |e| super::manifest::engine_error_line(l, e);
    let done = engine.converge(&l.spec, action, &mut events).map_err(err)?;
    Ok(done.as_str().to_owned())
}

fn wait(l: &Lowered, engine: &Engine, t0: Instant) -> Result<String, String> {
    let name = l.spec.name.to_string();
    let err = |e| super::manifest::engine_error_line(l, e);
    let rec = engine.load(&name).map_err(err)?;
    // An appliance has no seed and maybe no cloud-init: ready means its SSH answers.
    let target = if rec.machine.seed.is_some() {
        WaitFor::CloudInit
    } else {
        WaitFor::Ssh
    };
    let timeout = l.spec.boot_timeout.unwrap_or(DEFAULT_BOOT_TIMEOUT);
    let mut events = |e: Event| {
        if let Event::Phase(p, t) = e {
            eprintln!("{name}: [{:.1}s] {}", t.as_secs_f64(), p.label());
        }
    };
    let out = engine.wait(&name, target, timeout, t0, &mut events).map_err(err)?;
    let ready = match &out.finished {
        Some(f) => format!(
            "cloud-init {} finished, datasource {} [seed={}]",
            f.version,
            f.datasource,
            f.seed.as_deref().unwrap_or("?")
        ),
        None => "ssh answers".to_owned(),
    };
    Ok(match &out.address {
        Some(a) => format!("{ready}; {}", crate::commands::vm::address_line(a)),
        None => ready,
    })
}

fn print(reports: &[Report], format: Format) -> anyhow::Result<()> {
    if format == Format::Json {
        return crate::output::print_json(&serde_json::json!({ "documents": reports }));
    }
    for r in reports {
        let what = match (&r.result, r.action) {
            (Some(res), _) => res.clone(),
            (None, Action::Create) => "would be created".into(),
            (None, Action::Resume) => "would be created (an interrupted create is cleaned up first)".into(),
            (None, Action::Unchanged) => "unchanged: would be left as it is".into(),
            (None, Action::Recreate) => "would be removed and created again".into(),
        };
        println!("{}: {} `{}`: {what}", r.file, r.kind.as_str(), r.name);
        if let Some(b) = &r.backend_reason {
            println!("  {b}");
        }
        for d in &r.differences {
            println!("  {d}");
        }
        for n in &r.notes {
            println!("  note: {n}");
        }
        if r.result.is_none() {
            println!("  spec: {}", serde_json::to_string(&r.spec)?);
        }
        if let Some(s) = &r.ready {
            println!("  ready: {s}");
        }
        if let Some(e) = &r.error {
            println!("  failed: {e}");
        }
    }
    Ok(())
}
