#!/usr/bin/env bash
# nubo vm benchmarks. Boot times under TCG on these shared machines vary 2x between identical runs,
# so this measures what nubo controls, against peers measured in the same run, as ratios:
#   (a) host-side overhead: wall time from `nubo vm create` starting to QEMU's exec, against the same
#       steps by hand (cloud-localds + qemu-img create + launching QEMU); and the latency from a
#       console line's arrival in console.log to nubo printing its phase
#   (b) time from create to the kernel's first line (`Linux version`) for BIOS, EFI and direct-kernel
#       boot of the same image: what firmware + GRUB cost
#   (c) `nubo vm ls` with 50 recorded VMs, against `ls -l` and `cat` of the same records
# Every VM runs under TCG with `restrict=on` networking and is removed on exit.
# Needs $NUBO_BIN (scripts/bench.sh sets it), qemu-system-x86_64, qemu-img, cloud-localds, python3.
# The image: debian:12 in a bench root kept across runs (NUBO_BENCH_ROOT, default
# /var/tmp/nubo-bench/root), bootstrapped there when absent (once, ~60-100 s).
# VM_BENCH_RUNS overrides the 5 creates per side in (a); VM_BENCH_LS_RUNS the 20 runs in (c).
set -euo pipefail
: "${NUBO_BIN:?set NUBO_BIN to the release nubo binary (scripts/bench.sh does)}"
runs=${VM_BENCH_RUNS:-5}
ls_runs=${VM_BENCH_LS_RUNS:-20}
for t in qemu-system-x86_64 qemu-img cloud-localds python3; do
  command -v "$t" >/dev/null || { echo "vm: skipped: $t not found (qemu-system-x86, qemu-utils, cloud-image-utils, python3)"; exit 0; }
done
real_qemu=$(command -v qemu-system-x86_64)

export NUBO_ROOT=${NUBO_BENCH_ROOT:-/var/tmp/nubo-bench/root}
# AF_UNIX socket paths must stay under 108 bytes: keep the run dir short.
export NUBO_RUN_DIR=${NUBO_BENCH_RUN_DIR:-/tmp/nubo-bench-run}
mkdir -p "$NUBO_ROOT" "$NUBO_RUN_DIR"
work=$(mktemp -d /tmp/nubo-vm-bench.XXXXXX)
created=() # VM names to remove on exit
hand_pid=  # the by-hand QEMU running, if any
cleanup() {
  if [ -n "$hand_pid" ]; then kill -9 "$hand_pid" 2>/dev/null || true; fi
  if [ ${#created[@]} -gt 0 ]; then
    timeout 120 "$NUBO_BIN" vm rm --force "${created[@]}" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# A killed earlier run may have left its VMs in the bench root: they are all ours (vmb-*).
for d in "$NUBO_ROOT"/vms/vmb-*; do
  [ -d "$d" ] && timeout 120 "$NUBO_BIN" vm rm --force "$(basename "$d")" >/dev/null 2>&1 || true
done

if ! "$NUBO_BIN" image inspect debian:12 >"$work/image.json" 2>/dev/null; then
  echo "bootstrapping debian:12 into $NUBO_ROOT (once; kept across runs) ..."
  timeout 1800 "$NUBO_BIN" image bootstrap debian:12 >"$work/bootstrap.log" 2>&1 ||
    { echo "vm: nubo image bootstrap debian:12 failed:"; tail -20 "$work/bootstrap.log"; exit 1; }
  "$NUBO_BIN" image inspect debian:12 >"$work/image.json"
fi
field() { # key... : one field of the image record, empty when absent
  python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2:]:
    v = v.get(k) if isinstance(v, dict) else None
print(v or "")' "$work/image.json" "$@"
}
base=$(field path)
kernel=$(field boot kernel)
initrd=$(field boot initrd)
cmdline=$(field boot cmdline)
[ -n "$kernel" ] || { echo "vm: the debian:12 record names no kernel: direct-kernel boot cannot be measured"; exit 1; }

# The wrapper QEMU: first on PATH for nubo, and launched by hand for the peer. It stamps the
# time of its exec (then execs the real QEMU), so both sides are timed up to the same instant.
# `--version` (nubo's backend probe) is run as a child instead, to stamp its end as well.
# `--bench-calibrate` stamps and exits: the cost of starting the wrapper itself.
mkdir -p "$work/bin"
cat >"$work/bin/qemu-system-x86_64" <<EOF
#!/bin/sh
t=\$(date +%s%N)
case "\$1" in
--bench-calibrate) echo "exec \$t" >>"$work/stamps"; exit 0 ;;
--version)
  echo "probe \$t" >>"$work/stamps"
  "$real_qemu" "\$@"; rc=\$?
  echo "probe-end \$(date +%s%N)" >>"$work/stamps"
  exit \$rc ;;
