//! `nubo image build`: a VMfile run in a VM booted by nubo's own engine (qemu backend), sealed,
//! flattened and stored, with a step cache (see [`crate::cache`]).
//!
//! 1. Parse and resolve the VMfile; hash every file the steps read; resolve FROM through the
//!    engine's plan (catalog, local, OCI or URL, pulled as `vm create --image` would).
//! 2. Key each step. The longest cached prefix is reused; when every step and the sealed image
//!    are cached, the image is tagged and nothing boots.
//! 3. Otherwise one VM boots over FROM (or over the last cached layer, flattened into a
//!    temporary base), with restricted networking unless `--network`, a one-time key and the
//!    disk grown to SIZE. Each uncached step runs over SSH; after it, `sync` in the guest and
//!    a QMP `blockdev-snapshot-sync` freeze the step's writes in their own qcow2 file.
//! 4. Seal, power off, flatten the top of the chain into a standalone qcow2, store it with
//!    provenance, and turn the frozen files into cache layers (each rebased onto FROM).
//!
//! Any failure removes the VM and the work files (unless `--keep-failed`) and stores nothing.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::{Duration, Instant};

use nubo_core::{ByteSize, VmName};
use nubo_engine::{Engine, Event, WaitFor};
use nubo_image::{
    BuildProvenance, BuildStep, ImageRecord, ImageRef, ImageSource, ImageStore, Overwrite, SourceKind, TagChange,
};
use nubo_spec::{DiskSource, KernelBoot, Network, VmSpec};
use serde::Serialize;

use crate::cache::{self, Cache};
use crate::context::{self, ContextFile};
use crate::error::{io, BuildError};
use crate::guest::{self, Guest};
use crate::{Action, FromSource, Resolved, Step, CLOUD_CFG};

/// A VMfile is small; more than this is not one.
const MAX_VMFILE: u64 = crate::parse::MAX_VMFILE as u64;
/// How long the build VM's graceful power-off may take before it is killed (after `sync`).
const POWER_OFF: Duration = Duration::from_secs(120);

pub struct BuildRequest {
    pub vmfile: PathBuf,
    pub context: PathBuf,
    pub tag: Option<ImageRef>,
    pub build_args: Vec<(String, String)>,
    pub no_cache: bool,
    pub network: bool,
    pub keep_failed: bool,
    pub compress: bool,
    /// How long the build VM may take to finish cloud-init.
    pub boot_timeout: Duration,
    /// For `FROM oci://`: the store image the caller made of the container image (through
    /// `image from-container`'s path), which the build starts from.
    pub from_container: Option<ImageRef>,
}

#[derive(Debug, Serialize)]
pub struct Built {
    pub image: ImageRecord,
    /// What the build did to the tag: a tag that named another image is moved to this one
    /// (as `docker build -t` does), and the CLI says so.
    pub tag_change: TagChange,
    pub steps: Vec<StepReport>,
    /// Whether a VM booted (false: everything came from the cache).
    pub booted: bool,
    pub seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct StepReport {
    pub line: usize,
    pub instruction: String,
    pub cached: bool,
}

struct Planned<'a> {
    step: &'a Step,
    files: Vec<ContextFile>,
    key: String,
}

