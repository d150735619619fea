//! `nubo manifest validate|schema`.

use std::path::PathBuf;

#[derive(Debug, clap::Subcommand)]
pub enum ManifestCmd {
    /// Check manifests without touching any VM: syntax, fields, files, keys and images
    Validate(ValidateArgs),
    /// Print the JSON Schema of the manifest kinds (for editors)
    Schema,
}

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// A manifest file, a directory (every *.yaml and *.yml in it, sorted) or `-` for stdin
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    pub file: PathBuf,
}
