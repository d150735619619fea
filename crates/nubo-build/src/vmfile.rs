//! The VMfile's typed form: what [`crate::parse`] produces. Pure data.

use nubo_core::ByteSize;
use serde::Serialize;

/// A parsed VMfile: its instructions in order, each with the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmFile {
    /// What the build starts from (also the first instruction).
    pub from: FromSource,
    pub instructions: Vec<Instruction>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instruction {
    /// 1-based line where the instruction starts (continuations join later lines to it).
    pub line: usize,
    /// The instruction as written, continuations joined: what the step cache keys on.
    pub text: String,
    pub op: Op,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "op")]
pub enum Op {
    From(FromSource),
    Size(ByteSize),
    /// A cloud-config file of the context, baked in as `/etc/cloud/cloud.cfg.d/90-nubo-image.cfg`.
    CloudInit(String),
    Run(Command),
    Copy {
        sources: Vec<String>,
        dest: String,
    },
    Env(Vec<(String, String)>),
    Arg {
        name: String,
        default: Option<String>,
    },
    Label(Vec<(String, String)>),
    Hypervisor(String),
    Defaults {
        vcpus: Option<u32>,
        memory: Option<ByteSize>,
    },
    Appliance,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "kind")]
pub enum FromSource {
    /// A catalog reference, a local image or an OCI reference: resolved like `vm create --image`.
    Image { reference: String },
    /// `FROM URL CHECKSUM sha256:<hex>`.
    Url { url: String, checksum: String },
    /// `FROM oci://REGISTRY/REPO@sha256:<hex>`: a container image made bootable through
    /// `image from-container`'s path (`reference` without `oci://`; a tag only with
    /// `--allow-mutable-tag`).
    Container { reference: String },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase", tag = "form", content = "argv")]
pub enum Command {
    /// `RUN echo hi > /x`: run by `/bin/sh -c`.
    Shell(String),
    /// `RUN ["apt-get", "install", "-y", "curl"]`: run without a shell.
    Exec(Vec<String>),
}

impl Op {
    /// The keyword, as errors and progress name it.
    pub fn keyword(&self) -> &'static str {
        match self {
            Op::From(_) => "FROM",
            Op::Size(_) => "SIZE",
            Op::CloudInit(_) => "CLOUDINIT",
            Op::Run(_) => "RUN",
            Op::Copy { .. } => "COPY",
            Op::Env(_) => "ENV",
            Op::Arg { .. } => "ARG",
            Op::Label(_) => "LABEL",
            Op::Hypervisor(_) => "HYPERVISOR",
            Op::Defaults { .. } => "DEFAULTS",
            Op::Appliance => "APPLIANCE",
        }
    }

    /// Whether the step writes to the guest's disk (and so runs in the build VM).
    pub fn writes(&self) -> bool {
        matches!(self, Op::Run(_) | Op::Copy { .. } | Op::CloudInit(_))
    }
}