esac
echo "exec \$t" >>"$work/stamps"
exec "$real_qemu" "\$@"
EOF
chmod +x "$work/bin/qemu-system-x86_64"
wrap="$work/bin/qemu-system-x86_64"
now_ns() { local t=$EPOCHREALTIME; echo "${t/./}000"; } # no fork: bash's own clock, in ns
stamp() { awk -v k="$1" '$1 == k { v = $2 } END { print v }' "$work/stamps"; } # the last one
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ms() { awk -v n="$1" 'BEGIN { printf "%.1f", n / 1e6 }'; }

# ---------------------------------------------------------------------------------------------
echo "-- (a) host-side overhead: create start -> QEMU exec, median of $runs (debian:12, direct-kernel)"
: >"$work/stamps"
for _ in $(seq "$runs"); do
  t0=$(now_ns)
  "$wrap" --bench-calibrate
  echo $(($(stamp exec) - t0)) >>"$work/a-base"
done
# What the by-hand side passes to cloud-localds: the same shape nubo renders into its seed.
printf '#cloud-config\nhostname: vmb-hand\nssh_authorized_keys:\n  - "%s"\n' "$(cat "$NUBO_ROOT/ssh/id_ed25519.pub" 2>/dev/null || echo ssh-ed25519 AAAA bench)" >"$work/user-data"
printf 'instance-id: 00000000-0000-4000-8000-000000000000\nlocal-hostname: vmb-hand\n' >"$work/meta-data"
for i in $(seq "$runs"); do
  # nubo: the whole `vm create`, QEMU found on PATH like any user's.
  name="vmb-a$i"
  created+=("$name")
  t0=$(now_ns)
  PATH="$work/bin:$PATH" timeout 60 "$NUBO_BIN" vm create "$name" --image debian:12 --restrict-network \
    >/dev/null 2>"$work/create.err" || { echo "vm: nubo vm create failed:"; cat "$work/create.err"; exit 1; }
  t_exec=$(stamp exec) t_probe=$(stamp probe) t_probe_end=$(stamp probe-end)
  echo $((t_exec - t0)) >>"$work/a-nubo"
  if [ -n "$t_probe" ] && [ "$t_probe" -gt "$t0" ]; then
    echo $((t_probe_end - t_probe)) >>"$work/a-probe"
  fi
  timeout 60 "$NUBO_BIN" vm rm --force "$name" >/dev/null 2>&1
  # By hand: the same three steps a script would run.
  h="$work/hand$i"
  mkdir -p "$h"
  t0=$(now_ns)
  cloud-localds "$h/seed.img" "$work/user-data" "$work/meta-data"
  qemu-img create -q -f qcow2 -F qcow2 -b "$base" "$h/disk.qcow2"
  "$wrap" -name "vmb-hand$i" -machine pc -accel tcg,thread=multi -cpu max -smp 2 -m 1024M -nodefaults \
    -no-user-config -display none -serial "file:$h/console.log" -pidfile "$h/qemu.pid" -daemonize \
    -kernel "$kernel" -initrd "$initrd" -append "$cmdline console=ttyS0,115200" \
    -drive "if=virtio,file=$h/disk.qcow2,format=qcow2" -drive "if=virtio,file=$h/seed.img,format=raw,readonly=on" \
    -netdev user,id=net0,restrict=on -device virtio-net-pci,netdev=net0
  echo $(($(stamp exec) - t0)) >>"$work/a-hand"
  hand_pid=$(cat "$h/qemu.pid")
  kill "$hand_pid"
  for _ in $(seq 100); do kill -0 "$hand_pid" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$hand_pid" 2>/dev/null && { echo "vm: by-hand QEMU $hand_pid did not exit"; exit 1; }
  hand_pid=
done
b=$(median <"$work/a-base") n=$(median <"$work/a-nubo") hd=$(median <"$work/a-hand")
p=$( [ -s "$work/a-probe" ] && median <"$work/a-probe" || echo 0)
awk -v b="$b" -v n="$n" -v h="$hd" -v p="$p" 'BEGIN {
  nn = n - b; hn = h - b
  printf "  (wrapper start-up, subtracted below: %.1f ms)\n", b / 1e6
  printf "  nubo vm create            %7.1f ms\n", nn / 1e6
  if (p > 0) printf "    of which qemu --version %7.1f ms (the backend probe; nubo without it: %.1f ms)\n", p / 1e6, (nn - p - b) / 1e6
  printf "  by hand (cloud-localds + qemu-img create + qemu)  %7.1f ms\n", hn / 1e6
  printf "  ratio by hand / nubo      %7.1fx (goal: >= 3x, nubo <= 10 ms)\n", hn / nn
}'

