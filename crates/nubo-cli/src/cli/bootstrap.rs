//! `nubo image bootstrap`.

#[derive(Debug, clap::Args)]
pub struct BootstrapArgs {
    /// Image to build, e.g. `debian:12` (alias `debian:bookworm`)
    pub reference: String,
}
