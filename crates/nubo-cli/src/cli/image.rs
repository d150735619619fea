//! `nubo image ...`.

use std::path::PathBuf;

use nubo_core::ByteSize;

use crate::cli::bootstrap::BootstrapArgs;

#[derive(Debug, clap::Subcommand)]
pub enum ImageCmd {
    /// Download and verify a distro cloud image, a URL, or a VM image from an OCI registry
    Pull(PullArgs),
    /// Push an image to an OCI registry; prints the digest to pin
    Push(PushArgs),
    /// List a registry repository's tags and what each is
    LsRemote(LsRemoteArgs),
    /// Build a cloud image from a distribution's packages (offline-friendly)
    Bootstrap(BootstrapArgs),
    /// Make a bootable disk image from an OCI container image (its own kernel and cloud-init)
    FromContainer(crate::cli::from_container::FromContainerArgs),
    /// List images in the store
    Ls(LsArgs),
    /// Print an image's record as JSON
    Inspect(InspectArgs),
    /// Remove an image (refused while a VM uses it)
    Rm(RmArgs),
    /// Import a local disk image
    Import(ImportArgs),
    /// Convert an image to another format
    Convert(ConvertArgs),
    /// Remove blobs no tag or VM uses, stale partial downloads and empty tag directories
    Prune(PruneArgs),
    /// Build an image from a VMfile by booting it with nubo's own engine
    Build(BuildArgs),
    /// Write a commented starter VMfile
    Init(InitArgs),
    /// Show, set or clear the image `nubo vm create NAME` boots when no image is named
    Default(DefaultImageArgs),
    /// Print a file's digest (what pull verifies with; used by the benchmarks)
    #[command(hide = true)]
    Hash(HashArgs),
}

#[derive(Debug, clap::Args)]
pub struct DefaultImageArgs {
    /// The new default: a catalog reference, a local name:tag or a registry reference
    #[arg(long, value_name = "REF", conflicts_with = "clear")]
    pub set: Option<String>,
    /// Back to the built-in default (debian:12)
    #[arg(long)]
    pub clear: bool,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Catalog: ubuntu:24.04 (noble), ubuntu:22.04 (jammy), debian:12 (bookworm), debian:13 (trixie), rocky:9, rocky:10.\n\
Mirrors: --mirror URL, or NUBO_MIRROR_UBUNTU / NUBO_MIRROR_DEBIAN / NUBO_MIRROR_ROCKY, each a base URL laid out like the distro's own.\n\
Trust: the system CA store (or SSL_CERT_FILE instead of it) plus every --ca-cert.\n\
Registries: a reference with a registry host (`registry.example:5000/team/vm:1`, `...@sha256:<hex>`) is pulled from that OCI registry, every blob checked against the manifest's digest and size; credentials from `nubo registry login`, $REGISTRY_AUTH_FILE or ~/.docker/config.json.\n\
Examples:\n  nubo image pull debian:12\n  nubo image pull https://example.org/disk.qcow2 --checksum sha256:<hex> --name disk:1\n  nubo image pull registry.example:5000/team/debian:12 --name debian:team"
)]
pub struct PullArgs {
    /// A catalog reference (`debian:12`, `ubuntu:noble`, `rocky:9`), an https URL, or a
    /// registry reference (`REGISTRY/REPO[:TAG|@sha256:DIGEST]`)
    #[arg(value_name = "REF|URL|REGISTRY/REPO")]
    pub source: String,
    /// Re-point the tag if it already names another image (the old one stays until `nubo image prune`)
    #[arg(long)]
    pub force: bool,
    /// Verify against this instead of the published checksum file or `<url>.sha256`
    #[arg(long, value_name = "sha256:<hex>|sha512:<hex>")]
    pub checksum: Option<String>,
    /// Store the image under this reference
    #[arg(long, value_name = "name:tag")]
    pub name: Option<String>,
    /// Base URL replacing the distro's own (overrides NUBO_MIRROR_<DISTRO>)
    #[arg(long, value_name = "URL")]
    pub mirror: Option<String>,
    /// Also trust this PEM CA bundle (repeatable)
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
    /// Accept plain http:// URLs and mirrors
    #[arg(long)]
    pub allow_http: bool,
    /// Accept a URL that has no checksum anywhere (only TLS vouches for it; recorded as unverified)
    #[arg(long)]
    pub insecure_no_checksum: bool,
    /// Talk plain http to this reference's registry (and to no other host)
    #[arg(long)]
    pub insecure_registry: bool,
    #[command(flatten)]
    pub limits: crate::cli::net::NetLimitArgs,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "The image goes up as an OCI artifact (artifactType application/vnd.nubo.vm.v1): the disk as one layer (zstd-compressed with --compress), the kernel and initrd as further layers when recorded, the metadata in annotations. Blobs the registry already has are not uploaded.\n\
Example:\n  nubo image push debian:12 registry.example:5000/team/debian:12"
)]
pub struct PushArgs {
    /// The image in the store (`name:tag`)
    pub image: String,
    /// Where to push it: `REGISTRY/REPO[:TAG]` (the tag defaults to the image's)
    #[arg(value_name = "REGISTRY/REPO[:TAG]")]
    pub target: String,
    /// Upload the disk zstd-compressed (media type ...disk.qcow2.v1+zstd); pull decompresses it
    #[arg(long)]
    pub compress: bool,
    /// Also trust this PEM CA bundle (repeatable)
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
    /// Talk plain http to this registry (and to no other host)
    #[arg(long)]
    pub insecure_registry: bool,
    #[command(flatten)]
    pub limits: crate::cli::net::NetLimitArgs,
}

