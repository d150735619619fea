#!/usr/bin/env bash
# nubo boot-speed benchmark (issue 25): the bootstrapped debian:12 image from `nubo vm create --wait`
# to cloud-init done, phase by phase, and against peers booted in the same run (load on these shared
# machines varies 2x between identical runs, so only the ratios are comparable across runs):
#   nubo         `nubo vm create --wait` of this tree's debian:12; nubo's own phase lines (kernel
#                line, SSH reachable, cloud-init finished), then from inside the guest
#                `systemd-analyze`, `systemd-analyze blame`, `cloud-init analyze show` and the
#                time python3 takes to start and import cloud-init, which each of cloud-init's
#                four stage processes pays before its stage begins
#   plain QEMU   the same image booted by hand (qemu-system-x86_64, direct kernel, cloud-localds
#                seed), timed to cloud-init's closing console line: what nubo itself adds
#   peer image   optional: BOOT_BENCH_PEER_ROOT names a NUBO_ROOT holding another debian:12 (e.g.
#                the previous recipe's, bootstrapped by an older nubo), booted like the first
# Runs alternate (nubo, plain, peer) BOOT_BENCH_RUNS times (default 1); medians are compared. With
# BOOT_BENCH_PARALLEL=1 the sides of a run boot at the same time instead, so a machine whose load
# swings (other jobs) slows all of them alike: fairer ratios, longer absolute times.
# Every VM runs with `restrict=on` networking and is removed on exit; nubo picks its accelerator,
# the plain-QEMU side uses TCG unless BOOT_BENCH_ACCEL=kvm.
# Needs $NUBO_BIN (scripts/bench.sh sets it), qemu-system-x86_64, qemu-img, cloud-localds, ssh-keygen,
# python3. The image is bootstrapped once per recipe version into NUBO_BENCH_BOOT_ROOT (default
# /var/tmp/nubo-bench/boot-r<RECIPE_VERSION>), kept across runs.
set -euo pipefail
: "${NUBO_BIN:?set NUBO_BIN to the nubo binary (scripts/bench.sh does)}"
runs=${BOOT_BENCH_RUNS:-1}
deadline=${BOOT_BENCH_TIMEOUT:-400}
for t in qemu-system-x86_64 qemu-img cloud-localds ssh-keygen python3; do
  command -v "$t" >/dev/null || { echo "boot: skipped: $t not found (qemu-system-x86, qemu-utils, cloud-image-utils, openssh-client, python3)"; exit 0; }
