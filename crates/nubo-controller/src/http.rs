//! A tiny HTTP/1.1 server for `/metrics`, `/healthz` and `/readyz`: one request per
//! connection, a bounded request head, a few seconds per connection. No web framework.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::Metrics;

const MAX_HEAD: usize = 8192;

pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, ready: Arc<AtomicBool>) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
                let (code, body) = answer(line, &metrics, ready.load(Ordering::SeqCst));
                let resp = format!(
                    "HTTP/1.1 {code}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            })
            .await;
        });
    }
}

/// The status line and body for a request line.
pub fn answer(line: &[u8], metrics: &Metrics, ready: bool) -> (&'static str, String) {
    let mut parts = line.split(|&b| b == b' ');
    let method = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    if method != b"GET" {
        return ("405 Method Not Allowed", "GET only\n".into());
    }
    match path {
        b"/metrics" => ("200 OK", metrics.render()),
        b"/healthz" => ("200 OK", "ok\n".into()),
        b"/readyz" if ready => ("200 OK", "ok\n".into()),
        b"/readyz" => ("503 Service Unavailable", "not leading yet\n".into()),
        _ => ("404 Not Found", "not found: /metrics, /healthz, /readyz\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answer_paths_and_methods() {
        let m = Metrics::default();
        assert_eq!(answer(b"GET /healthz HTTP/1.1", &m, false).0, "200 OK");
        assert_eq!(answer(b"GET /readyz HTTP/1.1", &m, false).0, "503 Service Unavailable");
        assert_eq!(answer(b"GET /readyz HTTP/1.1", &m, true).0, "200 OK");
        assert!(answer(b"GET /metrics HTTP/1.1", &m, true)
            .1
            .contains("nubo_virtualmachines"));
        assert_eq!(answer(b"POST /metrics HTTP/1.1", &m, true).0, "405 Method Not Allowed");
        assert_eq!(answer(b"\xff\x00", &m, true).0, "405 Method Not Allowed");
        assert_eq!(answer(b"GET /../etc/passwd HTTP/1.1", &m, true).0, "404 Not Found");
    }
}
