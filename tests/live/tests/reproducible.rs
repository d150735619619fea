//! Issue 15, reproducible bootstrap: `nubo image bootstrap debian:12` built twice from the same
//! recipe and the same package versions gives the same sha256, and the image record lists the
//! package versions (what a rebuild needs besides the recipe key).
//!
//! One fresh bootstrap into its own `NUBO_ROOT`, compared with the shared live-test image when
//! that one was built from the same recipe key and recorded the same package versions (it is an
//! independent build: another root, another time, another work directory); otherwise a second
//! fresh bootstrap. Either way two separate builds are compared, never a build with itself.

use std::collections::BTreeMap;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use nubo_live::cli::{json, nubo, run};
use nubo_live::fixture::cache_base;
use nubo_live::{LiveTest, TestResult, TestRoot};

/// A bootstrap takes 1-4 minutes here; a cold .deb cache on a slow mirror more.
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(1800);

fn main() -> ExitCode {
    nubo_live::run(vec![LiveTest::new(
        "reproducible_bootstrap_same_recipe_same_sha256",
        &["bootstrap"],
        same_recipe_same_sha256,
    )])
}

/// What one build recorded.
struct Build {
    label: String,
    digest: String,
    recipe: String,
    packages: BTreeMap<String, String>,
    epoch: u64,
    path: String,
}

fn same_recipe_same_sha256() -> TestResult {
    let fresh_root = TestRoot::new()?;
    let fresh = bootstrap(&fresh_root, "fresh build")?;
    if fresh.packages.len() < 100 || !fresh.packages.contains_key("linux-image-cloud-amd64") {
        return Err(format!(
            "the record lists {} packages, not the installed set (no linux-image-cloud-amd64 or too few)",
            fresh.packages.len()
        ));
    }
    if fresh.epoch == 0 || !fresh.recipe.starts_with("sha256:") {
        return Err(format!(
            "the record's source_date_epoch ({}) or recipe key ({}) is not set",
            fresh.epoch, fresh.recipe
        ));
    }

    let cached_root = TestRoot::new()?;
    let cached = cached_root.with_debian_image()?;
    let cached = read_build("shared live-test image", &cached.record).ok();
    let (other_root, other) = match cached {
        Some(c) if c.recipe == fresh.recipe && c.packages == fresh.packages => {
            println!("comparing with the shared live-test image: same recipe key and package versions");
            (cached_root, c)
        }
        _ => {
            println!("the shared live-test image was built from other package versions or recorded none: bootstrapping again");
            let root = TestRoot::new()?;
            let second = bootstrap(&root, "second fresh build")?;
            (root, second)
        }
    };

    if other.recipe != fresh.recipe {
        return Err(format!(
            "the two builds have different recipe keys: {} and {}",
            fresh.recipe, other.recipe
        ));
    }
    if other.packages != fresh.packages {
        return Err(format!(
            "the mirror served other package versions between the two builds, so this run proves nothing: re-run. Changed: {}",
            changed(&fresh.packages, &other.packages)
        ));
    }
    if other.epoch != fresh.epoch {
        return Err(format!(
            "same packages but different source_date_epoch: {} ({}) and {} ({})",
            fresh.epoch, fresh.label, other.epoch, other.label
        ));
    }
    let (a, b) = (file_sha256(&fresh.path)?, file_sha256(&other.path)?);
    if a != fresh.digest || b != other.digest {
        return Err(format!(
            "a stored image does not match its record: {} is {a}, recorded {}; {} is {b}, recorded {}",
            fresh.path, fresh.digest, other.path, other.digest
        ));
    }
    if a != b {
        let cmp = run(
            Command::new("qemu-img").args(["compare", "-f", "qcow2", "-F", "qcow2", &fresh.path, &other.path]),
            Duration::from_secs(300),
        )?;
        return Err(format!(
            "two builds of recipe {} from the same {} package versions differ: {} ({a}) and {} ({b}); qemu-img compare: {}{}",
            fresh.recipe,
            fresh.packages.len(),
            fresh.label,
            other.label,
            cmp.stdout.trim(),
            cmp.stderr.trim()
        ));
    }
    println!(
        "reproducible: {} and {} are both {a} (recipe {}, {} packages, SOURCE_DATE_EPOCH {})",
        fresh.label,
        other.label,
        fresh.recipe,
        fresh.packages.len(),
        fresh.epoch
    );
    drop(other_root);
    Ok(())
}

/// `nubo image bootstrap debian:12` into `root`, then its record as `image inspect` prints it.
fn bootstrap(root: &TestRoot, label: &str) -> Result<Build, String> {
    let debs = cache_base().join("debs");
    let debs = debs.to_str().ok_or("the .deb cache path is not UTF-8")?;
    let t = Instant::now();
    nubo(
        root,
        &["image", "bootstrap", "debian:12", "--cache-dir", debs],
        BOOTSTRAP_TIMEOUT,
    )?
    .require()?;
    println!("timing {label}: bootstrap {:.1}s", t.elapsed().as_secs_f64());
    let out = nubo(root, &["image", "inspect", "debian:12"], Duration::from_secs(60))?.require()?;
    read_build(label, &json(&out.stdout, "`image inspect debian:12`")?)
}

fn read_build(label: &str, record: &serde_json::Value) -> Result<Build, String> {
    let s = |ptr: &str| {
        record
            .pointer(ptr)
            .and_then(|v| v.as_str())
            .map(str::to_owned)
            .ok_or_else(|| format!("{label}: the record has no {ptr}: {record}"))
    };
    let packages = record
        .pointer("/source/packages")
        .and_then(|v| v.as_object())
        .ok_or_else(|| format!("{label}: the record has no /source/packages"))?
        .iter()
        .map(|(k, v)| {
            v.as_str()
                .map(|v| (k.clone(), v.to_owned()))
                .ok_or_else(|| format!("{label}: package {k} has no version string"))
        })
        .collect::<Result<BTreeMap<_, _>, _>>()?;
    Ok(Build {
        label: label.to_owned(),
        digest: s("/digest")?,
        recipe: s("/source/recipe")?,
        packages,
        epoch: record
            .pointer("/source/source_date_epoch")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| format!("{label}: the record has no /source/source_date_epoch"))?,
        path: s("/path")?,
    })
}

fn file_sha256(path: &str) -> Result<String, String> {
    nubo_bootstrap::digest::file_digest(std::path::Path::new(path)).map_err(|e| format!("cannot read {path}: {e}"))
}

/// `name a -> b` for each package whose version differs or that only one build has.
fn changed(a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) -> String {
    let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter(|n| a.get(*n) != b.get(*n))
        .map(|n| {
            let v = |m: &BTreeMap<String, String>| m.get(n).map_or("(none)".to_owned(), Clone::clone);
            format!("{n} {} -> {}", v(a), v(b))
        })
        .collect::<Vec<_>>()
        .join(", ")
}
