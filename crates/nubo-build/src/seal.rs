//! Sealing: what makes the next boot of the image a new instance, with nothing of the build
//! left in it. Run as root in the build VM, after the last step, before power-off.

/// `%BUILD_KEY_TAG%` is replaced by the build key's comment, whose lines leave every
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
# The build's one-time key, from every account.
for f in /root/.ssh/authorized_keys /home/*/.ssh/authorized_keys; do
    [ -f "$f" ] && sed -i '/%BUILD_KEY_TAG%/d' "$f"
done
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

pub fn script(key_tag: &str) -> String {
    SCRIPT.replace("%BUILD_KEY_TAG%", key_tag)
}
