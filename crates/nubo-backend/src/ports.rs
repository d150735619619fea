//! Host ports published to the guest ([`MachineSpec::ports`](crate::MachineSpec::ports)): the
//! bind probe that refuses a taken port before a VM is made or booted, and the words `vm ls`
//! shows.

use std::net::{TcpListener, UdpSocket};

use nubo_core::{PortForward, Protocol};

use crate::BackendError;

/// Binds each forward's host socket for a moment, as the VMM will: a port another program
/// holds (or one this user may not bind, or an address that is not this host's) is refused
/// here, naming the forward, instead of failing inside the VMM.
pub fn check_free(ports: &[PortForward]) -> Result<(), BackendError> {
    for p in ports {
        let addr = (p.host_ip, p.host_port);
        let bound = match p.protocol {
            Protocol::Tcp => TcpListener::bind(addr).map(drop),
            Protocol::Udp => UdpSocket::bind(addr).map(drop),
        };
        if let Err(e) = bound {
            let fix = match e.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "another program (or VM) listens there: stop it, or publish another host port"
                }
                std::io::ErrorKind::PermissionDenied => "ports below 1024 need privileges: publish a port above 1023",
                std::io::ErrorKind::AddrNotAvailable => {
                    "the address is not one of this host's: give 127.0.0.1 or an address the host has"
                }
                _ => "publish another host port",
            };
            return Err(BackendError::InvalidSpec(format!(
                "host port {}:{}/{} of forward {p} cannot be bound ({e}): {fix}",
                p.host_ip,
                p.host_port,
                p.protocol.as_str()
            )));
        }
    }
    Ok(())
}

/// `127.0.0.1:8080->80/tcp`, as `docker ps` shows a published port.
pub fn shown(p: &PortForward) -> String {
    format!(
        "{}:{}->{}/{}",
        p.host_ip,
        p.host_port,
        p.guest_port,
        p.protocol.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_free_taken_tcp_port_refused_by_name() {
        let held = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = held.local_addr().unwrap().port();
        let fwd = PortForward::parse(&format!("{port}:80")).unwrap();

        let err = check_free(&[fwd]).unwrap_err().to_string();

        assert!(
            err.contains(&format!("127.0.0.1:{port}/tcp")) && err.contains("another host port"),
            "{err}"
        );
    }

    #[test]
    fn check_free_taken_udp_port_refused() {
        let held = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
        let port = held.local_addr().unwrap().port();
        let fwd = PortForward::parse(&format!("{port}:53/udp")).unwrap();

        assert!(check_free(&[fwd]).is_err());
    }

    #[test]
    fn check_free_free_port_accepted() {
        // A port freed here may be taken by another test before the check: a few tries.
        let mut said = Vec::new();
        for _ in 0..5 {
            let port = TcpListener::bind(("127.0.0.1", 0))
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let fwd = PortForward::parse(&format!("{port}:80")).unwrap();
            match check_free(&[fwd]) {
                Ok(()) => return,
                Err(e) => said.push(e.to_string()),
            }
        }

        panic!("five free ports refused: {said:?}");
    }

    #[test]
    fn shown_like_docker() {
        assert_eq!(shown(&PortForward::parse("8080:80").unwrap()), "127.0.0.1:8080->80/tcp");
    }
}