/// Runs the build. Progress goes to `events`, and the guest's output of each step as
/// [`Event::Output`] lines.
pub fn build(engine: &Engine, req: &BuildRequest, events: &mut dyn FnMut(Event)) -> Result<Built, BuildError> {
    let t0 = Instant::now();
    // `-f -`, a pipe or a FIFO as docker build takes them: bounded, never waiting forever.
    let bytes = nubo_core::input::read_small_input(&req.vmfile, "VMfile", MAX_VMFILE)
        .map_err(|e| BuildError::Refused(e.to_string()))?;
    let parsed = crate::parse_bytes(&bytes).map_err(|error| BuildError::Parse {
        file: req.vmfile.clone(),
        error,
    })?;
    let r = crate::resolve(&parsed, &req.build_args).map_err(|error| BuildError::Parse {
        file: req.vmfile.clone(),
        error,
    })?;
    let vmfile_digest = format!(
        "sha256:{}",
        nubo_image::digest::sha256_bytes(&bytes).trim_start_matches("sha256:")
    );
    if let Some(h) = &r.hypervisor {
        engine
            .registry
            .resolve(h)
            .map_err(|e| BuildError::Refused(format!("{}: HYPERVISOR {h}: {e}", req.vmfile.display())))?;
    }
    let root = context::open(&req.context)?;
    let store = ImageStore::open(&engine.roots.images()).map_err(BuildError::Store)?;
    let cache = Cache::open(store.dir())?;
    sweep(engine, &cache, events);

    // FROM, resolved and pulled exactly as `vm create --image` would.
    let from = resolve_from(engine, &r, req, events)?;
    let from_blob = from.path.clone();

    let mut planned = Vec::new();
    let mut parent = cache::root_key(&from.digest, r.size.map(ByteSize::bytes));
    for step in &r.steps {
        let files = match &step.action {
            Action::Run(_) => vec![],
            Action::Copy { sources, dest } => context::copy_files(&root, sources, dest)?,
            Action::CloudInit(p) => context::copy_files(&root, std::slice::from_ref(p), CLOUD_CFG)?,
        };
        let key = cache::step_key(&parent, &step.text, &step.env, &files);
        parent = key.clone();
        planned.push(Planned { step, files, key });
    }
    let final_key = cache::final_key(&parent, req.compress, r.appliance);
    let tag = match &req.tag {
        Some(t) => t.clone(),
        None => ImageRef::parse(&format!("vmfile:{}", &vmfile_digest["sha256:".len()..][..12]))
            .map_err(|e| BuildError::Refused(e.to_string()))?,
    };
    let provenance = BuildProvenance {
        vmfile_digest: vmfile_digest.clone(),
        from: match &r.from {
            FromSource::Image { reference } => reference.clone(),
            FromSource::Url { url, .. } => url.clone(),
            // The digest the reference resolved to, as the from-container record pins it.
            FromSource::Container { reference } => {
                format!("oci://{}", from.source.url.clone().unwrap_or_else(|| reference.clone()))
            }
        },
        from_digest: from.digest.clone(),
        args: r.args.clone(),
        steps: planned
            .iter()
            .map(|p| BuildStep {
                line: p.step.line,
                instruction: p.step.text.clone(),
                key: format!("sha256:{}", p.key),
            })
            .collect(),
    };

    // One build of a final key at a time: a second waits, then finds the first's layers.
    let _building = cache.lock_build(&final_key, || {
        events(Event::Step(format!(
            "waiting for another build of {} (the same steps, key sha256:{})",
            req.vmfile.display(),
            &final_key[..12]
        )))
    })?;

    // The longest cached prefix.
    let mut hit = 0;
    let mut hit_layer: Option<PathBuf> = None;
    if !req.no_cache {
        for (i, p) in planned.iter().enumerate().rev() {
            if let Some(l) = cache.verified_layer(&p.key, &from_blob) {
                hit = i + 1;
                hit_layer = Some(l);
                break;
            }
        }
        if let Some(digest) = cache.image(&final_key).filter(|_| hit == planned.len()) {
            if let Ok(blob) = store.blob_path(&digest, "qcow2") {
                if blob.is_file() {
                    events(Event::Step(format!(
                        "every step is cached: tagging {tag} (no VM booted)"
                    )));
                    let info = nubo_disk::inspect_base(&blob)?;
                    let rec = record(&from, &r, &tag, &digest, &blob, &info, provenance, t0)?;
                    let (work, _lock) = cache.work_dir(&uuid::Uuid::new_v4().simple().to_string()[..12])?;
                    let rec = with_boot_files(&store, rec, &from, &work);
                    let _ = fs::remove_dir_all(&work);
                    let added = store.tag(rec?, Overwrite::Replace)?;
                    return Ok(Built {
                        image: added.record,
                        tag_change: added.change,
                        steps: report(&planned, planned.len()),
                        booted: false,
                        seconds: t0.elapsed().as_secs_f64(),
                    });
                }
            }
        }
    }
    for p in &planned[..hit] {
        events(Event::Step(format!("line {}: {} (cached)", p.step.line, p.step.text)));
    }

    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let (work, lock) = cache.work_dir(&id)?;
    let vm = format!("nubo-build-{id}");
    let mut run = Run {
        engine,
        vm: vm.clone(),
        work: work.clone(),
        out: store.tmp_dir().join(format!("build-{id}.qcow2")),
        created: false,
        keep: req.keep_failed,
    };
    let result = (|| -> Result<Built, BuildError> {
        let base = match &hit_layer {
            None => from_blob.clone(),
            Some(layer) => {
                events(Event::Step(format!(
                    "flattening the cached layer of line {} into the build VM's base",
                    planned[hit - 1].step.line
                )));
                let flat = work.join("base.qcow2");
                qemu_img(
                    "flattening a cached layer",
                    &["convert", "-f", "qcow2", "-O", "qcow2"],
                    &[layer, &flat],
                )?;
                flat
            }
        };
        let (key, public) = guest::build_key(&work, &id)?;
        let spec = build_vm_spec(engine.layer_backend()?, &vm, &base, &from, &r, req, &public)?;
        events(Event::Step(format!(
            "booting build vm `{vm}` ({})",
            if req.network {
                "network on"
            } else {
                "network restricted to the SSH forward"
            }
        )));
        run.created = true;
        let created = engine.create(&spec, events)?;
        engine.wait(&vm, WaitFor::CloudInit, req.boot_timeout, created.started, events)?;
        let rec = engine.load(&vm)?;
        let addr = engine
            .reach(&rec)?
            .ssh
            .ok_or_else(|| BuildError::Refused(format!("build vm `{vm}` has no SSH endpoint")))?;
        let user = rec.ssh.user.clone();
        let ssh = nubo_engine::ssh::argv(&key, &work.join("known_hosts"), &rec.uuid, &user, addr, &[])?;
        let g = Guest { ssh };

        let total = planned.len();
        let mut frozen: Vec<PathBuf> = vec![rec.machine.disk.overlay.clone()];
        for (i, p) in planned.iter().enumerate().skip(hit) {
            let t = Instant::now();
            events(Event::Step(format!(
                "step {}/{total}, line {}: {}",
                i + 1,
                p.step.line,
                p.step.text
            )));
            let fail = |detail: String| BuildError::Step {
                index: i + 1,
                total,
                line: p.step.line,
                instruction: p.step.text.clone(),
                detail,
            };
            match &p.step.action {
                Action::Run(c) => g.run(&p.step.env, &guest::script(c), events).map_err(fail)?,
                Action::Copy { .. } | Action::CloudInit(_) => {
                    for f in &p.files {
                        g.put(f, events).map_err(|e| fail(format!("{e}")))?;
                    }
                }
            }
            g.run(&BTreeMap::new(), "sync", events)
                .map_err(|e| fail(format!("sync after the step: {e}")))?;
            let next = work.join(format!("layer-{}.qcow2", i + 1));
            engine
                .freeze_disk_layer(&rec, frozen.len() - 1, &next)
                .map_err(|e| fail(format!("freezing the step's layer: {e}")))?;
            frozen.push(next);
            events(Event::Step(format!(
                "step {}/{total} done in {:.1}s",
                i + 1,
                t.elapsed().as_secs_f64()
            )));
        }

        events(Event::Step(
            "sealing: cloud-init state, machine-id, host keys, the build key, logs, apt lists, free space".into(),
        ));
        let (_, nubo_key) = nubo_engine::ssh::ensure_key(&engine.roots.ssh_dir())?;
        g.run(&BTreeMap::new(), &crate::seal::script(&[&public, &nubo_key]), events)
            .map_err(|d| BuildError::Tool {
                what: "sealing the image".into(),
                detail: d,
            })?;
        engine.stop(&vm, false, POWER_OFF, events)?;

        // The top of the chain holds the seal's writes; flatten it into the image.
        let top = frozen.last().expect("the VM's overlay is always there").clone();
        let out = run.out.clone();
        events(Event::Step(format!(
            "flattening into a standalone qcow2{}",
            if req.compress { " (compressed)" } else { "" }
        )));
        let mut args = vec!["convert", "-f", "qcow2", "-O", "qcow2"];
        if req.compress {
            args.push("-c");
        }
        let flat = (|| {
            qemu_img("flattening the built image", &args, &[&top, &out])?;
            let info = nubo_disk::inspect_base(&out)?;
            let digest = nubo_image::digest::hash_file(&out, nubo_image::Algorithm::Sha256)
                .map_err(io(format!("hashing {}", out.display())))?
                .to_string();
            Ok::<_, BuildError>((info, digest))
        })();
        let (info, digest) = flat.inspect_err(|_| {
            let _ = fs::remove_file(&out);
        })?;

        // The frozen files become cache layers: each rebased (safely: data it shared with the
        // chain below is copied in) onto FROM's blob, newest first, so every chain below a
        // file is still whole when that file is rebased.
        let new_layers: Vec<(usize, PathBuf)> = frozen[..frozen.len() - 1]
            .iter()
            .enumerate()
            .map(|(j, f)| (hit + j, f.clone()))
            .collect();
        let mut made = Vec::new();
        for (i, f) in new_layers.iter().rev() {
            let dst = work.join(format!("cache-{i}.qcow2"));
            if f.starts_with(engine.roots.vm_dir(&vm)) {
                fs::hard_link(f, &dst).map_err(io(format!("keeping {}", f.display())))?;
            } else {
                fs::rename(f, &dst).map_err(io(format!("keeping {}", f.display())))?;
            }
            if !(*i == 0 && hit == 0) {
                qemu_img(
                    "rebasing a cache layer onto FROM",
                    &[
                        "rebase",
                        "-f",
                        "qcow2",
                        "-F",
                        "qcow2",
                        "-b",
                        &from_blob.display().to_string(),
                    ],
                    &[&dst],
                )?;
            }
            made.push((*i, dst));
        }
        let rec = record(&from, &r, &tag, &digest, &out, &info, provenance.clone(), t0)?;
        let rec = with_boot_files(&store, rec, &from, &work)?;
        let added = store.commit(&out, rec, Overwrite::Replace)?;
        for (i, f) in made {
            cache.put_layer(&planned[i].key, &f)?;
        }
        cache.set_image(&final_key, &added.record.digest)?;
        Ok(Built {
            image: added.record,
            tag_change: added.change,
            steps: report(&planned, hit),
            booted: true,
            seconds: t0.elapsed().as_secs_f64(),
        })
    })();
    match result {
        Ok(b) => {
            run.finish(events);
            drop(lock);
            Ok(b)
        }
        Err(e) => {
            run.fail(events);
            drop(lock);
            Err(e)
        }
    }
}

