//! An HTTPS server on 127.0.0.1 for pull tests: a self-signed CA (rcgen) the client is told to
//! trust, rustls on ring, and a tiny HTTP/1.1 handler with Range support, a "drop the connection
//! after N bytes" mode, an "ignore Range" mode, redirects, fixed error statuses and a "break the
//! TLS stream after N bytes" mode. One request per connection.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

#[derive(Clone, Default)]
struct Served {
    body: Vec<u8>,
    /// Close the connection after this many body bytes, on the first GET only.
    drop_after: Option<usize>,
    ignore_range: bool,
    /// Answer with this redirect (`Location`) instead of the body.
    redirect: Option<String>,
    /// Answer with this status, the first `status_times` requests (then the body).
    status: Option<(u16, usize)>,
    /// After this many body bytes, write bytes that are not a TLS record onto the socket.
    corrupt_after: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub path: String,
    pub range: Option<String>,
}

#[derive(Default)]
struct State {
    files: HashMap<String, Served>,
    hits: Vec<Hit>,
}

pub struct Server {
    pub base: String,
    pub ca: PathBuf,
    state: Arc<Mutex<State>>,
}

impl Server {
    /// Starts serving; the CA certificate is written to `dir/ca.pem`.
    pub fn start(dir: &Path) -> Server {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(DnType::CommonName, "nubo test CA");
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
        let ca = dir.join("ca.pem");
        std::fs::write(&ca, ca_cert.pem()).unwrap();

        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("https://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(tcp) = conn else { continue };
                let (config, st) = (config.clone(), st.clone());
                thread::spawn(move || {
                    let _ = serve(tcp, config, st);
                });
            }
        });
        Server { base, ca, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn put(&self, path: &str, body: impl Into<Vec<u8>>) {
        self.state.lock().unwrap().files.insert(
            path.to_owned(),
            Served {
                body: body.into(),
                ..Default::default()
            },
        );
    }

    pub fn put_dropping(&self, path: &str, body: impl Into<Vec<u8>>, after: usize) {
        let s = Served {
            body: body.into(),
            drop_after: Some(after),
            ..Default::default()
        };
        self.state.lock().unwrap().files.insert(path.to_owned(), s);
    }

    pub fn put_ignoring_range(&self, path: &str, body: impl Into<Vec<u8>>) {
        let s = Served {
            body: body.into(),
            ignore_range: true,
            ..Default::default()
        };
        self.state.lock().unwrap().files.insert(path.to_owned(), s);
    }

    /// `path` answers `302 Found` to `location`.
    pub fn put_redirect(&self, path: &str, location: &str) {
        let s = Served {
            redirect: Some(location.to_owned()),
            ..Default::default()
        };
        self.state.lock().unwrap().files.insert(path.to_owned(), s);
    }

    /// `path` answers `status` to its first `times` requests, then serves `body`.
    pub fn put_status(&self, path: &str, status: u16, times: usize, body: impl Into<Vec<u8>>) {
        let s = Served {
            body: body.into(),
            status: Some((status, times)),
            ..Default::default()
        };
        self.state.lock().unwrap().files.insert(path.to_owned(), s);
    }

    /// `path` sends `after` body bytes, then garbage where the next TLS record should be.
    pub fn put_corrupting(&self, path: &str, body: impl Into<Vec<u8>>, after: usize) {
        let s = Served {
            body: body.into(),
            corrupt_after: Some(after),
            ..Default::default()
        };
        self.state.lock().unwrap().files.insert(path.to_owned(), s);
    }

    /// The requests for `path`, in order, with their Range header.
    pub fn hits(&self, path: &str) -> Vec<Hit> {
        self.state
            .lock()
            .unwrap()
            .hits
            .iter()
            .filter(|h| h.path == path)
            .cloned()
            .collect()
    }
}

fn serve(tcp: TcpStream, config: Arc<rustls::ServerConfig>, st: Arc<Mutex<State>>) -> std::io::Result<()> {
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut reader = BufReader::new(&mut tls);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut range = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("range") {
                range = Some(v.trim().to_owned());
            }
        }
    }
    drop(reader);
    let path = request_line.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let served = {
        let mut s = st.lock().unwrap();
        s.hits.push(Hit {
            path: path.clone(),
            range: range.clone(),
        });
        let served = s.files.get(&path).cloned();
        // Drop only once: the retry must be able to finish.
        if let Some(f) = s.files.get_mut(&path) {
            f.drop_after = None;
            if let Some((code, n)) = f.status {
                f.status = (n > 1).then_some((code, n - 1));
            }
        }
        served
    };
    let Some(served) = served else {
        write!(
            tls,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found"
        )?;
        tls.conn.send_close_notify();
        return tls.flush();
    };
    if let Some(location) = &served.redirect {
        write!(
            tls,
            "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        tls.conn.send_close_notify();
        return tls.flush();
    }
    if let Some((code, _)) = served.status {
        write!(
            tls,
            "HTTP/1.1 {code} Error\r\nContent-Length: 5\r\nConnection: close\r\n\r\nerror"
        )?;
        tls.conn.send_close_notify();
        return tls.flush();
    }
    let len = served.body.len();
    let start = range
        .as_deref()
        .filter(|_| !served.ignore_range)
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.strip_suffix('-'))
        .and_then(|s| s.parse::<usize>().ok());
    match start {
        Some(s) if s >= len => {
            write!(tls, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
        }
        Some(s) => {
            write!(
                tls,
                "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {s}-{}/{len}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                len - 1,
                len - s
            )?;
            tls.write_all(&served.body[s..])?;
        }
        None => {
            write!(
                tls,
                "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nAccept-Ranges: bytes\r\nConnection: close\r\n\r\n"
            )?;
            if let Some(n) = served.corrupt_after {
                tls.write_all(&served.body[..n])?;
                tls.flush()?;
                // Not a TLS record: the client's TLS layer must fail, not see a dropped link.
                tls.sock.write_all(&[0x17, 0x03, 0x03, 0x00, 0x10])?;
                tls.sock.write_all(&[0xAB; 16])?;
                let mut sink = [0u8; 64];
                let _ = tls.sock.read(&mut sink);
                return Ok(());
            }
            if let Some(n) = served.drop_after {
                tls.write_all(&served.body[..n])?;
                tls.flush()?;
                // Abrupt close, no close_notify: what a dropped link looks like.
                return tls.sock.shutdown(std::net::Shutdown::Both);
            }
            tls.write_all(&served.body)?;
        }
    }
    tls.conn.send_close_notify();
    tls.flush()?;
    let mut sink = [0u8; 64];
    let _ = tls.sock.read(&mut sink);
    Ok(())
}

/// A small qcow2 (made in-process by nubo-disk) followed by `pad` bytes of varied filler, so
/// downloads span many reads.
pub fn qcow2_bytes(dir: &Path, name: &str, pad: usize) -> Vec<u8> {
    let p = dir.join(name);
    nubo_disk::create_qcow2(&p, 64 << 20).unwrap();
    let mut b = std::fs::read(&p).unwrap();
    std::fs::remove_file(&p).unwrap();
    b.extend((0..pad).map(|i| (i * 31 % 251) as u8));
    b
}

pub fn sha256(b: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, b).as_ref())
}

pub fn sha512(b: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA512, b).as_ref())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
