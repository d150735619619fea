#!/usr/bin/env bash
# OCI registry benchmarks, as ratios against skopeo measured in the same run, between the same
# local registry (Debian's docker-registry on 127.0.0.1, TLS from a throwaway CA, htpasswd auth,
# storage in a temp dir; started here and stopped by PID) and local storage:
#   push: `nubo image push` of the bootstrapped debian:12 image vs `skopeo copy oci:DIR docker://`
#   pull: `nubo image pull` into a fresh store (digest and size verified while streaming, strict
#         inspector, fsync) vs `skopeo copy docker:// oci:DIR`, and vs `curl -o` of the disk blob
#         alone from the same registry (the floor: one GET, nothing verified, nothing synced)
#   --compress: the same push and pull with the disk as a zstd layer (compress to tmp/, upload;
#         download, decompress, hash), against the same skopeo figures
# Before each push the registry's blob storage is emptied (and each run uses a new repository),
# so neither client can skip a blob or mount it from another repository (skopeo remembers where
# it saw a blob and asks the registry to mount it from there).
# Needs docker-registry, apache2-utils (htpasswd), skopeo, and the live tests' cached image
# (`cargo test -p nubo-live --test fixture` builds it). Run via scripts/bench.sh oci.
set -euo pipefail
. "$(dirname "$0")/lib/tls.sh"
NUBO_BIN=${NUBO_BIN:-target/release/nubo}
RUNS=${NUBO_BENCH_RUNS:-3}
for t in docker-registry htpasswd skopeo; do
  command -v "$t" >/dev/null || { echo "skipped: $t not found (scripts/install-deps.sh installs it)"; exit 0; }
