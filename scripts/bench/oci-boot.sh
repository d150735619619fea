#!/usr/bin/env bash
# Container image to bootable qcow2 (`nubo image from-container`), time and peak disk use,
# against the same rootfs made a disk by hand in the same run: `tar -x` of the same layer,
# sfdisk, `mkfs.ext4 -d`, grub-mkimage (BIOS core.img, placed with dd as nubo does: without
# grub-bios-setup's blocklist patch the hand-made disk is not bootable, so it is a floor, not a
# peer that boots) and `qemu-img convert`. virt-make-fs (libguestfs) is used in addition where
# it is installed, and said when it is not.
# The container image: the live tests' cached debian:12 image's root filesystem read out with
# debugfs (no mount), one tar+gzip layer in an OCI layout, pushed with skopeo to Debian's
# docker-registry on 127.0.0.1 (TLS from a throwaway CA, htpasswd; started here, stopped by PID).
# Needs root (owners are kept), docker-registry, apache2-utils, skopeo, debugfs and the cached
# image (`cargo test -p nubo-live --test fixture` builds it). Run via scripts/bench.sh oci-boot.
set -euo pipefail
. "$(dirname "$0")/lib/tls.sh"
NUBO_BIN=${NUBO_BIN:-target/release/nubo}
RUNS=${NUBO_BENCH_RUNS:-2}
[ "$(id -u)" = 0 ] || { echo "skipped: needs root (a container disk keeps its files' owners)"; exit 0; }
for t in docker-registry htpasswd skopeo debugfs sfdisk mkfs.ext4 grub-mkimage qemu-img; do
  command -v "$t" >/dev/null || { echo "skipped: $t not found (scripts/install-deps.sh installs it)"; exit 0; }
