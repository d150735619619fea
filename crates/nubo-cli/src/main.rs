//! The `nubo` binary: clap arguments (`cli`) -> resolved settings (`settings`, environment read
//! once) -> one module per verb (`commands`).

mod cli;
mod commands;
mod output;
mod settings;

use std::process::ExitCode;

/// Cache-line-aligned mid-size blocks: the copies inside rustls and ureq run at full speed
/// (see `nubo_core::alloc`).
#[global_allocator]
static ALLOC: nubo_core::alloc::LineAligned = nubo_core::alloc::LineAligned;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let settings = match settings::Settings::from_env(&args) {
        Ok(s) => s,
        Err(e) => return report(&e),
    };
    match commands::run(args, &settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => report(&e),
    }
}

/// Prints the whole error chain once; a closed stdout (`nubo image ls | head`) is not an error.
fn report(e: &anyhow::Error) -> ExitCode {
    let broken_pipe = e
        .chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| io.kind() == std::io::ErrorKind::BrokenPipe);
    if broken_pipe {
        return ExitCode::SUCCESS;
    }
    eprintln!("error: {e:#}");
    ExitCode::from(1)
}