/// The build VM and its work directory, removed whatever happens (or kept on request).
struct Run<'a> {
    engine: &'a Engine,
    vm: String,
    work: PathBuf,
    /// The flattened image before it is committed to the store.
    out: PathBuf,
    created: bool,
    keep: bool,
}

impl Run<'_> {
    fn finish(&self, events: &mut dyn FnMut(Event)) {
        if self.created {
            let _ = self.engine.remove(&self.vm, true, &mut |_| {});
        }
        let _ = fs::remove_dir_all(&self.work);
        let _ = events;
    }

    fn fail(&self, events: &mut dyn FnMut(Event)) {
        let _ = fs::remove_file(&self.out);
        if self.keep && self.created {
            let _ = fs::write(self.work.join("kept"), b"");
            events(Event::Note(format!(
                "--keep-failed: build vm `{vm}` is kept as it failed: look inside with `nubo vm ssh {vm}` (as nubo's user; root through sudo) or `nubo vm logs {vm}`; remove it with `nubo vm rm --force {vm}`, then `nubo image prune` reclaims its work files",
                vm = self.vm
            )));
            return;
        }
        if self.created {
            events(Event::Step(format!("removing build vm `{}`", self.vm)));
            let _ = self.engine.remove(&self.vm, true, &mut |_| {});
        }
        let _ = fs::remove_dir_all(&self.work);
    }
}

