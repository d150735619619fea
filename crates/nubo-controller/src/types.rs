//! The four custom resources (group `nubo.dev`, version `v1alpha1`), as Rust types from which
//! kube-rs derives structural CRDs; every field's doc comment becomes its description, which
//! `kubectl explain` shows. Field shapes follow banlieue's, so its users feel at home.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "nubo.dev";
pub const VERSION: &str = "v1alpha1";
/// The finalizer the controller puts on VirtualMachines (removes the domain and its volumes)
/// and VMImages (held while a VirtualMachine uses the image).
pub const FINALIZER: &str = "nubo.dev/cleanup";

/// A reference to an object by name.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NameRef {
    /// The object's name.
    pub name: String,
}

/// A reference to a Provider: by name, in the VirtualMachine's namespace unless `namespace` says otherwise.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ProviderRef {
    /// The Provider's name.
    pub name: String,
    /// The Provider's namespace (e.g. nubo-system); default: the VirtualMachine's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// A key of a Secret in the VirtualMachine's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// The Secret's name.
    pub name: String,
    /// The key in the Secret's data.
    pub key: String,
}

/// Data read from a Secret.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretSource {
    /// The Secret and key holding the data.
    pub secret_ref: SecretKeyRef,
}

/// A VM on a libvirt host of a Provider, personalised by cloud-init from a NoCloud seed.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nubo.dev",
    version = "v1alpha1",
    kind = "VirtualMachine",
    doc = "A VM on a libvirt host of a Provider, personalised by cloud-init from a NoCloud seed (nubo.dev).",
    namespaced,
    status = "VirtualMachineStatus",
    shortname = "vm",
    category = "nubo",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Host","type":"string","jsonPath":".status.host"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.addresses[0]"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// The VMClass (cluster-scoped) giving vCPUs, memory, disk size, firmware and machine.
    pub class_ref: NameRef,
    /// The VMImage (in this namespace) whose disk the VM boots from.
    pub image_ref: NameRef,
    /// The Provider whose hosts run the VM; optional when the namespace has exactly one Provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_ref: Option<ProviderRef>,
    /// The desired power state: true runs the VM, false keeps it defined and stopped.
    #[serde(default = "yes")]
    pub running: bool,
    /// The guest's hostname (RFC 1123 label); default: metadata.name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// cloud-init user-data from a Secret. The placeholders ${vm.name}, ${vm.namespace},
    /// ${vm.hostname} and ${vm.uuid} are substituted; any other ${vm.*} is refused with a condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data: Option<SecretSource>,
    /// cloud-init network-config (version 1 or 2) from a Secret, passed through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_data: Option<SecretSource>,
    /// Authorised SSH public keys, one key line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_keys: Vec<String>,
}

fn yes() -> bool {
    true
}

/// One condition, in metav1.Condition's shape.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Provisioned, Running, CloudInitDone, SeedCurrent (VirtualMachine); Ready, InUse (VMImage).
    #[serde(rename = "type")]
    pub type_: String,
    /// True, False or Unknown.
    pub status: String,
    /// Machine-readable CamelCase cause.
    pub reason: String,
    /// For people: the cause and, where there is one, the fix.
    pub message: String,
    /// When status last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The metadata.generation this condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// What the controller observed of the VM.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// Pending, Provisioning, Running, Stopped or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Provisioned, Running, CloudInitDone (readiness evidence as message) and SeedCurrent
    /// (False when the user-data Secret changed after the seed was made: the seed is never rewritten).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The domain's UUID, which is the guest's cloud-init instance-id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// The Provider host the VM was scheduled to (never moved afterwards).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// The guest's addresses, as observed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<String>,
    /// The metadata.generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Firmware a VMClass boots with.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FirmwareKind {
    /// Legacy BIOS (SeaBIOS).
    #[default]
    Bios,
    /// UEFI (OVMF on the host).
    Efi,
}

/// A size of VM: vCPUs, memory, disk, firmware and machine type.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nubo.dev",
    version = "v1alpha1",
    kind = "VMClass",
    doc = "A size of VM: vCPUs, memory, disk, firmware and machine type (cluster-scoped).",
    plural = "vmclasses",
    shortname = "vmclass",
    category = "nubo",
    printcolumn = r#"{"name":"vCPUs","type":"integer","jsonPath":".spec.vcpus"}"#,
    printcolumn = r#"{"name":"Memory","type":"string","jsonPath":".spec.memory"}"#,
    printcolumn = r#"{"name":"Disk","type":"integer","jsonPath":".spec.sizeGiB"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VMClassSpec {
    /// Virtual CPUs (1 to 255).
    #[schemars(range(min = 1, max = 255))]
    pub vcpus: u32,
    /// Guest memory as a Kubernetes quantity: 512Mi, 2Gi (at least 64Mi).
    pub memory: String,
    /// The OS disk's virtual size in GiB. An image bigger than this is refused with a condition, never truncated.
    #[serde(rename = "sizeGiB")]
    #[schemars(range(min = 1, max = 65536))]
    pub size_gib: u32,
    /// bios or efi.
    #[serde(default)]
    pub firmware: FirmwareKind,
    /// The machine type: pc (default) or q35.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
}

