//! A Docker-style token service on 127.0.0.1 for live tests (the `auth: token:` flow of
//! docker-registry 2.8): HTTPS with the test CA's certificate, Basic credentials checked,
//! and a JWT (ES256, signed with ring by a key whose self-signed certificate the registry
//! trusts as its `rootcertbundle`, and carried in the token's `x5c` header) granting the
//! scopes asked for. Every request it refused is counted.

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use rcgen::{CertificateParams, DnType, KeyPair};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub const SERVICE: &str = "nubo-live-registry";
pub const ISSUER: &str = "nubo-live-issuer";

pub struct TokenServer {
    /// `https://127.0.0.1:PORT/token`: the registry's `realm`.
    pub realm: String,
    /// The signing certificate (PEM): the registry's `rootcertbundle`.
    pub signer_pem: String,
    /// Token requests refused for bad credentials.
    pub refused: Arc<AtomicUsize>,
    /// Tokens issued.
    pub issued: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    addr: String,
}

struct Signer {
    key: EcdsaKeyPair,
    x5c: String,
    user: String,
    password: String,
}

impl TokenServer {
    /// Serves with `cert_pem`/`key_pem` (a certificate for 127.0.0.1) and accepts `user` with
    /// `password`.
    pub fn start(cert_pem: &str, key_pem: &str, user: &str, password: &str) -> Result<TokenServer, String> {
        let e = |e: rcgen::Error| format!("token signer: {e}");
        let signing = KeyPair::generate().map_err(e)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
        params.distinguished_name.push(DnType::CommonName, ISSUER);
        let signer_cert = params.self_signed(&signing).map_err(e)?;
        let rng = SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &signing.serialize_der(), &rng)
            .map_err(|e| format!("token signer key: {e}"))?;
        let signer = Arc::new(Signer {
            key,
            x5c: STANDARD.encode(signer_cert.der()),
            user: user.to_owned(),
            password: password.to_owned(),
        });

        let cert = rustls::pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| format!("token server certificate: {e}"))?;
        let server_key = KeyPair::from_pem(key_pem).map_err(e)?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::into_owned(cert)],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            )
            .map_err(|e| format!("token server TLS: {e}"))?;
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("token server: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?.to_string();
        let refused = Arc::new(AtomicUsize::new(0));
        let issued = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, i, s) = (refused.clone(), issued.clone(), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(tcp) = conn else { continue };
                let (config, signer, r, i) = (config.clone(), signer.clone(), r.clone(), i.clone());
                thread::spawn(move || {
                    let _ = serve(tcp, config, &signer, &r, &i);
                });
            }
        });
        Ok(TokenServer {
            realm: format!("https://{addr}/token"),
            signer_pem: signer_cert.pem(),
            refused,
            issued,
            stop,
            addr,
        })
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn serve(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    signer: &Signer,
    refused: &AtomicUsize,
    issued: &AtomicUsize,
) -> std::io::Result<()> {
    let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    let mut reader = BufReader::new(&mut tls);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    let mut authorization = None;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 || line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("authorization") {
                authorization = Some(v.trim().to_owned());
            }
        }
    }
    drop(reader);
    let target = request_line.split_whitespace().nth(1).unwrap_or("/");
    let want = format!(
        "Basic {}",
        STANDARD.encode(format!("{}:{}", signer.user, signer.password))
    );
    let (status, body) = if authorization.as_deref() != Some(want.as_str()) {
        refused.fetch_add(1, Ordering::SeqCst);
        (
            "401 Unauthorized",
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"bad credentials"}]}"#.to_owned(),
        )
    } else {
        let scopes: Vec<String> = query(target, "scope");
        let service = query(target, "service").into_iter().next().unwrap_or_default();
        match sign(signer, &service, &scopes) {
            Ok(t) => {
                issued.fetch_add(1, Ordering::SeqCst);
                (
                    "200 OK",
                    format!(r#"{{"token":"{t}","access_token":"{t}","expires_in":300}}"#),
                )
            }
            Err(e) => ("500 Internal Server Error", format!(r#"{{"error":"{e}"}}"#)),
        }
    };
    write!(
        tls,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    tls.flush()?;
    tls.conn.send_close_notify();
    let _ = tls.flush();
    Ok(())
}

/// Every value of `key` in `target`'s query string, percent-decoded.
fn query(target: &str, key: &str) -> Vec<String> {
    let q = target.split_once('?').map(|(_, q)| q).unwrap_or("");
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| decode(v))
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(if b[i] == b'+' { b' ' } else { b[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `repository:NAME:ACTIONS` scopes -> the JWT's `access` claim, every action granted.
fn sign(signer: &Signer, service: &str, scopes: &[String]) -> Result<String, String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    let access: Vec<serde_json::Value> = scopes
        .iter()
        .flat_map(|s| s.split(' '))
        .filter_map(|s| {
            let mut parts = s.splitn(3, ':');
            let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
            Some(serde_json::json!({
                "type": kind,
                "name": name,
                "actions": actions.split(',').collect::<Vec<_>>(),
            }))
        })
        .collect();
    let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "x5c": [signer.x5c]});
    let claims = serde_json::json!({
        "iss": ISSUER,
        "sub": signer.user,
        "aud": service,
        "exp": now + 300,
        "nbf": now - 10,
        "iat": now,
        "jti": format!("{now}-{}", std::process::id()),
        "access": access,
    });
    let input = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let sig = signer
        .key
        .sign(&SystemRandom::new(), input.as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig.as_ref())))
}
