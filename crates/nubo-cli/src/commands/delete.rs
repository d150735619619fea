//! `nubo delete -f`: removes the VMs the manifests name (no others), in parallel. A VM that is
//! not there is not an error. Only the documents' names are read: the files they reference may
//! be gone already.

use nubo_engine::apply::{host_parallelism, parallel};

use crate::cli::apply::DeleteArgs;
use crate::settings::Settings;

pub fn run(a: &DeleteArgs, settings: &Settings) -> anyhow::Result<()> {
    let engine = super::vm::engine(settings);
    let docs = super::manifest::documents(&a.file)?;
    let results = parallel(&docs, host_parallelism(), |d| {
        let name = d.name();
        engine
            .remove(name, true, &mut |_| {})
            .map_err(|e| format!("{}: vm `{name}`: {:#}", d.file, anyhow::Error::from(e)))
    });
    let mut failed = Vec::new();
    for (d, r) in docs.iter().zip(results) {
        match r {
            Ok(true) => println!("{}: vm `{}` removed", d.file, d.name()),
            Ok(false) => println!("{}: vm `{}` does not exist: nothing to remove", d.file, d.name()),
            Err(e) => failed.push(e),
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("{}", failed.join("\n"));
    }
    Ok(())
}
