#!/usr/bin/env bash
# nubo libvirt benchmark, ratios against peers measured in the same run on the same image:
#   - host-side time from `nubo vm create --backend libvirt` to the domain running (define,
#     UUID, seed volume upload, redefine, start) against `cloud-localds` + `qemu-img create` +
#     `virt-install --import` (seed ISO as a CD-ROM, same network) to the domain running;
#   - `nubo vm snapshot create|restore` (memory, 1 GiB guest) against `virsh snapshot-create-as`
#     / `snapshot-revert` on the peer's domain, both guests booted for the same time.
# Both run against a private libvirtd this script starts in its own network namespace (private
# config/state/socket directories, an isolated network without <forward>, qemu.conf running QEMU
# as root without relabelling), torn down by PID on exit. Never timed assertions.
# Needs root, $NUBO_BIN (scripts/bench.sh sets it), libvirtd, virtlogd, virsh, virt-install
# (virtinst), cloud-localds (cloud-image-utils), qemu-img, python3.
# LIBVIRT_BENCH_RUNS overrides the 3 rounds per side.
set -euo pipefail
: "${NUBO_BIN:?set NUBO_BIN to the release nubo binary (scripts/bench.sh does)}"
runs=${LIBVIRT_BENCH_RUNS:-3}
[ "$(id -u)" = 0 ] || { echo "libvirt: skipped: needs root (a network namespace and a private libvirtd)"; exit 0; }
for t in libvirtd virtlogd virsh qemu-img python3 cloud-localds ip; do
  command -v "$t" >/dev/null || { echo "libvirt: skipped: $t not found (scripts/install-deps.sh installs it)"; exit 0; }
