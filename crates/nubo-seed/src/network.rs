//! A generated network-config (version 2) for the common case: DHCP on the NIC with a known MAC.
//! Matching by MAC, not by interface name, because names differ between guest kernels and
//! machine types (`ens3`, `enp0s2`, `eth0`) while the MAC is what the VMM was told.

use crate::error::SeedError;

fn checked_mac(mac: &str) -> Result<String, SeedError> {
    let octets: Vec<&str> = mac.split(':').collect();
    let valid = octets.len() == 6
        && octets
            .iter()
            .all(|o| o.len() == 2 && o.chars().all(|c| c.is_ascii_hexdigit()));
    if !valid {
        return Err(SeedError::InvalidMac { mac: mac.to_owned() });
    }
    Ok(mac.to_ascii_lowercase())
}

/// `version: 2` with one ethernet matched by `mac` and configured by DHCPv4 and DHCPv6 RAs.
pub fn render_network_config_dhcp(mac: &str) -> Result<Vec<u8>, SeedError> {
    let mac = checked_mac(mac)?;
    Ok(format!(
        "version: 2\nethernets:\n  nic0:\n    match:\n      macaddress: \"{mac}\"\n    dhcp4: true\n    dhcp6: true\n"
    )
    .into_bytes())
}

/// `version: 2` with one ethernet matched by `mac` and a static `address` (`a.b.c.d/prefix`)
/// and default route via `gateway`: for networks without a DHCP server, where the host
/// computed the guest's address (Cloud Hypervisor's tap on nubo's bridge).
pub fn render_network_config_static(mac: &str, address: &str, gateway: &str) -> Result<Vec<u8>, SeedError> {
    let mac = checked_mac(mac)?;
    let bad = || SeedError::InvalidAddress {
        address: format!("{address} via {gateway}"),
    };
    let (ip, prefix) = address.split_once('/').ok_or_else(bad)?;
    let ip: std::net::Ipv4Addr = ip.parse().map_err(|_| bad())?;
    let prefix: u8 = prefix.parse().ok().filter(|p| (1..=32).contains(p)).ok_or_else(bad)?;
    let gateway: std::net::Ipv4Addr = gateway.parse().map_err(|_| bad())?;
    Ok(format!(
        "version: 2\nethernets:\n  nic0:\n    match:\n      macaddress: \"{mac}\"\n    dhcp4: false\n    dhcp6: false\n    addresses:\n      - \"{ip}/{prefix}\"\n    routes:\n      - to: \"0.0.0.0/0\"\n        via: \"{gateway}\"\n"
    )
    .into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_network_config_static_golden() {
        let out = render_network_config_static("52:54:00:67:89:AD", "10.237.137.173/16", "10.237.0.1").unwrap();

        let want = "version: 2\nethernets:\n  nic0:\n    match:\n      macaddress: \"52:54:00:67:89:ad\"\n    dhcp4: false\n    dhcp6: false\n    addresses:\n      - \"10.237.137.173/16\"\n    routes:\n      - to: \"0.0.0.0/0\"\n        via: \"10.237.0.1\"\n";
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn render_network_config_static_output_is_valid_network_config() {
        let out = render_network_config_static("52:54:00:12:34:56", "10.237.52.86/16", "10.237.0.1").unwrap();

        crate::validate_network_config(&out).unwrap();
        let docs = yaml_rust2::YamlLoader::load_from_str(std::str::from_utf8(&out).unwrap()).unwrap();
        assert_eq!(
            docs[0]["ethernets"]["nic0"]["addresses"][0].as_str(),
            Some("10.237.52.86/16")
        );
    }

    #[test]
    fn render_network_config_static_bad_address_is_refused() {
        for (a, g) in [
            ("10.237.0.2", "10.237.0.1"),
            ("10.237.0.2/33", "10.237.0.1"),
            ("x/16", "10.237.0.1"),
            ("10.237.0.2/16", "gw\n"),
        ] {
            let err = render_network_config_static("52:54:00:12:34:56", a, g).unwrap_err();

            assert!(matches!(err, SeedError::InvalidAddress { .. }), "{a} {g}: {err}");
        }
    }

    #[test]
    fn render_network_config_dhcp_golden() {
        let out = render_network_config_dhcp("52:54:00:AB:cd:01").unwrap();

        let want = "version: 2\nethernets:\n  nic0:\n    match:\n      macaddress: \"52:54:00:ab:cd:01\"\n    dhcp4: true\n    dhcp6: true\n";
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn render_network_config_dhcp_bad_mac_is_refused() {
        let err = render_network_config_dhcp("52:54:00:ab:cd").unwrap_err();

        assert!(err.to_string().contains("52:54:00:ab:cd"), "{err}");
    }

    #[test]
    fn render_network_config_dhcp_output_is_valid_yaml() {
        let out = render_network_config_dhcp("52:54:00:12:34:56").unwrap();

        let docs = yaml_rust2::YamlLoader::load_from_str(std::str::from_utf8(&out).unwrap()).unwrap();
        assert_eq!(
            docs[0]["ethernets"]["nic0"]["match"]["macaddress"].as_str(),
            Some("52:54:00:12:34:56")
        );
    }
}