/// What killed or interrupted builds left (their build VMs and work files), removed: for
/// `nubo image prune`. Running builds and `--keep-failed` ones are left alone.
pub fn sweep_interrupted(engine: &Engine, events: &mut dyn FnMut(Event)) -> Result<(), BuildError> {
    let dir = engine.roots.images().join("build-cache");
    if dir.exists() {
        sweep(engine, &Cache { dir }, events);
    }
    Ok(())
}

/// Build VMs and work files that a killed or interrupted build left: removed, so a re-run
/// converges. A live build holds its work directory's lock and is left alone.
fn sweep(engine: &Engine, cache: &Cache, events: &mut dyn FnMut(Event)) {
    for (id, dir, _lock) in cache.stale() {
        let vm = format!("nubo-build-{id}");
        if engine.roots.vm_dir(&vm).exists() {
            events(Event::Step(format!(
                "removing build vm `{vm}` left by an interrupted build"
            )));
            let _ = engine.remove(&vm, true, &mut |_| {});
        }
        let _ = fs::remove_dir_all(&dir);
    }
}

/// FROM as `vm create` would resolve it: planned through the engine, which pulls what is not local.
fn resolve_from(
    engine: &Engine,
    r: &Resolved,
    req: &BuildRequest,
    events: &mut dyn FnMut(Event),
) -> Result<ImageRecord, BuildError> {
    let source = match &r.from {
        FromSource::Container { reference } => DiskSource::Image {
            reference: req
                .from_container
                .as_ref()
                .ok_or_else(|| {
                    BuildError::Refused(format!(
                        "FROM oci://{reference}: the container image was not made into a disk first (`nubo image build` does it; a library caller runs `image from-container` and sets from_container)"
                    ))
                })?
                .to_string(),
        },
        FromSource::Image { reference } => DiskSource::Image {
            reference: reference.clone(),
        },
        FromSource::Url { url, checksum } => DiskSource::Url {
            url: url.clone(),
            checksum: Some(checksum.clone()),
            insecure_no_checksum: false,
            allow_http: url.starts_with("http://"),
        },
    };
    let name = VmName::parse("nubo-build-plan").map_err(|e| BuildError::Refused(e.to_string()))?;
    let mut spec = VmSpec::new(name, source);
    spec.backend = Some(engine.layer_backend()?.into());
    let (_, facts) = engine.plan(&spec, events)?;
    let from = facts
        .image
        .ok_or_else(|| BuildError::Refused("FROM did not resolve to an image in the store".into()))?;
    if !from.cloud_init {
        return Err(BuildError::Refused(format!(
            "FROM {}: an appliance has no cloud-init, so the build VM could not get its key: build FROM a cloud image, and mark the result with APPLIANCE instead",
            from.reference
        )));
    }
    if from.format != "qcow2" {
        return Err(BuildError::Refused(format!(
            "FROM {}: the image is {}; builds start from qcow2 images: `nubo image convert` it first",
            from.reference, from.format
        )));
    }
    Ok(from)
}

