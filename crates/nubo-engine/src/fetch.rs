//! An [`ImageFetcher`] that needs nothing from a binary: catalog, URL and registry pulls into
//! the store under a [`PullConfig`] (mirrors, TLS trust, registry credentials) its caller built,
//! progress as [`Event`]s. A daemon gives the engine this one; the CLI keeps its own for its
//! progress bars, over the same `PullConfig`.

use std::path::PathBuf;

use nubo_image::{ImageRecord, ImageStore, PullConfig, PullEvent, PullSource};

use crate::{EngineError, Event, Fetch, ImageFetcher};

pub struct PullFetcher {
    /// The image store's directory (`Roots::images`).
    pub images: PathBuf,
    pub config: PullConfig,
    /// Name a URL image with a checksum after that checksum (`url-sha256-<hex>`) instead of
    /// after its file name: a daemon serving many users' URLs (the Kubernetes controller) must
    /// not have `http://a/x/disk.qcow2` and `http://a/y/disk.qcow2` collide on the tag `disk`.
    /// The same checksum is the same bytes, so sharing that name is sharing one image.
    pub name_urls_by_checksum: bool,
}

/// The store name of a URL image verified against `sum`: `url-<algorithm>-<hex>` (a local
/// reference of lowercase hex and `-`).
pub fn url_image_name(sum: &nubo_image::Checksum) -> Result<nubo_image::ImageRef, EngineError> {
    let text = format!("url-{}", sum.to_string().replace(':', "-"));
    // sha512's 128 hex digits and the prefix exceed a component's 128 characters: the name
    // keeps the first 117 digits (468 bits), far beyond any accidental collision.
    let text: String = text.chars().take(nubo_image::reference::MAX_COMPONENT).collect();
    nubo_image::ImageRef::parse(&text)
        .map_err(|e| EngineError::spec(nubo_spec::Field::SourceUrlChecksum, e.to_string()))
}

impl ImageFetcher for PullFetcher {
    fn fetch(
        &self,
        what: &Fetch,
        cancel: &nubo_core::Cancel,
        events: &mut dyn FnMut(Event),
    ) -> Result<ImageRecord, EngineError> {
        let (label, mut req) = match what {
            Fetch::Catalog(r) => (format!("`{r}`"), self.config.request(PullSource::Catalog(r.clone()))),
            Fetch::Url {
                url,
                checksum,
                insecure_no_checksum,
                allow_http,
            } => {
                let mut req = self.config.request(PullSource::Url(url.clone()));
                req.checksum = checksum
                    .as_deref()
                    .map(str::parse::<nubo_image::Checksum>)
                    .transpose()
                    .map_err(|e| EngineError::spec(nubo_spec::Field::SourceUrlChecksum, e.to_string()))?;
                if self.name_urls_by_checksum {
                    req.name = req.checksum.as_ref().map(url_image_name).transpose()?;
                }
                req.insecure_no_checksum = *insecure_no_checksum;
                req.allow_http = *allow_http;
                (url.clone(), req)
            }
            Fetch::Oci(r) => return self.fetch_oci(r, cancel, events),
        };
        req.cancel = Some(cancel.clone());
        let store = ImageStore::open(&self.images)?;
        let mut on_event = |e: PullEvent| match e {
            PullEvent::Resolved { url, .. } => events(Event::Step(format!("pulling {url}"))),
            PullEvent::Waiting { .. } => events(Event::Note(format!("waiting for another pull of {label}"))),
            PullEvent::Unverified { url } => events(Event::Note(format!(
                "{url} has no checksum: only TLS vouches for its bytes"
            ))),
            _ => {}
        };
        let added = nubo_image::pull(&store, &req, &mut on_event).map_err(|e| EngineError::Pull {
            what: label.clone(),
            source: Box::new(e),
        })?;
        Ok(added.record)
    }
}

