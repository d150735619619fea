//! The authority of a remote URI: a user, a host and a port, each to a strict grammar, so
//! nothing in it can be read by ssh as an option or by libvirt as anything but a name.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// RFC 1035's limits: 253 characters in all, 63 per label.
const MAX_HOSTNAME: usize = 253;
const MAX_LABEL: usize = 63;
/// POSIX user names nubo accepts elsewhere (`ssh_user`) are at most 32 bytes.
const MAX_USER: usize = 32;

/// A remote host: a DNS name or an address literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    V4(Ipv4Addr),
    V6(Ipv6Addr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::V4(a) => write!(f, "{a}"),
            Host::V6(a) => write!(f, "[{a}]"),
        }
    }
}

/// `USER` of `USER@HOST`: `[A-Za-z_][A-Za-z0-9_.-]{0,31}`; never a password (`user:secret`).
pub(super) fn check_user(u: &str) -> Result<(), String> {
    if u.contains(':') {
        return Err("carries a password in its user part (`user:password@`): drop it, ssh asks or uses keys".into());
    }
    let first_ok = u.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    let rest_ok = u
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if u.is_empty() || u.len() > MAX_USER || !first_ok || !rest_ok {
        return Err(format!(
            "has the user `{}`: a user name is 1 to {MAX_USER} letters, digits, `_`, `.` and `-`, starting with a letter or `_`",
            u.escape_debug()
        ));
    }
    Ok(())
}

/// `HOST[:PORT]`, HOST a DNS name, an IPv4 address or `[IPv6]`.
pub(super) fn parse_host_port(s: &str) -> Result<(Host, Option<u16>), String> {
    if s.is_empty() {
        return Err("names no host: write `HOST` between `//` and `/system`".into());
    }
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return Err("has an unclosed `[` in its host".into());
        };
        let addr: Ipv6Addr = v6
            .parse()
            .map_err(|_| format!("has `[{}]`, which is not an IPv6 address", v6.escape_debug()))?;
        let port = match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(p) => Some(port(p)?),
                None => return Err("has text after its `]`: write `[ADDRESS]:PORT`".into()),
            },
        };
        (Host::V6(addr), port)
    } else {
        let (h, p) = match s.split_once(':') {
            Some((h, p)) => (h, Some(port(p)?)),
            None => (s, None),
        };
        (host(h)?, p)
    };
    Ok((host, port))
}

fn port(p: &str) -> Result<u16, String> {
    let bad = || {
        format!(
            "has the port `{}`: a port is a number from 1 to 65535",
            p.escape_debug()
        )
    };
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) || p.starts_with('0') {
        return Err(bad());
    }
    p.parse::<u16>().map_err(|_| bad())
}

fn host(h: &str) -> Result<Host, String> {
    // All digits and dots: an IPv4 address, or nothing (`1.2.3` and `010.0.0.1` are refused,
    // as C resolvers read them differently).
    if h.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return match h.parse::<Ipv4Addr>() {
            Ok(a) => Ok(Host::V4(a)),
            Err(_) => Err(format!(
                "has the host `{}`, which is not an IPv4 address",
                h.escape_debug()
            )),
        };
    }
    let bad = |why: String| Err(format!("has the host `{}`, {why}", h.escape_debug()));
    if h.len() > MAX_HOSTNAME {
        return bad(format!("{} characters long, over DNS's {MAX_HOSTNAME}", h.len()));
    }
    for label in h.split('.') {
        if label.is_empty() {
            return bad("with an empty label (leading, trailing or doubled `.`)".into());
        }
        if label.len() > MAX_LABEL {
            return bad(format!("with a label over DNS's {MAX_LABEL} characters"));
        }
        if let Some(c) = label.chars().find(|c| !(c.is_ascii_alphanumeric() || *c == '-')) {
            return bad(format!(
                "which holds `{}`: a host name has letters, digits, `-` and `.`",
                c.escape_debug()
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("with a label that starts or ends with `-`".into());
        }
    }
    Ok(Host::Name(h.to_owned()))
}
