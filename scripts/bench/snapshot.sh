#!/usr/bin/env bash
# nubo snapshot benchmark: `nubo vm snapshot create` and `restore` of a running 1 GiB-RAM guest
# (disk and memory), and how long the guest was frozen, against peers measured in the same run
# on the same image, as ratios:
#   - QEMU's own HMP `savevm` / `loadvm` on the same VM over its QMP socket (the floor: what
#     QEMU itself needs; the ratio is nubo's overhead: process start, lock, record, job polling)
#   - `virsh snapshot-create-as` / `snapshot-revert` of a libvirt domain with a 1 GiB guest on an
#     overlay of the same base, when libvirt is installed (else: says the peer is missing)
# Never timed assertions. Every VM runs under TCG with no outside network and is removed on exit.
# Needs $NUBO_BIN (scripts/bench.sh sets it), qemu-system-x86_64, qemu-img, python3.
# The image: debian:12 in the bench root kept across runs (NUBO_BENCH_ROOT, as scripts/bench/vm.sh).
# SNAPSHOT_BENCH_RUNS overrides the 3 rounds per side.
set -euo pipefail
: "${NUBO_BIN:?set NUBO_BIN to the release nubo binary (scripts/bench.sh does)}"
runs=${SNAPSHOT_BENCH_RUNS:-3}
for t in qemu-system-x86_64 qemu-img python3; do
  command -v "$t" >/dev/null || { echo "snapshot: skipped: $t not found (qemu-system-x86, qemu-utils, python3)"; exit 0; }
done
export NUBO_ROOT=${NUBO_BENCH_ROOT:-/var/tmp/nubo-bench/root}
export NUBO_RUN_DIR=${NUBO_BENCH_RUN_DIR:-/tmp/nubo-bench-run}
mkdir -p "$NUBO_ROOT" "$NUBO_RUN_DIR"
work=$(mktemp -d /tmp/nubo-snap-bench.XXXXXX)
vm=snapb-1
dom=
cleanup() {
  timeout 120 "$NUBO_BIN" vm rm --force "$vm" >/dev/null 2>&1 || true
  if [ -n "$dom" ]; then
    timeout 60 virsh destroy "$dom" >/dev/null 2>&1 || true
    timeout 60 virsh undefine "$dom" --snapshots-metadata --nvram >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
timeout 120 "$NUBO_BIN" vm rm --force "$vm" >/dev/null 2>&1 || true

if ! "$NUBO_BIN" image inspect debian:12 >"$work/image.json" 2>/dev/null; then
  echo "bootstrapping debian:12 into $NUBO_ROOT (once; kept across runs) ..."
  timeout 1800 "$NUBO_BIN" image bootstrap debian:12 >"$work/bootstrap.log" 2>&1 ||
    { echo "snapshot: nubo image bootstrap debian:12 failed:"; tail -20 "$work/bootstrap.log"; exit 1; }
  "$NUBO_BIN" image inspect debian:12 >"$work/image.json"
fi
base=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$work/image.json")
base_sha=$(sha256sum "$base" | cut -d' ' -f1)

now() { date +%s%N; }
secs() { python3 -c "print(f'{($2-$1)/1e9:.3f}')"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}x' if $2 > 0 else 'n/a')"; }
mean() { python3 -c 'import sys; v=[float(x) for x in sys.argv[1:]]; print(f"{sum(v)/len(v):.3f}")' "$@"; }

echo "booting a 1 GiB guest with nubo (cloud-init, TCG) ..."
timeout 600 "$NUBO_BIN" vm create "$vm" --image debian:12 --memory 1G --restrict-network --wait \
  --boot-timeout 400s >"$work/create.log" 2>&1 || { echo "snapshot: create failed:"; tail -20 "$work/create.log"; exit 1; }
qmp=$("$NUBO_BIN" vm inspect "$vm" | python3 -c 'import json,sys; print(json.load(sys.stdin)["backend_state"]["qmp_socket"])')

nc_create=() nc_restore=() nc_frozen=()
for i in $(seq "$runs"); do
  t0=$(now); timeout 300 "$NUBO_BIN" vm snapshot create "$vm" "b$i" >/dev/null 2>"$work/c$i.log"; t1=$(now)
  nc_create+=("$(secs "$t0" "$t1")")
  nc_frozen+=("$(sed -n 's/.*frozen for \([0-9.]*\)s.*/\1/p' "$work/c$i.log")")
  t0=$(now); timeout 300 "$NUBO_BIN" vm snapshot restore "$vm" "b$i" >/dev/null 2>&1; t1=$(now)
  nc_restore+=("$(secs "$t0" "$t1")")
done

# QEMU's own savevm/loadvm on the same VM, through its QMP socket (HMP passthrough).
cat >"$work/hmp.py" <<'PY'
import json, socket, sys, time
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); f = s.makefile("rw")
def cmd(c, a=None):
    f.write(json.dumps({"execute": c, **({"arguments": a} if a else {})}) + "\n"); f.flush()
    while True:
        r = json.loads(f.readline())
        if "return" in r or "error" in r: return r
