//! Generated user-data: a `#cloud-config` carrying the hostname and the default user's SSH keys.

use crate::yaml::scalar;

/// What nubo's own flags (`--hostname`, `--ssh-key`) turn into when no user-data file is given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CloudConfig {
    /// Set as `hostname:` only (no `fqdn:`), so cloud-init keeps the image's domain handling.
    pub hostname: Option<String>,
    /// Top-level `ssh_authorized_keys`, which cloud-init gives to the image's default user.
    pub ssh_authorized_keys: Vec<String>,
}

/// Renders `c` as `#cloud-config`. Every value is a YAML scalar quoted when needed, so a key's
/// comment or a stray newline cannot inject keys.
pub fn render_cloud_config(c: &CloudConfig) -> Vec<u8> {
    let mut out = String::from("#cloud-config\n");
    if let Some(h) = &c.hostname {
        out.push_str(&format!("hostname: {}\n", scalar(h)));
        // Maps the hostname to 127.0.1.1 in /etc/hosts, as Debian's installer does; without it
        // `sudo` warns that it cannot resolve the new hostname.
        out.push_str("manage_etc_hosts: localhost\n");
    }
    if !c.ssh_authorized_keys.is_empty() {
        out.push_str("ssh_authorized_keys:\n");
        for k in &c.ssh_authorized_keys {
            out.push_str(&format!("  - {}\n", scalar(k.trim())));
        }
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_cloud_config_empty_is_header_only() {
        let out = render_cloud_config(&CloudConfig::default());

        assert_eq!(out, b"#cloud-config\n");
    }

    #[test]
    fn render_cloud_config_hostname_and_keys_golden() {
        let c = CloudConfig {
            hostname: Some("web-1".into()),
            ssh_authorized_keys: vec!["ssh-ed25519 AAAAC3Nza a@b\n".into(), "ssh-rsa AAAAB3 c".into()],
        };

        let out = render_cloud_config(&c);

        let want = "#cloud-config\nhostname: web-1\nmanage_etc_hosts: localhost\nssh_authorized_keys:\n  - \"ssh-ed25519 AAAAC3Nza a@b\"\n  - \"ssh-rsa AAAAB3 c\"\n";
        assert_eq!(String::from_utf8(out).unwrap(), want);
    }

    #[test]
    fn render_cloud_config_output_passes_validation() {
        let c = CloudConfig {
            hostname: Some("h".into()),
            ssh_authorized_keys: vec!["k \"q\" \\ x".into()],
        };

        let out = render_cloud_config(&c);

        assert!(crate::user_data::validate_user_data(&out).is_ok());
    }
}
