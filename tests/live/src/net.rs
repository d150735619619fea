//! Sockets a live test opens: a free port, an HTTP GET retried while a guest's server starts,
//! and the same from inside a network namespace (where a libvirtd the test started runs its
//! guests' user-mode forwards).

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use nix::sched::{setns, CloneFlags};

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("cannot bind a port: {e}"))?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// `GET /path` on 127.0.0.1:port, the whole reply once it is a 200; retried for 90 s while the
/// guest's server starts.
pub fn http_get_ok(port: u16, path: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    while Instant::now() < deadline {
        let attempt = || -> std::io::Result<String> {
            let mut s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(10)))?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
            let mut reply = String::new();
            s.read_to_string(&mut reply)?;
            Ok(reply)
        };
        match attempt() {
            Ok(r) if r.starts_with("HTTP/1.0 200") => return Ok(r),
            Ok(r) => last = r,
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    Err(format!("GET {path} on 127.0.0.1:{port} never answered 200: {last}"))
}

/// Runs `f` on a thread that has entered the network namespace `ns` (`ip netns add`'s
/// `/run/netns/NS`); the test's other threads stay where they are.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> Result<T, String> + Send) -> Result<T, String> {
    let path = format!("/run/netns/{ns}");
    let file = File::open(&path).map_err(|e| format!("cannot open {path}: {e}"))?;
    std::thread::scope(|s| {
        s.spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| format!("setns into {path}: {e}"))?;
            f()
        })
        .join()
        .map_err(|_| format!("the thread in network namespace {ns} panicked"))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_netns_refuses_a_namespace_that_does_not_exist() {
        let err = in_netns("nubo-no-such-namespace", || Ok(())).unwrap_err();

        assert!(err.contains("/run/netns/nubo-no-such-namespace"), "{err}");
    }

    #[test]
    fn http_get_ok_returns_the_whole_200_reply() {
        let l = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut buf = [0u8; 512];
            let n = s.read(&mut buf).unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /x HTTP/1.0\r\n"));
            s.write_all(b"HTTP/1.0 200 OK\r\n\r\nbody").unwrap();
        });

        let reply = http_get_ok(port, "/x").unwrap();

        server.join().unwrap();
        assert_eq!(reply, "HTTP/1.0 200 OK\r\n\r\nbody");
    }
}
