#!/usr/bin/env bash
# Overlay creation: nubo-disk in-process against `qemu-img create -b` as a process, same run,
# printed as a ratio. RUNS overrides the 200 runs per side.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v qemu-img >/dev/null || { echo "skipped: qemu-img not found (install qemu-utils)"; exit 0; }
cargo run --release -q -p nubo-disk --example overlay_bench -- "${RUNS:-200}"
