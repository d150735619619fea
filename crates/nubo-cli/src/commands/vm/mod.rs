//! `nubo vm ...`: one module per verb; this one builds the engine and prints its events.

mod console;
mod cp;
mod create;
mod inspect;
mod lifecycle;
mod logs;
mod ls;
mod mount;
mod snapshot;
mod ssh;
mod status;

use std::time::Duration;

use nubo_engine::{Engine, Event};

use crate::cli::vm::VmCmd;
use crate::settings::Settings;

pub fn run(cmd: VmCmd, settings: &Settings) -> anyhow::Result<()> {
    if let VmCmd::Create(a) = &cmd {
        // Its --ca-cert reaches the pulls the engine asks for.
        let mut settings = Settings {
            extra_ca: a.ca_cert.clone(),
            ..settings.clone()
        };
        if let (Some(c), Some(dir)) = (&a.connect, &a.tls_dir) {
            settings.libvirt_uri = Some(super::remote::connect_uri(c, Some(dir))?);
        }
        return create::run(a, &engine(&settings), settings.home.as_deref());
    }
    let engine = engine(settings);
    match cmd {
        VmCmd::Create(_) => unreachable!("handled above"),
        VmCmd::Ls(a) => ls::run(&a, &engine),
        VmCmd::Start(a) => lifecycle::start(&a.name, &engine),
        VmCmd::Stop(a) => lifecycle::stop(&a, &engine),
        VmCmd::Restart(a) => lifecycle::restart(&a, &engine),
        VmCmd::Pause(a) => Ok(engine.pause(&a.name, &mut print_event)?),
        VmCmd::Resume(a) => Ok(engine.resume(&a.name, &mut print_event)?),
        VmCmd::Cp(a) => cp::run(&a, &engine),
        VmCmd::Rm(a) => lifecycle::rm(&a, &engine),
        VmCmd::Wait(a) => lifecycle::wait(&a, &engine),
        // Nothing in them looks at the token: Ctrl-C ends them at once, as always.
        VmCmd::Console(a) => crate::interrupt::uncancellable(|| console::run(&a.name, &engine, settings)),
        VmCmd::Logs(a) => crate::interrupt::uncancellable(|| logs::run(&a, &engine)),
        VmCmd::Ssh(a) => ssh::ssh(&a, &engine),
        VmCmd::Ip(a) => ssh::ip(&a, &engine),
        VmCmd::SshKey => ssh::key(&engine),
        VmCmd::Inspect(a) => inspect::run(&a.name, &engine),
        VmCmd::Status(a) => status::run(&a, &engine),
        VmCmd::DefaultBackend(a) => lifecycle::default_backend(&a, &engine),
        VmCmd::Snapshot(c) => snapshot::run(c, &engine),
        VmCmd::Mount(a) => mount::mount(&a, &engine),
        VmCmd::Umount(a) => mount::umount(&a, &engine),
    }
}

/// The engine the `vm` commands drive: Ctrl-C and SIGTERM cancel its waits
/// ([`crate::interrupt`]).
pub fn engine(settings: &Settings) -> Engine {
    Engine::new(
        settings.roots.clone(),
        nubo_backend::builtin_registry_from(&settings.backend_config()),
        settings.env_backend.clone(),
    )
    .with_fetcher(Box::new(Fetcher {
        settings: settings.clone(),
    }))
    .with_cancel(crate::interrupt::install())
}

/// Pulls for the engine with the binary's settings (mirrors, TLS roots) and progress display.
struct Fetcher {
    settings: Settings,
}

impl nubo_engine::ImageFetcher for Fetcher {
    fn fetch(
        &self,
        what: &nubo_engine::Fetch,
        // The process's token (the engine's is the same one): the pulls below take it.
        _cancel: &nubo_core::Cancel,
        _events: &mut dyn FnMut(Event),
    ) -> Result<nubo_image::ImageRecord, nubo_engine::EngineError> {
        let t0 = std::time::Instant::now();
        // Ctrl-C ends a download at its next read, keeping the partial file for the next pull
        // to resume; the engine's create then removes what it had made.
        let (label, result) = match what {
            nubo_engine::Fetch::Catalog(r) => (
                format!("`{r}`"),
                super::image::pull_catalog(r, &self.settings).map_err(|e| bootstrap_hint(r, e)),
            ),
            nubo_engine::Fetch::Oci(r) => (format!("`{r}`"), super::image::pull_oci(r, &self.settings)),
            nubo_engine::Fetch::Url {
                url,
                checksum,
                insecure_no_checksum,
                allow_http,
            } => (
                url.clone(),
                super::image::pull_url(
                    url,
                    checksum.as_deref(),
                    *insecure_no_checksum,
                    *allow_http,
                    &self.settings,
                ),
            ),
        };
        let rec = result.map_err(|e| nubo_engine::EngineError::Pull {
            what: label.clone(),
            source: e.into(),
        })?;
        eprintln!(
            "  pulled {label} as `{}` in {:.1}s",
            rec.reference,
            t0.elapsed().as_secs_f64()
        );
        Ok(rec)
    }
}

/// A catalog image nubo can also build from the distribution's packages (the default image,
/// `debian:12`): a failed download names that way, which needs no image server.
fn bootstrap_hint(r: &nubo_image::ImageRef, e: anyhow::Error) -> anyhow::Error {
    let cancelled = matches!(
        e.downcast_ref::<nubo_image::PullError>(),
        Some(nubo_image::PullError::Cancelled { .. })
    );
    if !cancelled && nubo_bootstrap::Release::find(&r.name, &r.tag).is_ok() {
        e.context(format!(
            "it could not be downloaded: build it from the distribution's packages with `nubo image bootstrap {r}`, then create the VM again"
        ))
    } else {
        e
    }
}

/// Progress goes to stderr, one plain line per event, so it reads the same on a terminal and
/// in a log; results go to stdout.
pub fn print_event(e: Event) {
    match e {
        Event::Step(s) => eprintln!("  {s}"),
        Event::Note(s) => eprintln!("note: {s}"),
        Event::Phase(p, t) => eprintln!("[{:>6}] {}", seconds(t), p.label()),
        Event::Output(s) => eprint!("{s}"),
    }
}

fn seconds(t: Duration) -> String {
    format!("{:.1}s", t.as_secs_f64())
}

/// What `--wait` found at a predicted address, in a line.
pub fn address_line(a: &nubo_engine::readiness::AddressOutcome) -> String {
    use nubo_engine::readiness::AddressOutcome;
    match a {
        AddressOutcome::Up { address, evidence } => format!("predicted address {address} is up: {evidence}"),
        AddressOutcome::Unverifiable { address, why } => {
            format!("predicted address {address} could not be checked from here: {why}")
        }
    }
}
