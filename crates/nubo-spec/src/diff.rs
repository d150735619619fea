//! [`VmSpec::differences`]: what changed between two specs, by field path, for "`create` again
//! with a different spec" errors and for `apply`'s plan.

use std::collections::BTreeMap;

use nubo_core::ByteSize;
use serde_json::Value;

use crate::field::Field;
use crate::spec::VmSpec;

/// Longest value shown in one difference: a payload's digest fits, key lines and long URLs are
/// cut rather than printed whole.
const MAX_SHOWN: usize = 100;

/// Shown as sizes (`2G`), not byte counts.
const SIZES: &[Field] = &[Field::ResourcesMemory, Field::ResourcesDiskSize];

const PAYLOADS: &[Field] = &[
    Field::CloudInitUserData,
    Field::CloudInitNetworkConfig,
    Field::CloudInitVendorData,
];

impl VmSpec {
    /// The fields in which `other` differs from `self`, each `path: old -> new` (`unset` for an
    /// absent value), in path order. Payloads compare and show by digest, never by content.
    pub fn differences(&self, other: &VmSpec) -> Vec<String> {
        let (mut old, mut new) = (leaves(self), leaves(other));
        // How long a `--wait` waits is not a property of the VM: a create with another timeout
        // (or none) is the same VM.
        for leaves in [&mut old, &mut new] {
            leaves.remove(Field::BootTimeout.path());
        }
        let mut paths: Vec<&String> = old.keys().chain(new.keys()).collect();
        paths.sort();
        paths.dedup();
        let show = |v: Option<&String>| v.map_or_else(|| "unset".to_owned(), |v| cut(v));
        paths
            .into_iter()
            .filter(|p| old.get(*p) != new.get(*p))
            .map(|p| format!("{p}: {} -> {}", show(old.get(p)), show(new.get(p))))
            .collect()
    }
}

/// Every leaf of the spec's serialised form, by path.
fn leaves(spec: &VmSpec) -> BTreeMap<String, String> {
    // Serialising fails only for a non-UTF-8 path, which validate() refuses; compare the whole
    // spec's debug form then, which still tells equal from different.
    let value = serde_json::to_value(spec).unwrap_or_else(|_| Value::String(format!("{spec:?}")));
    let mut out = BTreeMap::new();
    flatten("spec".to_owned(), &value, &mut out);
    out
}

fn flatten(path: String, v: &Value, out: &mut BTreeMap<String, String>) {
    if PAYLOADS.iter().any(|f| f.path() == path) {
        let digest = v.get("sha256").and_then(Value::as_str).unwrap_or_default();
        // By digest alone: records written before lengths were kept (wave 1) hold only it.
        out.insert(path, format!("sha256:{digest}"));
        return;
    }
    if SIZES.iter().any(|f| f.path() == path) {
        if let Some(bytes) = v.as_u64() {
            out.insert(path, ByteSize(bytes).to_string());
            return;
        }
    }
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                flatten(format!("{path}.{k}"), v, out);
            }
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                flatten(format!("{path}[{i}]"), v, out);
            }
        }
        other => {
            out.insert(path, other.to_string());
        }
    }
}

fn cut(s: &str) -> String {
    if s.chars().count() <= MAX_SHOWN {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(MAX_SHOWN).collect();
    out.push('…');
    out
}