fn build_vm_spec(
    backend: &str,
    vm: &str,
    base: &Path,
    from: &ImageRecord,
    r: &Resolved,
    req: &BuildRequest,
    public: &str,
) -> Result<VmSpec, BuildError> {
    let name = VmName::parse(vm).map_err(|e| BuildError::Refused(e.to_string()))?;
    let mut spec = VmSpec::new(
        name,
        DiskSource::Disk {
            path: base.to_path_buf(),
        },
    );
    spec.backend = Some(backend.into());
    spec.resources.disk_size = r.size;
    spec.resources.vcpus = Some(from.default_vcpus);
    spec.resources.memory = Some(ByteSize(from.default_memory_mib << 20));
    spec.network = if req.network {
        Network::Forward
    } else {
        Network::Restricted
    };
    spec.cloud_init.ssh_keys = vec![public.to_owned()];
    spec.ssh_user = from.default_user.clone();
    spec.boot_timeout = Some(req.boot_timeout);
    if let Some(b) = &from.boot {
        spec.boot = Some(KernelBoot {
            kernel: b.kernel.clone(),
            initrd: b.initrd.clone(),
            cmdline: Some(b.cmdline.clone()),
        });
    } else if from.firmware == [nubo_image::Firmware::Efi] {
        spec.firmware = nubo_spec::Firmware::Efi;
    }
    Ok(spec)
}

