#!/usr/bin/env bash
# Host-to-GPU transfer rate of stagefs-reader's pinned ring, and the pipeline's upload
# rate against it: printed numbers, not a test (tests assert results, never rates).
#
#   benches/gpu-h2d.sh [DIR]      # DIR: where to generate the files (default: a temp dir in /dev/shm)
#
# Needs a CUDA GPU: with --backend cuda, `stagefs-reader bench` fails without one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="/root/.cargo/bin:$HOME/.cargo/bin:$PATH"
cargo build --release -q -p stagefs-reader --bin stagefs-reader
bin=${CARGO_TARGET_DIR:-target}/release/stagefs-reader
if [[ $# -gt 0 ]]; then
    dir=$1
else
    dir=$(mktemp -d /dev/shm/stagefs-h2d.XXXXXX)
    trap 'rm -rf "$dir"' EXIT
fi
"$bin" gen "$dir" --files 2000 --min-bytes 100K --max-bytes 1M --seed 1
"$bin" bench "$dir" --backend cuda --batch-bytes 32M --h2d-reps 20 --epochs 2