json.loads(f.readline()); cmd("qmp_capabilities")
t = time.monotonic(); r = cmd("human-monitor-command", {"command-line": sys.argv[2]})
print(f"{time.monotonic() - t:.3f}")
if r.get("return"): print("hmp said:", r["return"], file=sys.stderr)
PY
q_save=() q_load=()
for i in $(seq "$runs"); do
  q_save+=("$(python3 "$work/hmp.py" "$qmp" "savevm q$i")")
  q_load+=("$(python3 "$work/hmp.py" "$qmp" "loadvm q$i")")
  python3 "$work/hmp.py" "$qmp" "delvm q$i" >/dev/null
done

echo "nubo snapshot create (disk+memory, 1 GiB guest): $(mean "${nc_create[@]}")s  (runs: ${nc_create[*]})"
echo "nubo guest freeze during create:                 $(mean "${nc_frozen[@]}")s  (runs: ${nc_frozen[*]})"
echo "nubo snapshot restore:                           $(mean "${nc_restore[@]}")s  (runs: ${nc_restore[*]})"
echo "qemu HMP savevm:                                 $(mean "${q_save[@]}")s  -> nubo/qemu $(ratio "$(mean "${nc_create[@]}")" "$(mean "${q_save[@]}")")"
echo "qemu HMP loadvm:                                 $(mean "${q_load[@]}")s  -> nubo/qemu $(ratio "$(mean "${nc_restore[@]}")" "$(mean "${q_load[@]}")")"
timeout 120 "$NUBO_BIN" vm rm --force "$vm" >/dev/null 2>&1

# libvirt on the same base: an overlay, a 1 GiB domain without any network interface.
if ! command -v virsh >/dev/null || ! timeout 20 virsh -c qemu:///system version >/dev/null 2>&1; then
  echo "virsh: peer missing (libvirt-clients and a running libvirtd are not installed here): no libvirt ratio"
else
  qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$work/lv.qcow2"
  dom="nubo-snapb-$$"
  cat >"$work/dom.xml" <<XML
<domain type='qemu'><name>$dom</name><memory unit='MiB'>1024</memory><vcpu>1</vcpu>
<os><type arch='x86_64' machine='pc'>hvm</type></os>
<devices><disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='$work/lv.qcow2'/><target dev='vda' bus='virtio'/></disk>
<serial type='pty'/></devices></domain>
XML
  virsh define "$work/dom.xml" >/dev/null && virsh start "$dom" >/dev/null
  echo "letting the libvirt guest boot (90 s) ..."; sleep 90
  v_create=() v_revert=()
  for i in $(seq "$runs"); do
    t0=$(now); timeout 300 virsh snapshot-create-as "$dom" "v$i" >/dev/null; t1=$(now); v_create+=("$(secs "$t0" "$t1")")
    t0=$(now); timeout 300 virsh snapshot-revert "$dom" "v$i" >/dev/null; t1=$(now); v_revert+=("$(secs "$t0" "$t1")")
  done
  echo "virsh snapshot-create-as:  $(mean "${v_create[@]}")s -> nubo/virsh $(ratio "$(mean "${nc_create[@]}")" "$(mean "${v_create[@]}")")"
  echo "virsh snapshot-revert:     $(mean "${v_revert[@]}")s -> nubo/virsh $(ratio "$(mean "${nc_restore[@]}")" "$(mean "${v_revert[@]}")")"
fi
[ "$(sha256sum "$base" | cut -d' ' -f1)" = "$base_sha" ] && echo "base image sha256 unchanged" ||
  { echo "snapshot: the base image $base changed"; exit 1; }
