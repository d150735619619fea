#!/usr/bin/env bash
# nubo image build benchmark: a VMfile FROM debian:12 (COPY a file, two RUNs, CLOUDINIT) built
#   - cold (--no-cache: one TCG boot, the steps, seal, flatten),
#   - again unchanged (the step cache: no boot),
#   - with only the last RUN changed (one boot from the cached layer, one step),
# and, where virt-customize (libguestfs-tools) is installed, the same COPY and RUN steps through
# `virt-customize` on a copy of the same base (its appliance boot included), as ratios against
# the cold build. Never timed assertions. The build VM has no outside network.
# Needs $NUBO_BIN (scripts/bench.sh sets it), qemu-img, python3. The image: debian:12 in the bench
# root kept across runs (NUBO_BENCH_ROOT, as scripts/bench/vm.sh).
set -euo pipefail
: "${NUBO_BIN:?set NUBO_BIN to the release nubo binary (scripts/bench.sh does)}"
for t in qemu-system-x86_64 qemu-img python3; do
  command -v "$t" >/dev/null || { echo "build: skipped: $t not found (qemu-system-x86, qemu-utils, python3)"; exit 0; }
done
export NUBO_ROOT=${NUBO_BENCH_ROOT:-/var/tmp/nubo-bench/root}
export NUBO_RUN_DIR=${NUBO_BENCH_RUN_DIR:-/tmp/nubo-bench-run}
mkdir -p "$NUBO_ROOT" "$NUBO_RUN_DIR"
work=$(mktemp -d /tmp/nubo-build-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT

if ! "$NUBO_BIN" image inspect debian:12 >"$work/image.json" 2>/dev/null; then
  echo "bootstrapping debian:12 into $NUBO_ROOT (once; kept across runs) ..."
  timeout 1800 "$NUBO_BIN" image bootstrap debian:12 >"$work/bootstrap.log" 2>&1 ||
    { echo "build: nubo image bootstrap debian:12 failed:"; tail -20 "$work/bootstrap.log"; exit 1; }
  "$NUBO_BIN" image inspect debian:12 >"$work/image.json"
fi
base=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$work/image.json")

now() { date +%s%N; }
secs() { python3 -c "print(f'{($2-$1)/1e9:.1f}')"; }
ratio() { python3 -c "print(f'{$1/$2:.3f}x' if $2 > 0 else 'n/a')"; }
speedup() { python3 -c "print(f'cold takes {$2/$1:.0f}x as long' if $1 > 0 else 'n/a')"; }

ctx="$work/ctx"; mkdir -p "$ctx"
head -c 1048576 /dev/urandom >"$ctx/payload.bin"
printf '#cloud-config\nruncmd:\n  - [touch, /var/tmp/first-boot]\n' >"$ctx/cloud.cfg"
vmfile() {
  cat >"$ctx/VMfile" <<EOF2
FROM debian:12
COPY payload.bin /opt/bench/
RUN sha256sum /opt/bench/payload.bin > /etc/bench-sum
CLOUDINIT cloud.cfg
RUN echo $1 > /etc/bench-last
EOF2
}
build() { timeout 1800 "$NUBO_BIN" image build -t bench-build:1 --boot-timeout 900s "$@" "$ctx" >"$work/build.log" 2>&1 ||
  { echo "build: nubo image build failed:"; tail -20 "$work/build.log"; exit 1; }; }

vmfile "$(date +%s%N)"
t0=$(now); build --no-cache; t1=$(now); cold=$(secs "$t0" "$t1")
t0=$(now); build; t1=$(now); cached=$(secs "$t0" "$t1")
grep -q "no VM booted" "$work/build.log" || { echo "build: the unchanged rebuild booted a VM:"; tail "$work/build.log"; exit 1; }
vmfile "changed-$(date +%s%N)"
t0=$(now); build; t1=$(now); last=$(secs "$t0" "$t1")

echo "nubo image build, cold (1 boot, 4 steps, seal, flatten): ${cold}s"
echo "nubo image build, unchanged (cache, no boot):             ${cached}s  ($(speedup "$cached" "$cold"))"
echo "nubo image build, last RUN changed (1 boot, 1 step):      ${last}s  ($(ratio "$last" "$cold") of cold)"

if command -v virt-customize >/dev/null; then
  cp --reflink=auto "$base" "$work/vc.qcow2"; chmod 0644 "$work/vc.qcow2"
  t0=$(now)
  LIBGUESTFS_BACKEND=direct timeout 1800 virt-customize -a "$work/vc.qcow2" --no-network \
    --mkdir /opt/bench --copy-in "$ctx/payload.bin:/opt/bench" \
    --run-command 'sha256sum /opt/bench/payload.bin > /etc/bench-sum' \
    --mkdir /etc/cloud/cloud.cfg.d --upload "$ctx/cloud.cfg:/etc/cloud/cloud.cfg.d/90-nubo-image.cfg" \
    --run-command 'echo peer > /etc/bench-last' >"$work/vc.log" 2>&1 &&
    { t1=$(now); vc=$(secs "$t0" "$t1"); echo "virt-customize, same steps (no seal, no flatten): ${vc}s  (nubo cold build: $(ratio "$cold" "$vc") of it)"; } ||
    { echo "virt-customize failed here (log tail below); no ratio"; tail -5 "$work/vc.log"; }
else
  echo "virt-customize: not installed (apt-get install libguestfs-tools provides it): no ratio against it"
fi
timeout 120 "$NUBO_BIN" image rm bench-build:1 >/dev/null 2>&1 || true
