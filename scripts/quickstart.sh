#!/usr/bin/env bash
# README's first command: on a fresh Debian 12 machine, installs what nubo needs, builds and
# installs `nubo`, builds a Debian 12 cloud image from Debian's packages, and boots a VM that
# cloud-init personalises, then proves it over SSH.
#
#   NAME=demo            the VM's name
#   NUBO_QUICKSTART_NET  `restricted` (default): the guest reaches nothing but its SSH forward on
#                        127.0.0.1; `open`: user-mode NAT, so the guest can reach the network
set -euo pipefail
cd "$(dirname "$0")/.."
name=${NAME:-demo}

bash scripts/install-deps.sh
cargo install --quiet --locked --path crates/nubo-cli --root "$HOME/.local"
export PATH="$HOME/.local/bin:$PATH"
echo "nubo installed at $(command -v nubo) ($(nubo --version))"

nubo doctor
if ! nubo image inspect debian:12 >/dev/null 2>&1; then
  nubo image bootstrap debian:12
fi
nubo image ls

net=(--restrict-network)
[ "${NUBO_QUICKSTART_NET:-restricted}" = open ] && net=()
if nubo vm inspect "$name" >/dev/null 2>&1; then
  echo "vm $name exists already: starting it if needed"
  nubo vm start "$name"
  nubo vm wait "$name"
else
  nubo vm create "$name" --image debian:12 --hostname "$name" "${net[@]}" --wait
fi
nubo vm ls
echo "--- inside the guest:"
nubo vm ssh "$name" -- 'echo "hostname: $(hostname)"; echo "instance-id: $(cat /var/lib/cloud/data/instance-id)"; cloud-init status'
cat <<MSG

vm $name is running and personalised. Next:
  nubo vm ssh $name          # a shell inside it
  nubo vm console $name      # its serial console (Ctrl-] detaches)
  nubo vm rm --force $name   # remove it (the image stays)
(nubo is in ~/.local/bin: add it to PATH in your shell profile if it is not there)
MSG
