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
    fn pull_fetcher_with_a_cancelled_token_pulls_nothing_and_says_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let url = serve(vec![7u8; 1 << 20]);
        let fetcher = PullFetcher {
            images: dir.path().join("images"),
            config: PullConfig::default(),
        };
        let cancel = nubo_core::Cancel::new();
        cancel.cancel();

        let err = fetcher
            .fetch(
                &Fetch::Url {
                    url,
                    checksum: Some(format!("sha256:{}", "0".repeat(64))),
                    insecure_no_checksum: false,
                    allow_http: true,
                },
                &cancel,
                &mut |_| {},
            )
            .err()
            .unwrap();

        let text = anyhow_chain(&err);
        assert!(text.contains("the pull was cancelled"), "{text}");
        assert!(text.contains("nothing was downloaded"), "{text}");
        assert!(nubo_image::ImageStore::open(&dir.path().join("images"))
            .unwrap()
            .list()
            .unwrap()
            .is_empty());
    }

    /// `err` and its sources, one line.
    fn anyhow_chain(err: &dyn std::error::Error) -> String {
        let mut out = err.to_string();
        let mut cur = err.source();
        while let Some(e) = cur {
            out.push_str(": ");
            out.push_str(&e.to_string());
            cur = e.source();
        }
        out
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
                &nubo_core::Cancel::new(),
                &mut |e| steps.push(format!("{e:?}")),
            )
            .unwrap();

        assert_eq!(rec.digest, digest);
        assert!(rec.path.is_file());
        assert!(steps.iter().any(|s| s.contains("pulling")), "{steps:?}");
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
        };
        let r = nubo_image::OciRef::parse("127.0.0.1:1/team/vm:1").unwrap();

        let err = fetcher
            .fetch(&Fetch::Oci(r), &nubo_core::Cancel::new(), &mut |_| {})
            .err()
            .unwrap();

        let chain = error_chain(&err);
        assert!(chain.contains("daemon-auth.json"), "{chain}");
        assert!(chain.contains("127.0.0.1:1/team/vm:1"), "{chain}");
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
        };
        let r = nubo_image::OciRef::parse(&format!("127.0.0.1:{port}/team/vm:1")).unwrap();
        let mut steps: Vec<String> = Vec::new();

        let err = fetcher
            .fetch(&Fetch::Oci(r), &nubo_core::Cancel::new(), &mut |e| {
                steps.push(format!("{e:?}"))
            })
            .err()
            .unwrap();

        let chain = error_chain(&err);
        assert!(matches!(err, EngineError::Pull { .. }), "{chain}");
        assert!(!chain.contains("secret"), "{chain}");
        assert!(steps.iter().any(|s| s.contains("pulling")), "{steps:?}");
    }

    /// The error and its sources, one line.
    fn error_chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut cur = e.source();
        while let Some(s) = cur {
            out.push_str(": ");
            out.push_str(&s.to_string());
            cur = s.source();
        }
        out
    }
}