done
version=$(sed -n 's/^pub const RECIPE_VERSION: u32 = \([0-9]*\);/\1/p' crates/nubo-bootstrap/src/recipe.rs)
[ -n "$version" ] || { echo "boot: cannot read RECIPE_VERSION from crates/nubo-bootstrap/src/recipe.rs"; exit 1; }
export NUBO_ROOT=${NUBO_BENCH_BOOT_ROOT:-/var/tmp/nubo-bench/boot-r$version}
export NUBO_RUN_DIR=${NUBO_BENCH_RUN_DIR:-/tmp/nubo-bench-boot-run}
peer_root=${BOOT_BENCH_PEER_ROOT:-}
mkdir -p "$NUBO_ROOT" "$NUBO_RUN_DIR"
work=$(mktemp -d /tmp/nubo-boot-bench.XXXXXX)
parallel=${BOOT_BENCH_PARALLEL:-0}
created=()   # "root name" pairs to remove on exit
cleanup() {
  for f in "$work"/hand*/qemu.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
  done
  for c in "${created[@]}"; do
    NUBO_ROOT=${c% *} timeout 120 "$NUBO_BIN" vm rm --force "${c##* }" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

if ! "$NUBO_BIN" image inspect debian:12 >"$work/image.json" 2>/dev/null; then
  echo "bootstrapping debian:12 (recipe $version) into $NUBO_ROOT (once; kept across runs) ..."
  timeout 1800 "$NUBO_BIN" image bootstrap debian:12 >"$work/bootstrap.log" 2>&1 ||
    { echo "boot: nubo image bootstrap debian:12 failed:"; tail -20 "$work/bootstrap.log"; exit 1; }
  "$NUBO_BIN" image inspect debian:12 >"$work/image.json"
fi
if [ -n "$peer_root" ]; then
  NUBO_ROOT=$peer_root "$NUBO_BIN" image inspect debian:12 >/dev/null 2>&1 ||
    { echo "boot: BOOT_BENCH_PEER_ROOT=$peer_root holds no debian:12"; exit 1; }
fi
field() { # key... : one field of the image record, empty when absent
  python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    v = v.get(k) if isinstance(v, dict) else None
print(v or "")' "$work/image.json" "$@"
}
base=$(field path) kernel=$(field boot kernel) initrd=$(field boot initrd) cmdline=$(field boot cmdline)
[ -n "$kernel" ] || { echo "boot: the debian:12 record names no kernel: the plain-QEMU peer needs one"; exit 1; }
ssh-keygen -q -t ed25519 -N "" -C nubo-boot-bench -f "$work/key"

# Runs a command, stamping each stderr line on arrival (nubo writes it unbuffered), and follows a
# console log for cloud-init's closing line. Prints `rc`, `finished MS` (console line, ms since
# the start), `up S` (the guest's own uptime in that line) and the command's lines as `# [MS] line`.
cat >"$work/observe.py" <<'PY'
import os, re, subprocess, sys, threading, time
console, deadline, out = sys.argv[1], float(sys.argv[2]), sys.argv[3]
cmd = sys.argv[4:]
t0 = time.time()
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
lines = []
def read_stderr():
    for raw in proc.stderr:
        lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))
threading.Thread(target=read_stderr, daemon=True).start()
seen, up, off, partial = {}, None, 0, b""
while time.time() - t0 < deadline and "finished" not in seen:
    try:
        with open(console, "rb") as f:
            f.seek(off)
            data = f.read()
    except FileNotFoundError:
        data = b""
    off += len(data)
    partial += data
    while b"\n" in partial:
        line, partial = partial.split(b"\n", 1)
        text = line.decode(errors="replace")
        if "Linux version " in text and "kernel" not in seen:
            seen["kernel"] = time.time()
        if "Cloud-init v. " in text and " finished at " in text:
            seen["finished"] = time.time()
            m = re.search(r"Up ([0-9.]+) seconds", text)
            up = m.group(1) if m else None
    time.sleep(0.02)
try:
    proc.wait(max(1.0, deadline - (time.time() - t0)))
except subprocess.TimeoutExpired:
    os.killpg(proc.pid, 9)
    proc.wait()
time.sleep(0.2)
with open(out, "w") as f:
    f.write("rc %d\n" % proc.returncode)
    for k, t in seen.items():
        f.write("%s %.0f\n" % (k, (t - t0) * 1000))
    if up:
        f.write("up %s\n" % up)
    f.write("".join("# [%.1fs] %s\n" % (t - t0, l) for t, l in lines))
PY
val() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# One `nubo vm create --wait`: label, root, name. Prints nubo's phases; leaves the VM running.
boot_nubo() {
  local label=$1 root=$2 name=$3 obs="$work/$3.obs"
  NUBO_ROOT=$root python3 "$work/observe.py" "$root/vms/$name/console.log" "$deadline" "$obs" \
    timeout "$deadline" "$NUBO_BIN" vm create "$name" --image debian:12 --restrict-network \
    --ssh-key "@$work/key.pub" --wait --boot-timeout "$((deadline - 20))s"
  if [ "$(val rc "$obs")" != 0 ]; then
    echo "boot: $label: nubo vm create --wait failed:"
    sed -n 's/^# /  /p' "$obs"
    tail -c 3000 "$root/vms/$name/console.log" 2>/dev/null | sed 's/^/  | /' || true
    exit 1
  fi
  echo "  $label: nubo's phases (seconds since create started; guest uptime at cloud-init done: $(val up "$obs") s)"
  sed -n 's/^# \[[0-9.]*s\] \(\[ *[0-9.]*s\] .*\)/    \1/p' "$obs"
  # nubo's own `[ 12.3s] cloud-init finished` figure, in ms.
  sed -n 's/^# \[[0-9.]*s\] \[ *\([0-9.]*\)s\] cloud-init finished$/\1/p' "$obs" | awk '{ printf "%.0f\n", $1 * 1000 }' >>"$work/t-$label"
}

