//! An [`ImageFetcher`] that needs nothing from a binary: catalog and URL pulls into the store
//! under a [`PullConfig`] (mirrors, TLS trust) its caller built, progress as [`Event`]s. A
//! daemon gives the engine this one; the CLI keeps its own for its progress bars and registry
//! credentials, over the same `PullConfig`.

use std::path::PathBuf;

use nubo_image::{ImageRecord, ImageStore, PullConfig, PullEvent, PullSource};

use crate::{EngineError, Event, Fetch, ImageFetcher};

pub struct PullFetcher {
    /// The image store's directory (`Roots::images`).
    pub images: PathBuf,
    pub config: PullConfig,
}

impl ImageFetcher for PullFetcher {
    fn fetch(&self, what: &Fetch, events: &mut dyn FnMut(Event)) -> Result<ImageRecord, EngineError> {
        let (label, req) = match what {
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
                req.insecure_no_checksum = *insecure_no_checksum;
                req.allow_http = *allow_http;
                (url.clone(), req)
            }
            Fetch::Oci(r) => {
                return Err(EngineError::Unavailable {
                    what: format!("pulling `{r}` from its registry without credentials"),
                    fix: "give the engine an ImageFetcher that holds the registry's credentials".into(),
                })
            }
        };
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

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

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

    #[test]
    fn pull_fetcher_url_with_checksum_pulls_into_store() {
        let dir = tempfile::tempdir().unwrap();
        let disk = dir.path().join("src.qcow2");
        nubo_disk::create_qcow2(&disk, 1 << 20).unwrap();
        let bytes = std::fs::read(&disk).unwrap();
        let digest = nubo_image::digest::sha256_bytes(&bytes);
        let url = serve(bytes);
        let fetcher = PullFetcher {
            images: dir.path().join("images"),
            config: PullConfig::default(),
        };
        let mut steps: Vec<String> = Vec::new();

        let rec = fetcher
            .fetch(
                &Fetch::Url {
                    url,
                    checksum: Some(digest.clone()),
                    insecure_no_checksum: false,
                    allow_http: true,
                },
                &mut |e| steps.push(format!("{e:?}")),
            )
            .unwrap();

        assert_eq!(rec.digest, digest);
        assert!(rec.path.is_file());
        assert!(steps.iter().any(|s| s.contains("pulling")), "{steps:?}");
    }

    #[test]
    fn pull_fetcher_oci_unavailable_names_fix() {
        let dir = tempfile::tempdir().unwrap();
        let fetcher = PullFetcher {
            images: dir.path().join("images"),
            config: PullConfig::default(),
        };
        let r = nubo_image::OciRef::parse("127.0.0.1:5000/team/vm:1").unwrap();

        let err = fetcher.fetch(&Fetch::Oci(r), &mut |_| {}).err().unwrap();

        assert!(err.to_string().contains("credentials"), "{err}");
    }
}
