//! `nubo seed build | inspect`.

use std::path::PathBuf;

#[derive(Debug, clap::Subcommand)]
pub enum SeedCmd {
    /// Build a NoCloud seed image (ISO9660 + Joliet, or VFAT) labelled CIDATA
    Build(SeedBuildArgs),
    /// List and print the files in a seed image
    Inspect(SeedInspectArgs),
}

/// A drop-in for `cloud-localds OUTPUT USER-DATA [META-DATA]`, plus nubo's own flags.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  nubo seed build -o seed.iso --hostname web-1 --ssh-key @~/.ssh/id_ed25519.pub\n  nubo seed build -o seed.iso --user-data user-data.yaml --network-config net.yaml\n  nubo seed build seed.iso user-data [meta-data]        # as cloud-localds"
)]
pub struct SeedBuildArgs {
    /// Where to write the image (`-` for stdout), mode 0600; an existing regular file is replaced
    /// atomically, anything else there (symlink, device, FIFO, directory) is refused
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// cloud-localds order: OUTPUT USER-DATA [META-DATA] (without -o), or USER-DATA [META-DATA] with -o
    #[arg(value_name = "FILES", num_args = 0..=3)]
    pub positional: Vec<PathBuf>,
    /// Guest hostname: meta-data `local-hostname` and, without --user-data, `hostname:` in the generated #cloud-config
    #[arg(long, value_name = "H")]
    pub hostname: Option<String>,
    /// cloud-init runs per-instance modules once per id: give a new one for each new VM
    #[arg(long = "instance-id", value_name = "ID", default_value = "iid-local01")]
    pub instance_id: String,
    /// SSH public key for the default user: the key itself, a `.pub` file's path, or @FILE of keys (one a line); repeatable
    #[arg(long = "ssh-key", value_name = "KEY|FILE.pub|@FILE")]
    pub ssh_keys: Vec<String>,
    /// user-data passed through byte for byte (#cloud-config, #! script, MIME multipart or gzip; at most 16 MiB)
    #[arg(long = "user-data", value_name = "FILE")]
    pub user_data: Option<PathBuf>,
    /// Network config (version 1 or 2), passed through
    #[arg(long = "network-config", value_name = "FILE")]
    pub network_config: Option<PathBuf>,
    /// vendor-data, passed through
    #[arg(long = "vendor-data", value_name = "FILE")]
    pub vendor_data: Option<PathBuf>,
    /// ISO9660 + Joliet (every guest) or VFAT (VMMs without a CD-ROM)
    #[arg(long, value_enum, default_value_t = SeedFormatArg::Iso)]
    pub format: SeedFormatArg,
    /// Pass user-data, network-config and vendor-data through unchecked (no format or YAML check)
    #[arg(long = "no-validate")]
    pub no_validate: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SeedFormatArg {
    Iso,
    Vfat,
}

#[derive(Debug, clap::Args)]
pub struct SeedInspectArgs {
    /// A seed image: ISO9660 (nubo's, cloud-localds', genisoimage's) or VFAT
    #[arg(value_name = "IMAGE")]
    pub image: PathBuf,
    /// `table` lists the files then prints each; `json` for programs
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
}
