//! A generated network-config (version 2) for the common case: DHCP on the NIC with a known MAC.
//! Matching by MAC, not by interface name, because names differ between guest kernels and
//! machine types (`ens3`, `enp0s2`, `eth0`) while the MAC is what the VMM was told.

use crate::error::SeedError;

/// `version: 2` with one ethernet matched by `mac` and configured by DHCPv4 and DHCPv6 RAs.
pub fn render_network_config_dhcp(mac: &str) -> Result<Vec<u8>, SeedError> {
    let octets: Vec<&str> = mac.split(':').collect();
    let valid = octets.len() == 6
        && octets
            .iter()
            .all(|o| o.len() == 2 && o.chars().all(|c| c.is_ascii_hexdigit()));
    if !valid {
        return Err(SeedError::InvalidMac { mac: mac.to_owned() });
    }
    let mac = mac.to_ascii_lowercase();
    Ok(format!(
        "version: 2\nethernets:\n  nic0:\n    match:\n      macaddress: \"{mac}\"\n    dhcp4: true\n    dhcp6: true\n"
    )
    .into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

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
