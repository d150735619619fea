//! `nubo image from-container REF -t name:tag`: pull a container image (every blob verified),
//! unpack its layers hostile-safe, assemble a bootable disk with nubo-bootstrap's reproducible
//! assembly, and store it as an ordinary image with its provenance. Prints the disk's
//! `sha256:<hex>` and `sha512:<hex>`.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use nubo_bootstrap::container::{assemble, ContainerSpec, IsoSpec};
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

/// `--add-kernel`: refused with the fix until a build VM installs the kernel.
fn add_kernel(asked: bool) -> anyhow::Result<()> {
    if asked {
        bail!("--add-kernel is not built yet: add the kernel to the container image instead (its Containerfile installing the distribution's kernel and initramfs, e.g. `RUN apt-get install -y linux-image-amd64`) and push it again");
    }
    Ok(())
}

/// The disk format assembled, and whether an ISO is made of it.
fn disk_format(s: &str) -> anyhow::Result<(DiskFormat, bool)> {
    match s {
        "qcow2" => Ok((DiskFormat::Qcow2, false)),
        "raw" => Ok((DiskFormat::Raw, false)),
        "iso" => Ok((DiskFormat::Raw, true)),
        other => bail!("--format `{other}` is not one nubo makes: use qcow2, raw or iso"),
    }
}

/// The most a baked cloud-config may hold: NoCloud user-data, not a payload.
const MAX_CLOUD_CONFIG: u64 = 1 << 20;

/// The `--iso-cloud-config` file: only with an ISO, a regular file, UTF-8, at most 1 MiB.
fn iso_cloud_config(path: Option<&Path>, iso: bool) -> anyhow::Result<Option<Vec<u8>>> {
    let Some(path) = path else { return Ok(None) };
    if !iso {
        bail!(
            "--iso-cloud-config {} is refused: it is baked into an ISO only; add --format iso",
            path.display()
        );
    }
    let f = File::open(path).with_context(|| format!("reading --iso-cloud-config {}", path.display()))?;
    let meta = f
        .metadata()
        .with_context(|| format!("reading --iso-cloud-config {}", path.display()))?;
    if !meta.is_file() || meta.len() > MAX_CLOUD_CONFIG {
        bail!(
            "--iso-cloud-config {} is refused: not a regular file of at most {MAX_CLOUD_CONFIG} bytes",
            path.display()
        );
    }
    let mut data = Vec::new();
    f.take(MAX_CLOUD_CONFIG + 1)
        .read_to_end(&mut data)
        .with_context(|| format!("reading --iso-cloud-config {}", path.display()))?;
    if std::str::from_utf8(&data).is_err() || data.len() as u64 > MAX_CLOUD_CONFIG {
        bail!(
            "--iso-cloud-config {} is refused: NoCloud user-data here is UTF-8 text of at most {MAX_CLOUD_CONFIG} bytes (a #cloud-config)",
            path.display()
        );
    }
    Ok(Some(data))
}

fn firmware(s: &str) -> anyhow::Result<Vec<Firmware>> {
    match s {
        "bios" => Ok(vec![Firmware::Bios]),
        "efi" => Ok(vec![Firmware::Efi]),
        "both" => Ok(vec![Firmware::Bios, Firmware::Efi]),
        other => bail!("--firmware `{other}` is not one nubo knows: use bios, efi or both"),
    }
}

pub fn run(a: &FromContainerArgs, settings: &Settings) -> anyhow::Result<()> {
    let rec = make(a, settings)?;
    let sha512 = sha512_of(&rec.path)?;
    if a.output == OutputFormat::Json {
        print_json(&rec)?;
    } else {
        println!("{}", rec.digest);
        println!("{sha512}");
    }
    Ok(())
}

