//! `nubo image build` and `nubo image init`.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use nubo_image::{ImageRef, ImageStore, PruneReport, Pruned};

use crate::cli::image::{BuildArgs, InitArgs};
use crate::commands::vm::{engine, print_event};
use crate::output::{print_json, Format};
use crate::settings::Settings;

pub fn build(a: &BuildArgs, settings: &Settings) -> anyhow::Result<()> {
    let vmfile = a.file.clone().unwrap_or_else(|| a.context.join("VMfile"));
    let tag = a
        .tag
        .as_deref()
        .map(|t| ImageRef::parse(t).with_context(|| format!("-t {t}")))
        .transpose()?;
    let mut build_args = Vec::new();
    for kv in &a.build_arg {
        let Some((k, v)) = kv.split_once('=') else {
            anyhow::bail!("--build-arg `{}` is not KEY=VALUE", nubo_core::name::quote(kv));
        };
        nubo_core::name::check(nubo_core::name::NameKind::BuildArg, k).context("--build-arg")?;
        build_args.push((k.to_owned(), v.to_owned()));
    }
    let boot_timeout =
        nubo_core::duration::parse_duration(&a.boot_timeout, Duration::from_secs(10), Duration::from_secs(24 * 3600))
            .context("--boot-timeout")?;
    let from_container = container_from(&vmfile, a, settings)?;
    let req = nubo_build::BuildRequest {
        vmfile,
        context: a.context.clone(),
        tag,
        build_args,
        no_cache: a.no_cache,
        network: a.network,
        keep_failed: a.keep_failed,
        compress: a.compress,
        boot_timeout,
        from_container,
    };
    let built = nubo_build::build(&engine(settings), &req, &mut print_event)?;
    if let nubo_image::TagChange::Replaced { digest, .. } = &built.tag_change {
        // `docker build -t` moves a tag silently; nubo moves it too, but says from what.
        eprintln!(
            "moved tag {} from {digest} to {}",
            built.image.reference, built.image.digest
        );
    }
    if a.output == Format::Json {
        return print_json(&built);
    }
    let cached = built.steps.iter().filter(|s| s.cached).count();
    eprintln!(
        "  {} of {} step(s) cached{}; {:.1}s",
        cached,
        built.steps.len(),
        if built.booted { "" } else { ", no VM booted" },
        built.seconds
    );
    println!("{} {}", built.image.reference, built.image.digest);
    Ok(())
}

/// The store image for a VMfile's `FROM oci://REGISTRY/REPO@sha256:<hex>`, made through
/// `image from-container`'s path (pulled, unpacked, assembled: reproducible from the digest)
/// under `from-container:<hex>` of the reference; a digest already made is reused. `None` for
/// any other FROM, or a VMfile the build itself will read (stdin) or refuse.
fn container_from(vmfile: &Path, a: &BuildArgs, settings: &Settings) -> anyhow::Result<Option<ImageRef>> {
    if vmfile.as_os_str() == "-" {
        return Ok(None);
    }
    // Read as the build reads it: never blocking on a FIFO, a regular file only, bounded; the
    // build itself then reports whatever is wrong with it.
    let text = {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(vmfile);
        let Ok(f) = f else { return Ok(None) };
        if !f.metadata().is_ok_and(|m| m.is_file()) {
            return Ok(None);
        }
        let mut text = Vec::new();
        if f.take(nubo_build::parse::MAX_VMFILE as u64 + 1)
            .read_to_end(&mut text)
            .is_err()
        {
            return Ok(None);
        }
        text
    };
    let Ok(parsed) = nubo_build::parse_bytes(&text) else {
        return Ok(None);
    };
    let nubo_build::FromSource::Container { reference } = parsed.from else {
        return Ok(None);
    };
    let key = nubo_image::digest::sha256_bytes(reference.as_bytes());
    let tag = ImageRef::parse(&format!("from-container:{}", &key["sha256:".len()..][..16]))?;
    let pinned = reference.contains("@sha256:");
    if pinned {
        if let Some(rec) = super::open_store(settings)?.get(&tag)? {
            if rec.path.is_file() {
                eprintln!("FROM oci://{reference}: made before, as {tag}");
                return Ok(Some(tag));
            }
        }
    }
    eprintln!("FROM oci://{reference}: making a bootable disk of the container image as {tag}");
    let args = crate::cli::from_container::FromContainerArgs {
        source: reference.clone(),
        tag: tag.to_string(),
        format: "qcow2".into(),
        iso_cloud_config: None,
        // from-container's default: room for cloud-init to grow into on a larger VM disk.
        size: nubo_core::ByteSize(4 << 30),
        firmware: "both".into(),
        allow_mutable_tag: a.allow_mutable_tag,
        add_kernel: false,
        appliance: false,
        force: true,
        ca_cert: a.ca_cert.clone(),
        insecure_registry: a.insecure_registry,
        // from-container's defaults.
        limits: crate::cli::net::NetLimitArgs {
            timeout: Duration::from_secs(120),
            speed_limit: 1024,
            speed_time: Duration::from_secs(60),
        },
        output: Format::default(),
    };
    super::from_container::make(&args, settings).with_context(|| format!("FROM oci://{reference}"))?;
    Ok(Some(tag))
}

pub fn init(a: &InitArgs) -> anyhow::Result<()> {
    if a.from.trim().is_empty() || a.from.chars().any(|c| c.is_whitespace() || c.is_control()) {
        anyhow::bail!(
            "--from `{}` is not an image reference: give one like `debian:12`",
            a.from.escape_debug()
        );
    }
    let text = nubo_build::starter(&a.from);
    nubo_build::parse(&text).context("the starter VMfile does not parse")?;
    // The one output-path rule (as `seed build -o`): no symlink (dangling or not), device or
    // FIFO is ever written through; --force replaces a regular file only, atomically.
    let existing = if a.force {
        nubo_core::file::Existing::Replace
    } else {
        nubo_core::file::Existing::Refuse
    };
    nubo_core::file::write_output_for(&a.file, text.as_bytes(), nubo_core::fsmode::RECORD, existing).map_err(
        |e| match e {
            nubo_core::FileError::OutputExists { .. } => anyhow::anyhow!(
                "{} already exists: nubo image init does not overwrite it; pass --force to replace it, or -f to write elsewhere",
                nubo_core::file::shorten(&a.file)
            ),
            other => anyhow::Error::new(other).context("writing the VMfile (-f)"),
        },
    )?;
    eprintln!(
        "wrote {}: edit it, then `nubo image build -t NAME:TAG .`",
        a.file.display()
    );
    Ok(())
}

/// `nubo image prune` also reclaims the build cache.
pub fn prune_cache(
    store: &ImageStore,
    dry_run: bool,
    report: &mut PruneReport,
    settings: &Settings,
) -> anyhow::Result<()> {
    if !dry_run {
        nubo_build::sweep_interrupted(&engine(settings), &mut print_event)?;
    }
    for (path, bytes) in nubo_build::cache::prune(store.dir(), dry_run)? {
        report.bytes += bytes;
        report.removed.push(Pruned {
            kind: "build-cache",
            path,
            bytes,
        });
    }
    Ok(())
}
