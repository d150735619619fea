//! `push` a stored image to a registry: hash the kernel and initrd (the disk's digest is its
//! store name, re-checked while it uploads), upload only the blobs the registry lacks (HEAD
//! first; chunked PATCHes), then the manifest; return the digest to pin.

use std::cell::RefCell;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use super::client::{Client, ClientSettings, UploadEvent};
use super::compress::compress;
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
    /// Push the disk zstd-compressed (its own media type; the disk's digest and size in the
    /// annotations).
    pub compress: bool,
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
    let media_type = manifest::disk_media_type(&record.format, req.compress).ok_or_else(|| OciError::Format {
        reference: record.reference.clone(),
        format: record.format.clone(),
    })?;
    let mut record = record;
    record.size = std::fs::metadata(&record.path)
        .map_err(|source| OciError::Io {
            path: record.path.clone(),
            source,
        })?
        .len();
    // The layer to upload: the stored disk itself, or its zstd form in tmp/ (deleted on return).
    let packed = if req.compress {
        Some(pack(store, &record, progress)?)
    } else {
        None
    };
    let (disk_file, disk_digest, disk_size) = match &packed {
        Some(p) => (p.path.clone(), p.digest.clone(), p.size),
        None => (record.path.clone(), record.digest.clone(), record.size),
    };
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
        disk: Descriptor::new(media_type, &disk_digest, disk_size),
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
    let mut files = vec![("disk", disk_file, blobs.disk.clone())];
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

/// A compressed copy of the disk in the store's `tmp/`, removed when dropped.
struct Packed {
    path: std::path::PathBuf,
    digest: String,
    size: u64,
}

impl Drop for Packed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn pack(store: &ImageStore, record: &ImageRecord, progress: &mut dyn FnMut(PullEvent)) -> Result<Packed, OciError> {
    let hex = crate::store::digest_hex(&record.digest)?;
    let path = store.tmp_dir().join(format!(
        "push-{}-{}.zst.part",
        &hex[..16],
        nubo_core::atomic::unique_tag()
    ));
    progress(PullEvent::Note(format!(
        "compressing the disk ({} bytes) with zstd",
        record.size
    )));
    let t = std::time::Instant::now();
    // Removed on every exit from here on, failure included.
    let mut packed = Packed {
        path,
        digest: String::new(),
        size: 0,
    };
    let (digest, size) = compress(&record.path, &packed.path).map_err(|source| OciError::Write {
        path: packed.path.clone(),
        source,
    })?;
    progress(PullEvent::Note(format!(
        "compressed to {size} bytes ({:.0}%) in {:.1}s",
        size as f64 * 100.0 / record.size.max(1) as f64,
        t.elapsed().as_secs_f64()
    )));
    packed.digest = digest;
    packed.size = size;
    Ok(packed)
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
        pos: 0,
        hashed: 0,
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
        &mut |e| {
            progress(PullEvent::Transfer(match e {
                UploadEvent::Sent(done) => DownloadEvent::Progress {
                    done,
                    total: Some(d.size),
                },
                UploadEvent::Retry { attempt, offset, error } => DownloadEvent::Retry { attempt, offset, error },
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

/// Hashes each byte of the file once as it is read, in order; bytes read again after a
/// retry rewound it are not hashed twice.
struct Hashing<'a, R> {
    inner: R,
    hasher: &'a RefCell<StreamHasher>,
    /// Where the next read starts.
    pos: u64,
    /// Bytes `[0, hashed)` are in the hash.
    hashed: u64,
}

impl<R: Read> Read for Hashing<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        let end = self.pos + n as u64;
        if end > self.hashed {
            // A rewind never goes past what was hashed, so pos <= hashed here.
            let from = (self.hashed.saturating_sub(self.pos)) as usize;
            self.hasher.borrow_mut().update(&buf[from..n]);
            self.hashed = end;
        }
        self.pos = end;
        Ok(n)
    }
}

impl<R: Seek> Seek for Hashing<'_, R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let at = self.inner.seek(to)?;
        if at > self.hashed {
            return Err(io::Error::other("an upload may not skip bytes it has not sent"));
        }
        self.pos = at;
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashing_rewound_reader_hashes_each_byte_once() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 256) as u8).collect();
        let hasher = RefCell::new(StreamHasher::new(None));
        let mut r = Hashing {
            inner: io::Cursor::new(data.clone()),
            hasher: &hasher,
            pos: 0,
            hashed: 0,
        };

        let mut sink = vec![0u8; 6000];
        r.read_exact(&mut sink).unwrap();
        r.seek(SeekFrom::Start(2500)).unwrap();
        io::copy(&mut r, &mut io::sink()).unwrap();

        let mut want = StreamHasher::new(None);
        want.update(&data);
        assert_eq!(hasher.into_inner().finish().sha256, want.finish().sha256);
    }

    #[test]
    fn hashing_seek_past_hashed_refused() {
        let hasher = RefCell::new(StreamHasher::new(None));
        let mut r = Hashing {
            inner: io::Cursor::new(vec![0u8; 100]),
            hasher: &hasher,
            pos: 0,
            hashed: 0,
        };

        assert!(r.seek(SeekFrom::Start(50)).is_err());
    }
}
