#!/usr/bin/env bash
# Packing a directory of many small files into an archive (issue 27), side by side:
# `stagefs pack` (many reader threads, one writer, index saved), GNU `tar -cf`, fpart bags
# packed by parallel GNU tars, and `mksquashfs` (its own threads, no compression), on
#   (a) the local disk (files in the page cache: the metadata is free), and
#   (b) latfs (benches/latfs): a passthrough FUSE mount of the same tree that adds LAT_US
#       to every lookup, getattr, open and readdir, as a parallel filesystem's metadata
#       server round trip does. Each tool gets a fresh latfs mount (cold kernel caches).
# Prints seconds, files/s, MB/s and the ratio to tar. A benchmark: it asserts nothing but
# that each archive lists N files.
#
#   sudo [REPS=5] benches/pack.sh [STAGEFS] [N] [LAT_US] [BAGS]
#       defaults: target/release/stagefs 20000 500 8; local runs: median of REPS
#
# Needs root (FUSE mounts), GNU tar, fpart, mksquashfs (Debian: tar, fpart, squashfs-tools)
# and cargo (to build latfs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=$(realpath "${1:-target/release/stagefs}")
n=${2:-20000}
lat=${3:-500}
bags=${4:-8}
reps=${REPS:-5}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
(cd benches/latfs && cargo build --release --quiet)
latfs=$CARGO_TARGET_DIR/release/latfs
work=$(mktemp -d /var/tmp/stagefs-pack-bench.XXXXXX)
cleanup() {
    umount "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "making $n files of 2-64 KB (random bytes) in $work/src, 500 per directory"
python3 - "$work/src" "$n" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(27)
for i in range(n):
    d = os.path.join(root, f"class{i // 500:04d}")
    if i % 500 == 0:
        os.makedirs(d)
    with open(os.path.join(d, f"{i:08d}.jpg"), "wb") as f:
        f.write(rng.randbytes(rng.randint(2_000, 64_000)))
PY
bytes=$(du -sb --apparent-size "$work/src" | cut -f1)
echo "tree: $n files, $((bytes / 1000000)) MB"
mkdir -p "$work/out" "$work/mnt"

mount_latfs() {
    "$latfs" "$work/src" "$work/mnt" "$lat" 64 &
    for _ in $(seq 100); do
        mountpoint -q "$work/mnt" && return
        sleep 0.05
    done
    echo "latfs did not mount" >&2
    exit 1
}
umount_latfs() { umount "$work/mnt"; wait; }

run_tool() {  # run_tool TOOL SRC: packs SRC into $work/out, prints the seconds taken
    local tool=$1 src=$2 start end
    rm -rf "$work/out" && mkdir -p "$work/out"
    sync
    start=$(date +%s.%N)
    case $tool in
        tar) tar -cf "$work/out/a.tar" -C "$src" . ;;
        stagefs) "$bin" pack "$src" "$work/out/a.tar" 2>/dev/null ;;
        fpart)
            (cd "$src" && fpart -n "$bags" -o "$work/out/bag" . >/dev/null 2>&1)
            ls "$work"/out/bag.* | xargs -P "$bags" -I{} tar -cf {}.tar -C "$src" -T {}
            ;;
        mksquashfs) mksquashfs "$src" "$work/out/a.sqsh" -quiet -no-progress -noI -noD -noF -noX -no-xattrs >/dev/null ;;
    esac
    end=$(date +%s.%N)
    local count
    case $tool in
        mksquashfs) count=$(unsquashfs -l "$work/out/a.sqsh" | grep -c '\.jpg$') ;;
        fpart) count=$(cat "$work"/out/bag.*.tar | tar -tif - | grep -c '\.jpg$') ;;
        *) count=$(tar -tf "$work/out/a.tar" | grep -c '\.jpg$') ;;
    esac
    [[ $count == "$n" ]] || { echo "$tool archived $count files, not $n" >&2; exit 1; }
    python3 -c "print(round($end - $start, 3))"
}

declare -A secs
tools=(tar stagefs fpart mksquashfs)
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
# Local runs take about a second: the median of $reps, interleaved, so that another
# process's burst does not decide the comparison.
declare -A runs
for rep in $(seq "$reps"); do
    for tool in "${tools[@]}"; do
        runs[$tool]+="$(run_tool "$tool" "$work/src") "
    done
done
for tool in "${tools[@]}"; do
    secs[local-$tool]=$(python3 -c "import statistics; print(statistics.median([${runs[$tool]// /,}0][:-1]))")
    echo "local  $tool: ${secs[local-$tool]} s (median of: ${runs[$tool]})"
done
for tool in "${tools[@]}"; do
    mount_latfs
    secs[latfs-$tool]=$(run_tool "$tool" "$work/mnt")
    umount_latfs
    echo "latfs  $tool: ${secs[latfs-$tool]} s"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

echo
echo "| source | tool | seconds | files/s | MB/s | speed vs tar |"
echo "|---|---|---:|---:|---:|---:|"
for place in local latfs; do
    for tool in "${tools[@]}"; do
        s=${secs[$place-$tool]}
        python3 -c "
s, tar, n, b = $s, ${secs[$place-tar]}, $n, $bytes
label = {'local': 'local disk (page cache)', 'latfs': 'latfs, ${lat} us per metadata op'}['$place']
tool = {'tar': 'GNU tar -cf', 'stagefs': 'stagefs pack', 'fpart': 'fpart -n $bags + $bags tars', 'mksquashfs': 'mksquashfs (no compression)'}['$tool']
print(f'| {label} | {tool} | {s:.2f} | {n / s:,.0f} | {b / s / 1e6:,.0f} | {tar / s:.1f}x |')"
    done
done
