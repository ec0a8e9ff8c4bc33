#!/bin/sh
# Builds the stagefs fuzz targets, and with `run` fuzzes each one in turn.
#
#   fuzz/build.sh                 # build all targets (ASan, debug assertions)
#   fuzz/build.sh run [SECONDS]   # then fuzz each target SECONDS (default 180), one at a time
#   fuzz/build.sh run 60 tar      # one target
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`). Works on stable Rust: RUSTC_BOOTSTRAP=1
# lets stable rustc accept the -Z flags cargo-fuzz passes (sanitizer, coverage).
# SANITIZER=none builds without ASan (faster, for CI smoke builds).
# New corpus entries go to fuzz/corpus/<target> (ignored by git); crashes to
# fuzz/artifacts/<target>. A crash becomes a regression: copy the input into
# fuzz/regressions/<target>/ and `cargo test hostile::fuzz_regressions_replay` replays it.
set -eu
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
sanitizer="${SANITIZER:-address}"
targets="tar squashfs index_cache decompress seek_table zip"

cargo fuzz build -a -s "$sanitizer"

[ "${1:-}" = run ] || exit 0
seconds="${2:-180}"
[ -n "${3:-}" ] && targets="$3"
for target in $targets; do
    case "$target" in
        tar) max_len=131072 ;;
        squashfs) max_len=65536 ;;
        *) max_len=16384 ;;
    esac
    mkdir -p "corpus/$target"
    cargo fuzz run -a -s "$sanitizer" "$target" "corpus/$target" "seeds/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=2048 -timeout=10 \
        -max_len="$max_len" -print_final_stats=1
done
