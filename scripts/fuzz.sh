#!/usr/bin/env bash
# Runs every fuzz target of the crates whose parsers face untrusted bytes (nubo-disk: the image
# inspector and header codecs; nubo-seed: the seed reader and YAML; nubo-manifest: the manifest
# parser and lowering, and the libvirt connection URI allowlist (`connect_uri`); nubo-build: the
# VMfile parser) for a bounded time each.
#
#   scripts/fuzz.sh [SECONDS]    # per target; default 20 (8 targets: with a cold build, about 5 minutes)
#
# Needs the nightly toolchain (libFuzzer's instrumentation) and cargo-fuzz, which it installs
# from crates.io when missing. Builds with the sanitizer off (the fuzzed code is safe Rust: a
# finding is a panic, not a memory error, and ASan would double the build) and with debug
# assertions on, so integer overflow in a parser panics instead of wrapping.
# A crash fails the script; its input is under crates/<crate>/fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."

secs="${1:-20}"
case "$secs" in
    '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a whole number, not '$secs'" >&2; exit 2 ;;
esac

if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "fuzz.sh: the nightly Rust toolchain is not installed (cargo-fuzz needs it): rustup toolchain install nightly" >&2
    exit 1
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

# One target dir for every crate: libFuzzer and the shared dependencies build once.
flags=(--sanitizer none --debug-assertions --target-dir "$PWD/target/fuzz")
for crate in crates/nubo-disk crates/nubo-seed crates/nubo-manifest crates/nubo-build crates/nubo-image; do
    (
        cd "$crate"
        cargo +nightly fuzz build "${flags[@]}"
        for target in $(cargo +nightly fuzz list); do
            echo "fuzz.sh: $crate $target for ${secs}s"
            mkdir -p "fuzz/corpus/$target"
            cargo +nightly fuzz run "${flags[@]}" "$target" -- -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=0 >"fuzz/$target.log" 2>&1 || {
                tail -n 40 "fuzz/$target.log" >&2
                echo "fuzz.sh: $crate fuzz target $target failed (log above, input under $crate/fuzz/artifacts/$target/)" >&2
                exit 1
            }
            grep -E '^Done|#[0-9]+.*DONE' "fuzz/$target.log" | tail -n 1 || true
            rm -f "fuzz/$target.log"
        done
    )
done
echo "fuzz.sh: every target ran ${secs}s without a crash"