#[derive(Debug, clap::Args)]
pub struct LsRemoteArgs {
    /// `REGISTRY/REPO`
    #[arg(value_name = "REGISTRY/REPO")]
    pub repository: String,
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
    /// Also trust this PEM CA bundle (repeatable)
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
    /// Talk plain http to this registry (and to no other host)
    #[arg(long)]
    pub insecure_registry: bool,
    #[command(flatten)]
    pub limits: crate::cli::net::NetLimitArgs,
}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
}

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// `name:tag`, or the registry reference the image was pulled from (`REGISTRY/REPO:TAG`)
    pub reference: String,
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    /// `name:tag`, or the registry reference the image was pulled from (`REGISTRY/REPO:TAG`)
    pub reference: String,
}

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// Disk image to import: qcow2 is copied, other formats are converted to qcow2
    pub file: PathBuf,
    /// Reference to store it under
    #[arg(short = 't', long = "tag", value_name = "name:tag")]
    pub tag: String,
    /// Re-point the tag if it already names another image (the old one stays until `nubo image prune`)
    #[arg(long)]
    pub force: bool,
    /// The image has no cloud-init: VMs get no seed and refuse --hostname/--ssh-key/--user-data
    #[arg(long)]
    pub appliance: bool,
    /// vCPUs for VMs made from it unless they say otherwise
    #[arg(long, value_name = "N")]
    pub default_vcpus: Option<u32>,
    /// Memory for VMs made from it unless they say otherwise, e.g. `2G`
    #[arg(long, value_name = "SIZE")]
    pub default_memory: Option<ByteSize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ConvertTo {
    Raw,
    Qcow2,
    Vmdk,
    Vdi,
    Vhdx,
    Vhd,
}

