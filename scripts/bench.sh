#!/usr/bin/env bash
# nubo's benchmarks: each section measures nubo against a peer tool in the same run and prints
# ratios, never absolute pass/fail times. Run from the repository root: bash scripts/bench.sh [section...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p nubo-cli
export NUBO_BIN="$PWD/target/release/nubo"
sections=("$@")
[ ${#sections[@]} -gt 0 ] || sections=($(ls scripts/bench/ | sed -n 's/\.sh$//p'))
for s in "${sections[@]}"; do
  echo "== $s"
  bash "scripts/bench/$s.sh"
done
