#!/usr/bin/env bash
# Installs the Debian packages nubo and its tests use, on Debian 12 (bookworm).
# qemu-system-x86 comes from bookworm-backports: bookworm's 7.2 conflicts with the
# backported qemu-utils these machines ship. Backports keeps its default priority (100),
# so nothing else is upgraded from it. Never add testing or unstable here.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
export DEBIAN_FRONTEND=noninteractive

codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
if [ "$codename" = bookworm ] && ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  # Use the same mirror the host already uses for bookworm itself.
  # deb822 stanzas: take the URIs of the one whose Suites lists plain "bookworm".
  mirror=$(awk 'BEGIN{RS=""} /(^|\n)Suites:[^\n]*[[:space:]]bookworm([[:space:]]|$)/ { if (match($0, /URIs:[[:space:]]*[^[:space:]]+/)) { split(substr($0, RSTART, RLENGTH), a, /[[:space:]]+/); print a[2]; exit } }' /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$mirror" ] || { echo "install-deps: no bookworm apt source found to derive the backports mirror from" >&2; exit 1; }
  printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' "$mirror" \
    | $SUDO tee /etc/apt/sources.list.d/bookworm-backports.sources >/dev/null
fi

# Wait for another apt (unattended-upgrades on a fresh machine) instead of failing on its lock.
apt_get() { $SUDO apt-get -o DPkg::Lock::Timeout=900 "$@"; }
apt_get update -qq
backports=()
[ "$codename" = bookworm ] && backports=(-t bookworm-backports)
apt_get install -y -qq --no-install-recommends "${backports[@]}" qemu-system-x86 qemu-utils
apt_get install -y -qq --no-install-recommends \
  ca-certificates mmdebstrap dosfstools mtools grub-pc-bin grub-efi-amd64-bin ovmf seabios \
  e2fsprogs fdisk util-linux xorriso genisoimage cloud-image-utils p7zip-full libarchive-tools \
  python3-pycdlib openssh-client gcc pkg-config
# OCI registry tests and benchmark: a real registry (started by the tests themselves on 127.0.0.1,
# never its systemd unit), htpasswd for its basic auth, and skopeo as the peer client.
apt_get install -y -qq --no-install-recommends docker-registry apache2-utils skopeo
# from_container's container image holds a file capability (setcap, as iputils-ping's postinst).
apt_get install -y -qq --no-install-recommends libcap2-bin
# libvirt backend and its live tests: libvirtd, its QEMU/network/storage drivers, virsh (tests
# observe libvirt with it; nubo itself loads libvirt.so.0 at run time and never runs virsh) and
# dnsmasq for an isolated network's DHCP; from backports to match its QEMU 10. Never
# libvirt-daemon-system: it autostarts a NAT network. The tests start libvirtd themselves.
apt_get install -y -qq --no-install-recommends "${backports[@]}" \
  libvirt-daemon libvirt-daemon-driver-qemu libvirt-daemon-driver-network \
  libvirt-daemon-driver-storage libvirt-clients dnsmasq-base iproute2
# The remote-host test's libvirtd listens for TLS with a CA and certificates it makes with openssl.
$SUDO apt-get install -y -qq --no-install-recommends openssl
# The qemu+ssh test starts its own sshd (its config, keys, the namespace's address): the package's
# ssh service must not start or stay enabled. A policy-rc.d that denies starts covers the install;
# where systemd runs, the unit is disabled and stopped as well.
if ! dpkg -s openssh-server >/dev/null 2>&1; then
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    trap '$SUDO rm -f "$policy"' EXIT
    apt_get install -y -qq --no-install-recommends openssh-server
    $SUDO rm -f "$policy"
    trap - EXIT
  else
    apt_get install -y -qq --no-install-recommends openssh-server
  fi
fi
if [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now ssh.service ssh.socket >/dev/null 2>&1 || true
fi
# The libvirt benchmark's peer (virt-install --import).
apt_get install -y -qq --no-install-recommends virtinst
# virtiofsd for shared folders (vm create --mount) over virtio-fs. Debian 12 has no package (QEMU
# 7.2 dropped its C virtiofsd; the Rust one is packaged from Debian 13 on), so there the pinned
# release is built from crates.io (about a minute; needs cargo) into /usr/libexec, where Debian's
# package puts it. QEMU's vhost-user descriptor lets libvirt find it too.
VIRTIOFSD_VERSION=1.14.0
if apt-cache show virtiofsd >/dev/null 2>&1; then
  apt_get install -y -qq --no-install-recommends virtiofsd
elif ! /usr/libexec/virtiofsd --version 2>/dev/null | grep -qx "virtiofsd $VIRTIOFSD_VERSION"; then
  apt_get install -y -qq --no-install-recommends libseccomp-dev libcap-ng-dev
  command -v cargo >/dev/null || { echo "install-deps: building virtiofsd needs cargo (rustup.rs)" >&2; exit 1; }
  vfs_tmp=$(mktemp -d)
  cargo install --quiet --locked --root "$vfs_tmp" virtiofsd --version "$VIRTIOFSD_VERSION"
  $SUDO install -m 0755 "$vfs_tmp/bin/virtiofsd" /usr/libexec/virtiofsd
  rm -rf "$vfs_tmp"
fi
if [ ! -e /usr/share/qemu/vhost-user/50-qemu-virtiofsd.json ]; then
  $SUDO mkdir -p /usr/share/qemu/vhost-user
  printf '{\n  "description": "virtiofsd: vhost-user virtio-fs device backend",\n  "type": "fs",\n  "binary": "/usr/libexec/virtiofsd"\n}\n' \
    | $SUDO tee /usr/share/qemu/vhost-user/50-qemu-virtiofsd.json >/dev/null
fi