done
record=$(ls /var/tmp/nubo-live-cache/*/images/refs/debian/12.json 2>/dev/null | head -1 || true)
[ -n "$record" ] || { echo "skipped: no cached debian:12 image (run the live tests once)"; exit 0; }
cache_images=$(dirname "$(dirname "$(dirname "$record")")")

work=$(mktemp -d /var/tmp/nubo-bench-oci.XXXXXX)
registry_pid=
cleanup() {
  if [ -n "$registry_pid" ]; then kill "$registry_pid" 2>/dev/null || true; wait "$registry_pid" 2>/dev/null || true; fi
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
now() { date +%s.%N; }

# The source store: the cached image's store, hard-linked (blobs are read-only) with its record
# paths pointing here.
mkdir -p "$work/src"
cp -al "$cache_images" "$work/src/images"
for f in "$work"/src/images/refs/*/*.json; do
  rm -f "$f.new"; sed "s#$cache_images#$work/src/images#g" "$f" >"$f.new"; rm -f "$f"; mv "$f.new" "$f"
done
disk_blob=$(ls "$work"/src/images/blobs/*.qcow2 | head -1)
size=$(stat -c %s "$disk_blob")
disk_digest=$(basename "$disk_blob" .qcow2)
mib=$(echo "$size / 1048576" | bc -l)

bench_tls_registry "$work"

export NUBO_ROOT="$work/src"
printf 'bench-password\n' | "$NUBO_BIN" registry login "$host" -u bench --password-stdin --ca-cert "$work/ca.pem" >/dev/null
creds=bench:bench-password
"$NUBO_BIN" image push debian:12 "$host/bench/seed:1" --ca-cert "$work/ca.pem" >/dev/null 2>&1
skopeo --insecure-policy copy -q --src-creds "$creds" --src-cert-dir "$work/certs" \
  "docker://$host/bench/seed:1" "oci:$work/layout:1" >/dev/null

n=0
# Before each timed run (untimed): the previous pulls' outputs are removed and `sync` writes
# back what an earlier run left dirty (curl and skopeo never sync: their writeback would land
# in whichever run comes next).
clear_pulled() {
  chmod -R u+w "$work/dst" 2>/dev/null || true
  rm -rf "$work/dst" "$work/pulled" "$work/curl.out"
  sync
}
timed() { local t0 t1; clear_pulled; t0=$(now); "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; "$@"; exit 1; }; t1=$(now); echo "$t1 - $t0" | bc -l; }
min() { local b=; for v in "$@"; do if [ -z "$b" ] || [ "$(echo "$v < $b" | bc -l)" = 1 ]; then b=$v; fi; done; echo "$b"; }
wipe() { rm -rf "$work/storage/docker/registry/v2/blobs" "$work/storage/docker/registry/v2/repositories"; }
nubo_push() { wipe; n=$((n + 1)); "$NUBO_BIN" image push debian:12 "$host/bench/nubo-$1:1" --ca-cert "$work/ca.pem"; }
nubo_push_z() { wipe; "$NUBO_BIN" image push debian:12 "$host/bench/nuboz-$1:1" --compress --ca-cert "$work/ca.pem"; }
skopeo_push() {
  wipe
  skopeo --insecure-policy copy -q --dest-creds "$creds" --dest-cert-dir "$work/certs" "oci:$work/layout:1" "docker://$host/bench/skopeo-$1:1"
}
nubo_pull() {
  mkdir -p "$work/dst"
  cp "$work/src/auth.json" "$work/dst/auth.json"
  NUBO_ROOT="$work/dst" "$NUBO_BIN" image pull "$host/bench/${1:-seed}:1" --ca-cert "$work/ca.pem"
}
skopeo_pull() {
  skopeo --insecure-policy copy -q --src-creds "$creds" --src-cert-dir "$work/certs" "docker://$host/bench/seed:1" "oci:$work/pulled:1"
}
curl_pull() {
  curl -fsSL -u "$creds" --cacert "$work/ca.pem" -o "$work/curl.out" "https://$host/v2/bench/seed/blobs/sha256:$disk_digest"
}
pn=(); ps=(); ln=(); ls=(); lc=()
for i in $(seq "$RUNS"); do
  pn+=("$(timed nubo_push "$i")"); ps+=("$(timed skopeo_push "$i")")
done
# The pulls read what the seed push put there.
wipe
"$NUBO_BIN" image push debian:12 "$host/bench/seed:1" --ca-cert "$work/ca.pem" >/dev/null 2>&1
for _ in $(seq "$RUNS"); do
  ln+=("$(timed nubo_pull)"); ls+=("$(timed skopeo_pull)"); lc+=("$(timed curl_pull)")
done
pz=(); lz=()
for i in $(seq "$RUNS"); do pz+=("$(timed nubo_push_z "$i")"); done
wipe
"$NUBO_BIN" image push debian:12 "$host/bench/seedz:1" --compress --ca-cert "$work/ca.pem" >/dev/null 2>&1
for _ in $(seq "$RUNS"); do lz+=("$(timed nubo_pull seedz)"); done
zsize=$(stat -c %s "$work"/storage/docker/registry/v2/blobs/sha256/*/*/data | sort -n | tail -1)
t_pn=$(min "${pn[@]}"); t_ps=$(min "${ps[@]}"); t_ln=$(min "${ln[@]}"); t_ls=$(min "${ls[@]}"); t_lc=$(min "${lc[@]}")
t_pz=$(min "${pz[@]}"); t_lz=$(min "${lz[@]}")
rate() { echo "scale=1; $mib / $1" | bc -l; }
echo "-- push: $(printf %.0f "$mib") MiB image to $host (best of $RUNS, new repository each run)"
printf "nubo image push       %8.3fs  %8s MiB/s\n" "$t_pn" "$(rate "$t_pn")"
printf "skopeo copy oci: ->   %8.3fs  %8s MiB/s\n" "$t_ps" "$(rate "$t_ps")"
printf "ratio nubo/skopeo (throughput): %.2fx\n" "$(echo "$t_ps / $t_pn" | bc -l)"
echo "-- pull: into a fresh store / oci: directory (best of $RUNS)"
printf "nubo image pull       %8.3fs  %8s MiB/s\n" "$t_ln" "$(rate "$t_ln")"
printf "skopeo copy -> oci:   %8.3fs  %8s MiB/s\n" "$t_ls" "$(rate "$t_ls")"
printf "ratio nubo/skopeo (throughput): %.2fx\n" "$(echo "$t_ls / $t_ln" | bc -l)"
printf "curl -o (disk blob)   %8.3fs  %8s MiB/s\n" "$t_lc" "$(rate "$t_lc")"
printf "ratio nubo/curl (throughput): %.2fx\n" "$(echo "$t_lc / $t_ln" | bc -l)"
echo "-- --compress: zstd disk layer of $(echo "$zsize / 1048576" | bc) MiB (best of $RUNS)"
printf "nubo image push --compress %8.3fs  ratio to skopeo push: %.2fx\n" "$t_pz" "$(echo "$t_ps / $t_pz" | bc -l)"
printf "nubo image pull (zstd)     %8.3fs  ratio to skopeo pull: %.2fx\n" "$t_lz" "$(echo "$t_ls / $t_lz" | bc -l)"
