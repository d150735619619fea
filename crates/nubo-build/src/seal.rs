//! Sealing: what makes the next boot of the image a new instance, with nothing of the build
//! left in it. Run as root in the build VM, after the last step, before power-off.

/// `%KEYS%` is replaced by the base64 bodies of the keys the build VM was given (the build's
/// one-time key and nubo's own, which the engine always adds): their lines leave every
/// authorized_keys file. Each command tolerates what a minimal image lacks.
pub const SCRIPT: &str = r#"set -u
# cloud-init: forget this instance, so the next boot (a new instance-id) runs every module again.
if command -v cloud-init >/dev/null 2>&1; then
    cloud-init clean --logs --machine-id --seed 2>/dev/null || cloud-init clean --logs || rm -rf /var/lib/cloud/*
fi
rm -rf /var/lib/cloud/instances /var/lib/cloud/instance /var/lib/cloud/data /var/lib/cloud/sem
# machine-id: empty (not absent), so systemd makes a fresh one on first boot.
: > /etc/machine-id
rm -f /var/lib/dbus/machine-id
# SSH host keys: regenerated on first boot by cloud-init (or ssh's own keygen unit).
rm -f /etc/ssh/ssh_host_*
# The build's one-time key and nubo's own key, from every account.
printf '%s\n' %KEYS% > /run/nubo-build-keys
for f in /root/.ssh/authorized_keys /home/*/.ssh/authorized_keys; do
    [ -f "$f" ] || continue
    grep -vF -f /run/nubo-build-keys "$f" > "$f.nubo-tmp" || true
    cat "$f.nubo-tmp" > "$f"; rm -f "$f.nubo-tmp"
done
rm -f /run/nubo-build-keys
# Logs, apt lists, temporary files, shell history.
find /var/log -type f \( -name '*.gz' -o -name '*.[0-9]' -o -name '*.old' \) -delete 2>/dev/null
find /var/log -type f -exec truncate -s 0 {} + 2>/dev/null
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /tmp/* /var/tmp/* /root/.bash_history /home/*/.bash_history
journalctl --rotate >/dev/null 2>&1; journalctl --vacuum-time=1s >/dev/null 2>&1
rm -rf /var/log/journal/*
sync
# Free space back to the host: the disk has discard=unmap; without fstrim, zeroes (detect-zeroes=unmap).
if ! fstrim -av >/dev/null 2>&1; then
    dd if=/dev/zero of=/var/tmp/nubo-zero bs=1M >/dev/null 2>&1; rm -f /var/tmp/nubo-zero
fi
sync
"#;

/// The seal for a VM given `public_keys` (OpenSSH public key lines).
pub fn script(public_keys: &[&str]) -> String {
    let bodies: Vec<String> = public_keys
        .iter()
        .filter_map(|k| k.split_whitespace().nth(1))
        // Base64 only: each goes into the script between single quotes.
        .filter(|b| !b.is_empty() && b.bytes().all(|c| c.is_ascii_alphanumeric() || b"+/=".contains(&c)))
        .map(|b| format!("'{b}'"))
        .collect();
    SCRIPT.replace("%KEYS%", &bodies.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_names_every_key_body_quoted() {
        let s = script(&[
            "ssh-ed25519 AAAAC3Nz+/= nubo-build-1",
            "ssh-ed25519 BBBB nubo",
            "bad key'; rm -rf /",
        ]);

        assert!(s.contains("printf '%s\\n' 'AAAAC3Nz+/=' 'BBBB' >"), "{s}");
        assert!(!s.contains("rm -rf /\n"), "{s}");
    }
}
