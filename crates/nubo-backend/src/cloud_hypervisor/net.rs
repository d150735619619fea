//! The guest's network: a tap device on the host bridge [`BRIDGE`], with the guest's address
//! computed from its MAC, so nubo needs no DHCP server: the address goes into the seed's
//! network-config (matched by MAC) and `nubo vm ip` shows it, marked as predicted.
//!
//! The pure half (MAC, tap name, address) is unit-tested; the driver half runs `ip` from
//! iproute2 and needs CAP_NET_ADMIN, which `check` verifies before anything is made.
//! nubo adds no NAT and no forwarding: the guest reaches the host (and other nubo guests) on
//! the bridge, nothing else unless the host's administrator routes it.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

use crate::{AddressCheck, BackendError};

pub const BRIDGE: &str = "nubo0";
/// The bridge's own address, the guests' gateway; guests get 10.237.0.2 to 10.237.255.254.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 237, 0, 1);
pub const PREFIX: u8 = 16;
/// The tap name's prefix; the rest is the VM's UUID, so names are unique and fit IFNAMSIZ (15).
const TAP_PREFIX: &str = "nt";
/// Bit 12 of the capability sets: CAP_NET_ADMIN.
const CAP_NET_ADMIN: u32 = 12;

fn hex_digits(uuid: &str) -> String {
    uuid.chars()
        .filter(char::is_ascii_hexdigit)
        .collect::<String>()
        .to_ascii_lowercase()
}

/// `nt` + the UUID's first 12 hex digits: 14 bytes, inside IFNAMSIZ.
pub fn tap_name(uuid: &str) -> String {
    let h = hex_digits(uuid);
    format!("{TAP_PREFIX}{}", &h[..h.len().min(12)])
}

/// A locally administered MAC (QEMU's 52:54:00 prefix) whose last two bytes are the guest's
/// host number on the bridge, 2..=65534, derived from the UUID. Pure.
pub fn mac_for(uuid: &str) -> String {
    let h = hex_digits(uuid);
    let tail = &h[h.len().saturating_sub(6)..];
    let raw = u32::from_str_radix(if tail.is_empty() { "0" } else { tail }, 16).unwrap_or(0);
    let b3 = (raw >> 16) as u8;
    let host = 2 + (raw & 0xffff) % 0xfffd;
    format!("52:54:00:{b3:02x}:{:02x}:{:02x}", host >> 8, host & 0xff)
}

/// The address a guest with `mac` gets on the bridge: 10.237.<byte 5>.<byte 6>. `None` for a
/// MAC that is not one of [`mac_for`]'s (or names the network, the gateway or broadcast).
pub fn predicted_address(mac: &str) -> Option<Ipv4Addr> {
    let b: Vec<u8> = mac
        .split(':')
        .map(|o| u8::from_str_radix(o, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    if b.len() != 6 || b[..3] != [0x52, 0x54, 0x00] {
        return None;
    }
    let host = u16::from(b[4]) << 8 | u16::from(b[5]);
    (2..=0xfffe).contains(&host).then(|| Ipv4Addr::new(10, 237, b[4], b[5]))
}

/// Whether `/proc/self/status` text grants CAP_NET_ADMIN in the effective set. Pure.
pub fn has_net_admin(proc_status: &str) -> bool {
    proc_status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_NET_ADMIN) != 0)
}

/// `has_net_admin` for this process.
pub fn can_admin_network() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| has_net_admin(&s))
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `ip` ({e}): install the iproute2 package"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn net_err(what: String, detail: String) -> BackendError {
    BackendError::Remote {
        what,
        detail: format!("{detail} (creating bridges and taps needs CAP_NET_ADMIN)"),
    }
}

