#!/usr/bin/env bash
# The Kubernetes controller under load (issue 23): N VirtualMachines (K8S_BENCH_VMS, default 50)
# with running: false applied at once -> time until all are Provisioned, the controller's RSS and
# its reconcile rate, against a genuine kube-apiserver (the shared run-apiserver.sh, cached build)
# and a libvirtd over qemu+tls in a network namespace (tests/live's harness). Needs root,
# libvirtd, openssl, and `run-apiserver.sh build` done once.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$(id -u)" = 0 ] || { echo "k8s: skipped: needs root (a network namespace and a private libvirtd)"; exit 0; }
tool=${NUBO_KUBE_APISERVER_TOOL:-/work/shared/tools/kube-apiserver}
[ -x "$tool/run-apiserver.sh" ] || { echo "k8s: skipped: $tool/run-apiserver.sh not found (set NUBO_KUBE_APISERVER_TOOL)"; exit 0; }
cargo build --release -q -p nubo-cli -p nubo-controller
cargo run --release -q -p nubo-live --example k8s_bench