# ---------------------------------------------------------------------------------------------
# Follows a VM's console.log (polling every millisecond, so an arrival is timed to ~1 ms) while
# running a command whose stderr lines it timestamps on arrival (nubo writes stderr unbuffered).
# Prints, in ms since the command started: when each console line we care about was first seen
# whole, and when nubo printed each phase. nubo polls the console every 20 ms, so the difference
# is nubo's reporting latency: expect 0-20 ms plus the read.
cat >"$work/observe.py" <<'PY'
import os, subprocess, sys, threading, time
console, deadline, mode, out = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
cmd = sys.argv[5:]
lines = []
t0 = time.time()
proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
def read_stderr():
    for raw in proc.stderr:
        lines.append((time.time(), raw.decode(errors="replace").rstrip("\n")))
reader = threading.Thread(target=read_stderr, daemon=True)
reader.start()
seen = {}
def want(line):
    if "Linux version " in line:
        return "console_kernel"
    if "Cloud-init v. " in line and " finished at " in line:
        return "console_finished"
fd, ino, off, partial = None, None, 0, b""
while time.time() - t0 < deadline:
    if fd is None:
        try:
            fd = os.open(console, os.O_RDONLY)
            ino, off, partial = os.fstat(fd).st_ino, 0, b""
        except FileNotFoundError:
            pass
    if fd is not None:
        data = os.pread(fd, 1 << 16, off)
        if data:
            off += len(data)
            partial += data
            while b"\n" in partial:
                line, partial = partial.split(b"\n", 1)
                k = want(line.decode(errors="replace"))
                if k and k not in seen:
                    seen[k] = time.time()
        elif not os.path.exists(console) or os.stat(console).st_ino != ino:
            os.close(fd)
            fd = None  # rotated or removed: start over on the new file
    done = proc.poll() is not None
    if mode == "kernel" and done and "console_kernel" in seen:
        break
    if mode == "wait" and done:
        break
    time.sleep(0.001)
timed_out = proc.poll() is None
if timed_out:
    os.killpg(proc.pid, 9)
proc.wait()
reader.join(2)
for t, line in lines:
    for phase, key in (("kernel booting", "nubo_kernel"), ("cloud-init finished", "nubo_finished")):
        if phase in line and key not in seen:
            seen[key] = t
with open(out, "w") as f:
    f.write("rc %d\ntimed_out %d\n" % (proc.returncode, timed_out))
    for k, t in seen.items():
        f.write("%s %.3f\n" % (k, (t - t0) * 1000))
    f.write("".join("# %s\n" % l for _, l in lines))
PY
val() { awk -v k="$1" '$1 == k { print $2 }' "$2"; }

echo "-- (b) create -> kernel's first console line (\`Linux version\`), same image, one boot each"
boot_ms() { # label name mode deadline nubo-args...
  local label=$1 name=$2 mode=$3 deadline=$4
  shift 4
  created+=("$name")
  python3 "$work/observe.py" "$NUBO_ROOT/vms/$name/console.log" "$deadline" "$mode" "$work/$name.obs" \
    timeout "$deadline" "$NUBO_BIN" vm create "$name" --image debian:12 --restrict-network "$@"
  if [ -z "$(val console_kernel "$work/$name.obs")" ]; then
    echo "vm: $label: no \`Linux version\` line within ${deadline}s; nubo said:"
    sed -n 's/^# /  /p' "$work/$name.obs"
    echo "  console log $NUBO_ROOT/vms/$name/console.log:"
    tail -c 2000 "$NUBO_ROOT/vms/$name/console.log" 2>/dev/null | sed 's/^/  | /' || true
    exit 1
  fi
}
boot_ms BIOS vmb-bios kernel 120 --firmware bios
timeout 60 "$NUBO_BIN" vm rm --force vmb-bios >/dev/null 2>&1
boot_ms EFI vmb-efi kernel 120 --firmware efi
timeout 60 "$NUBO_BIN" vm rm --force vmb-efi >/dev/null 2>&1
# The direct-kernel boot goes on to cloud-init with --wait, to time both console phases for (a).
boot_ms direct-kernel vmb-direct wait 300 --wait --boot-timeout 280s
t_bios=$(val console_kernel "$work/vmb-bios.obs")
t_efi=$(val console_kernel "$work/vmb-efi.obs")
t_direct=$(val console_kernel "$work/vmb-direct.obs")
awk -v b="$t_bios" -v e="$t_efi" -v d="$t_direct" 'BEGIN {
  printf "  BIOS (SeaBIOS + GRUB)      %7.2f s\n", b / 1e3
  printf "  EFI (OVMF + GRUB)          %7.2f s\n", e / 1e3
  printf "  direct-kernel (default)    %7.2f s\n", d / 1e3
  printf "  direct-kernel saves        %7.2f s vs BIOS (%.1fx), %.2f s vs EFI (%.1fx)\n", (b - d) / 1e3, b / d, (e - d) / 1e3, e / d
}'
obs="$work/vmb-direct.obs"
[ "$(val rc "$obs")" = 0 ] || { echo "vm: nubo vm create --wait failed:"; sed -n 's/^# /  /p' "$obs"; exit 1; }
echo "-- (a) console line in console.log -> nubo printing the phase (same direct-kernel boot)"
for p in kernel finished; do
  c=$(val "console_$p" "$obs") n=$(val "nubo_$p" "$obs")
  label=$([ "$p" = kernel ] && echo "kernel booting" || echo "cloud-init finished")
  if [ -n "$c" ] && [ -n "$n" ]; then
    awk -v l="$label" -v c="$c" -v n="$n" 'BEGIN { printf "  %-20s line at %8.3f s, nubo printed it %7.1f ms later (goal: within its 20 ms poll)\n", l, c / 1e3, n - c }'
  else
    echo "  $label: not seen (console ${c:-none}, nubo ${n:-none})"
  fi