# Inside the guest: where its boot time went.
guest_report() {
  local root=$1 name=$2
  # systemd-analyze answers once the boot's last job is done (nubo-ssh-keygen-rest.service runs
  # after cloud-init): wait for it, bounded.
  NUBO_ROOT=$root timeout 300 "$NUBO_BIN" vm ssh "$name" -- \
    'for i in $(seq 120); do systemd-analyze >/dev/null 2>&1 && break; sleep 2; done;
     systemd-analyze; echo "-- systemd-analyze blame (top 15)"; systemd-analyze blame | head -15;
     echo "-- systemd-analyze critical-chain"; systemd-analyze critical-chain --no-pager | tail -n +2 | head -25;
     echo "-- cloud-init analyze show"; sudo cloud-init analyze show;
     echo "-- stages served by the cloud-init zygote (recipe 5+)"; sudo cat /run/nubo-cloud-init/served 2>/dev/null || echo none;
     sudo journalctl -b -o cat -u nubo-cloud-init-zygote.service 2>/dev/null | grep -m1 imported || true;
     echo "-- what each of the four cloud-init processes pays before its stage starts (warm cache)";
     ms() { s=$(date +%s%N); "$@"; e=$(date +%s%N); echo "$(( (e - s) / 1000000 )) ms"; };
     echo "python3 -c pass: $(ms python3 -c pass)";
     echo "python3 -I -S -c pass (the zygote client): $(ms python3 -I -S -c pass)";
     echo "python3 -c \"import cloudinit.cmd.main\": $(ms python3 -c "import cloudinit.cmd.main")"' 2>&1 | sed 's/^/    /' || echo "    (could not reach the guest over SSH)"
}

# The same image booted by hand, as a script would: cloud-localds seed, overlay, QEMU.
boot_plain() {
  local h="$work/hand$1" obs
  obs="$h/obs"
  mkdir -p "$h"
  printf '#cloud-config\nssh_authorized_keys:\n  - "%s"\n' "$(cat "$work/key.pub")" >"$h/user-data"
  printf 'instance-id: %s\nlocal-hostname: bench-hand\n' "$(cat /proc/sys/kernel/random/uuid)" >"$h/meta-data"
  # TCG unless told: a /dev/kvm may be one nubo refuses (PVM cannot run stock kernels); set
  # BOOT_BENCH_ACCEL=kvm where nubo's create says it uses KVM.
  local accel="tcg,thread=multi" cpu=max
  if [ "${BOOT_BENCH_ACCEL:-tcg}" = kvm ]; then accel=kvm cpu=host; fi
  python3 "$work/observe.py" "$h/console.log" "$deadline" "$obs" sh -c '
    cloud-localds "$1/seed.img" "$1/user-data" "$1/meta-data" &&
    qemu-img create -q -f qcow2 -F qcow2 -b "$2" "$1/disk.qcow2" &&
    qemu-system-x86_64 -name bench-hand -machine pc -accel "$6" -cpu "$7" -smp 2 -m 1024M -nodefaults \
      -no-user-config -display none -serial "file:$1/console.log" -pidfile "$1/qemu.pid" -daemonize \
      -kernel "$3" -initrd "$4" -append "$5 console=ttyS0,115200" \
      -drive "if=virtio,file=$1/disk.qcow2,format=qcow2" -drive "if=virtio,file=$1/seed.img,format=raw,readonly=on" \
      -netdev user,id=net0,restrict=on -device virtio-net-pci,netdev=net0' \
    sh "$h" "$base" "$kernel" "$initrd" "$cmdline" "$accel" "$cpu"
  local f pid
  f=$(val finished "$obs")
  pid=$(cat "$h/qemu.pid" 2>/dev/null || true)
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  rm -f "$h/qemu.pid"
  if [ -z "$f" ]; then
    echo "boot: plain QEMU: no cloud-init closing line within ${deadline}s:"
    sed -n 's/^# /  /p' "$obs"
    tail -c 3000 "$h/console.log" 2>/dev/null | sed 's/^/  | /' || true
    exit 1
  fi
  echo "  plain QEMU: kernel line at $(awk -v k="$(val kernel "$obs")" 'BEGIN { printf "%.1f", k / 1e3 }') s, cloud-init finished at $(awk -v f="$f" 'BEGIN { printf "%.1f", f / 1e3 }') s (guest uptime $(val up "$obs") s)"
  echo "$f" >>"$work/t-plain"
  rm -f "$h/disk.qcow2"
}