/// Makes the bridge (if missing) and the VM's tap on it. Converges: a tap left by an
/// interrupted create is replaced.
pub fn create_tap(tap: &str) -> Result<(), BackendError> {
    if ip(&["link", "show", "dev", BRIDGE]).is_err() {
        match ip(&["link", "add", "name", BRIDGE, "type", "bridge"]) {
            Err(e) if !e.contains("File exists") => return Err(net_err(format!("creating bridge {BRIDGE}"), e)),
            _ => {}
        }
        let cidr = format!("{GATEWAY}/{PREFIX}");
        match ip(&["addr", "add", &cidr, "dev", BRIDGE]) {
            Err(e) if !e.contains("File exists") => {
                return Err(net_err(format!("addressing bridge {BRIDGE} with {cidr}"), e))
            }
            _ => {}
        }
        ip(&["link", "set", "dev", BRIDGE, "up"]).map_err(|e| net_err(format!("bringing bridge {BRIDGE} up"), e))?;
    }
    let _ = delete_tap(tap);
    ip(&["tuntap", "add", "dev", tap, "mode", "tap"]).map_err(|e| net_err(format!("creating tap {tap}"), e))?;
    ip(&["link", "set", "dev", tap, "master", BRIDGE, "up"])
        .map_err(|e| net_err(format!("attaching tap {tap} to bridge {BRIDGE}"), e))
}

/// Deletes the VM's tap; one already gone is success.
pub fn delete_tap(tap: &str) -> Result<(), BackendError> {
    match ip(&["link", "del", "dev", tap]) {
        Err(e) if !e.contains("Cannot find device") && !e.contains("does not exist") => {
            Err(net_err(format!("deleting tap {tap}"), e))
        }
        _ => Ok(()),
    }
}

/// Whether the host's ARP table (`/proc/net/arp` text) maps `addr` to `mac`: the guest has
/// used its predicted address. Pure.
pub fn arp_confirms(arp_table: &str, addr: Ipv4Addr, mac: &str) -> bool {
    let addr = addr.to_string();
    arp_table.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() >= 4 && f[0] == addr && f[3].eq_ignore_ascii_case(mac)
    })
}

/// The interface the host's IPv4 routing table (`/proc/net/route` text) sends `addr` through:
/// the longest matching prefix among routes that are up. Pure. The kernel prints each address
/// as the hex of its network-order bytes read as a native `u32`.
pub fn route_iface(routes: &str, addr: Ipv4Addr) -> Option<String> {
    const RTF_UP: u32 = 0x1;
    let want = u32::from_ne_bytes(addr.octets());
    routes
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let hex = |i: usize| f.get(i).and_then(|v| u32::from_str_radix(v, 16).ok());
            let (dest, flags, mask) = (hex(1)?, hex(3)?, hex(7)?);
            (flags & RTF_UP != 0 && want & mask == dest & mask).then(|| (mask.count_ones(), f[0].to_owned()))
        })
        .max_by_key(|(bits, _)| *bits)
        .map(|(_, iface)| iface)
}

