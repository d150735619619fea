//! `pull` from a registry into the store: resolve the manifest (checked against the digest when
//! pulled by digest), refuse anything but a nubo VM image by what it is, download each blob
//! the store lacks with its digest and size verified while streaming, run the strict disk
//! inspector on the disk, and only then move the files into the store under the disk's sha256.

use std::fs;
use std::path::{Path, PathBuf};

use super::client::{Client, ClientSettings};
use super::compress::{decompress, max_apparent, DecompressError};
use super::error::OciError;
use super::manifest::{classify, Descriptor, VmArtifact};
use crate::digest::StreamHasher;
use crate::download::DownloadEvent;
use crate::error::PullError;
use crate::lock::TargetLock;
use crate::pull::{now, PullEvent, DEFAULT_MEMORY_MIB, DEFAULT_VCPUS};
use crate::record::{ImageRecord, ImageSource, SourceKind};
use crate::reference::{ImageRef, OciRef};
use crate::store::{digest_hex, Added, ImageStore, Overwrite};

#[derive(Debug, Clone)]
pub struct OciPullRequest {
    pub reference: OciRef,
    /// Store under this name instead of [`local_name`]'s.
    pub name: Option<ImageRef>,
    /// Re-point the local tag when it names another image.
    pub force: bool,
    pub client: ClientSettings,
}

/// The registry and the repository/tag-or-digest path of `r`, or why it has none.
pub fn split(r: &OciRef) -> Result<(&str, &str, String), OciError> {
    let registry = r
        .registry
        .as_deref()
        .ok_or_else(|| OciError::NoRegistry(r.to_string()))?;
    let at = match (&r.digest, &r.tag) {
        (Some(d), _) => d.clone(),
        (None, Some(t)) => t.clone(),
        (None, None) => "latest".to_owned(),
    };
    Ok((registry, &r.repository, at))
}

/// The local `name:tag` an OCI reference is stored under unless `--name` says otherwise: the
/// whole `registry/repository` flattened (`:` -> `-`, `/` -> `_`), so it never collides with a
/// catalog name such as `debian:12`, and the tag (lowercased), or `sha256-<16 hex>` for a pull
/// by digest alone.
pub fn local_name(r: &OciRef) -> Result<ImageRef, OciError> {
    let registry = r
        .registry
        .as_deref()
        .ok_or_else(|| OciError::NoRegistry(r.to_string()))?;
    let name = format!(
        "{}_{}",
        registry.to_ascii_lowercase().replace(':', "-"),
        r.repository.replace('/', "_")
    );
    let tag = match (&r.tag, &r.digest) {
        (Some(t), _) => t.to_ascii_lowercase(),
        (None, Some(d)) => d.replace(':', "-").chars().take("sha256-".len() + 16).collect(),
        (None, None) => "latest".to_owned(),
    };
    ImageRef::parse(&format!("{name}:{tag}")).map_err(|_| OciError::NoLocalName(r.to_string()))
}

/// The image a reference was pulled as, if the store has it: same local name, pulled from the
/// same reference (and, for a digest, the same manifest). `vm create` uses it without asking
/// the registry, as it does a catalog image already pulled.
pub fn stored(store: &ImageStore, r: &OciRef) -> Result<Option<ImageRecord>, OciError> {
    let Some(rec) = store.get(&local_name(r)?)? else {
        return Ok(None);
    };
    let same_source = rec.source.kind == SourceKind::Oci && rec.source.url.as_deref() == Some(&r.to_string());
    let same_digest = r.digest.is_none() || rec.source.manifest == r.digest;
    Ok((same_source && same_digest && rec.path.is_file()).then_some(rec))
}

