//! A fault-injecting TCP proxy on 127.0.0.1 between nubo and a real server: it forwards bytes
//! both ways untouched (TLS passes through end to end) and, once the client has sent a
//! threshold of bytes, cuts one connection, once: in the middle of what the client is sending
//! ([`Cut::MidRequest`]), or on the first bytes of the client's next request after the server
//! answered, none of which reach the server ([`Cut::BetweenRequests`]). The fault is fake; the
//! server is not.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    MidRequest,
    BetweenRequests,
}

pub struct CuttingProxy {
    /// `127.0.0.1:PORT` to point the client at.
    pub host: String,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
}

impl CuttingProxy {
    /// Forwards to `upstream` (`host:port`); the connection carrying client byte number
    /// `cut_after` (counted over all connections) is closed both ways.
    pub fn start(upstream: &str, cut_after: u64, how: Cut) -> Result<CuttingProxy, String> {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("proxy: cannot listen: {e}"))?;
        let host = format!("127.0.0.1:{}", listener.local_addr().map_err(|e| e.to_string())?.port());
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let upstream = upstream.to_owned();
        let (c, s) = (cut.clone(), stop.clone());
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = conn else { continue };
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let (c, sent) = (c.clone(), sent.clone());
                thread::spawn(move || {
                    let _ = relay(client, server, &c, &sent, cut_after, how);
                });
            }
        });
        Ok(CuttingProxy { host, cut, stop })
    }

    /// Whether the cut happened.
    pub fn did_cut(&self) -> bool {
        self.cut.load(Ordering::SeqCst)
    }
}

impl Drop for CuttingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(&self.host);
    }
}

fn relay(
    client: TcpStream,
    server: TcpStream,
    cut: &AtomicBool,
    sent: &AtomicU64,
    cut_after: u64,
    how: Cut,
) -> io::Result<()> {
    let (mut c_read, mut s_write) = (client.try_clone()?, server.try_clone()?);
    let (mut s_read, mut c_write) = (server.try_clone()?, client.try_clone()?);
    // Whether the server sent anything since the client last did: the client's next bytes
    // start a new request.
    let answered = Arc::new(AtomicBool::new(false));
    let a = answered.clone();
    let back = thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        while let Ok(n) = s_read.read(&mut buf) {
            if n == 0 {
                break;
            }
            a.store(true, Ordering::SeqCst);
            if c_write.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_write.shutdown(Shutdown::Write);
    });
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = c_read.read(&mut buf)?;
        if n == 0 {
            let _ = s_write.shutdown(Shutdown::Write);
            break;
        }
        let before = sent.fetch_add(n as u64, Ordering::SeqCst);
        let new_request = answered.swap(false, Ordering::SeqCst);
        if how == Cut::BetweenRequests && before >= cut_after && new_request && !cut.swap(true, Ordering::SeqCst) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            break;
        }
        if how == Cut::MidRequest && before + n as u64 > cut_after && !cut.swap(true, Ordering::SeqCst) {
            // Forward what fits below the threshold, then cut this connection both ways.
            let keep = cut_after.saturating_sub(before) as usize;
            let _ = s_write.write_all(&buf[..keep]);
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
            break;
        }
        s_write.write_all(&buf[..n])?;
    }
    let _ = back.join();
    Ok(())
}
