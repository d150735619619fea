use clap::CommandFactory;

use crate::cli::{Cli, CompletionsArgs};

pub fn run(args: &CompletionsArgs) -> anyhow::Result<()> {
    clap_complete::generate(args.shell, &mut Cli::command(), "nubo", &mut std::io::stdout());
    Ok(())
}
