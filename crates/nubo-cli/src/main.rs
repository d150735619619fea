//! The `nubo` binary: clap arguments (`cli`) -> resolved settings (`settings`, environment read
//! once) -> one module per verb (`commands`).

mod cli;
mod commands;
mod interrupt;
mod output;
mod settings;
mod ssh_keys;
mod terminal;

use std::process::ExitCode;

/// Cache-line-aligned mid-size blocks: the copies inside rustls and ureq run at full speed
/// (see `nubo_core::alloc`).
#[global_allocator]
static ALLOC: nubo_core::alloc::LineAligned = nubo_core::alloc::LineAligned;

use clap::Parser;

fn main() -> ExitCode {
    let args = match cli::Cli::try_parse() {
        Ok(a) => a,
        Err(e) => return usage(&e),
    };
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
    eprintln!("error: {}", terminal::sanitize(&format!("{e:#}"), &terminal::argv()));
    // Ended by Ctrl-C or SIGTERM (the engine stopped at a safe point): the shell's convention.
    match interrupt::received() {
        Some(sig) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
        None => ExitCode::from(1),
    }
}

/// clap's message (help and version go to stdout as clap prints them); a usage error quotes the
/// argument it refuses, so it is printed without styles and with control characters escaped.
fn usage(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        e.exit();
    }
    let argv = terminal::argv();
    let text = if argv.iter().any(|a| a.chars().any(char::is_control)) {
        // clap quotes the value it refuses as typed (escapes stripped, newlines kept): say the
        // same from its context, each value quoted escaped.
        let what: Vec<String> = e
            .context()
            .filter(|(k, _)| !matches!(k, clap::error::ContextKind::Usage))
            .map(|(k, v)| {
                let k = k.as_str().unwrap_or("argument").to_lowercase();
                format!("{k} `{}`", nubo_core::name::quote(&v.to_string()))
            })
            .collect();
        format!(
            "error: {}: {}\n\nFor more information, try '--help'.\n",
            e.kind().as_str().unwrap_or("invalid arguments"),
            what.join(", ")
        )
    } else {
        e.render().to_string()
    };
    eprint!("{}", terminal::sanitize(&text, &argv));
    ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
}
