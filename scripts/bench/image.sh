#!/usr/bin/env bash
# Image store benchmarks, as ratios against peers measured in the same run:
#   verify: sha256 of the same 400 MiB file, `nubo image hash` vs `openssl dgst -sha256` (the bar:
#           both use SHA-NI/AVX2; coreutils sha256sum does not and is not the peer)
#   pull:   the same file over HTTPS from a local server on 127.0.0.1, `nubo image pull` (hash
#           while streaming, fsync, rename into the store) vs `curl -o`
# Run via scripts/bench.sh (which builds the release binary and sets NUBO_BIN), or directly.
set -euo pipefail
. "$(dirname "$0")/lib/tls.sh"
NUBO_BIN=${NUBO_BIN:-target/release/nubo}
SIZE_MIB=${NUBO_BENCH_IMAGE_MIB:-400}
RUNS=${NUBO_BENCH_RUNS:-3}
work=$(mktemp -d)
server_pid=
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; fi
  chmod -R u+w "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

now() { date +%s.%N; }
# best (lowest) wall time of $RUNS runs of "$@"; before each run (untimed) `$SETUP` clears the
# previous run's output and `sync` writes back what any earlier run left dirty (curl's output
# is never synced: its writeback would otherwise land in whichever run comes next)
SETUP=:
best() {
  local b= t0 t1 d
  for _ in $(seq "$RUNS"); do
    $SETUP; sync
    t0=$(now); "$@" >/dev/null 2>&1; t1=$(now)
    d=$(echo "$t1 - $t0" | bc -l)
    if [ -z "$b" ] || [ "$(echo "$d < $b" | bc -l)" = 1 ]; then b=$d; fi
  done
  echo "$b"
}
rate() { echo "scale=1; $SIZE_MIB / $1" | bc -l; }

file="$work/image.raw"
head -c "$((SIZE_MIB << 20))" /dev/urandom >"$file"
cat "$file" >/dev/null # page cache warm for both tools

echo "-- verify: sha256 of ${SIZE_MIB} MiB (best of $RUNS)"
t_nubo=$(best "$NUBO_BIN" image hash "$file")
t_ossl=$(best openssl dgst -sha256 "$file")
printf "nubo image hash       %8.3fs  %8s MiB/s\n" "$t_nubo" "$(rate "$t_nubo")"
printf "openssl dgst -sha256  %8.3fs  %8s MiB/s\n" "$t_ossl" "$(rate "$t_ossl")"
printf "ratio nubo/openssl (throughput): %.2fx\n" "$(echo "$t_ossl / $t_nubo" | bc -l)"

echo "-- pull: ${SIZE_MIB} MiB over HTTPS from 127.0.0.1 (best of $RUNS)"
bench_tls_cert "$work"
mkdir -p "$work/www" && ln "$file" "$work/www/image.raw"
cat >"$work/serve.py" <<'PY'
import http.server, ssl, sys, functools
root, cert, key = sys.argv[1:4]
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass
handler = functools.partial(Quiet, directory=root)
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(cert, key)
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
PY
coproc SERVER { exec python3 "$work/serve.py" "$work/www" "$work/cert.pem" "$work/key.pem"; }
server_pid=$SERVER_PID
read -r port <&"${SERVER[0]}"
url="https://127.0.0.1:$port/image.raw"
sum=$("$NUBO_BIN" image hash "$file" | cut -d' ' -f1)

clear_outputs() {
  chmod -R u+w "$work/root" 2>/dev/null || true
  rm -rf "$work/root" "$work/curl.out"
}
pull_once() {
  NUBO_ROOT="$work/root" "$NUBO_BIN" image pull "$url" --checksum "sha256:$sum" --name bench:1 --ca-cert "$work/ca.pem"
}
curl_once() { curl -sS --cacert "$work/ca.pem" -o "$work/curl.out" "$url"; }
pull_once >/dev/null 2>&1 || { clear_outputs; echo "nubo image pull failed:"; pull_once; exit 1; }
SETUP=clear_outputs
t_pull=$(best pull_once)
t_curl=$(best curl_once)
printf "nubo image pull       %8.3fs  %8s MiB/s\n" "$t_pull" "$(rate "$t_pull")"
printf "curl -o               %8.3fs  %8s MiB/s\n" "$t_curl" "$(rate "$t_curl")"
printf "ratio nubo/curl (throughput): %.2fx\n" "$(echo "$t_curl / $t_pull" | bc -l)"
