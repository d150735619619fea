//! The manifest kinds as serde reads them (camelCase, unknown fields refused). These mirror the
//! user's text; [`crate::lower`] turns them into a [`nubo_spec::VmSpec`].

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// The one API version nubo reads.
pub const API_VERSION: &str = "nubo.dev/v1alpha1";

/// The kinds nubo knows.
pub const KINDS: &[&str] = &["VirtualMachine", "Workload"];

/// The workload types nubo knows.
pub const WORKLOAD_TYPES: &[&str] = &["microvm"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Kind {
    VirtualMachine,
    Workload,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::VirtualMachine => "VirtualMachine",
            Kind::Workload => "Workload",
        }
    }
}

/// One document: `apiVersion`, `kind`, `metadata` and the kind's `spec`.
#[derive(Debug, Clone, PartialEq)]
pub struct RawDocument {
    pub kind: Kind,
    pub metadata: Metadata,
    pub spec: KindSpec,
}

#[derive(Debug, Clone, PartialEq)]
pub enum KindSpec {
    VirtualMachine(Box<VirtualMachineSpec>),
    Workload(Box<WorkloadSpec>),
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Metadata {
    /// The VM's name: a DNS label.
    pub name: String,
}

/// `kind: VirtualMachine`'s spec: `vm create`'s flags, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    pub image: Option<String>,
    pub disk: Option<String>,
    pub url: Option<String>,
    pub checksum: Option<String>,
    pub insecure_no_checksum: Option<bool>,
    pub allow_http: Option<bool>,
    pub resources: Option<ResourcesDoc>,
    pub firmware: Option<String>,
    pub boot: Option<BootDoc>,
    pub machine: Option<MachineDoc>,
    pub overrides: Option<BTreeMap<String, BTreeMap<String, String>>>,
    pub network: Option<String>,
    /// `[HOST_IP:]HOST_PORT:GUEST_PORT[/tcp|udp]` each, as `vm create --publish`.
    pub ports: Option<Vec<String>>,
    pub backend: Option<String>,
    pub cloud_init: Option<CloudInitDoc>,
    pub ssh_user: Option<String>,
    pub boot_timeout: Option<String>,
    /// Shared folders, `HOST_DIR[:GUEST_DIR][:ro]` each, as `--mount`.
    pub mounts: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResourcesDoc {
    pub vcpus: Option<u32>,
    pub memory: Option<String>,
    pub disk_size: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BootDoc {
    pub kernel: String,
    pub initrd: Option<String>,
    pub cmdline: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MachineDoc {
    Default,
    Microvm,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CloudInitDoc {
    pub hostname: Option<String>,
    pub ssh_keys: Option<Vec<String>>,
    pub user_data: Option<String>,
    pub user_data_file: Option<String>,
    pub network_config: Option<String>,
    pub network_config_file: Option<String>,
    pub vendor_data: Option<String>,
    pub vendor_data_file: Option<String>,
    pub seed: Option<String>,
}

/// `kind: Workload`'s spec.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct WorkloadSpec {
    #[serde(rename = "type")]
    pub workload_type: WorkloadType,
    pub backend: Option<String>,
    pub microvm: Option<MicrovmDoc>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum WorkloadType {
    Microvm,
}

/// `spec.microvm` of a microvm Workload: a VM on a microVM machine, no firmware.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MicrovmDoc {
    pub image: Option<String>,
    pub disk: Option<String>,
    pub url: Option<String>,
    pub checksum: Option<String>,
    pub insecure_no_checksum: Option<bool>,
    pub allow_http: Option<bool>,
    pub vcpus: Option<u32>,
    pub memory: Option<String>,
    pub disk_size: Option<String>,
    pub kernel: Option<String>,
    pub initrd: Option<String>,
    pub cmdline: Option<String>,
    pub overrides: Option<BTreeMap<String, BTreeMap<String, String>>>,
    pub network: Option<String>,
    pub cloud_init: Option<CloudInitDoc>,
    pub ssh_user: Option<String>,
    pub boot_timeout: Option<String>,
}

/// `apiVersion`, checked where it is read so its error has the value's position.
struct ApiVersion;

impl<'de> Deserialize<'de> for ApiVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ApiVersion, D::Error> {
        let v = String::deserialize(d)?;
        if v != API_VERSION {
            return Err(de::Error::custom(format!(
                "apiVersion `{}` is not one nubo reads: write `{API_VERSION}`",
                nubo_core::file::escape_control(&v)
            )));
        }
        Ok(ApiVersion)
    }
}

/// `kind`, checked where it is read.
struct KindValue(Kind);

impl<'de> Deserialize<'de> for KindValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KindValue, D::Error> {
        let k = String::deserialize(d)?;
        match k.as_str() {
            "VirtualMachine" => Ok(KindValue(Kind::VirtualMachine)),
            "Workload" => Ok(KindValue(Kind::Workload)),
            other => Err(de::Error::custom(format!(
                "unknown kind `{}`: nubo knows {}{}",
                nubo_core::file::escape_control(other),
                KINDS.join(", "),
                crate::suggest::did_you_mean(other, KINDS)
            ))),
        }
    }
}

const DOCUMENT_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec"];

impl<'de> Deserialize<'de> for RawDocument {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RawDocument, D::Error> {
        d.deserialize_struct("Document", DOCUMENT_FIELDS, DocumentVisitor)
    }
}

struct DocumentVisitor;

impl<'de> Visitor<'de> for DocumentVisitor {
    type Value = RawDocument;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a manifest: apiVersion: {API_VERSION}, kind, metadata and spec")
    }

    // The spec's type depends on `kind`, so `kind` is read first and `spec` straight into the
    // kind's type: its errors keep their positions (an internally tagged enum would buffer it).
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawDocument, A::Error> {
        let (mut version, mut kind, mut metadata, mut spec) = (false, None, None, None);
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "apiVersion" => {
                    map.next_value::<ApiVersion>()?;
                    version = true;
                }
                "kind" => kind = Some(map.next_value::<KindValue>()?.0),
                "metadata" => metadata = Some(map.next_value::<Metadata>()?),
                "spec" => {
                    spec =
                        Some(match kind {
                            Some(Kind::VirtualMachine) => KindSpec::VirtualMachine(map.next_value()?),
                            Some(Kind::Workload) => KindSpec::Workload(map.next_value()?),
                            None => return Err(de::Error::custom(
                                "`spec` comes before `kind`, so its fields cannot be read yet: put `kind` above `spec`",
                            )),
                        })
                }
                other => return Err(de::Error::unknown_field(other, DOCUMENT_FIELDS)),
            }
        }
        if !version {
            return Err(de::Error::custom(format!(
                "the document has no apiVersion: add `apiVersion: {API_VERSION}`"
            )));
        }
        let kind = kind.ok_or_else(|| {
            de::Error::custom(format!(
                "the document has no kind: add `kind:` ({})",
                KINDS.join(" or ")
            ))
        })?;
        let metadata =
            metadata.ok_or_else(|| de::Error::custom("the document has no metadata: add `metadata: {name: ...}`"))?;
        let spec = spec.ok_or_else(|| de::Error::custom("the document has no spec: add `spec:`"))?;
        Ok(RawDocument { kind, metadata, spec })
    }
}