done
peer=virt-install
command -v virt-install >/dev/null || peer=virsh
export NUBO_ROOT=${NUBO_BENCH_ROOT:-/var/tmp/nubo-bench/root}
export NUBO_RUN_DIR=${NUBO_BENCH_RUN_DIR:-/tmp/nubo-bench-run}
mkdir -p "$NUBO_ROOT" "$NUBO_RUN_DIR" /run/libvirt
work=$(mktemp -d /tmp/nlvb.XXXXXX)
ns="nubo-lvb-$$"
uri="qemu:///system?socket=$work/sock/libvirt-sock"
export NUBO_LIBVIRT_URI=$uri
lvpid= vlpid=
V() { timeout 120 virsh -q -c "$uri" "$@"; }
N() { timeout 600 ip netns exec "$ns" "$NUBO_BIN" "$@"; }
cleanup() {
  if [ -n "$lvpid" ]; then
    for i in $(seq "$runs"); do N vm rm --force "lvb-$i" >/dev/null 2>&1 || true; done
    for d in $(V list --all --name 2>/dev/null); do V destroy "$d" >/dev/null 2>&1 || true; V undefine --nvram --snapshots-metadata "$d" >/dev/null 2>&1 || true; done
    for n in $(V net-list --all --name 2>/dev/null); do V net-destroy "$n" >/dev/null 2>&1 || true; V net-undefine "$n" >/dev/null 2>&1 || true; done
    for p in $(V pool-list --all --name 2>/dev/null); do V pool-destroy "$p" >/dev/null 2>&1 || true; V pool-undefine "$p" >/dev/null 2>&1 || true; done
    kill "$lvpid" 2>/dev/null || true
  fi
  [ -n "$vlpid" ] && kill "$vlpid" 2>/dev/null || true
  sleep 1
  ip netns delete "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

if ! "$NUBO_BIN" image inspect debian:12 >"$work/image.json" 2>/dev/null; then
  echo "bootstrapping debian:12 into $NUBO_ROOT (once; kept across runs) ..."
  timeout 1800 "$NUBO_BIN" image bootstrap debian:12 >"$work/bootstrap.log" 2>&1 ||
    { echo "libvirt: nubo image bootstrap debian:12 failed:"; tail -20 "$work/bootstrap.log"; exit 1; }
  "$NUBO_BIN" image inspect debian:12 >"$work/image.json"
fi
read -r base kernel initrd cmdline < <(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); b=r.get("boot") or {}; print(r["path"], b.get("kernel",""), b.get("initrd",""), (b.get("cmdline") or "").replace(" ", "\x1f"))' "$work/image.json")
cmdline=${cmdline//$'\x1f'/ }

# The private libvirtd.
mkdir -p "$work"/{etc,run,lib,cache,log,sock}
cp -a /etc/libvirt/. "$work/etc/"; rm -rf "$work/etc/qemu/networks"
printf 'unix_sock_dir = "%s"\nunix_sock_rw_perms = "0700"\nauth_unix_rw = "none"\nauth_unix_ro = "none"\n' "$work/sock" >"$work/etc/libvirtd.conf"
printf 'user = "root"\ngroup = "root"\ndynamic_ownership = 0\nremember_owner = 0\n' >"$work/etc/qemu.conf"
ip netns add "$ns"; ip netns exec "$ns" ip link set lo up
ip netns exec "$ns" sh -c "set -e; mount --bind $work/etc /etc/libvirt; mount --bind $work/run /run/libvirt; mount --bind $work/lib /var/lib/libvirt; mount --bind $work/cache /var/cache/libvirt; mount --bind $work/log /var/log/libvirt; virtlogd </dev/null >$work/virtlogd.out 2>&1 & echo \$! >$work/virtlogd.pid; exec libvirtd --pid-file $work/libvirtd.pid </dev/null >$work/libvirtd.out 2>&1" &
lvpid=$!
for _ in $(seq 600); do V version >/dev/null 2>&1 && break; sleep 0.3; done
vlpid=$(cat "$work/virtlogd.pid")
V version >/dev/null || { echo "libvirt: the private libvirtd did not start:"; tail "$work/libvirtd.out"; exit 1; }
echo "<network><name>default</name><bridge name='nlvbbr0'/><ip address='192.168.151.1' netmask='255.255.255.0'><dhcp><range start='192.168.151.10' end='192.168.151.200'/></dhcp></ip></network>" >"$work/net.xml"
V net-define "$work/net.xml" >/dev/null; V net-start default >/dev/null

now() { date +%s%N; }
secs() { python3 -c "print(f'{($2-$1)/1e9:.3f}')"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}x' if $2 > 0 else 'n/a')"; }
mean() { python3 -c 'import sys; v=[float(x) for x in sys.argv[1:]]; print(f"{sum(v)/len(v):.3f}")' "$@"; }
running() { for _ in $(seq 600); do [ "$(V domstate "$1" 2>/dev/null)" = running ] && return 0; sleep 0.05; done; return 1; }

printf '#cloud-config\nhostname: peer\n' >"$work/user-data"
n_create=() p_create=()
for i in $(seq "$runs"); do
  t0=$(now); N vm create "lvb-$i" --image debian:12 --backend libvirt --memory 1G >"$work/n$i.log" 2>&1 ||
    { echo "libvirt: nubo create failed:"; tail "$work/n$i.log"; exit 1; }
  running "lvb-$i" || { echo "libvirt: lvb-$i never ran"; exit 1; }; t1=$(now); n_create+=("$(secs "$t0" "$t1")")
  t0=$(now)
  printf 'instance-id: peer-%s\nlocal-hostname: peer-%s\n' "$i" "$i" >"$work/meta-$i"
  cloud-localds "$work/seed-$i.iso" "$work/user-data" "$work/meta-$i"
  qemu-img create -q -f qcow2 -b "$base" -F qcow2 "$work/peer-$i.qcow2"
  if [ "$peer" = virt-install ]; then
    boot=()
    [ -n "$kernel" ] && boot=(--boot "kernel=$kernel,initrd=$initrd,kernel_args=$cmdline console=ttyS0,115200")
    timeout 300 virt-install --connect "$uri" --import --name "peer-$i" --memory 1024 --vcpus 1 --virt-type qemu \
      --machine pc --osinfo detect=on,require=off "${boot[@]}" \
      --disk "path=$work/peer-$i.qcow2,format=qcow2,bus=virtio" --disk "path=$work/seed-$i.iso,device=cdrom,bus=ide" \
      --network network=default,model=virtio --graphics none --noautoconsole >"$work/p$i.log" 2>&1 ||
      { echo "libvirt: virt-install failed:"; tail "$work/p$i.log"; exit 1; }
  else
    echo "virt-install not found: the peer is virsh define + start of the equivalent XML"
    exit 1
  fi
  running "peer-$i" || { echo "libvirt: peer-$i never ran:"; tail "$work/p$i.log"; exit 1; }; t1=$(now); p_create+=("$(secs "$t0" "$t1")")
  [ "$i" = "$runs" ] || { N vm rm --force "lvb-$i" >/dev/null 2>&1; V destroy "peer-$i" >/dev/null; V undefine "peer-$i" >/dev/null; }
done
echo "nubo vm create -> domain running:                 $(mean "${n_create[@]}")s  (runs: ${n_create[*]})"
echo "cloud-localds + qemu-img + virt-install --import:  $(mean "${p_create[@]}")s  (runs: ${p_create[*]}) -> nubo/peer $(ratio "$(mean "${n_create[@]}")" "$(mean "${p_create[@]}")")"

echo "letting both guests boot (60 s) ..."; sleep 60
vm="lvb-$runs" dom="peer-$runs"
n_snap=() n_rev=() v_snap=() v_rev=()
for i in $(seq "$runs"); do
  t0=$(now); N vm snapshot create "$vm" "s$i" >/dev/null 2>&1; t1=$(now); n_snap+=("$(secs "$t0" "$t1")")
  t0=$(now); N vm snapshot restore "$vm" "s$i" >/dev/null 2>&1; t1=$(now); n_rev+=("$(secs "$t0" "$t1")")
  t0=$(now); V snapshot-create-as "$dom" "v$i" >/dev/null; t1=$(now); v_snap+=("$(secs "$t0" "$t1")")
  t0=$(now); V snapshot-revert "$dom" "v$i" >/dev/null; t1=$(now); v_rev+=("$(secs "$t0" "$t1")")
done
echo "nubo vm snapshot create (memory):  $(mean "${n_snap[@]}")s; virsh snapshot-create-as $(mean "${v_snap[@]}")s -> nubo/virsh $(ratio "$(mean "${n_snap[@]}")" "$(mean "${v_snap[@]}")")"
echo "nubo vm snapshot restore (memory): $(mean "${n_rev[@]}")s; virsh snapshot-revert $(mean "${v_rev[@]}")s -> nubo/virsh $(ratio "$(mean "${n_rev[@]}")" "$(mean "${v_rev[@]}")")"
