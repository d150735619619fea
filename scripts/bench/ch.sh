#!/usr/bin/env bash
# Cloud Hypervisor against QEMU's microvm machine, on the same PVH test guest (tests/live's
# `pvh_guest`, a few hundred bytes that print a counter to COM1), as ratios from one run:
#   running:    `nubo vm create` starting -> it returns with the VMM reporting the VM running
#               (Cloud Hypervisor: vm.create + vm.boot answered, then checked with vm.info;
#               QEMU: -daemonize returned)
#   first byte: `nubo vm create` starting -> the guest's first serial byte in console.log
# Cloud Hypervisor's runs are under `unshare --net` (its tap and bridge live in a namespace the
# run makes and that dies with the VMM); QEMU's use --restrict-network. Every VM is removed.
# The binary: $NUBO_CLOUD_HYPERVISOR, else cloud-hypervisor on PATH, else the shared build at
# ../shared/tools/cloud-hypervisor/ or /work/shared/tools/cloud-hypervisor/; else skipped.
# CH_BENCH_RUNS overrides the 5 creates per side.
set -euo pipefail
: "${NUBO_BIN:?set NUBO_BIN to the release nubo binary (scripts/bench.sh does)}"
runs=${CH_BENCH_RUNS:-5}
ch=${NUBO_CLOUD_HYPERVISOR:-$(command -v cloud-hypervisor || true)}
for c in "$ch" ../shared/tools/cloud-hypervisor/cloud-hypervisor /work/shared/tools/cloud-hypervisor/cloud-hypervisor; do
  if [ -n "$c" ] && [ -x "$c" ]; then ch=$(readlink -f "$c"); break; fi
  ch=
done
[ -n "$ch" ] || { echo "ch: skipped: no cloud-hypervisor binary (PATH, NUBO_CLOUD_HYPERVISOR, ../shared/tools/cloud-hypervisor/)"; exit 0; }
for t in qemu-system-x86_64 unshare curl python3; do
  command -v "$t" >/dev/null || { echo "ch: skipped: $t not found"; exit 0; }
done
[ -e /dev/kvm ] || { echo "ch: skipped: /dev/kvm does not exist"; exit 0; }

work=$(mktemp -d /tmp/nubo-ch-bench.XXXXXX)
export NUBO_ROOT=$work/root NUBO_RUN_DIR=/tmp/nubo-chb-$$
export PATH="$(dirname "$ch"):$PATH"
mkdir -p "$NUBO_ROOT" "$NUBO_RUN_DIR"
created=()
cleanup() {
  if [ ${#created[@]} -gt 0 ]; then timeout 120 "$NUBO_BIN" vm rm --force "${created[@]}" >/dev/null 2>&1 || true; fi
  rm -rf "$work" "$NUBO_RUN_DIR"
}
trap cleanup EXIT

cargo run -q --release -p nubo-live --example pvh_guest -- "$work/pvh.elf"
truncate -s 1M "$work/disk.raw"
now() { date +%s%N; }

# one BACKEND NAME: prints "<ms to running> <ms to first byte>"
one() {
  local backend=$1 name=$2 wrap=() extra=()
  if [ "$backend" = ch ]; then wrap=(unshare --net --); else extra=(--restrict-network); fi
  local log="$NUBO_ROOT/vms/$name/console.log" t0 t_run t_byte=
  created+=("$name")
  t0=$(now)
  "${wrap[@]}" "$NUBO_BIN" vm create "$name" --disk "$work/disk.raw" --kernel "$work/pvh.elf" --cmdline pvh \
    --machine microvm --memory 128M --backend "$backend" "${extra[@]}" >/dev/null 2>"$work/err" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if [ -z "$t_byte" ] && [ -s "$log" ]; then t_byte=$(now); fi
    sleep 0.001
  done
  wait "$pid" || { cat "$work/err" >&2; exit 1; }
  t_run=$(now)
  if [ "$backend" = ch ]; then
    local sock
    sock=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["backend_state"]["api_socket"])' "$NUBO_ROOT/vms/$name/vm.json")
    curl -s --max-time 5 --unix-socket "$sock" http://localhost/api/v1/vm.info | grep -q '"state":"Running"' \
      || { echo "ch: vm.info does not say Running after create" >&2; exit 1; }
  fi
  local deadline=$(( $(date +%s) + 60 ))
  while [ -z "$t_byte" ]; do
    if [ -s "$log" ]; then t_byte=$(now); fi
    [ "$(date +%s)" -lt "$deadline" ] || { echo "ch: $name printed nothing in 60 s" >&2; exit 1; }
    sleep 0.001
  done
  timeout 120 "$NUBO_BIN" vm rm --force "$name" >/dev/null
  echo "$(( (t_run - t0) / 1000000 )) $(( (t_byte - t0) / 1000000 ))"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
: >"$work/ch" ; : >"$work/qemu"
for i in $(seq "$runs"); do
  one ch "chb-$i" >>"$work/ch"
  one qemu "qmb-$i" >>"$work/qemu"
done
ch_run=$(cut -d' ' -f1 "$work/ch" | median); ch_byte=$(cut -d' ' -f2 "$work/ch" | median)
q_run=$(cut -d' ' -f1 "$work/qemu" | median); q_byte=$(cut -d' ' -f2 "$work/qemu" | median)
echo "ch: PVH guest, median of $runs creates each (cloud-hypervisor $("$ch" --version 2>/dev/null | sed -n 1p | cut -d' ' -f2), qemu microvm $(qemu-system-x86_64 --version | sed -n 1p | cut -d' ' -f4))"
printf '  create -> VM running:   cloud-hypervisor %5d ms   qemu microvm %5d ms   qemu/ch %.1fx\n' "$ch_run" "$q_run" "$(echo "$q_run / ($ch_run + 0.0001)" | bc -l)"
printf '  create -> first serial: cloud-hypervisor %5d ms   qemu microvm %5d ms   qemu/ch %.1fx\n' "$ch_byte" "$q_byte" "$(echo "$q_byte / ($ch_byte + 0.0001)" | bc -l)"
