//! The JSON Schema of the manifest kinds (`nubo manifest schema`), for editors (the YAML
//! language server reads it). Written by hand next to the types, with their help text; a test
//! holds every object's properties to the fields the serde types accept, so the two cannot
//! drift.

use serde_json::{json, Value};

use crate::types::API_VERSION;

fn text(description: &str) -> Value {
    json!({ "type": "string", "description": description })
}

fn size(description: &str) -> Value {
    json!({
        "type": "string",
        "pattern": "^[0-9]+(\\.[0-9]+)?\\s*([KkMmGgTt]([Ii]?[Bb])?|[Bb])$",
        "description": description,
        "examples": ["512M", "2G"]
    })
}

fn source_properties() -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert(
        "image".into(),
        text("an image in the store or a catalog reference to pull: `debian:12`, `ubuntu:24.04`"),
    );
    m.insert(
        "disk".into(),
        text("a disk image file used read-only as the base (relative to this manifest)"),
    );
    m.insert(
        "url".into(),
        text("an https:// URL of a cloud image, verified by `checksum`"),
    );
    m.insert(
        "checksum".into(),
        text("`sha256:<hex>` or `sha512:<hex>` of the image at `url`"),
    );
    m.insert(
        "insecureNoChecksum".into(),
        json!({"type": "boolean", "description": "accept `url` unverified"}),
    );
    m.insert(
        "allowHttp".into(),
        json!({"type": "boolean", "description": "accept a plain http:// `url`"}),
    );
    m
}

fn overrides() -> Value {
    json!({
        "type": "object",
        "description": "per-backend options the neutral spec cannot say, by backend id: `qemu: {machine: q35, accel: tcg}`",
        "additionalProperties": { "type": "object", "additionalProperties": { "type": "string" } }
    })
}

fn cloud_init() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "description": "what the NoCloud seed carries; user-data never re-applies to an existing VM",
        "properties": {
            "hostname": text("the guest's hostname (default: the VM's name)"),
            "sshKeys": { "type": "array", "items": { "type": "string" },
                "description": "public key lines, or `@path` to a .pub / authorized_keys file (relative to this manifest, `~` expanded)" },
            "userData": text("user-data passed through as is (`#cloud-config`, a script, MIME)"),
            "userDataFile": text("a file holding the user-data (relative to this manifest)"),
            "networkConfig": text("network config (version 1 or 2), as text"),
            "networkConfigFile": text("a file holding the network config"),
            "vendorData": text("vendor-data, as text"),
            "vendorDataFile": text("a file holding the vendor-data"),
            "seed": text("your own NoCloud seed image, attached as is (excludes every field above)")
        }
    })
}

/// The schema: one document is a VirtualMachine or a Workload.
pub fn schema() -> Value {
    let mut vm = source_properties();
    vm.insert(
        "resources".into(),
        json!({
            "type": "object", "additionalProperties": false,
            "properties": {
                "vcpus": { "type": "integer", "minimum": 1, "description": "virtual CPUs" },
                "memory": size("guest memory"),
                "diskSize": size("the overlay's virtual size (at least the image's)")
            }
        }),
    );
    vm.insert(
        "firmware".into(),
        text("`auto` (the image's), `bios`, `efi`, or a path to UEFI firmware code"),
    );
    vm.insert("boot".into(), json!({
        "type": "object", "additionalProperties": false, "required": ["kernel"],
        "description": "boot a kernel directly (no firmware)",
        "properties": { "kernel": text("kernel image path"), "initrd": text("initrd path"), "cmdline": text("kernel command line") }
    }));
    vm.insert(
        "machine".into(),
        json!({ "enum": ["default", "microvm"], "description": "the backend-neutral machine model" }),
    );
    vm.insert("overrides".into(), overrides());
    vm.insert(
        "network".into(),
        text("`forward` (default), `restricted` (nothing but the SSH forward), `none` (no network device), or a libvirt network's name"),
    );
    vm.insert("ports".into(), json!({
        "type": "array",
        "items": text("`[HOST_IP:]HOST_PORT:GUEST_PORT[/tcp|udp]`: a host port (on 127.0.0.1 unless an address is given) forwarded to the guest"),
        "description": "host ports forwarded to the guest (user-mode networking), as `vm create --publish`"
    }));
    vm.insert(
        "backend".into(),
        text("`qemu`, `libvirt`, `cloud-hypervisor`; absent: nubo's selection precedence"),
    );
    vm.insert("cloudInit".into(), cloud_init());
    vm.insert(
        "sshUser".into(),
        text("the user `nubo vm ssh` logs in as (default: the image's)"),
    );
    vm.insert(
        "bootTimeout".into(),
        text("how long `--wait` waits for cloud-init: `90s`, `5m`"),
    );
    vm.insert(
        "mounts".into(),
        json!({ "type": "array", "items": { "type": "string" }, "description": "shared folders, each `HOST_DIR[:GUEST_DIR][:ro]` as `--mount` (a relative HOST_DIR is against the manifest's directory)" }),
    );

    let mut micro = source_properties();
    micro.insert("vcpus".into(), json!({ "type": "integer", "minimum": 1 }));
    micro.insert("memory".into(), size("guest memory"));
    micro.insert("diskSize".into(), size("the overlay's virtual size"));
    micro.insert(
        "kernel".into(),
        text("kernel image path (default: the image's recorded kernel)"),
    );
    micro.insert("initrd".into(), text("initrd path"));
    micro.insert("cmdline".into(), text("kernel command line"));
    micro.insert("overrides".into(), overrides());
    micro.insert(
        "network".into(),
        text("`forward`, `restricted` or `none` (no network device)"),
    );
    micro.insert("cloudInit".into(), cloud_init());
    micro.insert("sshUser".into(), text("the user `nubo vm ssh` logs in as"));
    micro.insert("bootTimeout".into(), text("how long `--wait` waits for cloud-init"));

    let metadata = json!({
        "type": "object", "additionalProperties": false, "required": ["name"],
        "properties": { "name": { "type": "string", "pattern": "^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
            "description": "the VM's name: a DNS label" } }
    });
    let document = |kind: &str, spec: Value| {
        json!({
            "type": "object", "additionalProperties": false,
            "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {
                "apiVersion": { "const": API_VERSION },
                "kind": { "const": kind },
                "metadata": metadata.clone(),
                "spec": spec
            }
        })
    };
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://nubo.dev/schemas/v1alpha1/manifest.json",
        "title": "nubo manifest",
        "description": "a nubo VirtualMachine or Workload; `nubo apply -f` creates it",
        "oneOf": [
            document("VirtualMachine", json!({ "type": "object", "additionalProperties": false, "properties": vm })),
            document("Workload", json!({
                "type": "object", "additionalProperties": false, "required": ["type"],
                "properties": {
                    "type": { "enum": crate::types::WORKLOAD_TYPES },
                    "backend": { "enum": ["qemu", "cloud-hypervisor"], "description": "a backend with a microVM machine; absent: nubo's selection precedence (cloud-hypervisor where installed, else QEMU's microvm machine)" },
                    "microvm": { "type": "object", "additionalProperties": false, "properties": micro }
                }
            }))
        ]
    })
}

