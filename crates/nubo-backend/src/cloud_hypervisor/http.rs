//! A small, bounded HTTP/1.1 client for Cloud Hypervisor's API socket, generic over its
//! transport so tests drive it with in-memory streams.
//!
//! Why not a crate: the tree is synchronous (std + ureq). ureq 3 reaches Unix sockets only
//! through its `unversioned` transport API, which may change in any release; hyper-based
//! clients (hyperlocal, the generated cloud-hypervisor clients) bring tokio, a second async
//! stack, for one request at a time on a local socket. Cloud Hypervisor's micro_http answers
//! every request with a status line, headers and a `Content-Length` body, so the client needs
//! only that: one request per connection, every read bounded in bytes and (by the socket's
//! timeouts) in time.

use std::io::{self, Read, Write};

/// The longest status line plus headers accepted (micro_http sends about 120 bytes).
pub const MAX_HEAD: usize = 16 << 10;
/// The longest body accepted: `vm.info` of a large VM is a few KiB, error replies with a
/// backtrace about 1 KiB.
pub const MAX_BODY: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("API socket transport")]
    Io(#[from] io::Error),
    #[error("the API closed the connection before a complete reply")]
    Closed,
    #[error("the API's reply is not HTTP/1.1: {0}")]
    Malformed(String),
    #[error("the API's reply is larger than {limit} bytes")]
    TooLarge { limit: usize },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The request bytes. Pure.
pub fn render_request(method: &str, path: &str, body: Option<&[u8]>) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\n");
    match body {
        Some(b) => {
            out.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                b.len()
            ));
            let mut bytes = out.into_bytes();
            bytes.extend_from_slice(b);
            bytes
        }
        None => {
            // micro_http wants a length on PUT even when there is no body.
            out.push_str("Content-Length: 0\r\n\r\n");
            out.into_bytes()
        }
    }
}

/// Sends one request and reads its reply: the head up to [`MAX_HEAD`], the body by its
/// `Content-Length` up to [`MAX_BODY`].
pub fn exchange<S: Read + Write>(
    stream: &mut S,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<Response, HttpError> {
    stream.write_all(&render_request(method, path, body))?;
    stream.flush()?;
    read_response(stream)
}

pub fn read_response<R: Read>(r: &mut R) -> Result<Response, HttpError> {
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(HttpError::TooLarge { limit: MAX_HEAD });
        }
        let n = r.read(&mut chunk)?;
        if n == 0 {
            return Err(HttpError::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    if !version.starts_with("HTTP/1.") {
        return Err(HttpError::Malformed(status_line.chars().take(80).collect()));
    }
    let status: u16 = code
        .parse()
        .map_err(|_| HttpError::Malformed(status_line.chars().take(80).collect()))?;
    let mut length = 0usize;
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            return Err(HttpError::Malformed(line.chars().take(80).collect()));
        };
        if k.trim().eq_ignore_ascii_case("content-length") {
            length = v
                .trim()
                .parse()
                .map_err(|_| HttpError::Malformed(line.chars().take(80).collect()))?;
        }
        if k.trim().eq_ignore_ascii_case("transfer-encoding") {
            return Err(HttpError::Malformed(format!("unsupported {}", line.trim())));
        }
    }
    if length > MAX_BODY {
        return Err(HttpError::TooLarge { limit: MAX_BODY });
    }
    let mut body = buf.split_off(head_end + 4);
    body.truncate(length);
    while body.len() < length {
        let want = (length - body.len()).min(chunk.len());
        let n = r.read(&mut chunk[..want])?;
        if n == 0 {
            return Err(HttpError::Closed);
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Response { status, body })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    /// A transport that reads canned bytes and keeps what is written.
    struct Duplex {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn duplex(reply: &[u8]) -> Duplex {
        Duplex {
            input: Cursor::new(reply.to_vec()),
            output: Vec::new(),
        }
    }

    #[test]
    fn render_request_put_with_body_golden() {
        let out = render_request("PUT", "/api/v1/vm.create", Some(b"{}"));

        assert_eq!(
            String::from_utf8(out).unwrap(),
            "PUT /api/v1/vm.create HTTP/1.1\r\nHost: localhost\r\nAccept: application/json\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        );
    }

    #[test]
    fn exchange_no_content_reply_is_204() {
        let mut s = duplex(b"HTTP/1.1 204 \r\nServer: Cloud Hypervisor API\r\nConnection: keep-alive\r\n\r\n");

        let r = exchange(&mut s, "PUT", "/api/v1/vm.boot", None).unwrap();

        assert_eq!(
            r,
            Response {
                status: 204,
                body: vec![]
            }
        );
        assert!(String::from_utf8_lossy(&s.output).contains("Content-Length: 0"));
    }

    #[test]
    fn exchange_error_reply_body_read_by_length() {
        let body = br#"["Error from API","The VM info is not available","VM is not created"]"#;
        let mut reply = format!(
            "HTTP/1.1 404 \r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        reply.extend_from_slice(body);
        reply.extend_from_slice(b"trailing bytes of another reply");
        let mut s = duplex(&reply);

        let r = exchange(&mut s, "GET", "/api/v1/vm.info", None).unwrap();

        assert_eq!((r.status, r.body.as_slice()), (404, &body[..]));
    }

    #[test]
    fn read_response_truncated_body_is_closed() {
        let mut s = duplex(b"HTTP/1.1 200 \r\nContent-Length: 10\r\n\r\nabc");

        assert!(matches!(read_response(&mut s), Err(HttpError::Closed)));
    }

    #[test]
    fn read_response_huge_length_is_refused() {
        let mut s = duplex(b"HTTP/1.1 200 \r\nContent-Length: 99999999999\r\n\r\n");

        assert!(matches!(read_response(&mut s), Err(HttpError::TooLarge { .. })));
    }

    #[test]
    fn read_response_endless_head_is_refused() {
        let mut s = duplex(&vec![b'a'; MAX_HEAD * 2]);

        assert!(matches!(read_response(&mut s), Err(HttpError::TooLarge { .. })));
    }

    #[test]
    fn read_response_not_http_is_malformed() {
        let mut s = duplex(b"SSH-2.0-OpenSSH\r\n\r\n");

        assert!(matches!(read_response(&mut s), Err(HttpError::Malformed(_))));
    }

    #[test]
    fn read_response_chunked_is_refused() {
        let mut s = duplex(b"HTTP/1.1 200 \r\nTransfer-Encoding: chunked\r\n\r\n");

        assert!(matches!(read_response(&mut s), Err(HttpError::Malformed(_))));
    }
}