#[derive(Debug, clap::Args)]
pub struct ConvertArgs {
    /// An image in the store (`name:tag`) or a disk image file
    #[arg(value_name = "REF|PATH")]
    pub source: String,
    /// Target format (the result is flattened: no backing file)
    #[arg(long, value_enum)]
    pub to: ConvertTo,
    /// Output file [default: <name>.<format> in the current directory]
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Compress (qcow2 and vmdk only)
    #[arg(long)]
    pub compress: bool,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Removes: blobs no tag points at and no VM is based on (with their boot files), partial downloads no pull is writing, leftovers of killed imports, empty tag directories.\n\
Refused while a tag's record is unreadable (`nubo image ls` names it): prune could not tell whether its blob is in use."
)]
pub struct PruneArgs {
    /// Prune the base volumes nubo uploaded to this libvirt host's pool instead (those no VM's disk volume backs onto)
    #[arg(long, value_name = "URI")]
    pub connect: Option<String>,
    /// With a qemu+tls:// --connect: the directory of libvirt's TLS client certificates
    #[arg(long = "tls-dir", value_name = "DIR", requires = "connect")]
    pub tls_dir: Option<PathBuf>,
    /// With --connect: the storage pool (default: nubo's own pool for this NUBO_ROOT)
    #[arg(long, value_name = "NAME", requires = "connect")]
    pub pool: Option<String>,
    /// Report what would be removed without removing it
    #[arg(long)]
    pub dry_run: bool,
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
}

#[derive(Debug, clap::Args)]
pub struct HashArgs {
    pub file: PathBuf,
    #[arg(long, default_value = "sha256", value_parser = ["sha256", "sha512"])]
    pub algorithm: String,
}

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Each step runs as root in a VM nubo boots over FROM (restricted networking unless --network), over SSH with a one-time key. At the end the image is sealed (cloud-init cleaned, machine-id emptied, host keys and the build key removed, logs and apt lists cleared, free space trimmed), flattened into one qcow2 and stored with its provenance (`nubo image inspect`).\n\
Each writing step is cached as a qcow2 layer keyed by its parent, its text and the content of the files it reads: an unchanged VMfile boots nothing, a changed step re-runs from there. `nubo image prune` reclaims the cache.\n\
Examples:\n  nubo image init && nubo image build -t web:1 .\n  nubo image build -f ci/VMfile --build-arg VERSION=2 --network -t app:2 ci/"
)]
pub struct BuildArgs {
    /// The VMfile, or `-` for standard input [default: CONTEXT/VMfile]
    #[arg(short = 'f', long = "file", value_name = "VMfile")]
    pub file: Option<PathBuf>,
    /// Store the image under this reference [default: vmfile:<VMfile digest prefix>]
    #[arg(short = 't', long = "tag", value_name = "name:tag")]
    pub tag: Option<String>,
    /// A value for an ARG of the VMfile (repeatable)
    #[arg(long = "build-arg", value_name = "K=V")]
    pub build_arg: Vec<String>,
    /// Ignore the step cache (new layers still replace the cached ones)
    #[arg(long)]
    pub no_cache: bool,
    /// Give the build VM a network (NAT): for steps that download; without it the guest reaches nothing
    #[arg(long)]
    pub network: bool,
    /// Keep the build VM when a step fails, to look inside (the command to remove it is printed)
    #[arg(long)]
    pub keep_failed: bool,
    /// Compress the image's qcow2 clusters (smaller, slower to write and to boot)
    #[arg(long)]
    pub compress: bool,
    /// How long the build VM may take to finish cloud-init, e.g. `10m`
    #[arg(long, value_name = "DURATION", default_value = "15m")]
    pub boot_timeout: String,
    /// `FROM oci://REGISTRY/REPO:TAG`: accept a tag and record the digest it resolved to
    #[arg(long)]
    pub allow_mutable_tag: bool,
    /// `FROM oci://`: also trust this PEM CA bundle for the registry (repeatable)
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
    /// `FROM oci://`: talk plain http to its registry (and to no other host)
    #[arg(long)]
    pub insecure_registry: bool,
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: crate::output::Format,
    /// The build context: COPY and CLOUDINIT read only from this directory
    #[arg(value_name = "CONTEXT", default_value = ".")]
    pub context: PathBuf,
}

#[derive(Debug, clap::Args)]
pub struct InitArgs {
    /// The image the VMfile starts FROM
    #[arg(long = "from", value_name = "REF", default_value = "debian:12")]
    pub from: String,
    /// Where to write it
    #[arg(short = 'f', long = "file", value_name = "VMfile", default_value = "VMfile")]
    pub file: PathBuf,
    /// Replace an existing file
    #[arg(long)]
    pub force: bool,
}
