#!/usr/bin/env bash
# nubo remote-libvirt benchmark (issue 22), ratios against peers measured in the same run:
#   - the base upload, timed apart: nubo's first create on a host (which uploads the base as
#     the volume nubo-base-<sha256>, reads it back and hashes it) minus its later creates (base
#     reused), against `virsh vol-create-as` + `vol-upload` of the same base (no check);
#   - create to domain running with the base already on the host: `nubo vm create --connect
#     qemu+tls://... --tls-dir` against `qemu-img`-free peer steps over the same TLS connection:
#     `virsh vol-create-as --backing-vol` (overlay), `cloud-localds` + `vol-create-as` +
#     `vol-upload` (seed volume), `virt-install --connect ... --import` with both volumes.
# The "remote" host is a private libvirtd this script starts in its own network namespace,
# listening for TLS on its end of a veth pair (10.250.78.1/30, this host 10.250.78.2; nothing
# routed), with a CA, server and client certificates made here with openssl. No guest network
# on either side (--network none): only creation is timed. Torn down by PID on exit; never
# timed assertions. Needs root, $NUBO_BIN, libvirtd, virtlogd, virsh, virt-install,
# cloud-localds, openssl, python3. REMOTE_BENCH_RUNS overrides the 3 rounds per side.
set -euo pipefail
: "${NUBO_BIN:?set NUBO_BIN to the release nubo binary (scripts/bench.sh does)}"
runs=${REMOTE_BENCH_RUNS:-3}
[ "$(id -u)" = 0 ] || { echo "remote: skipped: needs root (a network namespace and a private libvirtd)"; exit 0; }
for t in libvirtd virtlogd virsh virt-install cloud-localds openssl python3 ip; do
  command -v "$t" >/dev/null || { echo "remote: skipped: $t not found (scripts/install-deps.sh installs it)"; exit 0; }
