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
    /// Which files a manifest may name (kustomize's rule): `root-only` (the default) only files
    /// that resolve, after symlinks, inside the manifest's own directory tree (the working
    /// directory for `-`); `none` any file you can read. Also kustomize's spellings
    /// LoadRestrictionsRootOnly and LoadRestrictionsNone
    #[arg(long, value_name = "root-only|none", default_value = "root-only", value_parser = super::apply::parse_restrictor)]
    pub load_restrictor: nubo_manifest::LoadRestrictor,
}
