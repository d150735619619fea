//! `nubo image bootstrap`: build with nubo-bootstrap, then add the image and its boot files to
//! the store.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use nubo_bootstrap::{BuildSpec, Host, Mode, Progress, Recipe, Release, Stage};
use nubo_image::{BootFiles, Firmware, ImageRecord, ImageRef, ImageSource, ImageStore, SourceKind};

use crate::cli::bootstrap::BootstrapArgs;
use crate::output::{print_json, Format};
use crate::settings::Settings;

/// What a bootstrapped Debian asks of a VM by default: the cloud kernel boots in 1 GiB.
const DEFAULT_VCPUS: u32 = 2;
const DEFAULT_MEMORY_MIB: u64 = 1024;

pub fn run(args: &BootstrapArgs, settings: &Settings) -> anyhow::Result<()> {
    let reference = ImageRef::parse(&args.reference)?;
    let release = Release::find(&reference.name, &reference.tag)?;
    let mirror = match &args.mirror {
        Some(m) => m.clone(),
        None => nubo_bootstrap::host_mirror(Path::new("/etc/apt"))?,
    };
    // Before the host probe: a refused mirror or package name is the user's to fix, whatever
    // this host has installed.
    let recipe = Recipe::new(release, mirror, args.size, args.packages.clone())?;
    let host =
        Host::probe_in(settings.host.path.as_deref()).context("checking this host for `nubo image bootstrap`")?;
    let cache = match (&args.cache_dir, args.no_cache) {
        (_, true) => None,
        (Some(d), false) => Some(d.clone()),
        (None, false) => Some(settings.roots.root.join("cache").join("debs")),
    };
    let store = ImageStore::open(&settings.roots.images())?;
    let mode = match host.mode {
        Mode::Root => "as root",
        Mode::Unshare => "as this user, in a user namespace (mmdebstrap --mode=unshare)",
    };
    eprintln!(
        "bootstrapping {reference} (Debian {}, {} packages) from {} {mode}",
        release.suite,
        recipe.packages().len(),
        recipe.mirror
    );
    let spec = BuildSpec {
        recipe: &recipe,
        cache_dir: cache.as_deref(),
        work_parent: &store.tmp_dir(),
    };
    let mut progress = Lines {
        tty: settings.stderr_tty,
    };
    let built =
        nubo_bootstrap::build(&host, &spec, &mut progress).with_context(|| format!("bootstrapping {reference}"))?;

    let (kernel, initrd) = store.add_boot_files(&built.digest, &built.kernel, Some(built.initrd.as_path()))?;
    let record = ImageRecord {
        reference: reference.to_string(),
        digest: built.digest.clone(),
        path: built.qcow2.clone(),
        format: "qcow2".into(),
        size: built.size,
        virtual_size: built.virtual_size,
        cloud_init: true,
        os: Some(release.os.into()),
        release: Some(release.version.into()),
        arch: "x86_64".into(),
        firmware: vec![Firmware::Bios, Firmware::Efi],
        boot: Some(BootFiles {
            kernel,
            initrd,
            cmdline: built.cmdline.clone(),
        }),
        default_vcpus: DEFAULT_VCPUS,
        default_memory_mib: DEFAULT_MEMORY_MIB,
        default_user: Some("debian".into()),
        hypervisor: None,
        source: ImageSource {
            url: Some(recipe.mirror.clone()),
            recipe: Some(recipe.key()),
            source_date_epoch: Some(built.source_date_epoch),
            packages: Some(built.packages.clone()),
            ..ImageSource::new(SourceKind::Bootstrap)
        },
        verified: true,
        created: rfc3339(SystemTime::now()),
        build_seconds: Some(round1(built.elapsed)),
        labels: Default::default(),
        build: None,
    };
    let rec = store.add(&built.qcow2, record)?;
    eprintln!(
        "built {} in {:.1}s: {} ({} MiB on disk, {} virtual), {}",
        rec.reference,
        built.elapsed.as_secs_f64(),
        rec.path.display(),
        rec.size >> 20,
        nubo_core::ByteSize(rec.virtual_size),
        rec.digest
    );
    if args.output == Format::Json {
        print_json(&rec)?;
    }
    Ok(())
}

/// One line per stage with its elapsed time; mmdebstrap's own `I:` lines indented below it.
struct Lines {
    tty: bool,
}

impl Progress for Lines {
    fn started(&mut self, stage: Stage) {
        eprintln!("[{}/{}] {}", stage.number(), Stage::ALL.len(), stage.label());
    }

    fn detail(&mut self, _stage: Stage, line: &str) {
        // Info lines are progress; anything else (W:, E:) is worth seeing on a log too.
        if self.tty || !line.starts_with("I: ") {
            eprintln!("      {line}");
        }
        let _ = std::io::stderr().flush();
    }

    fn finished(&mut self, _stage: Stage, elapsed: Duration) {
        eprintln!("      done in {:.1}s", elapsed.as_secs_f64());
    }
}

fn round1(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}

/// `YYYY-MM-DDTHH:MM:SSZ`.
fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    #[test]
    fn rfc3339_epoch_and_leap_day() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3661)),
            "2000-02-29T01:01:01Z"
        );
    }
}
