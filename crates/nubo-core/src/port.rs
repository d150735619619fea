//! Port forwards from the host to the guest (`--publish [HOST_IP:]HOST_PORT:GUEST_PORT[/tcp|udp]`,
//! a manifest's `ports:`), parsed strictly: one syntax, written back as it reads, so a record and
//! a manifest hold the same text.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The longest forward text accepted (`255.255.255.255:65535:65535/tcp` is 31 bytes).
const MAX_LEN: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// One forward: `host_ip:host_port` on the host reaches `guest_port` in the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PortForward {
    /// Where the host listens; 127.0.0.1 unless the user names another address.
    pub host_ip: Ipv4Addr,
    pub host_port: u16,
    pub guest_port: u16,
    pub protocol: Protocol,
}

/// Why a forward's text was refused; the message names the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("port forward `{text}` {why}")]
pub struct PortError {
    text: String,
    why: String,
}

impl PortForward {
    /// `[HOST_IP:]HOST_PORT:GUEST_PORT[/tcp|udp]`: ports 1–65535, an IPv4 host address
    /// (127.0.0.1 when left out), tcp when no protocol is given. Nothing else is accepted:
    /// no ranges, no names, no spaces.
    pub fn parse(text: &str) -> Result<PortForward, PortError> {
        let err = |why: &str| PortError {
            text: crate::file::escape_control(&text.chars().take(MAX_LEN).collect::<String>()),
            why: why.to_owned(),
        };
        const FORM: &str = "write [HOST_IP:]HOST_PORT:GUEST_PORT[/tcp|udp], e.g. 8080:80 or 127.0.0.1:5353:53/udp";
        if text.len() > MAX_LEN {
            return Err(err(&format!("is longer than {MAX_LEN} bytes: {FORM}")));
        }
        let (addr, protocol) = match text.split_once('/') {
            None => (text, Protocol::Tcp),
            Some((a, "tcp")) => (a, Protocol::Tcp),
            Some((a, "udp")) => (a, Protocol::Udp),
            Some(_) => return Err(err("names a protocol other than tcp or udp: end it with /tcp or /udp")),
        };
        let parts: Vec<&str> = addr.split(':').collect();
        let (host_ip, host, guest) = match parts.as_slice() {
            [h, g] => (Ipv4Addr::LOCALHOST, *h, *g),
            [ip, h, g] => {
                let ip = ip.parse::<Ipv4Addr>().map_err(|_| {
                    err("has a host address that is not an IPv4 address: give one such as 127.0.0.1, or leave it out")
                })?;
                (ip, *h, *g)
            }
            _ => return Err(err(&format!("is not in the form {FORM}"))),
        };
        let port = |s: &str, which: &str| -> Result<u16, PortError> {
            let ok = !s.is_empty() && s.len() <= 5 && s.bytes().all(|b| b.is_ascii_digit());
            match s.parse::<u16>() {
                Ok(p) if ok && p > 0 => Ok(p),
                _ => Err(err(&format!(
                    "has {which} port `{s}`, not a number from 1 to 65535: {FORM}"
                ))),
            }
        };
        Ok(PortForward {
            host_ip,
            host_port: port(host, "host")?,
            guest_port: port(guest, "guest")?,
            protocol,
        })
    }
}

impl fmt::Display for PortForward {
    /// Always in full, `127.0.0.1:8080:80/tcp`, which parses back to the same forward.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}/{}",
            self.host_ip,
            self.host_port,
            self.guest_port,
            self.protocol.as_str()
        )
    }
}

impl FromStr for PortForward {
    type Err = PortError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PortForward::parse(s)
    }
}

impl Serialize for PortForward {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PortForward {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        PortForward::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_two_parts_defaults_loopback_tcp() {
        let p = PortForward::parse("8080:80").unwrap();

        assert_eq!(
            p,
            PortForward {
                host_ip: Ipv4Addr::LOCALHOST,
                host_port: 8080,
                guest_port: 80,
                protocol: Protocol::Tcp
            }
        );
    }

    #[test]
    fn parse_address_and_udp_kept() {
        let p = PortForward::parse("0.0.0.0:5353:53/udp").unwrap();

        assert_eq!(p.host_ip, Ipv4Addr::UNSPECIFIED);
        assert_eq!((p.host_port, p.guest_port, p.protocol), (5353, 53, Protocol::Udp));
    }

    #[test]
    fn display_round_trips() {
        let p = PortForward::parse("2222:22/tcp").unwrap();

        assert_eq!(p.to_string(), "127.0.0.1:2222:22/tcp");
        assert_eq!(PortForward::parse(&p.to_string()).unwrap(), p);
    }

    #[test]
    fn parse_malformed_refused_with_form() {
        for bad in [
            "",
            "80",
            "0:80",
            "80:0",
            "65536:80",
            "8080:80/sctp",
            "8080-8090:80",
            "+80:80",
            " 80:80",
            "localhost:80:80",
            "::1:80:80",
            "1.2.3.4:5:6:7",
            "80:80/",
            "00000080:80",
            "8080:80\n",
        ] {
            let err = PortForward::parse(bad);

            assert!(err.is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn parse_error_names_text_and_fix() {
        let err = PortForward::parse("80:http").unwrap_err().to_string();

        assert!(err.contains("`80:http`") && err.contains("1 to 65535"), "{err}");
    }

    #[test]
    fn parse_long_input_bounded() {
        let err = PortForward::parse(&"9".repeat(10_000)).unwrap_err().to_string();

        assert!(err.len() < 300, "{err}");
    }

    #[test]
    fn serde_is_the_text() {
        let p: PortForward = serde_json::from_str("\"8080:80\"").unwrap();

        assert_eq!(serde_json::to_string(&p).unwrap(), "\"127.0.0.1:8080:80/tcp\"");
        assert!(serde_json::from_str::<PortForward>("\"80\"").is_err());
    }
}