/// Where a VMImage's disk comes from, for one class of Provider.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageSource {
    /// The Provider class this source serves: libvirt.
    pub provider_class: String,
    /// Url (an http(s) download) or Oci (a registry reference).
    pub kind: SourceKind,
    /// The URL, or the OCI reference (digest-pinned `@sha256:` unless allowMutableTag).
    #[serde(rename = "ref")]
    pub reference: String,
    /// `sha256:<hex>` or `sha512:<hex>` of the disk image, verified while it streams into each host's pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

/// How an image source is fetched.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum SourceKind {
    Url,
    Oci,
}

/// A disk image imported into the pools of the Providers' hosts.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nubo.dev",
    version = "v1alpha1",
    kind = "VMImage",
    doc = "A disk image, verified by checksum, for the Providers' hosts.",
    plural = "vmimages",
    shortname = "vmimage",
    category = "nubo",
    namespaced,
    status = "VMImageStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VMImageSpec {
    /// Sources by Provider class; the first matching a Provider's class is used.
    pub sources: Vec<ImageSource>,
    /// Accept an OCI reference by tag (mutable) instead of digest.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_mutable_tag: bool,
    /// For Oci sources from a registry that wants a login: a Secret of type
    /// `kubernetes.io/dockerconfigjson` (`kubectl create secret docker-registry`) in the
    /// VMImage's namespace, whose `auths` entry for the registry is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret_ref: Option<NameRef>,
}

/// One host's copy of the image.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageHostStatus {
    /// The Provider's host name.
    pub name: String,
    /// The volume is in the host's pool, verified.
    pub ready: bool,
    /// The base volume's name in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
}

/// The image's state on one Provider.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageProviderStatus {
    /// The Provider (namespace/name when in another namespace).
    pub provider_name: String,
    /// Every host of the Provider has the image.
    pub ready: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Per host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<ImageHostStatus>,
}

/// The import's progress.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VMImageStatus {
    /// Pending, Importing, Ready or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Ready (with the failure as message) and InUse (deletion held while VirtualMachines use it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The image's digest once verified (sha256:<hex>).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Per Provider.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_provider: Vec<ImageProviderStatus>,
    /// The metadata.generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// One libvirt host of a Provider.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHost {
    /// The host's name in status (a DNS label).
    pub name: String,
    /// libvirt's URI for it: qemu+tls://HOST/system.
    pub uri: String,
    /// The libvirt storage pool for base images, OS disks and seeds (it must exist).
    pub pool: String,
    /// The libvirt network the VMs join (it must exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// A label for spreading (rack, room); informational for now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
}

/// Hypervisor hosts reached through libvirt with mutual TLS, and the credentials for them.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "nubo.dev",
    version = "v1alpha1",
    kind = "Provider",
    doc = "libvirt hosts reached with mutual TLS, and the Secret holding the client credentials.",
    namespaced,
    shortname = "vmprovider",
    category = "nubo",
    status = "ProviderStatus",
    printcolumn = r#"{"name":"Class","type":"string","jsonPath":".spec.class"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProviderSpec {
    /// The kind of hosts: libvirt.
    pub class: String,
    /// The hosts.
    pub hosts: Vec<ProviderHost>,
    /// A Secret in the Provider's namespace with the TLS client certificate, key and CA:
    /// keys cacert.pem, clientcert.pem, clientkey.pem (libvirt's names) or ca.crt, tls.crt, tls.key.
    pub credentials_secret_ref: NameRef,
}

/// Free capacity of a host, as libvirt reports it (virNodeGetFreeMemory, virNodeGetInfo).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostCapacity {
    /// Free memory in bytes: new VMs go to the reachable host with the most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_memory_bytes: Option<u64>,
    /// The host's memory in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The host's logical CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
}

/// One host as last probed.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderHostStatus {
    /// The host's name.
    pub name: String,
    /// libvirtd answered over TLS.
    pub reachable: bool,
    /// What the host has free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<HostCapacity>,
    /// Why not reachable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the host was last asked (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<String>,
}

/// The hosts as last probed.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStatus {
    /// Per host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<ProviderHostStatus>,
    /// The metadata.generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
