# Sourced by the bench sections that talk TLS to a server on 127.0.0.1 (not a section itself:
# bench.sh runs scripts/bench/*.sh only).

# bench_tls_cert DIR: DIR/ca.pem, and DIR/cert.pem + DIR/key.pem for 127.0.0.1 signed by it
# (webpki refuses a self-signed CA certificate used by the server itself).
bench_tls_cert() {
  local d=$1
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 -subj "/CN=nubo bench CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign \
    -keyout "$d/ca.key" -out "$d/ca.pem" >/dev/null 2>&1
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
    -keyout "$d/key.pem" -out "$d/leaf.csr" >/dev/null 2>&1
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >"$d/leaf.ext"
  openssl x509 -req -in "$d/leaf.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 1 \
    -extfile "$d/leaf.ext" -out "$d/cert.pem" >/dev/null 2>&1
}

# bench_tls_registry DIR: Debian's docker-registry over TLS on 127.0.0.1 with the user
# bench/bench-password, its storage in DIR/storage and skopeo's CA in DIR/certs. Sets port,
# host (127.0.0.1:PORT) and registry_pid (the caller's EXIT trap ends it).
bench_tls_registry() {
  local d=$1
  bench_tls_cert "$d"
  mkdir -p "$d/certs" && cp "$d/ca.pem" "$d/certs/ca.crt"
  htpasswd -Bbn bench bench-password >"$d/htpasswd" 2>/dev/null
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  host="127.0.0.1:$port"
  cat >"$d/config.yml" <<YML
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $d/storage
http:
  addr: $host
  tls:
    certificate: $d/cert.pem
    key: $d/key.pem
auth:
  htpasswd:
    realm: nubo-bench
    path: $d/htpasswd
YML
  docker-registry serve "$d/config.yml" >"$d/registry.log" 2>&1 &
  registry_pid=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
}
