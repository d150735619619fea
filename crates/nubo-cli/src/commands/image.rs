//! `nubo image pull | ls | inspect | rm | import | convert | prune | hash`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use nubo_disk::Format;
use nubo_image::{
    Added, ConvertSpec, ImageRecord, ImageRef, ImageStore, ImportRequest, PullEvent, PullRequest, PullSource, TagChange,
};

use crate::cli::image::{ConvertArgs, ConvertTo, HashArgs, ImageCmd, ImportArgs, PruneArgs, PullArgs};
use crate::output::{print_json, print_table, Format as OutputFormat};
use crate::settings::Settings;

mod build;
mod default;
mod from_container;
mod progress;
mod registry;

pub(crate) use registry::pull_oci;

pub fn run(cmd: ImageCmd, settings: &Settings) -> anyhow::Result<()> {
    match cmd {
        ImageCmd::Pull(a) => pull(&a, settings),
        ImageCmd::Push(a) => registry::push(&a, settings),
        ImageCmd::LsRemote(a) => registry::ls_remote(&a, settings),
        ImageCmd::Bootstrap(_) => unreachable!("dispatched to commands::bootstrap"),
        ImageCmd::Ls(a) => ls(a.output, settings),
        ImageCmd::Inspect(a) => {
            let store = open_store(settings)?;
            print_json(&store.require(&stored_ref(&a.reference)?)?)
        }
        ImageCmd::Rm(a) => rm(&a.reference, settings),
        ImageCmd::Import(a) => import(&a, settings),
        ImageCmd::Convert(a) => convert(&a, settings),
        ImageCmd::Prune(a) => prune(&a, settings),
        ImageCmd::Hash(a) => hash(&a),
        ImageCmd::Build(a) => build::build(&a, settings),
        ImageCmd::Init(a) => build::init(&a),
        ImageCmd::Default(a) => default::run(&a, settings),
        ImageCmd::FromContainer(a) => from_container::run(&a, settings),
    }
}

fn open_store(settings: &Settings) -> anyhow::Result<ImageStore> {
    Ok(ImageStore::open(&settings.roots.images())?)
}

fn parse_ref(s: &str) -> anyhow::Result<ImageRef> {
    Ok(ImageRef::parse(s)?)
}

/// An image in the store named as the user knows it: `name:tag`, or the registry reference it
/// was pulled from (`REGISTRY/REPO:TAG`, `...@sha256:<hex>`), which is stored under
/// [`nubo_image::oci::local_name`] (the store's names hold no `/`). `vm create --image` finds a
/// pulled image the same way.
pub(crate) fn stored_ref(s: &str) -> anyhow::Result<ImageRef> {
    match nubo_image::AnyRef::parse(s)? {
        nubo_image::AnyRef::Oci(r) if r.registry.is_some() => Ok(nubo_image::oci::local_name(&r)?),
        _ => parse_ref(s),
    }
}

fn pull(a: &PullArgs, settings: &Settings) -> anyhow::Result<()> {
    let source = PullSource::parse(&a.source)?;
    if let PullSource::Oci(r) = &source {
        return registry::pull(a, r, settings);
    }
    let mut req = pull_request(source, settings);
    req.name = a.name.as_deref().map(parse_ref).transpose()?;
    req.checksum = a
        .checksum
        .as_deref()
        .map(str::parse)
        .transpose()
        .context("--checksum")?;
    if a.mirror.is_some() {
        req.mirror = a.mirror.clone();
    }
    req.tls.extra_ca = a.ca_cert.clone();
    req.allow_http = a.allow_http;
    req.insecure_no_checksum = a.insecure_no_checksum;
    req.force = a.force;
    req.limits = a.limits.limits();
    let added = run_pull(&req, settings)?;
    let rec = &added.record;
    let how = match (&rec.source.checksum, rec.verified) {
        (Some(c), true) => format!("verified {}", c.split(':').next().unwrap_or("checksum")),
        _ => "UNVERIFIED: only TLS vouched for it".to_owned(),
    };
    println!("{} {} ({}, {how})", rec.reference, rec.digest, human(rec.size));
    report_change(&added);
    Ok(())
}

