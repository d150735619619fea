//! `nubo manifest validate|schema`, and what `apply` and `delete` share: reading manifests and
//! turning engine errors back into `file:line:col: path: message`.

use std::path::Path;

use nubo_engine::apply::References;
use nubo_engine::{Engine, EngineError};
use nubo_manifest::{Document, HostFiles, LoadRestrictor, Lowered, ManifestErrors};

use crate::cli::manifest::ManifestCmd;
use crate::settings::Settings;

pub fn run(cmd: ManifestCmd, settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        ManifestCmd::Schema => crate::output::print_json(&nubo_manifest::schema::schema()),
        ManifestCmd::Validate(a) => {
            let engine = super::vm::engine(settings);
            let lowered = read(&a.file, settings, a.load_restrictor)?;
            let notes = check(&lowered, &engine)?;
            plan(&lowered, &notes, &engine)?;
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
    if file == Path::new("-") {
        // Standard input through the one bounded reader (a pipe that never ends, or a second
        // `-` in the same command, is refused there).
        let bytes = nubo_core::input::read_small_input(file, "manifest", nubo_manifest::MAX_MANIFEST).map_err(|e| {
            ManifestErrors::one(nubo_manifest::ManifestError {
                file: "-".into(),
                line: 1,
                column: 1,
                path: None,
                message: e.to_string(),
            })
        })?;
        return nubo_manifest::load(file, &mut bytes.as_slice(), &cwd);
    }
    nubo_manifest::load(file, &mut std::io::empty(), &cwd)
}

/// Every document of `file`, parsed (for `delete`: names only, no file it names is read).
pub fn documents(file: &Path) -> anyhow::Result<Vec<Document>> {
    Ok(nubo_manifest::parse_all(&sources(file)?)?)
}

/// Every document of `file`, lowered to its VmSpec and validated; the files a manifest names
/// are confined by `restrictor` (see [`nubo_manifest::restrict`]).
pub fn read(file: &Path, settings: &Settings, restrictor: LoadRestrictor) -> anyhow::Result<Vec<Lowered>> {
    let files = HostFiles {
        home: settings.home.clone(),
        restrictor,
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

/// Plans every document as `apply --dry-run` does (capabilities, backend checks, overrides,
/// the files a create opens), writing, locking and pulling nothing; a document whose image is
/// still to be pulled cannot be planned and is left to `check`'s note. A backend this host
/// cannot reach (a remote libvirt, a missing VMM) says nothing about the manifest: `apply`
/// reports it, `validate` does not.
pub fn plan(lowered: &[Lowered], refs: &[References], engine: &Engine) -> Result<(), ManifestErrors> {
    let mut errors = Vec::new();
    for (l, r) in lowered.iter().zip(refs) {
        if r.pull_first {
            continue;
        }
        match engine.dry_run(&l.spec) {
            Err(e) if e.kind() == nubo_core::ErrorKind::Unavailable => {}
            Err(e) => errors.extend(engine_error(l, e).into_errors()),
            Ok(_) => {}
        }
    }
    ManifestErrors::check(errors)
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
