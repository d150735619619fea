//! `nubo image from-container REF -t name:tag`: pull a container image (every blob verified),
//! unpack its layers hostile-safe, assemble a bootable disk with nubo-bootstrap's reproducible
//! assembly, and store it as an ordinary image with its provenance. Prints the disk's
//! `sha256:<hex>` and `sha512:<hex>`.

use std::fs::File;
use std::io::Read;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use nubo_bootstrap::container::{assemble, ContainerSpec};
use nubo_bootstrap::{DiskFormat, Host, Progress, Stage, MIN_SIZE};
use nubo_image::digest::StreamHasher;
use nubo_image::oci::container::{self, ContainerRequest};
use nubo_image::oci::unpack::{self, Limits};
use nubo_image::{Algorithm, BootFiles, Firmware, ImageRecord, ImageRef, ImageSource, OciRef, PullEvent, SourceKind};

use super::open_store;
use super::progress::Reporter;
use crate::cli::from_container::FromContainerArgs;
use crate::commands::registry::client_settings;
use crate::output::{print_json, Format as OutputFormat};
use crate::settings::Settings;

const DEFAULT_VCPUS: u32 = 2;
const DEFAULT_MEMORY_MIB: u64 = 1024;

fn disk_format(s: &str) -> anyhow::Result<DiskFormat> {
    match s {
        "qcow2" => Ok(DiskFormat::Qcow2),
        "raw" => Ok(DiskFormat::Raw),
        "iso" => bail!("--format iso is not built yet: make a qcow2 or raw disk (`--format qcow2`)"),
        other => bail!("--format `{other}` is not a disk format nubo makes: use qcow2 or raw"),
    }
}

fn firmware(s: &str) -> anyhow::Result<Vec<Firmware>> {
    match s {
        "bios" => Ok(vec![Firmware::Bios]),
        "efi" | "both" => {
            bail!("--firmware {s} is not built yet: container disks boot with BIOS for now (`--firmware bios`)")
        }
        other => bail!("--firmware `{other}` is not one nubo knows: use bios"),
    }
}

pub fn run(a: &FromContainerArgs, settings: &Settings) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let format = disk_format(&a.format)?;
    let firmware = firmware(&a.firmware)?;
    let name = ImageRef::parse(&a.tag)?;
    let reference = match nubo_image::AnyRef::parse(&a.source)? {
        nubo_image::AnyRef::Oci(r) if r.registry.is_some() => r,
        _ => return Err(nubo_image::oci::OciError::NoRegistry(a.source.clone()).into()),
    };
    if a.size.bytes() < MIN_SIZE.bytes() || !a.size.bytes().is_multiple_of(1 << 20) {
        bail!(
            "--size {} is refused: a container disk is a whole number of MiB and at least {}",
            a.size,
            MIN_SIZE
        );
    }
    let store = open_store(settings)?;
    if !a.force && store.get(&name)?.is_some() {
        bail!("image {name} already exists: pick another -t name:tag, or pass --force to re-point it");
    }
    // Before any download: the tools and root privileges the assembly needs.
    let host = Host::probe().context("checking this host for `nubo image from-container`")?;
    let tmp = store.tmp_dir();
    let work = tempfile_in(&tmp)?;
    let req = ContainerRequest {
        reference: reference.clone(),
        allow_mutable_tag: a.allow_mutable_tag,
        client: client_settings(
            reference.registry.as_deref().unwrap_or_default(),
            &a.ca_cert,
            a.insecure_registry,
            a.limits.limits(),
            settings,
        )?,
    };
    let blobs = work.path().join("blobs");
    std::fs::create_dir(&blobs).with_context(|| format!("creating {}", blobs.display()))?;
    let mut reporter = Reporter::new(settings.stderr_tty);
    let fetched = container::fetch(&req, &blobs, &mut |e: PullEvent| reporter.event(e));
    reporter.finish();
    let img = fetched.with_context(|| format!("pulling container image {reference}"))?;

    let tree = work.path().join("tree");
    let limits = Limits::within_free_space(&tmp, a.size.bytes())
        .with_context(|| format!("checking the free space in {}", tmp.display()))?;
    eprintln!(
        "unpacking {} layer(s) of {}@{}",
        img.layers.len(),
        img.repository,
        img.manifest_digest
    );
    let unpacked = unpack::unpack(&img.layers, &tree, &limits)
        .with_context(|| format!("unpacking container image {reference}"))?;
    std::fs::remove_dir_all(&blobs).with_context(|| format!("removing {}", blobs.display()))?;
    eprintln!(
        "      {} entries, {} MiB{}{}",
        unpacked.entries,
        unpacked.bytes >> 20,
        if unpacked.skipped_devices.is_empty() {
            String::new()
        } else {
            format!(
                "; device nodes not made (devtmpfs provides them): {}",
                unpacked.skipped_devices.join(", ")
            )
        },
        if unpacked.skipped_xattrs == 0 {
            String::new()
        } else {
            format!("; xattrs not kept on {} entries", unpacked.skipped_xattrs)
        }
    );

    let spec = ContainerSpec {
        tree: &tree,
        source_digest: &img.manifest_digest,
        epoch: img.created_epoch,
        size: a.size.bytes(),
        format,
        appliance: a.appliance,
        work_parent: &tmp,
    };
    let built =
        assemble(&host, &spec, &mut Lines).with_context(|| format!("making a disk of container image {reference}"))?;
    drop(work);

    let (kernel, initrd) = store.add_boot_files(&built.digest, &built.kernel, Some(built.initrd.as_path()))?;
    let mut labels = container::provenance(&img);
    labels.insert("io.nubo.source.container.kernel".into(), built.kernel_path.clone());
    labels.insert(
        "io.nubo.source.tools".into(),
        format!("nubo {}", env!("CARGO_PKG_VERSION")),
    );
    let record = ImageRecord {
        reference: name.to_string(),
        digest: built.digest.clone(),
        path: built.disk.clone(),
        format: match format {
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Raw => "raw",
        }
        .into(),
        size: built.size,
        virtual_size: built.virtual_size,
        cloud_init: built.cloud_init,
        os: None,
        release: None,
        arch: "x86_64".into(),
        firmware,
        boot: Some(BootFiles {
            kernel,
            initrd,
            cmdline: built.cmdline.clone(),
        }),
        default_vcpus: DEFAULT_VCPUS,
        default_memory_mib: DEFAULT_MEMORY_MIB,
        default_user: None,
        hypervisor: None,
        source: ImageSource {
            url: Some(pinned(&reference, &img.manifest_digest, img.index_digest.as_deref())),
            manifest: Some(img.manifest_digest.clone()),
            source_date_epoch: Some(img.created_epoch),
            ..ImageSource::new(SourceKind::Container)
        },
        verified: true,
        created: humantime::format_rfc3339_seconds(SystemTime::now()).to_string(),
        build_seconds: Some((t0.elapsed().as_secs_f64() * 10.0).round() / 10.0),
        labels,
        build: None,
    };
    let rec = store.add(&built.disk, record)?;
    let sha512 = sha512_of(&rec.path)?;
    eprintln!(
        "made {} from {}@{} in {:.1}s: {} ({} MiB on disk, {} virtual), kernel {}{}",
        rec.reference,
        img.repository,
        img.manifest_digest,
        t0.elapsed().as_secs_f64(),
        rec.path.display(),
        rec.size >> 20,
        nubo_core::ByteSize(rec.virtual_size),
        built.kernel_path,
        if built.cloud_init {
            ""
        } else {
            ", appliance (no cloud-init)"
        }
    );
    if a.output == OutputFormat::Json {
        print_json(&rec)?;
    } else {
        println!("{}", rec.digest);
        println!("{sha512}");
    }
    Ok(())
}