/// Says on stderr what tagging did when it was not a new tag: what a forced command replaced,
/// or that the tag already held these bytes.
pub(crate) fn report_change(added: &Added) {
    let r = &added.record.reference;
    match &added.change {
        TagChange::Created => {}
        TagChange::Unchanged => eprintln!("{r} unchanged: it already was {}", added.record.digest),
        TagChange::Replaced { digest, verified } => eprintln!(
            "replaced {r}: it was {digest} ({}); `nubo image prune` removes the old image once no tag or VM uses it",
            if *verified { "verified" } else { "unverified" }
        ),
    }
}

/// A pull with the settings' mirror for the distro and its TLS trust; Ctrl-C ends it between
/// reads, keeping the partial file ([`crate::interrupt`]).
fn pull_request(source: PullSource, settings: &Settings) -> PullRequest {
    let mut req = settings.pull_config().request(source);
    req.cancel = Some(crate::interrupt::install());
    req
}

fn run_pull(req: &PullRequest, settings: &Settings) -> anyhow::Result<Added> {
    let store = open_store(settings)?;
    let mut reporter = progress::Reporter::new(settings.stderr_tty);
    let rec = nubo_image::pull(&store, req, &mut |e: PullEvent| reporter.event(e));
    reporter.finish();
    // Every PullError names its URL or reference already.
    Ok(rec?)
}

/// For `vm create --url-img URL`: pulls (or finds already verified) the image at `url`.
pub(crate) fn pull_url(
    url: &str,
    checksum: Option<&str>,
    insecure_no_checksum: bool,
    allow_http: bool,
    settings: &Settings,
) -> anyhow::Result<ImageRecord> {
    let mut req = pull_request(PullSource::Url(url.to_owned()), settings);
    req.checksum = checksum.map(str::parse).transpose().context("--checksum")?;
    req.insecure_no_checksum = insecure_no_checksum;
    req.allow_http = allow_http;
    run_pull(&req, settings).map(|added| added.record)
}

/// For the engine (`vm create --image REF` of an official reference not in the store yet).
pub(crate) fn pull_catalog(r: &ImageRef, settings: &Settings) -> anyhow::Result<ImageRecord> {
    Ok(run_pull(&pull_request(PullSource::Catalog(r.clone()), settings), settings)?.record)
}

/// Binary multiples, one decimal, as `ls -h` and qemu-img print them.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.1}{}", UNITS[i])
    }
}

fn source_label(r: &ImageRecord) -> String {
    let kind = match r.source.kind {
        nubo_image::SourceKind::Pull => "pull",
        nubo_image::SourceKind::Import => "import",
        nubo_image::SourceKind::Bootstrap => "bootstrap",
        nubo_image::SourceKind::Oci => "oci",
        nubo_image::SourceKind::Build => "build",
        nubo_image::SourceKind::Container => "container",
    };
    match &r.source.serial {
        Some(s) => format!("{kind} {s}"),
        None => kind.to_owned(),
    }
}

/// Lists every readable record; each unreadable one is a warning on stderr naming the file
/// (exit 0, and `-o json` stays the JSON array of the readable ones).
fn ls(output: OutputFormat, settings: &Settings) -> anyhow::Result<()> {
    let listing = open_store(settings)?.scan()?;
    for bad in &listing.bad {
        eprintln!(
            "warning: skipped {}: {}; remove the file (or `nubo image import --force` over its tag) to clear this",
            bad.path.display(),
            nubo_core::error::chain(&bad.error)
        );
    }
    let records = listing.records;
    if output == OutputFormat::Json {
        return print_json(&records);
    }
    let rows: Vec<Vec<String>> = records
        .iter()
        .map(|r| {
            vec![
                r.reference.clone(),
                r.kind_label().to_owned(),
                human(r.size),
                human(r.virtual_size),
                format!("{} vcpu / {}", r.default_vcpus, human(r.default_memory_mib << 20)),
                source_label(r),
                if r.verified { "yes" } else { "no" }.to_owned(),
            ]
        })
        .collect();
    print_table(
        &["NAME", "TYPE", "SIZE", "VIRTUAL SIZE", "DEFAULTS", "SOURCE", "VERIFIED"],
        &rows,
    )?;
    Ok(())
}

