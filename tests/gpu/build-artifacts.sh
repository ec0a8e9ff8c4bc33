#!/usr/bin/env bash
# Builds what tests/gpu/device-run.sh needs on a GPU machine that has no Rust toolchain:
#
#   tests/gpu/build-artifacts.sh DIR
#
# DIR gets the stagefs wheel (python/build-wheel.sh: glibc 2.17, so it runs on any GPU
# node), the release `stagefs-reader` binary and the reader's GPU test binary
# (`--features gpu-tests`, tests/gpu.rs). Copy DIR and the checkout to the GPU machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="/root/.cargo/bin:$HOME/.cargo/bin:$PATH"
out=$1
mkdir -p "$out"
rm -f "$out"/stagefs-*.whl
cp "$(python/build-wheel.sh)" "$out/"
cargo build --release -q -p stagefs-reader --bin stagefs-reader
cp "${CARGO_TARGET_DIR:-target}/release/stagefs-reader" "$out/"
test_bin=$(cargo test --release -q -p stagefs-reader --features gpu-tests --test gpu --no-run --message-format=json \
    | python3 -c 'import json,sys; print(*[m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == "gpu"])')
cp "$test_bin" "$out/reader-gpu-tests"
ls -l "$out"
