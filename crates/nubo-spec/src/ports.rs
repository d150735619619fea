//! Checks of [`crate::VmSpec::ports`]: each forward was parsed strictly already
//! ([`nubo_core::PortForward`]); here, how they fit together and with the network.

use nubo_core::PortForward;

use crate::error::FieldError;
use crate::field::Field;
use crate::spec::Network;

/// More forwards than anyone publishes by hand; each is one QEMU `hostfwd` option.
pub const MAX_PORTS: usize = 64;

pub(crate) fn check(ports: &[PortForward], network: &Network, e: &mut Vec<FieldError>) {
    if ports.is_empty() {
        return;
    }
    if *network == Network::None {
        e.push(FieldError::new(
            Field::Ports,
            "forwards ports, but network is none (no network device): drop the ports, or use network forward or restricted",
        ));
    }
    if ports.len() > MAX_PORTS {
        e.push(FieldError::new(
            Field::Ports,
            format!("has {} forwards, over the limit of {MAX_PORTS}", ports.len()),
        ));
        return;
    }
    for (i, p) in ports.iter().enumerate() {
        // One host socket per (address, port, protocol); 0.0.0.0 takes the port on every address.
        let clash = ports[..i].iter().find(|q| {
            q.protocol == p.protocol
                && q.host_port == p.host_port
                && (q.host_ip == p.host_ip || q.host_ip.is_unspecified() || p.host_ip.is_unspecified())
        });
        if let Some(q) = clash {
            e.push(FieldError::at(
                Field::Ports,
                &format!("[{i}]"),
                format!("{p} takes the same host port as {q}: give each forward its own host port"),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{DiskSource, Field, Network, VmSpec};

    fn spec(ports: &[&str], network: Network) -> VmSpec {
        let mut s = VmSpec::new(
            nubo_core::VmName::parse("web").unwrap(),
            DiskSource::Image {
                reference: "debian:12".into(),
            },
        );
        s.ports = ports.iter().map(|p| p.parse().unwrap()).collect();
        s.network = network;
        s
    }

    #[test]
    fn ports_distinct_accepted() {
        let s = spec(&["8080:80", "8080:80/udp", "127.0.0.2:8080:80"], Network::Restricted);

        assert!(s.validate().is_ok());
    }

    #[test]
    fn ports_same_host_port_refused_at_index() {
        let s = spec(&["8080:80", "127.0.0.1:8080:81/tcp"], Network::Forward);

        let err = s.validate().unwrap_err();

        let e = &err.errors()[0];
        assert_eq!((e.field, e.path.as_str()), (Field::Ports, "spec.ports[1]"));
    }

    #[test]
    fn ports_unspecified_address_clashes_with_loopback() {
        let s = spec(&["0.0.0.0:8080:80", "8080:81"], Network::Forward);

        assert!(s.validate().is_err());
    }

    #[test]
    fn ports_without_network_refused() {
        let s = spec(&["8080:80"], Network::None);

        let err = s.validate().unwrap_err().to_string();

        assert!(err.contains("network is none"), "{err}");
    }

    #[test]
    fn ports_round_trip_through_json() {
        let s = spec(&["8080:80", "0.0.0.0:53:53/udp"], Network::Forward);

        let back: VmSpec = serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();

        assert_eq!(back, s);
    }
}