fn rm(reference: &str, settings: &Settings) -> anyhow::Result<()> {
    let store = open_store(settings)?;
    let r = stored_ref(reference)?;
    let rec = store.require(&r)?;
    let vms_dir = settings.roots.vms();
    let users = nubo_engine::usage::vms_using(&vms_dir, &rec)
        .with_context(|| format!("reading VM records in {}", vms_dir.display()))?;
    if !users.is_empty() {
        bail!(
            "image `{r}` is used by VM{} {}: remove {} first (`nubo vm rm {}`)",
            if users.len() == 1 { "" } else { "s" },
            users.join(", "),
            if users.len() == 1 { "it" } else { "them" },
            users.join(" ")
        );
    }
    store.remove(&r)?;
    println!("removed {r}");
    Ok(())
}

fn import(a: &ImportArgs, settings: &Settings) -> anyhow::Result<()> {
    let store = open_store(settings)?;
    let req = ImportRequest {
        file: a.file.clone(),
        reference: parse_ref(&a.tag)?,
        appliance: a.appliance,
        default_vcpus: a.default_vcpus,
        default_memory_mib: a.default_memory.map(|m| m.mib()),
        force: a.force,
    };
    let added = nubo_image::import(&store, &req).with_context(|| format!("importing {}", a.file.display()))?;
    let rec = &added.record;
    println!(
        "{} {} ({} {}, {})",
        rec.reference,
        rec.digest,
        rec.format,
        human(rec.size),
        rec.kind_label()
    );
    report_change(&added);
    Ok(())
}

/// Digests among `candidates` that some VM's record names as its base.
fn digests_in_use(candidates: &[String], settings: &Settings) -> anyhow::Result<BTreeSet<String>> {
    let vms_dir = settings.roots.vms();
    let mut used = BTreeSet::new();
    for digest in candidates {
        // No tag names this blob any more: only a VM's digest can still point at it.
        let probe = ImageRecord {
            reference: digest.clone(),
            digest: digest.clone(),
            ..placeholder_record()
        };
        let users = nubo_engine::usage::vms_using(&vms_dir, &probe)
            .with_context(|| format!("reading VM records in {}", vms_dir.display()))?;
        if !users.is_empty() {
            used.insert(digest.clone());
        }
    }
    Ok(used)
}

fn placeholder_record() -> ImageRecord {
    ImageRecord {
        reference: String::new(),
        digest: String::new(),
        path: PathBuf::new(),
        format: String::new(),
        size: 0,
        virtual_size: 0,
        cloud_init: false,
        os: None,
        release: None,
        arch: String::new(),
        firmware: vec![],
        boot: None,
        default_vcpus: 0,
        default_memory_mib: 0,
        default_user: None,
        hypervisor: None,
        source: nubo_image::ImageSource::new(nubo_image::SourceKind::Import),
        verified: false,
        created: String::new(),
        build_seconds: None,
        labels: Default::default(),
        build: None,
    }
}

fn prune(a: &PruneArgs, settings: &Settings) -> anyhow::Result<()> {
    if let Some(c) = &a.connect {
        return prune_remote(a, c, settings);
    }
    let store = open_store(settings)?;
    let in_use = digests_in_use(&store.unreferenced_blobs()?, settings)?;
    let mut report = store.prune(&in_use, a.dry_run)?;
    build::prune_cache(&store, a.dry_run, &mut report, settings)?;
    if a.output == OutputFormat::Json {
        return print_json(&report);
    }
    let verb = if a.dry_run { "would remove" } else { "removed" };
    for p in &report.removed {
        println!("{verb} {} {} ({})", p.kind, p.path.display(), human(p.bytes));
    }
    for d in &report.kept_in_use {
        eprintln!("kept {d}: a VM is based on it (`nubo vm ls`)");
    }
    for p in &report.kept_active {
        eprintln!("kept {}: a pull is writing it", p.display());
    }
    let reclaimed = if a.dry_run { "would reclaim" } else { "reclaimed" };
    println!(
        "{reclaimed} {} in {} item(s)",
        human(report.bytes),
        report.removed.len()
    );
    Ok(())
}

