//! `push` a stored image to a registry: hash the kernel and initrd (the disk's digest is its
//! store name, re-checked while it uploads), upload only the blobs the registry lacks (HEAD
//! first; chunked PATCHes), then the manifest; return the digest to pin.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use super::client::{Client, ClientSettings};
use super::error::OciError;
use super::manifest::{self, Blobs, Descriptor, EMPTY_BYTES, EMPTY_DIGEST, INITRD, KERNEL};
use crate::digest::{hash_file, StreamHasher};
use crate::download::DownloadEvent;
use crate::pull::PullEvent;
use crate::record::ImageRecord;
use crate::reference::{ImageRef, OciRef};
use crate::store::ImageStore;
use crate::Algorithm;

#[derive(Debug, Clone)]
pub struct PushRequest {
    pub image: ImageRef,
    pub target: OciRef,
    pub client: ClientSettings,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// `REGISTRY/REPO:TAG`.
    pub tagged: String,
    /// `REGISTRY/REPO@sha256:...`: what to pin.
    pub pinned: String,
    pub digest: String,
    /// Blobs uploaded and blobs the registry already had.
    pub uploaded: usize,
    pub skipped: usize,
}

pub fn push(store: &ImageStore, req: &PushRequest, progress: &mut dyn FnMut(PullEvent)) -> Result<Pushed, OciError> {
    let t = &req.target;
    if t.digest.is_some() {
        return Err(OciError::PushToDigest(t.to_string()));
    }
    let registry = t
        .registry
        .as_deref()
        .ok_or_else(|| OciError::NoRegistry(t.to_string()))?;
    let repository = t.repository.as_str();
    let tag = t.tag.clone().unwrap_or_else(|| req.image.tag.clone());
    let record = store.require(&req.image)?;
    let media_type = manifest::disk_media_type(&record.format).ok_or_else(|| OciError::Format {
        reference: record.reference.clone(),
        format: record.format.clone(),
    })?;
    let disk_size = std::fs::metadata(&record.path)
        .map_err(|source| OciError::Io {
            path: record.path.clone(),
            source,
        })?
        .len();
    let boot_blob = |path: &Path, media: &str| -> Result<Descriptor, OciError> {
        let io = |source| OciError::Io {
            path: path.to_path_buf(),
            source,
        };
        let size = std::fs::metadata(path).map_err(io)?.len();
        let digest = hash_file(path, Algorithm::Sha256).map_err(io)?.to_string();
        Ok(Descriptor::new(media, &digest, size))
    };
    let kernel = record.boot.as_ref().map(|b| boot_blob(&b.kernel, KERNEL)).transpose()?;
    let initrd = match record.boot.as_ref().and_then(|b| b.initrd.as_ref()) {
        Some(p) => Some(boot_blob(p, INITRD)?),
        None => None,
    };
    let blobs = Blobs {
        disk: Descriptor::new(media_type, &record.digest, disk_size),
        kernel,
        initrd,
    };
    let m = manifest::render(&record, &blobs);
    let bytes = m.to_bytes();
    let mut h = StreamHasher::new(None);
    h.update(&bytes);
    let digest = h.finish().sha256.to_string();

    let client = Client::new(registry, &req.client)?;
    let mut uploaded = 0;
    let mut skipped = 0;
    let mut files = vec![("disk", record.path.clone(), blobs.disk.clone())];
    if let (Some(b), Some(k)) = (&record.boot, &blobs.kernel) {
        files.push(("kernel", b.kernel.clone(), k.clone()));
        if let (Some(p), Some(i)) = (&b.initrd, &blobs.initrd) {
            files.push(("initrd", p.clone(), i.clone()));
        }
    }
    for (what, path, d) in &files {
        if client.has_blob(repository, &d.digest)? {
            progress(PullEvent::Note(format!(
                "{what} {} already in {registry}/{repository}",
                d.digest
            )));
            skipped += 1;
            continue;
        }
        progress(PullEvent::Note(format!(
            "uploading {what} {} ({} bytes)",
            d.digest, d.size
        )));
        upload_file(&client, repository, &record, what, path, d, progress)?;
        uploaded += 1;
    }
    if client.has_blob(repository, EMPTY_DIGEST)? {
        skipped += 1;
    } else {
        client.upload_bytes(repository, EMPTY_DIGEST, EMPTY_BYTES)?;
        uploaded += 1;
    }
    let stored = client.put_manifest(repository, &tag, &bytes)?;
    if let Some(got) = stored.filter(|g| *g != digest) {
        return Err(OciError::PushDigest {
            registry: registry.to_owned(),
            expected: digest,
            got,
        });
    }
    Ok(Pushed {
        tagged: format!("{registry}/{repository}:{tag}"),
        pinned: format!("{registry}/{repository}@{digest}"),
        digest,
        uploaded,
        skipped,
    })
}

/// Streams `path` up, hashing what is sent; the upload is closed only if that hash is the
/// descriptor's (a damaged store never reaches the registry under a good digest).
fn upload_file(
    client: &Client,
    repository: &str,
    record: &ImageRecord,
    what: &'static str,
    path: &Path,
    d: &Descriptor,
    progress: &mut dyn FnMut(PullEvent),
) -> Result<(), OciError> {
    let file = File::open(path).map_err(|source| OciError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let hasher = RefCell::new(StreamHasher::new(None));
    let mut reader = Hashing {
        inner: io::BufReader::with_capacity(1 << 20, file),
        hasher: &hasher,
    };
    progress(PullEvent::Transfer(DownloadEvent::Start {
        offset: 0,
        total: Some(d.size),
    }));
    client.upload_blob(
        repository,
        &d.digest,
        d.size,
        &mut reader,
        &mut |done| {
            progress(PullEvent::Transfer(DownloadEvent::Progress {
                done,
                total: Some(d.size),
            }))
        },
        &mut || {
            let got = hasher.replace(StreamHasher::new(None)).finish().sha256.to_string();
            if got == d.digest {
                Ok(())
            } else {
                Err(OciError::StoreDamaged {
                    reference: record.reference.clone(),
                    what,
                    path: path.to_path_buf(),
                    digest: d.digest.clone(),
                })
            }
        },
    )
}

struct Hashing<'a, R> {
    inner: R,
    hasher: &'a RefCell<StreamHasher>,
}

impl<R: Read> Read for Hashing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.borrow_mut().update(&buf[..n]);
        Ok(n)
    }
}