# One side of a run: boots, reports (from inside the guest too) and removes the VM.
side() { # nubo|plain|peer run
  case $1 in
  nubo)
    boot_nubo nubo "$NUBO_ROOT" "bootb-$2"
    guest_report "$NUBO_ROOT" "bootb-$2"
    NUBO_ROOT=$NUBO_ROOT timeout 120 "$NUBO_BIN" vm rm --force "bootb-$2" >/dev/null 2>&1 ;;
  plain) boot_plain "$2" ;;
  peer)
    boot_nubo peer "$peer_root" "bootp-$2"
    guest_report "$peer_root" "bootp-$2"
    NUBO_ROOT=$peer_root timeout 120 "$NUBO_BIN" vm rm --force "bootp-$2" >/dev/null 2>&1 ;;
  esac
}
sides=(nubo plain)
[ -n "$peer_root" ] && sides+=(peer)
echo "-- debian:12 (recipe $version) from create to cloud-init done, $runs run(s) per side$([ "$parallel" = 1 ] && echo ", sides booted at the same time")"
for i in $(seq "$runs"); do
  created+=("$NUBO_ROOT bootb-$i")
  [ -n "$peer_root" ] && created+=("$peer_root bootp-$i")
  if [ "$parallel" = 1 ]; then
    pids=()
    for s in "${sides[@]}"; do
      (side "$s" "$i") >"$work/side-$s-$i.out" 2>&1 &
      pids+=($!)
    done
    failed=0
    for p in "${pids[@]}"; do wait "$p" || failed=1; done
    for s in "${sides[@]}"; do cat "$work/side-$s-$i.out"; done
    [ "$failed" = 0 ] || { echo "boot: a side failed (above)"; exit 1; }
  else
    for s in "${sides[@]}"; do side "$s" "$i"; done
  fi
done
n=$(median <"$work/t-nubo") p=$(median <"$work/t-plain")
q=$([ -s "$work/t-peer" ] && median <"$work/t-peer" || echo 0)
awk -v n="$n" -v p="$p" -v q="$q" 'BEGIN {
  printf "  nubo vm create --wait -> cloud-init finished  %6.1f s (median; goal under TCG: <= 25 s)\n", n / 1e3
  printf "  plain QEMU boot of the same image             %6.1f s (nubo / plain %.2fx: what nubo adds)\n", p / 1e3, n / p
  if (q > 0) printf "  peer image (BOOT_BENCH_PEER_ROOT), same nubo %6.1f s (peer / this image %.2fx)\n", q / 1e3, q / n
}'
