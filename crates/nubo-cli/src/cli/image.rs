//! `nubo image ...`.

use crate::cli::bootstrap::BootstrapArgs;

#[derive(Debug, clap::Subcommand)]
pub enum ImageCmd {
    /// Download and verify a distro cloud image or a URL
    Pull(PullArgs),
    /// Build a cloud image from a distribution's packages (offline-friendly)
    Bootstrap(BootstrapArgs),
    /// List images in the store
    Ls(LsArgs),
    /// Print an image's record as JSON
    Inspect(InspectArgs),
    /// Remove an image (refused while a VM uses it)
    Rm(RmArgs),
    /// Import a local disk image
    Import(ImportArgs),
    /// Convert an image to another format
    Convert(ConvertArgs),
}

#[derive(Debug, clap::Args)]
pub struct PullArgs {}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
}

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    pub reference: String,
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    pub reference: String,
}

#[derive(Debug, clap::Args)]
pub struct ImportArgs {}

#[derive(Debug, clap::Args)]
pub struct ConvertArgs {}
