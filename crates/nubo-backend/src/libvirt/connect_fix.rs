//! The fix for a connection that failed, by transport: over `qemu+ssh://` the failure is
//! usually ssh's (the host key, the key, the remote helper), not a stopped daemon, and the URI
//! cannot carry `keyfile=` or `known_hosts=` (nubo refuses them), so the fix is in the caller's
//! own ssh setup.

use nubo_spec::uri::{ConnectUri, Transport};

/// `host` or `[host]:port` as `known_hosts` and `ssh-keygen -R` write it.
fn known_hosts_name(uri: &ConnectUri) -> String {
    let host = uri.host().map(|h| h.to_string()).unwrap_or_default();
    match uri.port() {
        Some(p) if p != 22 => format!("[{}]:{p}", host.trim_start_matches('[').trim_end_matches(']')),
        _ => host,
    }
}

/// libvirt's message for a failed open, without the banner ssh prints around a changed host
/// key (its `@` frame, the warnings, the `ssh-keygen -f` advice nubo's fix replaces) and
/// without carriage returns: one line a caller can read in an error.
pub fn detail(uri: &ConnectUri, message: &str) -> String {
    if uri.transport() != Transport::Ssh {
        return message.to_owned();
    }
    const NOISE: [&str; 8] = [
        "IT IS POSSIBLE THAT SOMEONE",
        "Someone could be eavesdropping",
        "It is also possible that",
        "Please contact your system administrator",
        "Add correct host key in",
        "remove with:",
        "ssh-keygen -f ",
        "WARNING: ",
    ];
    message
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.trim_start_matches("Cannot recv data: ").starts_with('@'))
        .filter(|l| !l.starts_with('@') && !NOISE.iter().any(|n| l.contains(n)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What to do about `detail` (libvirt's message) when opening `uri` failed.
pub fn fix(uri: &ConnectUri, detail: &str) -> String {
    if uri.transport() != Transport::Ssh {
        return "start libvirtd (or virtqemud), or give another URI with --connect / NUBO_LIBVIRT_URI".into();
    }
    let name = known_hosts_name(uri);
    let user = uri.user().map(|u| format!("{u}@")).unwrap_or_default();
    let port = uri.port().map(|p| format!(" -p {p}")).unwrap_or_default();
    let host = uri.host().map(|h| h.to_string()).unwrap_or_default();
    if detail.contains("Host key verification failed")
        || detail.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
        || detail.contains("No ED25519 host key is known")
        || detail.contains("host key for")
    {
        format!(
            "ssh did not accept the host key of `{name}`: the URI takes no host-key option, so put the host's real key in ~/.ssh/known_hosts of the user running nubo (check its fingerprint on the host, `ssh-keygen -R '{name}'` to drop a stale one, then `ssh{port} {user}{host} true` once)"
        )
    } else if detail.contains("Permission denied") {
        format!(
            "ssh could not log in to `{user}{host}`: the URI takes no key file, so offer the key through ssh-agent (SSH_AUTH_SOCK) or ~/.ssh (id_ed25519 or an IdentityFile in ~/.ssh/config) of the user running nubo, and authorize it on the host"
        )
    } else {
        format!(
            "check that `ssh{port} {user}{host} virt-ssh-helper --version` works as the user running nubo (host key in ~/.ssh/known_hosts, key in ssh-agent or ~/.ssh), and that libvirtd (or virtqemud) runs on that host"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nubo_spec::uri::Origin;

    fn uri(s: &str) -> ConnectUri {
        ConnectUri::parse(s, Origin::Spec).unwrap()
    }

    #[test]
    fn fix_ssh_host_key_names_known_hosts_and_port() {
        let f = fix(
            &uri("qemu+ssh://root@10.0.0.1:2222/system"),
            "Cannot recv data: Host key verification failed.: Connection reset by peer",
        );
        assert!(f.contains("known_hosts"), "{f}");
        assert!(f.contains("ssh-keygen -R '[10.0.0.1]:2222'"), "{f}");
        assert!(f.contains("ssh -p 2222 root@10.0.0.1 true"), "{f}");
    }

    #[test]
    fn fix_ssh_permission_denied_names_agent() {
        let f = fix(&uri("qemu+ssh://h/system"), "Permission denied (publickey).");
        assert!(f.contains("ssh-agent") && !f.contains("known_hosts"), "{f}");
    }

    #[test]
    fn detail_ssh_changed_host_key_banner_dropped() {
        let msg = "Cannot recv data: @@@@@@@@\r\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\n@@@@@@@@\r\nIT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\r\nThe fingerprint for the ED25519 key sent by the remote host is\nSHA256:abc.\r\nPlease contact your system administrator.\r\n  remove with:\r\n  ssh-keygen -f \"/h/.ssh/known_hosts\" -R \"[h]:2222\"\r\nHost key verification failed.: Connection reset by peer";
        let d = detail(&uri("qemu+ssh://h:2222/system"), msg);
        assert_eq!(
            d,
            "The fingerprint for the ED25519 key sent by the remote host is SHA256:abc. Host key verification failed.: Connection reset by peer"
        );
        assert_eq!(detail(&uri("qemu+tls://h/system"), "a\nb"), "a\nb");
    }

    #[test]
    fn fix_tls_names_daemon() {
        let f = fix(&uri("qemu+tls://h/system"), "Connection refused");
        assert!(f.contains("start libvirtd"), "{f}");
    }
}