fn target_format(to: ConvertTo) -> Format {
    match to {
        ConvertTo::Raw => Format::Raw,
        ConvertTo::Qcow2 => Format::Qcow2,
        ConvertTo::Vmdk => Format::Vmdk,
        ConvertTo::Vdi => Format::Vdi,
        ConvertTo::Vhdx => Format::Vhdx,
        ConvertTo::Vhd => Format::Vpc,
    }
}

/// A path when it names a file (or looks like one), else a store reference.
fn convert_source(source: &str, settings: &Settings) -> anyhow::Result<(PathBuf, String)> {
    let p = Path::new(source);
    if p.exists() || source.contains('/') {
        let stem = p
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "image".into());
        return Ok((p.to_path_buf(), stem));
    }
    let r = parse_ref(source)?;
    let rec = open_store(settings)?.require(&r)?;
    Ok((rec.path, format!("{}-{}", r.name, r.tag)))
}

fn convert(a: &ConvertArgs, settings: &Settings) -> anyhow::Result<()> {
    let (src, stem) = convert_source(&a.source, settings)?;
    let info = nubo_disk::inspect(&src)?;
    let to = target_format(a.to);
    let ext = if to == Format::Vpc { "vhd" } else { to.as_str() };
    let out = a
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{stem}.{ext}")));
    let spec = ConvertSpec {
        src: src.clone(),
        src_format: info.format,
        to,
        out: out.clone(),
        compress: a.compress,
    };
    nubo_image::convert(&spec).with_context(|| format!("converting {}", a.source))?;
    println!("{}", out.display());
    Ok(())
}

fn hash(a: &HashArgs) -> anyhow::Result<()> {
    let alg = match a.algorithm.as_str() {
        "sha512" => nubo_image::Algorithm::Sha512,
        _ => nubo_image::Algorithm::Sha256,
    };
    let sum = nubo_image::digest::hash_file(&a.file, alg).with_context(|| format!("hashing {}", a.file.display()))?;
    println!("{}  {}", sum.hex, a.file.display());
    Ok(())
}

/// `nubo image prune --connect URI`: the base volumes nubo uploaded to that host's pool that
/// no OS disk volume backs onto.
fn prune_remote(a: &PruneArgs, connect: &str, settings: &Settings) -> anyhow::Result<()> {
    let uri = super::remote::connect_uri(connect, a.tls_dir.as_deref())?;
    let pool = a
        .pool
        .clone()
        .unwrap_or_else(|| nubo_backend::libvirt::own_pool_for_root(&settings.roots.root));
    let removed = nubo_backend::libvirt::prune_base_volumes(&uri, &pool, a.dry_run)
        .with_context(|| format!("pruning base volumes of pool `{pool}` at `{uri}`"))?;
    if a.output == OutputFormat::Json {
        return print_json(&serde_json::json!({ "pool": pool, "removed": removed, "dry_run": a.dry_run }));
    }
    let verb = if a.dry_run { "would remove" } else { "removed" };
    for v in &removed {
        println!("{verb} base volume {v} from pool `{pool}` at `{uri}`");
    }
    println!("{verb} {} base volume(s)", removed.len());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nubo_image::catalog;

    #[test]
    fn human_mib_has_one_decimal() {
        assert_eq!(human(1536 << 20), "1.5G");
    }

    #[test]
    fn human_small_is_bytes() {
        assert_eq!(human(512), "512B");
    }

    #[test]
    fn target_format_vhd_is_vpc() {
        assert_eq!(target_format(ConvertTo::Vhd), Format::Vpc);
    }

    #[test]
    fn catalog_knows_every_documented_reference() {
        assert_eq!(catalog::references().len(), 6);
    }
}