done
timeout 60 "$NUBO_BIN" vm rm --force vmb-direct >/dev/null 2>&1

# ---------------------------------------------------------------------------------------------
echo "-- (c) nubo vm ls with 50 recorded (stopped) VMs, median of $ls_runs runs"
# One real VM, stopped, then its directory copied to 50 names in a root of their own, with the
# name, UUID and paths inside vm.json rewritten: 50 records as real as `create` writes them.
created+=(vmb-ls)
timeout 60 "$NUBO_BIN" vm create vmb-ls --image debian:12 --restrict-network >/dev/null 2>"$work/create.err" ||
  { echo "vm: nubo vm create failed:"; cat "$work/create.err"; exit 1; }
timeout 60 "$NUBO_BIN" vm stop --force vmb-ls >/dev/null 2>&1
ls_root="$work/ls-root"
mkdir -p "$ls_root/vms"
python3 - "$NUBO_ROOT/vms/vmb-ls" "$ls_root/vms" "$NUBO_RUN_DIR" <<'PY'
import json, os, shutil, sys, uuid
src, vms, run = sys.argv[1:4]
rec = json.load(open(os.path.join(src, "vm.json")))
old_uuid, old_dir = rec["uuid"], os.path.dirname(src)
def rewrite(v, name, new_uuid):
    if isinstance(v, dict):
        return {k: rewrite(x, name, new_uuid) for k, x in v.items()}
    if isinstance(v, list):
        return [rewrite(x, name, new_uuid) for x in v]
    if isinstance(v, str):
        return v.replace(old_dir + "/", vms + "/").replace("vmb-ls", name).replace(old_uuid, new_uuid)
    return v
for i in range(1, 51):
    name = "vmb-ls-%02d" % i
    dst = os.path.join(vms, name)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("vm.json"))
    with open(os.path.join(dst, "vm.json"), "w") as f:
        json.dump(rewrite(rec, name, str(uuid.uuid4())), f, indent=2)
PY
rows=$(NUBO_ROOT="$ls_root" "$NUBO_BIN" vm ls -o json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
[ "$rows" = 50 ] || { echo "vm: nubo vm ls listed $rows VMs, not 50"; exit 1; }
time_ms() { # file command... : appends one wall time in ns per run
  local out=$1 t0
  shift
  for _ in $(seq "$ls_runs"); do
    t0=$(now_ns)
    "$@" >/dev/null
    echo $(($(now_ns) - t0)) >>"$out"
  done
}
nubo_ls() { NUBO_ROOT="$ls_root" "$NUBO_BIN" vm ls; }
cat_records() { cat "$ls_root"/vms/*/vm.json; }
time_ms "$work/c-nubo" nubo_ls
time_ms "$work/c-ls" ls -l "$ls_root/vms"
time_ms "$work/c-cat" cat_records
awk -v n="$(median <"$work/c-nubo")" -v l="$(median <"$work/c-ls")" -v c="$(median <"$work/c-cat")" 'BEGIN {
  printf "  nubo vm ls (50 VMs)        %7.2f ms (goal <= 20 ms)\n", n / 1e6
  printf "  ls -l of vms/              %7.2f ms (nubo / peer %.1fx)\n", l / 1e6, n / l
  printf "  cat of the 50 vm.json      %7.2f ms (nubo / peer %.1fx)\n", c / 1e6, n / c
}'