pub fn pull(store: &ImageStore, req: &OciPullRequest, progress: &mut dyn FnMut(PullEvent)) -> Result<Added, OciError> {
    let r = &req.reference;
    let shown = r.to_string();
    let (registry, repository, at) = split(r)?;
    let client = Client::new(registry, &req.client)?;
    let bytes = client
        .manifest(repository, &at, &shown)?
        .ok_or_else(|| OciError::NotFound {
            reference: shown.clone(),
            registry: registry.to_owned(),
            repository: repository.to_owned(),
            what: match &r.digest {
                Some(d) => format!("manifest {d}"),
                None => format!("tag `{at}`"),
            },
        })?;
    let mut h = StreamHasher::new(None);
    h.update(&bytes);
    let manifest_digest = h.finish().sha256.to_string();
    if let Some(want) = &r.digest {
        if *want != manifest_digest {
            return Err(OciError::ManifestMismatch {
                reference: shown,
                actual: manifest_digest,
            });
        }
    }
    progress(PullEvent::Note(format!(
        "{shown} is {registry}/{repository}@{manifest_digest}"
    )));
    let art = classify(&bytes).map_err(|error| OciError::Manifest {
        reference: shown.clone(),
        error,
    })?;
    let local = match &req.name {
        Some(n) => n.clone(),
        None => local_name(r)?,
    };
    let overwrite = Overwrite::from_force(req.force);
    // Refuse a tag move before downloading anything.
    store.check_tag(&local, &art.disk.digest, overwrite)?;

    let tmp = store.tmp_dir();
    let hex = digest_hex(&art.disk.digest)?;
    let key = format!("oci-{}", &hex[..24]);
    let lock_path = tmp.join(format!("{key}.lock"));
    let _lock = TargetLock::acquire(&lock_path, &mut || {
        progress(PullEvent::Waiting {
            lock: lock_path.clone(),
        })
    })
    .map_err(|source| {
        OciError::Setup(Box::new(PullError::Lock {
            path: lock_path.clone(),
            source,
        }))
    })?;

    let blob = store.blob_path(&art.disk.digest, &art.format)?;
    let boot_dir = store.dir().join("boot").join(hex);
    let mut parts: Vec<PathBuf> = Vec::new();
    // The kernel and initrd (when the store lacks them) download on a second thread while the
    // disk does: small blobs, each a round trip and an fsync that need not wait for the disk.
    let boot_missing = art.blobs.kernel.is_some() && !boot_dir.join("vmlinuz").is_file();
    let boot_parts = boot_missing.then(|| {
        let k = tmp.join(format!("{key}.kernel.part"));
        let i = art
            .blobs
            .initrd
            .as_ref()
            .map(|_| tmp.join(format!("{key}.initrd.part")));
        parts.push(k.clone());
        parts.extend(i.clone());
        (k, i)
    });
    parts.push(tmp.join(format!("{key}.part")));
    if art.disk.compressed_to.is_some() {
        parts.push(tmp.join(format!("{key}.zst.part")));
    }
    let result = (|| {
        let (disk_part, boot_fetched) = std::thread::scope(|s| {
            let boot = boot_parts.as_ref().map(|(kpart, ipart)| {
                let (client, shown) = (&client, &shown);
                let (kernel, initrd) = (art.blobs.kernel.as_ref(), art.blobs.initrd.as_ref());
                s.spawn(move || -> Result<Vec<PullEvent>, OciError> {
                    // This thread's notes are shown once the disk is done; its byte counts
                    // are left out (the disk's progress is the one on screen).
                    let mut notes = Vec::new();
                    let mut keep = |e: PullEvent| {
                        if matches!(e, PullEvent::Note(_)) {
                            notes.push(e);
                        }
                    };
                    let kernel = kernel.expect("boot parts exist only with a kernel blob");
                    get_blob(client, repository, kernel, "kernel", kpart, shown, &mut keep)?;
                    if let (Some(i), Some(p)) = (initrd, ipart) {
                        get_blob(client, repository, i, "initrd", p, shown, &mut keep)?;
                    }
                    Ok(notes)
                })
            });
            let disk = (|| -> Result<Option<PathBuf>, OciError> {
                Ok(if blob.is_file() {
                    // The stored disk has the digest, so its size is known: a manifest that
                    // claims another is lying, and its number would go into the record.
                    let have = fs::metadata(&blob)
                        .map_err(|source| OciError::Io {
                            path: blob.clone(),
                            source,
                        })?
                        .len();
                    if have != art.disk_size() {
                        return Err(OciError::Inconsistent {
                            reference: shown.clone(),
                            annotated: format!("{} bytes", art.disk_size()),
                            actual: format!("{have} bytes (the disk with its digest, already stored)"),
                        });
                    }
                    progress(PullEvent::AlreadyPresent {
                        digest: art.disk.digest.clone(),
                    });
                    None
                } else if let Some(limit) = art.disk.compressed_to {
                    // The layer (resumable, verified as sent), then the disk decompressed from it.
                    let zpart = tmp.join(format!("{key}.zst.part"));
                    check_room(&tmp, &art, &zpart, &shown)?;
                    get_blob(&client, repository, &art.blobs.disk, "disk", &zpart, &shown, progress)?;
                    let part = tmp.join(format!("{key}.part"));
                    unpack(&zpart, &part, limit, &art.disk.digest, &shown, progress)?;
                    let _ = fs::remove_file(&zpart);
                    Some(part)
                } else {
                    let part = tmp.join(format!("{key}.part"));
                    check_room(&tmp, &art, &part, &shown)?;
                    get_blob(&client, repository, &art.blobs.disk, "disk", &part, &shown, progress)?;
                    Some(part)
                })
            })();
            let boot = boot.map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            (disk, boot)
        });
        if let Some(Ok(notes)) = &boot_fetched {
            for n in notes {
                progress(n.clone());
            }
        }
        let disk_part = disk_part?;
        if let Some(fetched) = boot_fetched {
            fetched?;
        }
        let disk_path = disk_part.as_deref().unwrap_or(&blob);
        let virtual_size = check_disk(disk_path, &art, &shown)?;
        progress(PullEvent::Verified {
            checksum: art.disk.digest.clone(),
        });

        let boot = match &boot_parts {
            Some((k, i)) => {
                let (k, i) = store.add_boot_files(&art.disk.digest, k, i.as_deref())?;
                art.meta.boot(k, i)
            }
            None if art.blobs.kernel.is_some() => art.meta.boot(
                boot_dir.join("vmlinuz"),
                art.blobs.initrd.as_ref().map(|_| boot_dir.join("initrd.img")),
            ),
            None => None,
        };
        let record = record(&art, &local, r, &manifest_digest, virtual_size, boot);
        Ok(match disk_part {
            Some(part) => store.commit(&part, record, overwrite)?,
            None => store.tag(record, overwrite)?,
        })
    })();
    // An interrupted transfer keeps its partial for the next pull to resume with Range;
    // every other failure leaves nothing behind.
    let resumable = matches!(
        &result,
        Err(OciError::Transfer {
            source,
            ..
        }) if matches!(**source, PullError::Interrupted { kept, .. } if kept > 0)
    );
    if result.is_err() && !resumable {
        for p in &parts {
            let _ = fs::remove_file(p);
        }
    }
    result
}

