//! One module per verb. `run` dispatches.

mod apply;
mod bootstrap;
mod completions;
mod controller;
mod delete;
mod doctor;
pub(crate) mod image;
pub(crate) mod manifest;
pub(crate) mod registry;
mod remote;
mod seed;
pub(crate) mod vm;

use crate::cli::image::ImageCmd;
use crate::cli::{Cli, Command};
use crate::settings::Settings;

pub fn run(cli: Cli, settings: &Settings) -> anyhow::Result<()> {
    match cli.command {
        Command::Image(ImageCmd::Bootstrap(a)) => bootstrap::run(&a, settings),
        Command::Image(cmd) => image::run(cmd, settings),
        Command::Registry(cmd) => registry::run(cmd, settings),
        Command::Seed(cmd) => seed::run(cmd, settings),
        Command::Vm(cmd) => vm::run(cmd, settings),
        Command::Apply(a) => apply::run(&a, settings),
        Command::Delete(a) => delete::run(&a, settings),
        Command::Manifest(cmd) => manifest::run(cmd, settings),
        Command::Doctor(a) => doctor::run(&a, settings),
        Command::Completions(a) => completions::run(&a),
        Command::Controller(a) => controller::run(&a),
    }
}