/// What the host can tell of the guest's predicted address `addr` (MAC `mac`) from its routing
/// and ARP tables: seen (a neighbour entry with the VM's MAC), not seen, or why it cannot
/// tell from here (no route to the bridge's network in this network namespace, or a route
/// through another interface). Pure.
pub fn address_check(routes: &str, arp: &str, addr: Ipv4Addr, mac: &str) -> AddressCheck {
    match route_iface(routes, addr) {
        None => AddressCheck::Unverifiable(format!(
            "this host has no route to {addr}: bridge {BRIDGE} is not in this network namespace (it lives where the VM was created; run nubo there)"
        )),
        Some(iface) if iface != BRIDGE => AddressCheck::Unverifiable(format!(
            "this host routes {addr} through {iface}, not bridge {BRIDGE}: another network uses {GATEWAY}/{PREFIX}"
        )),
        Some(_) if arp_confirms(arp, addr, mac) => AddressCheck::Seen(format!(
            "the host's neighbour table holds {addr} at {mac} on bridge {BRIDGE}"
        )),
        Some(_) => AddressCheck::NotSeen,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "5e1b9f7c-1d2e-4f00-8a9b-0123456789ab";

    #[test]
    fn tap_name_fits_ifnamsiz() {
        let t = tap_name(UUID);

        assert_eq!(t, "nt5e1b9f7c1d2e");
        assert!(t.len() <= 15);
    }

    #[test]
    fn mac_for_golden_and_predicted_address_round_trips() {
        let mac = mac_for(UUID);

        assert_eq!(mac, "52:54:00:67:89:ad");
        assert_eq!(predicted_address(&mac), Some(Ipv4Addr::new(10, 237, 0x89, 0xad)));
    }

    #[test]
    fn mac_for_never_gives_gateway_or_broadcast() {
        for tail in ["000000", "000001", "00ffff", "00fffe", "ffffff"] {
            let mac = mac_for(&format!("00000000-0000-0000-0000-000000{tail}"));

            assert!(predicted_address(&mac).is_some(), "{tail} -> {mac}");
        }
    }

    #[test]
    fn predicted_address_foreign_or_reserved_mac_is_none() {
        assert_eq!(predicted_address("02:00:00:00:12:34"), None);
        assert_eq!(predicted_address("52:54:00:00:00:01"), None);
        assert_eq!(predicted_address("52:54:00:00:ff:ff"), None);
        assert_eq!(predicted_address("not a mac"), None);
    }

    #[test]
    fn has_net_admin_reads_capeff_bit_12() {
        assert!(has_net_admin("Name:\tx\nCapEff:\t000001ffffffffff\n"));
        assert!(!has_net_admin("CapEff:\t0000000000000000\n"));
        assert!(!has_net_admin("no caps here"));
    }

    #[test]
    fn arp_confirms_matching_line() {
        let table = "IP address       HW type     Flags       HW address            Mask     Device\n10.237.137.173   0x1         0x2         52:54:00:67:89:ad     *        nubo0\n";

        assert!(arp_confirms(
            table,
            Ipv4Addr::new(10, 237, 137, 173),
            "52:54:00:67:89:AD"
        ));
        assert!(!arp_confirms(table, Ipv4Addr::new(10, 237, 0, 2), "52:54:00:67:89:ad"));
    }

    /// A namespace with the bridge up (10.237.0.0/16 on nubo0) and a default route via eth0.
    const ROUTES: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
eth0\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
nubo0\t0000ED0A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n";
    const ARP: &str = "IP address       HW type     Flags       HW address            Mask     Device\n10.237.137.173   0x1         0x2         52:54:00:67:89:ad     *        nubo0\n";

    #[test]
    fn route_iface_longest_prefix_wins() {
        assert_eq!(
            route_iface(ROUTES, Ipv4Addr::new(10, 237, 137, 173)).as_deref(),
            Some("nubo0")
        );
        assert_eq!(
            route_iface(ROUTES, Ipv4Addr::new(192, 0, 2, 1)).as_deref(),
            Some("eth0")
        );
        assert_eq!(route_iface("Iface\n", Ipv4Addr::new(10, 237, 0, 2)), None);
    }

    #[test]
    fn address_check_neighbour_entry_is_seen() {
        let c = address_check(ROUTES, ARP, Ipv4Addr::new(10, 237, 137, 173), "52:54:00:67:89:ad");

        assert!(
            matches!(c, AddressCheck::Seen(ref e) if e.contains("neighbour")),
            "{c:?}"
        );
    }

    #[test]
    fn address_check_bridge_route_without_entry_is_not_seen() {
        let c = address_check(ROUTES, "", Ipv4Addr::new(10, 237, 137, 173), "52:54:00:67:89:ad");

        assert_eq!(c, AddressCheck::NotSeen);
    }

    #[test]
    fn address_check_without_bridge_is_unverifiable_saying_why() {
        let only_default = ROUTES.lines().take(2).collect::<Vec<_>>().join("\n");
        let none = address_check("Iface\n", ARP, Ipv4Addr::new(10, 237, 137, 173), "52:54:00:67:89:ad");
        let other = address_check(
            &only_default,
            ARP,
            Ipv4Addr::new(10, 237, 137, 173),
            "52:54:00:67:89:ad",
        );

        assert!(
            matches!(none, AddressCheck::Unverifiable(ref w) if w.contains("no route") && w.contains("nubo0")),
            "{none:?}"
        );
        assert!(
            matches!(other, AddressCheck::Unverifiable(ref w) if w.contains("through eth0")),
            "{other:?}"
        );
    }
}