/// The whole command up to the stored record: what `image build` runs for `FROM oci://`.
pub fn make(a: &FromContainerArgs, settings: &Settings) -> anyhow::Result<ImageRecord> {
    let t0 = Instant::now();
    add_kernel(a.add_kernel)?;
    let (format, iso) = disk_format(&a.format)?;
    let firmware = firmware(&a.firmware)?;
    let cloud_config = iso_cloud_config(a.iso_cloud_config.as_deref(), iso)?;
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
    if iso {
        nubo_bootstrap::iso::probe_tools().context("checking this host for `--format iso`")?;
    }
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
        match (unpacked.xattrs, unpacked.skipped_xattrs) {
            (0, 0) => String::new(),
            (set, 0) => format!("; {set} xattrs set"),
            (set, n) => format!("; {set} xattrs set, some not kept on {n} entries (names nubo does not set, symlinks)"),
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
        iso: iso.then_some(IsoSpec {
            cloud_config: cloud_config.as_deref(),
        }),
    };
    let built =
        assemble(&host, &spec, &mut Lines).with_context(|| format!("making a disk of container image {reference}"))?;
    drop(work);

    // An ISO boots through its own GRUB; the disk's root=UUID command line is not its.
    let boot = if iso {
        None
    } else {
        let (kernel, initrd) = store.add_boot_files(&built.digest, &built.kernel, Some(built.initrd.as_path()))?;
        Some(BootFiles {
            kernel,
            initrd,
            cmdline: built.cmdline.clone(),
        })
    };
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
        format: match (iso, format) {
            (true, _) => "iso",
            (false, DiskFormat::Qcow2) => "qcow2",
            (false, DiskFormat::Raw) => "raw",
        }
        .into(),
        size: built.size,
        virtual_size: if iso { built.size } else { built.virtual_size },
        cloud_init: built.cloud_init,
        os: None,
        release: None,
        arch: "x86_64".into(),
        firmware,
        boot,
        default_vcpus: DEFAULT_VCPUS,
        default_memory_mib: DEFAULT_MEMORY_MIB,
        default_user: built.default_user.clone(),
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
    Ok(rec)
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
    fn add_kernel_refused_with_the_fix() {
        let err = add_kernel(true).unwrap_err().to_string();

        assert!(
            err.contains("--add-kernel is not built yet") && err.contains("linux-image-amd64"),
            "{err}"
        );
        assert!(add_kernel(false).is_ok());
    }

    #[test]
    fn disk_format_iso_made_from_raw() {
        assert_eq!(disk_format("iso").unwrap(), (DiskFormat::Raw, true));
    }

    #[test]
    fn disk_format_qcow2_and_raw_accepted() {
        assert_eq!(disk_format("qcow2").unwrap(), (DiskFormat::Qcow2, false));
        assert_eq!(disk_format("raw").unwrap(), (DiskFormat::Raw, false));
        assert!(disk_format("vmdk").is_err());
    }

    #[test]
    fn iso_cloud_config_without_iso_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();

        let err = iso_cloud_config(Some(f.path()), false).unwrap_err().to_string();

        assert!(err.contains("add --format iso"), "{err}");
    }

    #[test]
    fn iso_cloud_config_binary_refused() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), [0xff, 0xfe, 0x00]).unwrap();

        let err = iso_cloud_config(Some(f.path()), true).unwrap_err().to_string();

        assert!(err.contains("UTF-8 text"), "{err}");
    }

    #[test]
    fn iso_cloud_config_directory_refused() {
        let d = tempfile::tempdir().unwrap();

        let err = format!("{:#}", iso_cloud_config(Some(d.path()), true).unwrap_err());

        assert!(err.contains("--iso-cloud-config"), "{err}");
    }

    #[test]
    fn iso_cloud_config_text_read() {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), "#cloud-config\nhostname: a\n").unwrap();

        assert_eq!(
            iso_cloud_config(Some(f.path()), true).unwrap().unwrap(),
            b"#cloud-config\nhostname: a\n"
        );
    }

    #[test]
    fn firmware_bios_efi_both_recorded() {
        assert_eq!(firmware("bios").unwrap(), vec![Firmware::Bios]);
        assert_eq!(firmware("efi").unwrap(), vec![Firmware::Efi]);
        assert_eq!(firmware("both").unwrap(), vec![Firmware::Bios, Firmware::Efi]);
    }

    #[test]
    fn firmware_unknown_refused_naming_choices() {
        let err = firmware("coreboot").unwrap_err().to_string();

        assert!(err.contains("use bios, efi or both"), "{err}");
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