fn qemu_img(what: &str, args: &[&str], files: &[&Path]) -> Result<(), BuildError> {
    let out = Process::new("qemu-img")
        .args(args)
        .args(files)
        .output()
        .map_err(|e| BuildError::Tool {
            what: what.into(),
            detail: format!("qemu-img: {e}: install the qemu-utils package"),
        })?;
    if !out.status.success() {
        return Err(BuildError::Tool {
            what: what.into(),
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn record(
    from: &ImageRecord,
    r: &Resolved,
    tag: &ImageRef,
    digest: &str,
    file: &Path,
    info: &nubo_disk::DiskInfo,
    build: BuildProvenance,
    t0: Instant,
) -> Result<ImageRecord, BuildError> {
    let size = fs::metadata(file)
        .map_err(io(format!("reading {}", file.display())))?
        .len();
    Ok(image_record(
        from,
        r,
        tag,
        digest,
        size,
        info.virtual_size,
        build,
        t0.elapsed().as_secs_f64(),
    ))
}

/// The built image's record: FROM's facts, the VMfile's settings (HYPERVISOR, DEFAULTS,
/// APPLIANCE, LABEL) and the provenance. Pure.
#[allow(clippy::too_many_arguments)]
pub fn image_record(
    from: &ImageRecord,
    r: &Resolved,
    tag: &ImageRef,
    digest: &str,
    size: u64,
    virtual_size: u64,
    build: BuildProvenance,
    seconds: f64,
) -> ImageRecord {
    ImageRecord {
        reference: tag.to_string(),
        digest: digest.to_owned(),
        path: PathBuf::new(),
        format: "qcow2".into(),
        size,
        virtual_size,
        cloud_init: !r.appliance,
        os: from.os.clone(),
        release: from.release.clone(),
        arch: from.arch.clone(),
        firmware: from.firmware.clone(),
        boot: None,
        default_vcpus: r.vcpus.unwrap_or(from.default_vcpus),
        default_memory_mib: r.memory.map(ByteSize::mib).unwrap_or(from.default_memory_mib),
        default_user: from.default_user.clone(),
        hypervisor: r.hypervisor.clone(),
        source: ImageSource::new(SourceKind::Build),
        verified: from.verified,
        created: nubo_image::pull::now(),
        build_seconds: Some(seconds),
        labels: r.labels.clone(),
        build: Some(build),
    }
}

/// The built image boots like FROM: its kernel and initrd, copied next to the new blob.
fn with_boot_files(
    store: &ImageStore,
    mut rec: ImageRecord,
    from: &ImageRecord,
    work: &Path,
) -> Result<ImageRecord, BuildError> {
    let Some(b) = &from.boot else { return Ok(rec) };
    let k = work.join("vmlinuz");
    fs::copy(&b.kernel, &k).map_err(io(format!("copying {}", b.kernel.display())))?;
    let i = match &b.initrd {
        Some(src) => {
            let i = work.join("initrd.img");
            fs::copy(src, &i).map_err(io(format!("copying {}", src.display())))?;
            Some(i)
        }
        None => None,
    };
    let (kernel, initrd) = store.add_boot_files(&rec.digest, &k, i.as_deref())?;
    rec.boot = Some(nubo_image::BootFiles {
        kernel,
        initrd,
        cmdline: b.cmdline.clone(),
    });
    Ok(rec)
}

fn report(planned: &[Planned], hit: usize) -> Vec<StepReport> {
    planned
        .iter()
        .enumerate()
        .map(|(i, p)| StepReport {
            line: p.step.line,
            instruction: p.step.text.clone(),
            cached: i < hit,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from() -> ImageRecord {
        serde_json::from_value(serde_json::json!({
            "reference": "debian:12", "digest": "sha256:00", "path": "/s/b.qcow2", "format": "qcow2",
            "size": 1, "virtual_size": 2, "cloud_init": true, "arch": "x86_64", "firmware": ["bios"],
            "default_vcpus": 2, "default_memory_mib": 1024, "default_user": "debian",
            "source": {"kind": "bootstrap"}, "verified": true, "created": "2026-01-01T00:00:00Z"
        }))
        .unwrap()
    }

    fn provenance() -> BuildProvenance {
        BuildProvenance {
            vmfile_digest: "sha256:aa".into(),
            from: "debian:12".into(),
            from_digest: "sha256:00".into(),
            args: BTreeMap::new(),
            steps: vec![],
        }
    }

    fn built(vmfile: &str) -> ImageRecord {
        let r = crate::resolve(&crate::parse(vmfile).unwrap(), &[]).unwrap();
        image_record(
            &from(),
            &r,
            &ImageRef::parse("web:1").unwrap(),
            "sha256:bb",
            10,
            20,
            provenance(),
            1.0,
        )
    }

    #[test]
    fn image_record_takes_the_vmfile_settings() {
        let rec =
            built("FROM debian:12\nHYPERVISOR cloud-hypervisor\nDEFAULTS vcpus=4 memory=3G\nLABEL a=b\nAPPLIANCE\n");

        assert_eq!(rec.hypervisor.as_deref(), Some("cloud-hypervisor"));
        assert_eq!((rec.default_vcpus, rec.default_memory_mib), (4, 3072));
        assert!(!rec.cloud_init);
        assert_eq!(rec.labels.get("a").map(String::as_str), Some("b"));
        assert_eq!(rec.source.kind, SourceKind::Build);
        assert_eq!(rec.build, Some(provenance()));
    }

    #[test]
    fn image_record_without_settings_keeps_from_defaults() {
        let rec = built("FROM debian:12\n");

        assert_eq!(rec.hypervisor, None);
        assert_eq!((rec.default_vcpus, rec.default_memory_mib), (2, 1024));
        assert!(rec.cloud_init);
        assert_eq!(rec.default_user.as_deref(), Some("debian"));
        assert_eq!(rec.reference, "web:1");
    }
}
