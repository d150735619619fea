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
    /// Output: a qcow2 or raw disk, or a hybrid ISO (BIOS and UEFI, CD-ROM and USB disk) whose
    /// root is the disk's filesystem read-only under a tmpfs overlay
    #[arg(long, value_name = "qcow2|raw|iso", default_value = "qcow2")]
    pub format: String,
    /// With --format iso: bake this cloud-config into the ISO as its default NoCloud seed, so a
    /// VM booted from the ISO alone is personalised
    #[arg(long, value_name = "FILE")]
    pub iso_cloud_config: Option<PathBuf>,
    /// Virtual size of the disk (cloud-init grows the root to a larger VM disk)
    #[arg(long, value_name = "SIZE", default_value = "4G")]
    pub size: ByteSize,
    /// Firmware the image is recorded to boot with (`vm create` picks from it): bios, efi or
    /// both. Every disk carries both GRUBs (BIOS-boot partition and ESP); an ISO boots both ways
    #[arg(long, value_name = "bios|efi|both", default_value = "both")]
    pub firmware: String,
    /// Accept a tag and record the digest it resolved to
    #[arg(long)]
    pub allow_mutable_tag: bool,
    /// Install the distribution's kernel in a build VM when the image has none (not built yet:
    /// refused with the fix)
    #[arg(long)]
    pub add_kernel: bool,
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