done
record=$(ls /var/tmp/nubo-live-cache/*/images/refs/debian/12.json 2>/dev/null | head -1 || true)
[ -n "$record" ] || { echo "skipped: no cached debian:12 image (run the live tests once)"; exit 0; }
qcow2=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["path"])' "$record")
vsize=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["virtual_size"])' "$record")

work=$(mktemp -d /var/tmp/nubo-bench-oci-boot.XXXXXX)
registry_pid=
sampler_pid=
cleanup() {
  if [ -n "$sampler_pid" ]; then kill "$sampler_pid" 2>/dev/null || true; wait "$sampler_pid" 2>/dev/null || true; fi
  if [ -n "$registry_pid" ]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
now() { date +%s.%N; }

# The rootfs as one gzip layer in an OCI layout (as the live test makes it).
qemu-img convert -f qcow2 -O raw "$qcow2" "$work/disk.raw"
offset=$(sfdisk -J "$work/disk.raw" | python3 -c 'import json,sys; p=json.load(sys.stdin)["partitiontable"]["partitions"]; print(p[-1]["start"]*512)')
mkdir "$work/tree"
debugfs -R "rdump / $work/tree" "$work/disk.raw?offset=$offset" >/dev/null 2>&1
rm -f "$work/disk.raw"
tar --numeric-owner --sort=name --exclude=./lost+found -C "$work/tree" -cf "$work/layer.tar" .
rm -rf "$work/tree"
diff_id=sha256:$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip -n -1 "$work/layer.tar"
layer=$(sha256sum "$work/layer.tar.gz" | cut -d' ' -f1)
lsize=$(stat -c %s "$work/layer.tar.gz")
mkdir -p "$work/oci/blobs/sha256"
cp "$work/layer.tar.gz" "$work/oci/blobs/sha256/$layer"
config="{\"created\":\"2024-06-01T00:00:00Z\",\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{},\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[\"$diff_id\"]}}"
printf %s "$config" >"$work/config.json"
cd_=$(sha256sum "$work/config.json" | cut -d' ' -f1)
cp "$work/config.json" "$work/oci/blobs/sha256/$cd_"
manifest="{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$cd_\",\"size\":${#config}},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$layer\",\"size\":$lsize}]}"
printf %s "$manifest" >"$work/manifest.json"
md=$(sha256sum "$work/manifest.json" | cut -d' ' -f1)
cp "$work/manifest.json" "$work/oci/blobs/sha256/$md"
printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"1"}}]}' \
  "$md" "${#manifest}" >"$work/oci/index.json"

bench_tls_registry "$work"
skopeo --insecure-policy copy -q --dest-creds bench:bench-password --dest-cert-dir "$work/certs" \
  --digestfile "$work/pushed" "oci:$work/oci:1" "docker://$host/bench/os:1" >/dev/null
ref="$host/bench/os@$(cat "$work/pushed")"

# Peak bytes allocated (not apparent: the raw disk is sparse) under DIR while a command runs: `du` sampled every 0.2 s.
peak_of() {
  local dir=$1; shift
  : >"$work/peak"
  # du fails on files that vanish while it counts: the sampler goes on regardless.
  ( set +e; while :; do du -sB1 "$dir" 2>/dev/null | cut -f1 >>"$work/peak"; sleep 0.2; done ) &
  sampler_pid=$!
  local t0 t1; t0=$(now)
  "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  t1=$(now)
  kill "$sampler_pid" 2>/dev/null || true; wait "$sampler_pid" 2>/dev/null || true; sampler_pid=
  echo "$(echo "$t1 - $t0" | bc -l) $(sort -n "$work/peak" | tail -1)"
}

nubo_run() {
  rm -rf "$work/root"; mkdir -p "$work/root"
  export NUBO_ROOT="$work/root"
  printf 'bench-password\n' | "$NUBO_BIN" registry login "$host" -u bench --password-stdin --ca-cert "$work/ca.pem" >/dev/null
  peak_of "$work/root" "$NUBO_BIN" image from-container "$ref" -t os:1 --size "$vsize" --ca-cert "$work/ca.pem"
}

by_hand() {
  local d=$work/hand
  rm -rf "$d"; mkdir -p "$d/tree"
  tar -xzf "$work/layer.tar.gz" -C "$d/tree" --numeric-owner
  truncate -s "$vsize" "$d/disk.raw"
  printf 'label: gpt\nstart=2048, size=2048, type=21686148-6449-6E6F-744E-656564454649\nstart=4096, size=126976, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B\nstart=131072, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n' |
    sfdisk -q --no-reread --no-tell-kernel "$d/disk.raw"
  local kib=$(( (vsize - 131072 * 512 - 33 * 512) / 1024 / 1024 * 1024 ))
  mkfs.ext4 -q -F -E offset=$((131072 * 512)) -d "$d/tree" "$d/disk.raw" "${kib}k"
  rm -rf "$d/tree"
  printf 'search --no-floppy --fs-uuid --set=root x\nconfigfile /boot/grub/grub.cfg\n' >"$d/early.cfg"
  grub-mkimage -O i386-pc -d /usr/lib/grub/i386-pc -p /boot/grub -c "$d/early.cfg" -o "$d/core.img" \
    biosdisk part_gpt ext2 search search_fs_uuid normal configfile linux
  dd if=/usr/lib/grub/i386-pc/boot.img of="$d/disk.raw" bs=440 count=1 conv=notrunc status=none
  dd if="$d/core.img" of="$d/disk.raw" bs=512 seek=2048 conv=notrunc status=none
  qemu-img convert -f raw -O qcow2 "$d/disk.raw" "$d/disk.qcow2"
  rm -f "$d/disk.raw"
}

bn=(); bh=(); pn=(); ph=()
for _ in $(seq "$RUNS"); do
  sync
  read -r t p < <(nubo_run); bn+=("$t"); pn+=("$p")
  sync
  mkdir -p "$work/hand"
  read -r t p < <(peak_of "$work/hand" by_hand); bh+=("$t"); ph+=("$p")
done
min() { local b=; for v in "$@"; do if [ -z "$b" ] || [ "$(echo "$v < $b" | bc -l)" = 1 ]; then b=$v; fi; done; echo "$b"; }
t_n=$(min "${bn[@]}"); t_h=$(min "${bh[@]}"); p_n=$(min "${pn[@]}"); p_h=$(min "${ph[@]}")
echo "-- container image ($(echo "$lsize / 1048576" | bc) MiB gzip layer) to a $(echo "$vsize / 1073741824" | bc) GiB bootable qcow2, best of $RUNS"
printf "nubo image from-container     %8.1fs  peak %6d MiB  (pull + verify, 2-pass unpack, assembly, sha256)\n" "$t_n" "$((p_n / 1048576))"
printf "by hand (tar, mkfs.ext4 -d...) %7.1fs  peak %6d MiB  (no verification, no reproducible ids, GRUB not patched)\n" "$t_h" "$((p_h / 1048576))"
printf "ratio nubo / by hand          %8.2fx\n" "$(echo "$t_n / $t_h" | bc -l)"
command -v virt-make-fs >/dev/null || echo "virt-make-fs: not installed here (libguestfs-tools); not measured"
