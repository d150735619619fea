//! VMfile builds. The parser ([`parse`]) and resolution ([`resolve()`]) are pure; with the
//! `engine` feature (the default), [`build`] runs a VMfile in a VM booted by nubo's own
//! engine, seals the result and stores it as an image.

#[cfg(feature = "engine")]
pub mod build;
#[cfg(feature = "engine")]
pub mod cache;
#[cfg(feature = "engine")]
pub mod context;
#[cfg(feature = "engine")]
pub mod error;
#[cfg(feature = "engine")]
pub mod guest;
pub mod parse;
pub mod resolve;
#[cfg(feature = "engine")]
pub mod seal;
pub mod vmfile;
pub mod words;

#[cfg(test)]
mod tests;

#[cfg(feature = "engine")]
pub use build::{build, sweep_interrupted, BuildRequest, Built, StepReport};
#[cfg(feature = "engine")]
pub use error::BuildError;
pub use parse::{parse, parse_bytes, ParseError};
pub use resolve::{resolve, Action, Resolved, Step, CLOUD_CFG};
pub use vmfile::{Command, FromSource, Instruction, Op, VmFile};

/// The starter VMfile `nubo image init` writes: every instruction, commented.
pub fn starter(from: &str) -> String {
    format!(
        "# A VMfile: how `nubo image build` makes an image. Build it with\n\
#   nubo image build -t myimage:1 .\n\
# and boot it with `nubo vm create NAME --image myimage:1 --wait`.\n\
\n\
# The image to start from: a catalog reference (debian:12, ubuntu:24.04), a local image,\n\
# an OCI reference, or `FROM https://... CHECKSUM sha256:<hex>`. Exactly one, first.\n\
FROM {from}\n\
\n\
# The disk's size. It must come before any RUN, COPY or CLOUDINIT: the root filesystem\n\
# grows to it on the build VM's first boot.\n\
SIZE 10G\n\
\n\
# Build arguments (`--build-arg GREETING=hi`) and environment for the RUN steps.\n\
ARG GREETING=hello\n\
ENV DEBIAN_FRONTEND=noninteractive\n\
\n\
# Files of the build context (this directory) into the guest. Paths may not leave it.\n\
# COPY motd /etc/motd\n\
\n\
# Commands run as root in the guest; a non-zero exit fails the build. Networking is off\n\
# unless the build is run with --network (needed for apt-get install).\n\
RUN echo \"$GREETING from a VMfile\" > /etc/nubo-built\n\
\n\
# A cloud-config baked in as the default of every VM made from the image (a VM's own\n\
# --user-data still applies on top of it).\n\
# CLOUDINIT cloud.cfg\n\
\n\
# Metadata: labels (annotations when pushed), the backend VMs should use, the defaults\n\
# `vm create` uses when given none, and APPLIANCE for images without cloud-init.\n\
LABEL org.opencontainers.image.description=\"built with nubo\"\n\
# HYPERVISOR qemu\n\
# DEFAULTS vcpus=2 memory=2G\n\
# APPLIANCE\n"
    )
}