/// Downloads one blob into `part` and checks its size and digest against the descriptor; on
/// any mismatch the partial is deleted.
pub(crate) fn get_blob(
    client: &Client,
    repository: &str,
    d: &Descriptor,
    what: &'static str,
    part: &Path,
    reference: &str,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<(), OciError> {
    progress(PullEvent::Note(format!("{what} {} ({} bytes)", d.digest, d.size)));
    let fetched = client.fetch_blob(repository, &d.digest, d.size, part, &mut |e: DownloadEvent| {
        progress(e.into())
    });
    let fail = |e: OciError| {
        let _ = fs::remove_file(part);
        e
    };
    let (digests, size) = match fetched {
        Ok(x) => x,
        Err(PullError::SizeMismatch { got, .. }) => {
            return Err(fail(OciError::BlobSize {
                reference: reference.to_owned(),
                what,
                digest: d.digest.clone(),
                expected: d.size,
                got,
            }))
        }
        Err(source) => {
            return Err(OciError::Transfer {
                reference: reference.to_owned(),
                what,
                source: Box::new(source),
            })
        }
    };
    if size != d.size {
        return Err(fail(OciError::BlobSize {
            reference: reference.to_owned(),
            what,
            digest: d.digest.clone(),
            expected: d.size,
            got: size,
        }));
    }
    let actual = digests.sha256.to_string();
    if actual != d.digest {
        return Err(fail(OciError::BlobMismatch {
            reference: reference.to_owned(),
            what,
            digest: d.digest.clone(),
            actual,
        }));
    }
    Ok(())
}

/// Refuses, before a byte of the disk is downloaded, a disk that cannot fit: what is left of
/// the layer plus, for a compressed one, the disk it decompresses to (its annotated
/// `io.nubo.image.disk.size`), against the free space of the store's filesystem; and a
/// compressed layer annotated larger than [`max_apparent`] of its size.
fn check_room(tmp: &Path, art: &VmArtifact, part: &Path, reference: &str) -> Result<(), OciError> {
    let layer = art.blobs.disk.size;
    if let Some(size) = art.disk.compressed_to.filter(|s| *s > max_apparent(layer)) {
        return Err(OciError::Decompress {
            reference: reference.to_owned(),
            why: format!(
                "annotation io.nubo.image.disk.size says {size} bytes from a {layer}-byte layer, more than the {} (1 GiB + 1024x) a real disk compresses from (a decompression bomb; push a disk that empty as qcow2, which stores no zeros)",
                max_apparent(layer)
            ),
        });
    }
    let have = fs::metadata(part).map(|m| m.len()).unwrap_or(0);
    let need = layer
        .saturating_sub(have)
        .saturating_add(art.disk.compressed_to.unwrap_or(0));
    let st = nix::sys::statvfs::statvfs(tmp).map_err(|e| OciError::Io {
        path: tmp.to_path_buf(),
        source: e.into(),
    })?;
    #[allow(clippy::unnecessary_cast)] // the field types differ between libcs
    let free = (st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64);
    if need > free {
        return Err(OciError::NoRoom {
            reference: reference.to_owned(),
            dir: tmp.to_path_buf(),
            need,
            free,
        });
    }
    Ok(())
}

/// Decompresses the verified layer `zpart` into `part`, at most `limit` bytes, and checks the
/// result against the disk digest the manifest annotates; on any failure `part` is deleted.
fn unpack(
    zpart: &Path,
    part: &Path,
    limit: u64,
    digest: &str,
    reference: &str,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<(), OciError> {
    progress(PullEvent::Note(format!("decompressing the disk ({limit} bytes)")));
    progress(PullEvent::Transfer(DownloadEvent::Start {
        offset: 0,
        total: Some(limit),
    }));
    let r = decompress(zpart, part, limit, &mut |done| {
        progress(PullEvent::Transfer(DownloadEvent::Progress {
            done,
            total: Some(limit),
        }))
    });
    let fail = |e: OciError| {
        let _ = fs::remove_file(part);
        e
    };
    let (actual, size) = match r {
        Ok(x) => x,
        Err(DecompressError::TooBig { limit }) => {
            return Err(fail(OciError::Decompress {
                reference: reference.to_owned(),
                why: format!("it decompresses to more than the {limit} bytes the manifest annotates (a decompression bomb, or a wrong annotation)"),
            }))
        }
        Err(DecompressError::TooDense { max }) => {
            return Err(fail(OciError::Decompress {
                reference: reference.to_owned(),
                why: format!("more than {max} of its bytes are data, more than a real disk compresses from a layer this size (64 MiB + 64x; zero runs are holes and not counted): a decompression bomb"),
            }))
        }
        Err(DecompressError::Corrupt(e)) => {
            return Err(fail(OciError::Decompress {
                reference: reference.to_owned(),
                why: format!("it is not a valid zstd stream ({e})"),
            }))
        }
        Err(DecompressError::Write(source)) => {
            return Err(fail(OciError::Write {
                path: part.to_path_buf(),
                source,
            }))
        }
    };
    if size != limit {
        return Err(fail(OciError::Decompress {
            reference: reference.to_owned(),
            why: format!("it decompresses to {size} bytes where the manifest annotates {limit}"),
        }));
    }
    if actual != digest {
        return Err(fail(OciError::BlobMismatch {
            reference: reference.to_owned(),
            what: "decompressed disk",
            digest: digest.to_owned(),
            actual,
        }));
    }
    Ok(())
}

/// The strict inspector on the disk (a registry is untrusted): its format must be the one the
/// layer's media type says, self-contained, and its virtual size the annotated one.
fn check_disk(path: &Path, art: &VmArtifact, reference: &str) -> Result<u64, OciError> {
    let info = nubo_disk::inspect(path).map_err(|source| OciError::Disk {
        reference: reference.to_owned(),
        source,
    })?;
    if info.backing.is_some() {
        return Err(OciError::HasBacking {
            reference: reference.to_owned(),
        });
    }
    if info.format.as_str() != art.format {
        return Err(OciError::Inconsistent {
            reference: reference.to_owned(),
            annotated: art.format.clone(),
            actual: info.format.as_str().to_owned(),
        });
    }
    if let Some(v) = art.meta.virtual_size.filter(|v| *v != info.virtual_size) {
        return Err(OciError::Inconsistent {
            reference: reference.to_owned(),
            annotated: format!("{v} bytes (virtual)"),
            actual: format!("{} bytes", info.virtual_size),
        });
    }
    Ok(info.virtual_size)
}

fn record(
    art: &VmArtifact,
    local: &ImageRef,
    r: &OciRef,
    manifest_digest: &str,
    virtual_size: u64,
    boot: Option<crate::record::BootFiles>,
) -> ImageRecord {
    let m = &art.meta;
    ImageRecord {
        reference: local.to_string(),
        digest: art.disk.digest.clone(),
        path: PathBuf::new(),
        format: art.format.clone(),
        size: art.disk_size(),
        virtual_size,
        cloud_init: m.cloud_init,
        os: m.os.clone(),
        release: m.release.clone(),
        arch: m.arch.clone().unwrap_or_else(|| "x86_64".into()),
        firmware: m.firmware.clone(),
        boot,
        default_vcpus: m.default_vcpus.unwrap_or(DEFAULT_VCPUS),
        default_memory_mib: m.default_memory_mib.unwrap_or(DEFAULT_MEMORY_MIB),
        default_user: m.default_user.clone(),
        hypervisor: m.hypervisor.clone(),
        source: ImageSource {
            url: Some(r.to_string()),
            checksum: Some(art.disk.digest.clone()),
            manifest: Some(manifest_digest.to_owned()),
            origin: m.origin.clone().map(Box::new),
            ..ImageSource::new(SourceKind::Oci)
        },
        // Every blob was checked against the manifest's digest and size.
        verified: true,
        created: now(),
        build_seconds: None,
        labels: Default::default(),
        build: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_name_flattens_registry_and_path() {
        let r = OciRef::parse("127.0.0.1:5000/team/debian:12").unwrap();

        assert_eq!(local_name(&r).unwrap().to_string(), "127.0.0.1-5000_team_debian:12");
    }

    #[test]
    fn local_name_digest_only_uses_short_digest_tag() {
        let r = OciRef::parse(&format!("r.io/vm@sha256:{}", "ab".repeat(32))).unwrap();

        assert_eq!(local_name(&r).unwrap().tag, "sha256-abababababababab");
    }

    #[test]
    fn local_name_without_registry_refused() {
        let r = OciRef::parse("team/vm:1").unwrap();

        assert!(matches!(local_name(&r), Err(OciError::NoRegistry(_))));
    }

    #[test]
    fn split_defaults_to_latest() {
        let r = OciRef::parse("r.io/vm").unwrap();

        assert_eq!(split(&r).unwrap(), ("r.io", "vm", "latest".to_owned()));
    }
}
