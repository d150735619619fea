//! `nubo image bootstrap`: a bootable cloud image built from a distribution's packages.
//!
//! The recipe: `mmdebstrap --variant=minbase` into a directory, `sfdisk` on a sparse raw file
//! (GPT: BIOS boot, ESP, ext4 root), `mkfs.ext4 -d TREE -E offset=` straight into the file,
//! GRUB's boot.img/core.img placed and patched as grub-bios-setup would, a FAT ESP with a
//! standalone `BOOTX64.EFI` (`mkfs.vfat --offset` + mtools), then `qemu-img convert` to qcow2.
//! No loop devices, no mounts; root or, for other users, mmdebstrap's unshare mode.
//!
//! Pure parts (recipe key, layout, GRUB patching, generated files, mirror parsing) are unit
//! tested; [`build`](build::build) runs the tools and is exercised by the live tests.

pub mod build;
pub mod commands;
pub mod container;
pub mod digest;
pub mod error;
pub mod ext4_times;
pub mod facts;
pub mod grub;
pub mod host;
pub mod identity;
pub mod iso;
pub mod layout;
pub mod mirror;
pub mod recipe;
pub mod rootfs;
mod run;
pub mod stage;

pub use build::{build, BuildSpec, Built, DiskFormat, Progress, Stage};
pub use error::BootstrapError;
pub use host::{Host, Mode};
pub use mirror::host_mirror;
pub use recipe::{Recipe, Release, BASE_PACKAGES, DEFAULT_SIZE, MIN_SIZE, RECIPE_VERSION};