/// The reference as resolved: the digest it pinned (or the tag's digest now).
fn pinned(r: &OciRef, manifest: &str, index: Option<&str>) -> String {
    let base = OciRef {
        tag: None,
        digest: Some(index.unwrap_or(manifest).to_owned()),
        ..r.clone()
    };
    base.to_string()
}

fn tempfile_in(dir: &std::path::Path) -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("from-container-pull-")
        .tempdir_in(dir)
        .with_context(|| format!("creating a work directory in {}", dir.display()))
}

fn sha512_of(path: &std::path::Path) -> anyhow::Result<String> {
    let mut f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut h = StreamHasher::new(Some(Algorithm::Sha512));
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let d = h.finish();
    Ok(d.other.map(|c| c.to_string()).unwrap_or_default())
}

/// One line per assembly stage with its time.
struct Lines;

impl Progress for Lines {
    fn started(&mut self, stage: Stage) {
        eprintln!("[{}/{}] {}", stage.number(), Stage::ALL.len(), stage.label());
    }

    fn finished(&mut self, _stage: Stage, elapsed: Duration) {
        eprintln!("      done in {:.1}s", elapsed.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_format_iso_refused_not_built_yet() {
        let err = disk_format("iso").unwrap_err().to_string();

        assert!(err.contains("--format iso is not built yet"), "{err}");
    }

    #[test]
    fn disk_format_qcow2_and_raw_accepted() {
        assert_eq!(disk_format("qcow2").unwrap(), DiskFormat::Qcow2);
        assert_eq!(disk_format("raw").unwrap(), DiskFormat::Raw);
        assert!(disk_format("vmdk").is_err());
    }

    #[test]
    fn firmware_efi_and_both_refused_not_built_yet() {
        for f in ["efi", "both"] {
            let err = firmware(f).unwrap_err().to_string();

            assert!(err.contains(&format!("--firmware {f} is not built yet")), "{err}");
        }
        assert_eq!(firmware("bios").unwrap(), vec![Firmware::Bios]);
    }

    #[test]
    fn pinned_names_index_digest_when_there_is_one() {
        let r = OciRef::parse("registry.example:5000/team/os:1").unwrap();
        let (m, i) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "b".repeat(64)),
        );

        assert_eq!(pinned(&r, &m, Some(&i)), format!("registry.example:5000/team/os@{i}"));
        assert_eq!(pinned(&r, &m, None), format!("registry.example:5000/team/os@{m}"));
    }
}
