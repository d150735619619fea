//! `nubo apply` and `nubo delete`: manifests in files you keep in git.

use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct ApplyArgs {
    /// A manifest file, a directory (every *.yaml and *.yml in it, sorted) or `-` for stdin
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    pub file: PathBuf,
    /// Which files a manifest may name (kustomize's rule): `root-only` (the default) only files
    /// that resolve, after symlinks, inside the manifest's own directory tree (the working
    /// directory for `-`); `none` any file you can read. Also kustomize's spellings
    /// LoadRestrictionsRootOnly and LoadRestrictionsNone
    #[arg(long, value_name = "root-only|none", default_value = "root-only", value_parser = parse_restrictor)]
    pub load_restrictor: nubo_manifest::LoadRestrictor,
    /// Print, per document, the lowered spec, the backend chosen and why, and what would be
    /// created or left; write, lock or pull nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Wait until cloud-init has finished in every VM (in parallel) and report each
    #[arg(long)]
    pub wait: bool,
    /// Replace a VM whose spec differs from its manifest (its disk and cloud-init state are lost)
    #[arg(long)]
    pub recreate: bool,
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
}

#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// A manifest file, a directory or `-`: the VMs it names are removed, no others
    #[arg(short = 'f', long = "filename", value_name = "FILE|DIR|-")]
    pub file: PathBuf,
    /// Accepted for symmetry with apply (delete reads no file a manifest names)
    #[arg(long, value_name = "root-only|none", default_value = "root-only", value_parser = parse_restrictor)]
    pub load_restrictor: nubo_manifest::LoadRestrictor,
}

pub(crate) fn parse_restrictor(s: &str) -> Result<nubo_manifest::LoadRestrictor, String> {
    nubo_manifest::LoadRestrictor::parse(s)
}
