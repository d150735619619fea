use std::time::Instant;

use nubo_engine::{Engine, WaitFor};

use super::print_event;
use crate::cli::vm::{DefaultBackendArgs, RmArgs, StopArgs, WaitArgs, WaitForArg};

pub fn start(name: &str, engine: &Engine) -> anyhow::Result<()> {
    engine.start(name, &mut print_event)?;
    Ok(())
}

pub fn stop(a: &StopArgs, engine: &Engine) -> anyhow::Result<()> {
    Ok(engine.stop(&a.name, a.force, a.timeout, &mut print_event)?)
}

pub fn restart(a: &StopArgs, engine: &Engine) -> anyhow::Result<()> {
    engine.restart(&a.name, a.force, a.timeout, &mut print_event)?;
    Ok(())
}

pub fn rm(a: &RmArgs, engine: &Engine) -> anyhow::Result<()> {
    if a.names.is_empty() {
        anyhow::bail!("give the name of the VM to remove (`nubo vm ls` lists them)");
    }
    let mut failed = 0;
    for name in &a.names {
        match engine.remove(name, a.force, &mut print_event) {
            Ok(false) => eprintln!("  vm `{name}` does not exist: nothing to remove"),
            Ok(true) => {}
            Err(e) => {
                eprintln!("error: {e:#}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} VMs could not be removed", a.names.len());
    }
    Ok(())
}

pub fn wait(a: &WaitArgs, engine: &Engine) -> anyhow::Result<()> {
    let target = match a.target {
        WaitForArg::Ssh => WaitFor::Ssh,
        WaitForArg::CloudInit => WaitFor::CloudInit,
    };
    let out = engine.wait(&a.name, target, a.timeout, Instant::now(), &mut print_event)?;
    if let Some(f) = &out.finished {
        println!(
            "{} {} [seed={}]",
            f.datasource,
            f.version,
            f.seed.as_deref().unwrap_or("?")
        );
    } else if let Some(s) = &out.status_over_ssh {
        println!("{s}");
    }
    if let Some(a) = &out.address {
        eprintln!("{}", super::address_line(a));
    }
    Ok(())
}

pub fn default_backend(a: &DefaultBackendArgs, engine: &Engine) -> anyhow::Result<()> {
    if a.clear {
        engine.set_default_backend(None)?;
        eprintln!("default backend cleared: new VMs use NUBO_VM_BACKEND or the heuristic");
    } else if let Some(b) = &a.set {
        let id = engine.set_default_backend(Some(b))?;
        eprintln!("default backend for new VMs: {}", id.unwrap_or_default());
    } else {
        match engine.default_backend()? {
            Some(b) => println!("{b}"),
            None => println!("(none: NUBO_VM_BACKEND or the heuristic decides)"),
        }
    }
    Ok(())
}
