//! `nubo vm ...`.

use std::path::PathBuf;

use clap::ValueEnum;

use crate::output::Format;

#[derive(Debug, clap::Subcommand)]
pub enum VmCmd {
    /// Create a VM from an image (or a disk), personalised by cloud-init, and start it
    Create(Box<CreateArgs>),
    /// List VMs with their live state
    #[command(alias = "list")]
    Ls(LsArgs),
    /// Start a stopped VM (its seed is reused, never rewritten)
    Start(NameArgs),
    /// Stop a VM: ACPI power-off, then a bounded wait, then kill
    Stop(StopArgs),
    /// Stop and start a VM
    Restart(StopArgs),
    /// Pause a running VM (its vCPUs stop; memory and devices stay)
    Pause(NameArgs),
    /// Resume a paused VM
    Resume(NameArgs),
    /// Copy files between the host and a VM over its SSH (`VM:PATH` names the guest side)
    #[command(alias = "transfer")]
    Cp(CpArgs),
    /// Remove a VM: its VMM, overlay, seed, sockets, logs and record (never its base image)
    #[command(alias = "delete")]
    Rm(RmArgs),
    /// Wait until a running VM is ready, reporting each boot phase
    Wait(WaitArgs),
    /// Attach to the serial console (detach with Ctrl-])
    Console(NameArgs),
    /// Print the serial console log
    Logs(LogsArgs),
    /// Run ssh into the VM (as the image's default user, with nubo's key)
    Ssh(SshArgs),
    /// Print how to reach the VM
    Ip(IpArgs),
    /// Print nubo's SSH public key (to put in your own user-data)
    SshKey,
    /// Print a VM's record as JSON
    Inspect(NameArgs),
    /// Show a VM's status: conditions (Provisioned, Running, CloudInitDone, SeedCurrent) with reasons
    Status(StatusArgs),
    /// Show, set or clear the backend new VMs use by default
    DefaultBackend(DefaultBackendArgs),
    /// Snapshots of a VM: disk and memory while it runs, disk only while it is stopped
    #[command(subcommand)]
    Snapshot(SnapshotCmd),
    /// Share a host directory with a running VM, mounted in the guest (hot-plug: qemu pc machine or local libvirt, VM created with a --mount)
    Mount(MountArgs),
    /// Stop sharing a directory with a running VM: unmounted in the guest, then unplugged (qemu, local libvirt)
    Umount(UmountArgs),
}

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    pub name: String,
    /// HOST_DIR[:GUEST_DIR][:ro], as `vm create --mount`
    #[arg(value_name = "HOST_DIR[:GUEST_DIR][:ro]")]
    pub mount: String,
}

#[derive(Debug, clap::Args)]
pub struct UmountArgs {
    pub name: String,
    /// The guest directory the folder is mounted on
    pub guest_dir: PathBuf,
}

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCmd {
    /// Take a snapshot (a running VM pauses while its memory is written; the time is reported)
    Create(SnapshotCreateArgs),
    /// List a VM's snapshots, cross-checked against what its disk really holds
    #[command(alias = "list")]
    Ls(SnapshotLsArgs),
    /// Remove snapshots (the VM itself is untouched)
    #[command(alias = "delete")]
    Rm(SnapshotRmArgs),
    /// Return the VM to a snapshot (a memory snapshot restored onto a stopped VM starts it)
    #[command(alias = "revert")]
    Restore(SnapshotRestoreArgs),
}

