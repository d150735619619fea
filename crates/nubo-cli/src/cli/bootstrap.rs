//! `nubo image bootstrap`.

use std::path::PathBuf;

use nubo_core::ByteSize;

#[derive(Debug, clap::Args)]
pub struct BootstrapArgs {
    /// Image to build, e.g. `debian:12` (alias `debian:bookworm`)
    pub reference: String,
    /// Debian archive URL (http://, https:// or file:/) [default: the Debian mirror in this host's apt sources]
    #[arg(long, value_name = "URL")]
    pub mirror: Option<String>,
    /// Virtual size of the image's disk (cloud-init grows the root to a larger VM disk)
    #[arg(long, value_name = "SIZE", default_value = "2G")]
    pub size: ByteSize,
    /// Extra package to install, as NAME, NAME=VERSION or NAME/SUITE (repeatable)
    #[arg(long = "package", short = 'p', value_name = "NAME")]
    pub packages: Vec<String>,
    /// Where downloaded .debs are kept between builds [default: $NUBO_ROOT/cache/debs]
    #[arg(long, value_name = "DIR", conflicts_with = "no_cache")]
    pub cache_dir: Option<PathBuf>,
    /// Download every package again and keep none
    #[arg(long)]
    pub no_cache: bool,
    /// Print the stored image's record as JSON when done
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
}