done
export NUBO_ROOT=${NUBO_BENCH_ROOT:-/var/tmp/nubo-bench/root}
export NUBO_RUN_DIR=${NUBO_BENCH_RUN_DIR:-/tmp/nubo-bench-run}
unset NUBO_LIBVIRT_URI
mkdir -p "$NUBO_ROOT" "$NUBO_RUN_DIR"
work=$(mktemp -d /tmp/nrb.XXXXXX)
ns="nubo-rb-$$"
host=nrbh$$
addr=10.250.78.1
sock="qemu:///system?socket=$work/sock/libvirt-sock"
ruri="qemu+tls://$addr/system"
lvpid= vlpid=
V() { timeout 120 virsh -q -c "$sock" "$@"; }
R() { timeout 600 virsh -q -c "$ruri?pkipath=$work/pki/client" "$@"; }
N() { timeout 600 "$NUBO_BIN" "$@"; }
cleanup() {
  if [ -n "$lvpid" ]; then
    for i in 0 $(seq "$runs"); do N vm rm --force "rb-$i" >/dev/null 2>&1 || true; done
    for d in $(V list --all --name 2>/dev/null); do V destroy "$d" >/dev/null 2>&1 || true; V undefine --nvram "$d" >/dev/null 2>&1 || true; done
    for p in $(V pool-list --all --name 2>/dev/null); do
      for v in $(V vol-list --pool "$p" 2>/dev/null | awk '{print $1}'); do V vol-delete --pool "$p" "$v" >/dev/null 2>&1 || true; done
      V pool-destroy "$p" >/dev/null 2>&1 || true; V pool-undefine "$p" >/dev/null 2>&1 || true
    done
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
    { echo "remote: nubo image bootstrap debian:12 failed:"; tail -20 "$work/bootstrap.log"; exit 1; }
  "$NUBO_BIN" image inspect debian:12 >"$work/image.json"
fi
base=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$work/image.json")

# The PKI: CA, server certificate for $addr, client certificate (libvirt's layouts).
mkdir -p "$work"/pki/{server,client}
(
  cd "$work/pki"
  openssl genrsa -out ca.key 2048 2>/dev/null
  openssl req -x509 -new -key ca.key -days 2 -subj "/CN=nubo bench CA" -out ca.pem \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign 2>/dev/null
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:%s\n' "$addr" >server.ext
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >client.ext
  for n in server client; do
    openssl genrsa -out "$n.key" 2048 2>/dev/null
    subj="/CN=nubo-bench-client"; [ "$n" = server ] && subj="/CN=$addr"
    openssl req -new -key "$n.key" -subj "$subj" -out "$n.csr"
    openssl x509 -req -in "$n.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile "$n.ext" -out "$n.pem" 2>/dev/null
  done
  cp ca.pem server/cacert.pem; cp server.pem server/servercert.pem; install -m 600 server.key server/serverkey.pem
  cp ca.pem client/cacert.pem; cp client.pem client/clientcert.pem; install -m 600 client.key client/clientkey.pem
)

# The private libvirtd, listening for TLS in its namespace.
mkdir -p "$work"/{etc,run,lib,cache,log,sock}
cp -a /etc/libvirt/. "$work/etc/"; rm -rf "$work/etc/qemu/networks"
cat >"$work/etc/libvirtd.conf" <<CONF
unix_sock_dir = "$work/sock"
unix_sock_rw_perms = "0700"
auth_unix_rw = "none"
auth_unix_ro = "none"
listen_tls = 1
listen_tcp = 0
listen_addr = "$addr"
auth_tls = "none"
ca_file = "$work/pki/server/cacert.pem"
cert_file = "$work/pki/server/servercert.pem"
key_file = "$work/pki/server/serverkey.pem"
CONF
printf 'user = "root"\ngroup = "root"\ndynamic_ownership = 0\nremember_owner = 0\n' >"$work/etc/qemu.conf"
ip netns add "$ns"; ip netns exec "$ns" ip link set lo up
ip link add "$host" type veth peer name nrbtls0 netns "$ns"
ip addr add 10.250.78.2/30 dev "$host"; ip link set "$host" up
ip netns exec "$ns" ip addr add "$addr/30" dev nrbtls0; ip netns exec "$ns" ip link set nrbtls0 up
ip netns exec "$ns" sh -c "set -e; mount -t tmpfs -o mode=0755 nubo-run /run; mkdir /run/libvirt; mkdir -m 1777 /run/lock; mount --bind $work/etc /etc/libvirt; mount --bind $work/run /run/libvirt; mount --bind $work/lib /var/lib/libvirt; mount --bind $work/cache /var/cache/libvirt; mount --bind $work/log /var/log/libvirt; virtlogd </dev/null >$work/virtlogd.out 2>&1 & echo \$! >$work/virtlogd.pid; exec libvirtd --listen --pid-file $work/libvirtd.pid </dev/null >$work/libvirtd.out 2>&1" &
lvpid=$!
for _ in $(seq 600); do V version >/dev/null 2>&1 && break; sleep 0.3; done
vlpid=$(cat "$work/virtlogd.pid")
R version >/dev/null || { echo "remote: the private libvirtd does not answer over TLS:"; tail "$work/libvirtd.out"; exit 1; }

now() { date +%s%N; }
secs() { python3 -c "print(f'{($2-$1)/1e9:.3f}')"; }
ratio() { python3 -c "print(f'{$1/$2:.2f}x' if $2 > 0 else 'n/a')"; }
mean() { python3 -c 'import sys; v=[float(x) for x in sys.argv[1:]]; print(f"{sum(v)/len(v):.3f}")' "$@"; }
running() { for _ in $(seq 600); do [ "$(V domstate "$1" 2>/dev/null)" = running ] && return 0; sleep 0.05; done; return 1; }
create() {
  N vm create "$1" --image debian:12 --backend libvirt --connect "$ruri" --tls-dir "$work/pki/client" \
    --network none --memory 512M --vcpus 1 >"$work/$1.log" 2>&1 || { echo "remote: nubo create $1 failed:"; tail "$work/$1.log"; exit 1; }
  running "$1" || { echo "remote: $1 never ran"; exit 1; }
}

t0=$(now); create rb-0; t1=$(now); first=$(secs "$t0" "$t1")
pool=$("$NUBO_BIN" vm inspect rb-0 | python3 -c 'import json,sys; print(json.load(sys.stdin)["backend_state"]["pool"])')
n_create=() p_create=()
for i in $(seq "$runs"); do
  t0=$(now); create "rb-$i"; t1=$(now); n_create+=("$(secs "$t0" "$t1")")
done
size=$(stat -c %s "$base")
t0=$(now)
R vol-create-as "$pool" peer-base.qcow2 "$size" --format raw >/dev/null
R vol-upload --pool "$pool" peer-base.qcow2 "$base"
t1=$(now); p_upload=$(secs "$t0" "$t1")
bpath=$(R vol-path --pool "$pool" peer-base.qcow2)
printf '#cloud-config\nhostname: peer\n' >"$work/user-data"
for i in $(seq "$runs"); do
  t0=$(now)
  R vol-create-as "$pool" "peer-$i.qcow2" 10G --format qcow2 --backing-vol "$bpath" --backing-vol-format qcow2 >/dev/null
  printf 'instance-id: peer-%s\nlocal-hostname: peer-%s\n' "$i" "$i" >"$work/meta-$i"
  cloud-localds "$work/seed-$i.iso" "$work/user-data" "$work/meta-$i"
  R vol-create-as "$pool" "peer-$i-cidata.iso" "$(stat -c %s "$work/seed-$i.iso")" --format raw >/dev/null
  R vol-upload --pool "$pool" "peer-$i-cidata.iso" "$work/seed-$i.iso"
  timeout 300 virt-install --connect "$ruri?pkipath=$work/pki/client" --import --name "peer-$i" --memory 512 --vcpus 1 \
    --virt-type qemu --machine pc --osinfo detect=on,require=off \
    --disk "vol=$pool/peer-$i.qcow2,bus=virtio" --disk "vol=$pool/peer-$i-cidata.iso,device=cdrom,bus=ide" \
    --network none --graphics none --noautoconsole >"$work/p$i.log" 2>&1 ||
    { echo "remote: virt-install failed:"; tail "$work/p$i.log"; exit 1; }
  running "peer-$i" || { echo "remote: peer-$i never ran"; exit 1; }
  t1=$(now); p_create+=("$(secs "$t0" "$t1")")
  V destroy "peer-$i" >/dev/null
done
upload=$(python3 -c "print(f'{$first - $(mean "${n_create[@]}"):.3f}')")
echo "base upload (nubo: first create minus later ones, read back and hashed): ${upload}s; virsh vol-create-as + vol-upload ${p_upload}s -> nubo/virsh $(ratio "$upload" "$p_upload")"
echo "nubo vm create --connect qemu+tls (base on the host) -> running: $(mean "${n_create[@]}")s  (runs: ${n_create[*]})"
echo "vol-create-as + cloud-localds + vol-upload + virt-install --import:  $(mean "${p_create[@]}")s  (runs: ${p_create[*]}) -> nubo/peer $(ratio "$(mean "${n_create[@]}")" "$(mean "${p_create[@]}")")"
