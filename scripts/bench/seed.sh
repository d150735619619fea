#!/usr/bin/env bash
# nubo seed build vs cloud-localds: whole-process time for the same typical seed (1 KiB user-data
# with an SSH key, meta-data, network-config), N runs each, printed as a ratio; and image sizes.
# Needs $NUBO_BIN (scripts/bench.sh sets it) and cloud-localds (cloud-image-utils).
set -euo pipefail
: "${NUBO_BIN:?set NUBO_BIN to the release nubo binary (scripts/bench.sh does)}"
runs=${SEED_BENCH_RUNS:-200}
command -v cloud-localds >/dev/null || { echo "seed: cloud-localds not found: install cloud-image-utils"; exit 0; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
{
  printf '#cloud-config\nhostname: web-1\nssh_authorized_keys:\n'
  printf '  - "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKa0n8b2hK4x0lq1Xy3u7m2dQ4Yk5bZfX8wJ9t3sVh1Q bench@nubo"\n'
  printf 'runcmd:\n'
  for _ in $(seq 1 14); do printf '  - [sh, -c, "echo nubo-bench-marker >> /run/nubo-bench"]\n'; done
} > "$work/user-data"
# Pad with a YAML comment to exactly 1 KiB, so the file stays valid #cloud-config.
pad=$(( 1024 - $(stat -c %s "$work/user-data") - 3 ))
[ "$pad" -ge 0 ] || { echo "seed: bench user-data grew past 1 KiB"; exit 1; }
{ printf '# '; head -c "$pad" /dev/zero | tr '\0' x; printf '\n'; } >> "$work/user-data"
printf 'instance-id: iid-bench\nlocal-hostname: web-1\n' > "$work/meta-data"
printf 'version: 2\nethernets:\n  nic0:\n    match:\n      macaddress: "52:54:00:12:34:56"\n    dhcp4: true\n' > "$work/network-config"

# Both take the same positional form: OUTPUT USER-DATA META-DATA.
time_runs() { # command...
  local start end
  start=$(date +%s%N)
  for _ in $(seq 1 "$runs"); do "$@" >/dev/null || { echo "seed: $1 failed" >&2; return 1; }; done
  end=$(date +%s%N)
  echo $(( (end - start) / runs ))
}
nubo_ns=$(time_runs "$NUBO_BIN" seed build --network-config "$work/network-config" "$work/nubo.iso" "$work/user-data" "$work/meta-data")
peer_ns=$(time_runs cloud-localds --network-config="$work/network-config" "$work/peer.iso" "$work/user-data" "$work/meta-data")

# The same files must come out of both, or the timing compares different work.
"$NUBO_BIN" seed inspect -o json "$work/nubo.iso" > "$work/nubo.json"
"$NUBO_BIN" seed inspect -o json "$work/peer.iso" > "$work/peer.json"
if ! diff <(grep -v '"image"' "$work/nubo.json") <(grep -v '"image"' "$work/peer.json") >/dev/null; then
  echo "seed: nubo and cloud-localds images differ in content"; exit 1
fi

nubo_size=$(stat -c %s "$work/nubo.iso")
peer_size=$(stat -c %s "$work/peer.iso")
awk -v n="$nubo_ns" -v p="$peer_ns" -v runs="$runs" -v ns="$nubo_size" -v ps="$peer_size" 'BEGIN {
  printf "seed build, %d runs each (whole process, same inputs)\n", runs
  printf "  nubo seed build   %8.2f ms/seed\n", n / 1e6
  printf "  cloud-localds     %8.2f ms/seed\n", p / 1e6
  printf "  ratio             %8.1fx faster\n", p / n
  printf "image size: nubo %d bytes, cloud-localds %d bytes (%.1f%%)\n", ns, ps, 100 * ns / ps
}'