#[derive(Debug, clap::Args)]
pub struct SnapshotCreateArgs {
    pub name: String,
    /// Snapshot name (default: `snap-<date>-<time>`): letters, digits, `.`, `_`, `-`, at most 64
    pub snapshot: Option<String>,
    #[arg(long)]
    pub description: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct SnapshotLsArgs {
    pub name: String,
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: Format,
}

#[derive(Debug, clap::Args)]
pub struct SnapshotRmArgs {
    pub name: String,
    #[arg(required = true)]
    pub snapshots: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct SnapshotRestoreArgs {
    pub name: String,
    pub snapshot: String,
}

#[derive(Debug, clap::Args)]
pub struct NameArgs {
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MachineArg {
    Pc,
    Q35,
    Microvm,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AccelArg {
    Auto,
    Kvm,
    Tcg,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum WaitForArg {
    Ssh,
    CloudInit,
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// VM name: a DNS label (lowercase letters, digits, `-`; at most 63 characters)
    pub name: String,
    /// Image from the store (`nubo image ls`); an official reference not yet local is pulled.
    /// Without --image, --disk and --url-img: the default image (`nubo image default`)
    #[arg(long, conflicts_with_all = ["disk", "url_img"])]
    pub image: Option<String>,
    /// Download a cloud image from this https URL (verified by --checksum or `<url>.sha256`) and boot it
    #[arg(long, value_name = "URL", conflicts_with = "disk")]
    pub url_img: Option<String>,
    /// Checksum for --url-img: `sha256:<hex>` or `sha512:<hex>`
    #[arg(long, requires = "url_img")]
    pub checksum: Option<String>,
    /// Boot a --url-img that has no checksum anywhere (only TLS vouches for it)
    #[arg(long, requires = "url_img")]
    pub insecure_no_checksum: bool,
    /// Allow a plain http:// --url-img (anyone on the path could swap the image)
    #[arg(long, requires = "url_img")]
    pub allow_http: bool,
    /// Also trust this PEM CA bundle when pulling the image (a private registry or mirror;
    /// repeatable), as `nubo image pull --ca-cert`
    #[arg(long = "ca-cert", value_name = "FILE")]
    pub ca_cert: Vec<PathBuf>,
    /// Boot this disk image (qcow2 or raw) through an overlay; the file itself is never written
    #[arg(long)]
    pub disk: Option<PathBuf>,
    /// Backend: `qemu`, `libvirt` (`virt`) or `cloud-hypervisor` (`ch`) (see `nubo vm default-backend` and NUBO_VM_BACKEND)
    #[arg(long)]
    pub backend: Option<String>,
    /// libvirt: the connection URI (default NUBO_LIBVIRT_URI, else qemu:///system for root, qemu:///session otherwise)
    #[arg(long, value_name = "URI")]
    pub connect: Option<String>,
    /// libvirt: with a qemu+tls:// --connect, the directory of cacert.pem, clientcert.pem and clientkey.pem (default: libvirt's own locations)
    #[arg(long = "tls-dir", value_name = "DIR", requires = "connect")]
    pub tls_dir: Option<std::path::PathBuf>,
    /// libvirt: the storage pool for the seed volume (default: nubo's own directory pool under NUBO_ROOT)
    #[arg(long, value_name = "NAME")]
    pub pool: Option<String>,
    #[arg(long)]
    pub vcpus: Option<u32>,
    /// Memory, e.g. `2G` or `512M`
    #[arg(long)]
    pub memory: Option<nubo_core::ByteSize>,
    /// Size of the VM's disk (at least the image's virtual size), e.g. `20G`
    #[arg(long)]
    pub disk_size: Option<nubo_core::ByteSize>,
    /// Guest hostname (default: the VM name)
    #[arg(long)]
    pub hostname: Option<String>,
    /// SSH public key for the default user: the key itself, a `.pub` file's path, or `@file` (repeatable)
    #[arg(long = "ssh-key", value_name = "KEY|FILE.pub|@FILE")]
    pub ssh_keys: Vec<String>,
    /// cloud-init user-data file, passed through byte for byte
    #[arg(long)]
    pub user_data: Option<PathBuf>,
    /// cloud-init network-config file (version 1 or 2), passed through
    #[arg(long)]
    pub network_config: Option<PathBuf>,
    /// Attach your own NoCloud seed image as is (instead of nubo making one)
    #[arg(long)]
    pub seed: Option<PathBuf>,
    /// Share a host directory (repeatable); GUEST_DIR defaults to HOST_DIR's own path; `ro` is
    /// enforced by the device. virtio-fs (9p where virtiofsd is missing), mounted by cloud-init
    #[arg(long = "mount", value_name = "HOST_DIR[:GUEST_DIR][:ro]")]
    pub mounts: Vec<String>,
    /// Boot this kernel directly (default when the image records its kernel)
    #[arg(long)]
    pub kernel: Option<PathBuf>,
    #[arg(long, requires = "kernel")]
    pub initrd: Option<PathBuf>,
    #[arg(long, requires = "kernel")]
    pub cmdline: Option<String>,
    /// Boot through firmware and the image's boot loader: `bios`, `efi`, or a UEFI firmware file
    #[arg(long, value_name = "bios|efi|PATH")]
    pub firmware: Option<String>,
    #[arg(long, value_enum)]
    pub machine: Option<MachineArg>,
    /// `auto` uses KVM where it can run stock kernels, else TCG (and says why)
    #[arg(long, value_enum, default_value = "auto")]
    pub accel: AccelArg,
    /// Cut the guest off from every network but its forwarded ports (QEMU `restrict=on`)
    #[arg(long)]
    pub restrict_network: bool,
    /// The guest's network: `forward` (default), `restricted` (as --restrict-network), `none`
    /// (no network device: console only), or a named network (libvirt)
    #[arg(
        long,
        value_name = "forward|restricted|none|NAME",
        conflicts_with = "restrict_network"
    )]
    pub network: Option<String>,
    /// Forward a host port to the guest: `[HOST_IP:]HOST_PORT:GUEST_PORT[/tcp|udp]`, on
    /// 127.0.0.1 unless an address is given (repeatable; user-mode networking)
    #[arg(long = "publish", short = 'p', value_name = "[HOST_IP:]HOST_PORT:GUEST_PORT[/PROTO]")]
    pub publish: Vec<String>,
    /// User `nubo vm ssh` logs in as (default: the image's default user)
    #[arg(long)]
    pub ssh_user: Option<String>,
    /// Wait until cloud-init has finished, reporting each phase
    #[arg(long)]
    pub wait: bool,
    /// Print the VmSpec and the plan as JSON and make nothing (no pull, no file, no VMM)
    #[arg(long, conflicts_with = "wait")]
    pub dry_run: bool,
    /// How long `--wait` waits, e.g. `300s` or `5m`
    #[arg(long, default_value = "300s", value_parser = boot_timeout)]
    pub boot_timeout: std::time::Duration,
}

#[derive(Debug, clap::Args)]
pub struct CpArgs {
    /// Copy directories recursively
    #[arg(short = 'r', long)]
    pub recursive: bool,
    /// `[VM:]SRC`: a host path, or `VM:PATH` in the guest
    pub source: String,
    /// `[VM:]DST`: a host path, or `VM:PATH` in the guest (`VM:` alone is the login user's home)
    pub destination: String,
}

#[derive(Debug, clap::Args)]
pub struct LsArgs {
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: Format,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    pub name: String,
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: Format,
}

#[derive(Debug, clap::Args)]
pub struct StopArgs {
    pub name: String,
    /// Kill the VMM at once instead of asking the guest to power off
    #[arg(long, short)]
    pub force: bool,
    /// How long to wait for the guest to power off before killing it
    #[arg(long, default_value = "90s", value_parser = stop_timeout)]
    pub timeout: std::time::Duration,
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    pub names: Vec<String>,
    /// Remove a running VM too (its VMM is killed)
    #[arg(long, short)]
    pub force: bool,
}

#[derive(Debug, clap::Args)]
pub struct WaitArgs {
    pub name: String,
    #[arg(long = "for", value_enum, default_value = "cloud-init")]
    pub target: WaitForArg,
    #[arg(long, default_value = "300s", value_parser = boot_timeout)]
    pub timeout: std::time::Duration,
}

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    pub name: String,
    /// Keep printing as the console writes
    #[arg(long, short)]
    pub follow: bool,
    /// The previous boot's log
    #[arg(long)]
    pub previous: bool,
}

#[derive(Debug, clap::Args)]
pub struct SshArgs {
    pub name: String,
    /// Reach the guest through this host (ssh -J), e.g. a remote libvirt host whose network
    /// the guest is on: [USER@]HOST[:PORT], authenticated by your own SSH setup
    #[arg(long, value_name = "[USER@]HOST[:PORT]")]
    pub jump: Option<String>,
    /// Command to run instead of a login shell (after `--`)
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct IpArgs {
    pub name: String,
    #[arg(short = 'o', long = "output", value_enum, default_value_t)]
    pub output: Format,
}

#[derive(Debug, clap::Args)]
pub struct DefaultBackendArgs {
    #[arg(long, conflicts_with = "clear")]
    pub set: Option<String>,
    #[arg(long)]
    pub clear: bool,
}

/// `--boot-timeout` and `vm wait --timeout`: 1 s to 24 h, so no deadline can overflow.
fn boot_timeout(s: &str) -> Result<std::time::Duration, String> {
    nubo_core::duration::parse_duration(
        s,
        nubo_spec::limits::MIN_BOOT_TIMEOUT,
        nubo_spec::limits::MAX_BOOT_TIMEOUT,
    )
    .map_err(|e| e.to_string())
}

/// `vm stop --timeout`: 0 s (kill at once after asking) to 1 h.
fn stop_timeout(s: &str) -> Result<std::time::Duration, String> {
    nubo_core::duration::parse_duration(s, std::time::Duration::ZERO, std::time::Duration::from_secs(3600))
        .map_err(|e| e.to_string())
}
