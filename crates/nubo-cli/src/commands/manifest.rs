//! `nubo manifest validate|schema`, and what `apply` and `delete` share: reading manifests and
//! turning engine errors back into `file:line:col: path: message`.

use std::path::Path;

use nubo_engine::apply::References;
use nubo_engine::{Engine, EngineError};
use nubo_manifest::{Document, HostFiles, Lowered, ManifestErrors};

use crate::cli::manifest::ManifestCmd;
use crate::settings::Settings;

pub fn run(cmd: ManifestCmd, settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        ManifestCmd::Schema => crate::output::print_json(&nubo_manifest::schema::schema()),
        ManifestCmd::Validate(a) => {
            let engine = super::vm::engine(settings);
            let lowered = read(&a.file, settings)?;
            let notes = check(&lowered, &engine)?;
            for (l, notes) in lowered.iter().zip(notes) {
                println!("{}: {} `{}` is valid", l.doc.file, l.kind().as_str(), l.spec.name);
                for n in notes.notes {
                    eprintln!("note: {}: {n}", l.spec.name);
                }
            }
            Ok(())
        }
    }
}

fn sources(file: &Path) -> Result<Vec<nubo_manifest::Source>, ManifestErrors> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| Path::new("/").to_path_buf());
    nubo_manifest::load(file, &mut std::io::stdin().lock(), &cwd)
}

/// Every document of `file`, parsed (for `delete`: names only, no file it names is read).
pub fn documents(file: &Path) -> anyhow::Result<Vec<Document>> {
    Ok(nubo_manifest::parse_all(&sources(file)?)?)
}

/// Every document of `file`, lowered to its VmSpec and validated.
pub fn read(file: &Path, settings: &Settings) -> anyhow::Result<Vec<Lowered>> {
    let files = HostFiles {
        home: settings.home.clone(),
    };
    Ok(nubo_manifest::read_all(&sources(file)?, &files)?)
}

/// What every document references, checked without writing (images, disks, files); every
/// problem of every document, or each document's notes.
pub fn check(lowered: &[Lowered], engine: &Engine) -> Result<Vec<References>, ManifestErrors> {
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    for l in lowered {
        match engine.check_references(&l.spec) {
            Ok(mut r) => {
                r.notes.splice(0..0, l.notes.iter().cloned());
                notes.push(r);
            }
            Err(e) => {
                errors.extend(engine_error(l, e).into_errors());
                notes.push(References::default());
            }
        }
    }
    ManifestErrors::check(errors)?;
    Ok(notes)
}

/// An engine error about `l`'s VM, at the key it concerns (a field error) or at the document.
pub fn engine_error(l: &Lowered, e: EngineError) -> ManifestErrors {
    match e {
        EngineError::Spec(errors) => l.spec_errors(&errors),
        other => ManifestErrors::one(l.error(format!("{:#}", anyhow::Error::from(other)))),
    }
}

/// The same, as one line for reports.
pub fn engine_error_line(l: &Lowered, e: EngineError) -> String {
    engine_error(l, e).to_string()
}
