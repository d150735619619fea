//! `nubo vm ...`.

#[derive(Debug, clap::Subcommand)]
pub enum VmCmd {
    /// Create (and start) a VM
    Create(NameArgs),
}

#[derive(Debug, clap::Args)]
pub struct NameArgs {
    pub name: String,
}
