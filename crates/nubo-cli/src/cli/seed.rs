//! `nubo seed build | inspect`.

#[derive(Debug, clap::Subcommand)]
pub enum SeedCmd {
    /// Build a NoCloud seed image (ISO9660 + Joliet, or VFAT) labelled CIDATA
    Build(SeedBuildArgs),
    /// List and print the files in a seed image
    Inspect(SeedInspectArgs),
}

#[derive(Debug, clap::Args)]
pub struct SeedBuildArgs {}

#[derive(Debug, clap::Args)]
pub struct SeedInspectArgs {}
