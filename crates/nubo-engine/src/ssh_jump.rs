//! `nubo vm ssh --jump [USER@]HOST[:PORT]`: the host SSH goes through (`ssh -J`) to reach a
//! guest whose address only that host can reach (a VM on a remote libvirt host's network).
//! The value is hostile input handed to `ssh`: it is parsed into a user, a host and a port,
//! each checked, and given back in one canonical form, so it can never be read as an option
//! (`-oProxyCommand=...`), a second jump (`a,b`) or an `ssh://` URI.

use std::fmt;
use std::net::Ipv6Addr;

/// A parsed, checked jump host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JumpHost {
    pub user: Option<String>,
    /// A DNS name, an IPv4 address, or an IPv6 address (without brackets).
    pub host: String,
    pub port: Option<u16>,
}

/// Why a `--jump` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--jump `{shown}` is not [USER@]HOST[:PORT]: {why}")]
pub struct JumpError {
    shown: String,
    why: String,
}

const MAX_LEN: usize = 255;

impl JumpHost {
    pub fn parse(s: &str) -> Result<JumpHost, JumpError> {
        let err = |why: &str| JumpError {
            shown: s.chars().take(64).flat_map(char::escape_default).collect(),
            why: why.to_owned(),
        };
        if s.is_empty() || s.len() > MAX_LEN {
            return Err(err("give a host name or address of at most 255 characters"));
        }
        if s.starts_with('-') {
            return Err(err("it starts with `-`, which ssh would read as an option"));
        }
        let (user, rest) = match s.rsplit_once('@') {
            Some((u, r)) => (Some(u), r),
            None => (None, s),
        };
        if let Some(u) = user {
            let ok = !u.is_empty()
                && u.len() <= 32
                && !u.starts_with(['-', '.'])
                && u.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if !ok {
                return Err(err(
                    "the user must be letters, digits, `_`, `.` or `-` (at most 32, not starting with `-` or `.`)",
                ));
            }
        }
        let (host, port) = if let Some(r) = rest.strip_prefix('[') {
            let (h, tail) = r
                .split_once(']')
                .ok_or_else(|| err("an IPv6 address in brackets needs its closing `]`"))?;
            h.parse::<Ipv6Addr>()
                .map_err(|_| err("the address in brackets is not an IPv6 address"))?;
            let port = match tail {
                "" => None,
                t => Some(t.strip_prefix(':').ok_or_else(|| err("only `:PORT` may follow `]`"))?),
            };
            (h, port)
        } else {
            match rest.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (rest, None),
            }
        };
        let port = port
            .map(|p| match p.parse::<u16>() {
                Ok(n) if n > 0 && p.chars().all(|c| c.is_ascii_digit()) => Ok(n),
                _ => Err(err("the port must be a number from 1 to 65535")),
            })
            .transpose()?;
        if !rest.starts_with('[') && !valid_host(host) {
            return Err(err(
                "the host must be a DNS name (letters, digits, `-`, labels joined by `.`) or an IP address",
            ));
        }
        Ok(JumpHost {
            user: user.map(str::to_owned),
            host: host.to_owned(),
            port,
        })
    }
}

fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// The canonical form handed to `ssh -J`.
impl fmt::Display for JumpHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(u) = &self.user {
            write!(f, "{u}@")?;
        }
        if self.host.contains(':') {
            write!(f, "[{}]", self.host)?;
        } else {
            write!(f, "{}", self.host)?;
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jump_parse_each_good_form_round_trips() {
        for s in [
            "bastion",
            "root@10.250.77.1",
            "ops@host.example:2222",
            "[fe80::1]",
            "u@[2001:db8::2]:22",
            "a-b.c-d",
        ] {
            let j = JumpHost::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!(j.to_string(), s);
        }
        let j = JumpHost::parse("ops@host:2222").unwrap();
        assert_eq!(j.user.as_deref(), Some("ops"));
        assert_eq!((j.host.as_str(), j.port), ("host", Some(2222)));
    }

    #[test]
    fn jump_parse_hostile_values_are_refused() {
        for s in [
            "",
            "-oProxyCommand=touch /tmp/x",
            "-J",
            "a,b",
            "ssh://host",
            "host:0",
            "host:65536",
            "host:+22",
            "host:22:23",
            "u@",
            "@host",
            "-u@host",
            "u;rm@host",
            "host name",
            "host\n-o x",
            "[::1",
            "[notv6]",
            "[::1]x",
            "h$(id)",
            "-host",
            "host-",
            "a..b",
            &"a".repeat(300),
        ] {
            assert!(JumpHost::parse(s).is_err(), "{s:?} was accepted");
        }
    }

    #[test]
    fn jump_error_names_flag_and_shape_escaped() {
        let e = JumpHost::parse("x\ny:0").unwrap_err().to_string();
        assert!(e.starts_with("--jump `x\\ny:0` is not [USER@]HOST[:PORT]: "), "{e}");
        assert!(!e.contains('\n'));
    }
}
