//! clap definitions only; execution lives in `commands/`.

pub mod apply;
pub mod bootstrap;
pub mod from_container;
pub mod image;
pub mod manifest;
pub mod net;
pub mod registry;
pub mod seed;
pub mod vm;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "nubo",
    version,
    about = "Distro cloud images in, cloud-init-personalised VMs out",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Verified local image store: pull, bootstrap, import, convert, inspect, remove
    #[command(subcommand)]
    Image(image::ImageCmd),
    /// Log in to or out of an OCI registry (credentials for image push/pull)
    #[command(subcommand)]
    Registry(registry::RegistryCmd),
    /// Build or inspect a NoCloud seed (a drop-in for cloud-localds)
    #[command(subcommand)]
    Seed(seed::SeedCmd),
    /// Create and manage virtual machines
    #[command(subcommand)]
    Vm(vm::VmCmd),
    /// Create or converge the VMs manifests describe (`-f FILE|DIR|-`)
    Apply(apply::ApplyArgs),
    /// Remove the VMs manifests name
    Delete(apply::DeleteArgs),
    /// Validate manifests, or print their JSON Schema
    #[command(subcommand)]
    Manifest(manifest::ManifestCmd),
    /// Check this host's prerequisites, each with the package that fixes it
    Doctor(DoctorArgs),
    /// Print a shell completion script
    Completions(CompletionsArgs),
    /// The Kubernetes controller: `run` reconciles nubo.dev resources, `crds` prints their
    /// definitions (runs the `nubo-controller` binary installed beside nubo)
    Controller(ControllerArgs),
}

#[derive(Debug, clap::Args)]
pub struct ControllerArgs {
    /// `run [--state-dir DIR] [--listen ADDR] ...` or `crds`; see `nubo controller --help`
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<std::ffi::OsString>,
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Also check this libvirt host (its daemon, and for qemu+tls:// the TLS client certificates)
    #[arg(long, value_name = "URI")]
    pub connect: Option<String>,
    /// With a qemu+tls:// --connect: the directory of cacert.pem, clientcert.pem and clientkey.pem (default: libvirt's own locations)
    #[arg(long = "tls-dir", value_name = "DIR", requires = "connect")]
    pub tls_dir: Option<std::path::PathBuf>,
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
}

#[derive(Debug, clap::Args)]
pub struct CompletionsArgs {
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}
