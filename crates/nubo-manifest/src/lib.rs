//! nubo-manifest: the `VirtualMachine` and `Workload` YAML kinds (`apiVersion:
//! nubo.dev/v1alpha1`), lowered to [`nubo_spec::VmSpec`], the spec `vm create`'s flags produce.
//!
//! - [`load`]: `-f FILE|DIR|-` -> sources, bounded reads.
//! - [`parse`]: bytes -> documents. `nubo_seed::yaml::check_bounded` first (size, depth, alias
//!   bombs, duplicate keys), then serde-saphyr with YAML 1.2 scalars and unknown fields refused
//!   with the nearest known name. Pure.
//! - [`lower`]: a document -> a validated [`nubo_spec::VmSpec`], reading the files it names
//!   for their content through [`Files`]; spec errors are mapped back to the keys written.
//! - [`read_all`]: all of it for a set of sources, every error of every document collected,
//!   names unique across documents.
//!
//! Every error is a [`ManifestError`]: `file:line:col: path: message`.

mod error;
mod fields;
pub mod index;
mod load;
mod lower;
mod parse;
pub mod restrict;
pub mod schema;
mod suggest;
pub mod types;

pub use error::{ManifestError, ManifestErrors};
pub use fields::manifest_paths;
pub use load::{load, MAX_FILES};
pub use lower::{lower, Files, HostFiles, Lowered, MAX_KEY_FILE, MICROVM_BACKENDS};
pub use parse::{parse, Document, Source, MAX_DOCUMENTS, MAX_MANIFEST};
pub use restrict::LoadRestrictor;
pub use suggest::{did_you_mean, nearest};
pub use types::{Kind, API_VERSION, KINDS, WORKLOAD_TYPES};

use std::collections::BTreeMap;

/// Parses every source, collecting every error; names must be unique across all documents.
pub fn parse_all(sources: &[Source]) -> Result<Vec<Document>, ManifestErrors> {
    let mut docs = Vec::new();
    let mut errors = Vec::new();
    for s in sources {
        match parse(s) {
            Ok(d) => docs.extend(d),
            Err(e) => errors.extend(e.into_errors()),
        }
    }
    let mut seen: BTreeMap<&str, &Document> = BTreeMap::new();
    for d in &docs {
        if let Some(first) = seen.insert(d.name(), d) {
            let pos = first.index.pos("metadata.name");
            errors.push(d.error(
                "metadata.name",
                format!(
                    "`{}` is also the name of the document at {}:{}:{}: each VM needs its own name",
                    nubo_core::file::escape_control(d.name()),
                    first.file,
                    pos.line,
                    pos.column
                ),
            ));
        }
    }
    ManifestErrors::check(errors)?;
    Ok(docs)
}

/// Parses and lowers every source: every error of every document, or every VM's spec.
pub fn read_all(sources: &[Source], files: &dyn Files) -> Result<Vec<Lowered>, ManifestErrors> {
    let docs = parse_all(sources)?;
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for d in docs {
        match lower(d, files) {
            Ok(l) => out.push(l),
            Err(e) => errors.extend(e.into_errors()),
        }
    }
    ManifestErrors::check(errors)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