#[cfg(test)]
mod tests {
    use serde::de::{self, Deserialize, Deserializer, Visitor};

    use super::*;
    use crate::types::*;

    /// The field names serde accepts for `T`: a deserializer that records what
    /// `deserialize_struct` is asked for, then stops.
    fn fields<'de, T: Deserialize<'de>>() -> Vec<&'static str> {
        struct Probe(Option<&'static [&'static str]>);
        #[derive(Debug)]
        struct Stop;
        impl std::fmt::Display for Stop {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("stop")
            }
        }
        impl std::error::Error for Stop {}
        impl de::Error for Stop {
            fn custom<M: std::fmt::Display>(_: M) -> Stop {
                Stop
            }
        }
        impl<'de> Deserializer<'de> for &mut Probe {
            type Error = Stop;
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Stop> {
                self.0 = Some(fields);
                Err(Stop)
            }
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
                Err(Stop)
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 u8 u16 u32 u64 f32 f64 char str string bytes byte_buf option unit
                unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
            }
        }
        let mut p = Probe(None);
        let _ = T::deserialize(&mut p);
        p.0.expect("a struct").to_vec()
    }

    fn keys(v: &Value, ptr: &str) -> Vec<String> {
        let mut k: Vec<String> = v
            .pointer(ptr)
            .and_then(Value::as_object)
            .unwrap_or_else(|| panic!("no object at {ptr}"))
            .keys()
            .cloned()
            .collect();
        k.sort();
        k
    }

    fn sorted(f: Vec<&str>) -> Vec<String> {
        let mut f: Vec<String> = f.into_iter().map(str::to_owned).collect();
        f.sort();
        f
    }

    #[test]
    fn schema_properties_match_the_types() {
        let s = schema();
        let vm = "/oneOf/0/properties/spec/properties";
        let wl = "/oneOf/1/properties/spec/properties";

        let cases: Vec<(String, Vec<&str>)> = vec![
            (vm.to_owned(), fields::<VirtualMachineSpec>()),
            (format!("{vm}/resources/properties"), fields::<ResourcesDoc>()),
            (format!("{vm}/boot/properties"), fields::<BootDoc>()),
            (format!("{vm}/cloudInit/properties"), fields::<CloudInitDoc>()),
            (wl.to_owned(), fields::<WorkloadSpec>()),
            (format!("{wl}/microvm/properties"), fields::<MicrovmDoc>()),
            (
                format!("{wl}/microvm/properties/cloudInit/properties"),
                fields::<CloudInitDoc>(),
            ),
            (
                "/oneOf/0/properties/metadata/properties".to_owned(),
                fields::<Metadata>(),
            ),
        ];

        for (ptr, f) in cases {
            assert_eq!(keys(&s, &ptr), sorted(f), "{ptr}");
        }
    }
}
