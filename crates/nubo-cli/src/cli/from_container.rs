//! `nubo image from-container`.

use std::path::PathBuf;

use nubo_core::ByteSize;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "The container image must carry its own kernel and initramfs (/boot/vmlinuz-<version> + /boot/initrd.img-<version>, or /usr/lib/modules/<version>/vmlinuz + initramfs.img) and cloud-init (/usr/bin/cloud-init) unless --appliance.\n\
The disk is reproducible: the same container digest gives the same sha256 (ids derived from the digest, times clamped to the config's `created`).\n\
Example:\n  nubo image from-container registry.example:5000/team/os@sha256:<hex> -t os:1"
)]
pub struct FromContainerArgs {
    /// The container image: `REGISTRY/REPO@sha256:<hex>` (a tag only with --allow-mutable-tag)
    #[arg(value_name = "REGISTRY/REPO@sha256:DIGEST")]
    pub source: String,
    /// Store the disk under this name
    #[arg(short = 't', long = "tag", value_name = "name:tag")]
    pub tag: String,
    /// Disk format: qcow2 or raw (iso is not built yet)
    #[arg(long, value_name = "qcow2|raw", default_value = "qcow2")]
    pub format: String,
    /// Virtual size of the disk (cloud-init grows the root to a larger VM disk)
    #[arg(long, value_name = "SIZE", default_value = "4G")]
    pub size: ByteSize,
    /// Firmware the disk boots with: bios (efi and both are not built yet)
    #[arg(long, value_name = "bios", default_value = "bios")]
    pub firmware: String,
    /// Accept a tag and record the digest it resolved to
    #[arg(long)]
    pub allow_mutable_tag: bool,
    /// The image has no cloud-init and configures itself: store it as an appliance
    #[arg(long)]
    pub appliance: bool,
    /// Re-point the name if it already names another image
    #[arg(long)]
    pub force: bool,
    /// Also trust this PEM CA bundle (repeatable)
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
    /// Talk plain http to this registry (and to no other host)
    #[arg(long)]
    pub insecure_registry: bool,
    #[command(flatten)]
    pub limits: crate::cli::net::NetLimitArgs,
    /// Print the stored image's record as JSON when done (instead of the two checksum lines)
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
}