impl PullFetcher {
    /// A registry image: the one already pulled from `r`, else pulled with the credentials
    /// [`PullConfig::credentials`] gives for its registry.
    fn fetch_oci(
        &self,
        r: &nubo_image::OciRef,
        cancel: &nubo_core::Cancel,
        events: &mut dyn FnMut(Event),
    ) -> Result<ImageRecord, EngineError> {
        let label = format!("`{r}`");
        let failed = |e: nubo_image::oci::OciError| EngineError::Pull {
            what: label.clone(),
            source: Box::new(e),
        };
        let store = ImageStore::open(&self.images)?;
        if let Some(rec) = nubo_image::oci::stored(&store, r).map_err(failed)? {
            return Ok(rec);
        }
        let mut req = self.config.oci_request(r).map_err(failed)?;
        req.client.cancel = Some(cancel.clone());
        events(Event::Step(format!("pulling {r}")));
        let mut on_event = |e: PullEvent| match e {
            PullEvent::Waiting { .. } => events(Event::Note(format!("waiting for another pull of {label}"))),
            PullEvent::Note(n) => events(Event::Step(n)),
            _ => {}
        };
        let added = nubo_image::oci::pull(&store, &req, &mut on_event).map_err(failed)?;
        Ok(added.record)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use nubo_core::error::chain;

    use super::*;

    /// An HTTP/1.1 server on 127.0.0.1 answering every request with `body` (HEAD without it).
    fn serve(body: Vec<u8>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(head.as_bytes());
                if !req.starts_with(b"HEAD") {
                    let _ = s.write_all(&body);
                }
            }
        });
        format!("http://{addr}/disk.qcow2")
    }

    /// A fetcher into `dir/images` with the default pull configuration.
    fn fetcher(dir: &std::path::Path, name_urls_by_checksum: bool) -> PullFetcher {
        PullFetcher {
            images: dir.join("images"),
            config: PullConfig::default(),
            name_urls_by_checksum,
        }
    }

    /// An image at a plain-HTTP `url` (the tests' local servers) with its checksum.
    fn http_image(url: &str, checksum: &str) -> Fetch {
        Fetch::Url {
            url: url.to_owned(),
            checksum: Some(checksum.to_owned()),
            insecure_no_checksum: false,
            allow_http: true,
        }
    }

    #[test]
    fn pull_fetcher_with_a_cancelled_token_pulls_nothing_and_says_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let url = serve(vec![7u8; 1 << 20]);
        let fetcher = fetcher(dir.path(), false);
        let cancel = nubo_core::Cancel::new();
        cancel.cancel();

        let err = fetcher
            .fetch(
                &http_image(&url, &format!("sha256:{}", "0".repeat(64))),
                &cancel,
                &mut |_| {},
            )
            .err()
            .unwrap();

        let text = chain(&err);
        assert!(text.contains("the pull was cancelled"), "{text}");
        assert!(text.contains("nothing was downloaded"), "{text}");
        assert!(nubo_image::ImageStore::open(&dir.path().join("images"))
            .unwrap()
            .list()
            .unwrap()
            .is_empty());
    }

    #[test]
    fn pull_fetcher_url_with_checksum_pulls_into_store() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("src.qcow2");
        nubo_disk::create_qcow2(&disk, 1 << 20).unwrap();
        let bytes = std::fs::read(&disk).unwrap();
        let digest = nubo_image::digest::sha256_bytes(&bytes);
        let url = serve(bytes);
        let fetcher = fetcher(dir.path(), false);
        let mut steps: Vec<String> = Vec::new();

        let rec = fetcher
            .fetch(&http_image(&url, &digest), &nubo_core::Cancel::new(), &mut |e| {
                steps.push(format!("{e:?}"))
            })
            .unwrap();

        assert_eq!(rec.digest, digest);
        assert!(rec.path.is_file());
        assert!(steps.iter().any(|s| s.contains("pulling")), "{steps:?}");
    }

    /// Two qcow2 disks of different bytes served by two servers under one file name
    /// (`http://127.0.0.1:<port>/disk.qcow2`): (URL, sha256) each.
    fn two_disks_one_name(dir: &std::path::Path) -> Vec<(String, String)> {
        [1u64 << 20, 2 << 20]
            .into_iter()
            .map(|size| {
                let disk = dir.join(format!("src-{size}.qcow2"));
                nubo_disk::create_qcow2(&disk, size).unwrap();
                let bytes = std::fs::read(&disk).unwrap();
                let digest = nubo_image::digest::sha256_bytes(&bytes);
                (serve(bytes), digest)
            })
            .collect()
    }

    #[test]
    fn pull_fetcher_same_file_name_two_urls_named_by_checksum_both_kept() {
        let dir = tempfile::tempdir().unwrap();
        let served = two_disks_one_name(dir.path());
        let fetcher = fetcher(dir.path(), true);
        let fetch =
            |url: &str, digest: &str| fetcher.fetch(&http_image(url, digest), &nubo_core::Cancel::new(), &mut |_| {});

        let a = fetch(&served[0].0, &served[0].1).unwrap();
        let b = fetch(&served[1].0, &served[1].1).unwrap();
        let a_again = fetch(&served[0].0, &served[0].1).unwrap();

        assert_eq!(a.digest, served[0].1);
        assert_eq!(b.digest, served[1].1);
        assert_ne!(a.path, b.path);
        assert_ne!(a.reference, b.reference);
        assert_eq!(a_again.digest, a.digest);
        assert_eq!(a_again.path, a.path);
        assert_eq!(a.reference, format!("url-{}:latest", served[0].1.replace(':', "-")));
        let store = nubo_image::ImageStore::open(&dir.path().join("images")).unwrap();
        assert_eq!(store.list().unwrap().len(), 2);
    }

    #[test]
    fn pull_fetcher_same_file_name_by_file_name_second_refused() {
        // The CLI's naming, for contrast: the second `disk.qcow2` would re-point tag `disk`.
        let dir = tempfile::tempdir().unwrap();
        let served = two_disks_one_name(dir.path());
        let fetcher = fetcher(dir.path(), false);
        let fetch = |(url, digest): &(String, String)| {
            fetcher.fetch(&http_image(url, digest), &nubo_core::Cancel::new(), &mut |_| {})
        };

        fetch(&served[0]).unwrap();
        assert!(fetch(&served[1]).is_err());
    }

    #[test]
    fn url_image_name_sha512_fits_a_component() {
        let sum: nubo_image::Checksum = format!("sha512:{}", "ab".repeat(64)).parse().unwrap();
        let r = url_image_name(&sum).unwrap();
        assert!(r.to_string().starts_with("url-sha512-abab"), "{r}");
    }

    #[test]
    fn pull_fetcher_oci_reads_credentials_from_config_bad_file_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("daemon-auth.json");
        std::fs::write(&bad, b"{not json").unwrap();
        let mut config = PullConfig::default();
        config.credentials.files.push(bad);
        let fetcher = PullFetcher {
            images: dir.path().join("images"),
            config,
            name_urls_by_checksum: false,
        };
        let r = nubo_image::OciRef::parse("127.0.0.1:1/team/vm:1").unwrap();

        let err = fetcher
            .fetch(&Fetch::Oci(r), &nubo_core::Cancel::new(), &mut |_| {})
            .err()
            .unwrap();

        let text = chain(&err);
        assert!(text.contains("daemon-auth.json"), "{text}");
        assert!(text.contains("127.0.0.1:1/team/vm:1"), "{text}");
    }

    #[test]
    fn pull_fetcher_oci_with_credentials_asks_the_registry() {
        // A registry that is not there: the fetcher got past the credentials and tried it
        // (over https, as the CLI does), and says which image it could not pull.
        let dir = tempfile::tempdir().unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let mut config = PullConfig::default();
        config.credentials.entries.insert(
            format!("127.0.0.1:{port}"),
            nubo_image::oci::Credentials {
                username: "u".into(),
                password: "secret".into(),
            },
        );
        let fetcher = PullFetcher {
            images: dir.path().join("images"),
            config,
            name_urls_by_checksum: false,
        };
        let r = nubo_image::OciRef::parse(&format!("127.0.0.1:{port}/team/vm:1")).unwrap();
        let mut steps: Vec<String> = Vec::new();

        let err = fetcher
            .fetch(&Fetch::Oci(r), &nubo_core::Cancel::new(), &mut |e| {
                steps.push(format!("{e:?}"))
            })
            .err()
            .unwrap();

        let text = chain(&err);
        assert!(matches!(err, EngineError::Pull { .. }), "{text}");
        assert!(!text.contains("secret"), "{text}");
        assert!(steps.iter().any(|s| s.contains("pulling")), "{steps:?}");
    }
}
