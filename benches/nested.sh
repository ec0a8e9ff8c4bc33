#!/usr/bin/env bash
# `--recursive` beside ratarmount --recursive on an ImageNet-shaped archive (issue 24): one
# outer tar of CLASSES inner tars of FILES files each (2-30 KB), scaled down from
# ImageNet's 1,000 x 1,300. Prints, per system: time to a usable mount with no saved
# index (indexing), time to remount with the saved index, the daemon's resident memory
# per file, and read rates over every file (4 readers): first pass after drop_caches
# (cold) and second pass (warm). A benchmark: it asserts only that both list every file.
#
#   benches/nested.sh [STAGEFS] [CLASSES] [FILES]   (defaults: target/release/stagefs 100 500)
#
# Needs GNU tar and ratarmount (benches/run.sh installs it into benches/.venv). Root (drop_caches).
set -euo pipefail
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
bin=$(realpath "${1:-target/release/stagefs}")
classes=${2:-100}
files=${3:-500}
ratarmount=${RATARMOUNT:-$(dirname "$0")/.venv/bin/ratarmount}
work=$(mktemp -d /dev/shm/stagefs-nested.XXXXXX)
cleanup() {
    "$bin" umount "$work/mnt-stagefs" 2>/dev/null || true
    fusermount3 -u "$work/mnt-ratar" 2>/dev/null || umount -l "$work/mnt-ratar" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "making $classes inner tars of $files files in $work"
python3 - "$work/src" "$classes" "$files" <<'PY'
import os, random, sys
root, classes, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(1)
for c in range(classes):
    d = os.path.join(root, f"n{c:08d}")
    os.makedirs(d)
    for i in range(files):
        with open(os.path.join(d, f"n{c:08d}_{i}.JPEG"), "wb") as f:
            f.write(rng.randbytes(rng.randint(2_000, 30_000)))
PY
mkdir "$work/inner"
for d in "$work"/src/*; do tar -C "$d" -cf "$work/inner/$(basename "$d").tar" .; done
tar -C "$work/inner" -cf "$work/train.tar" .
rm -rf "$work/src" "$work/inner"
total=$((classes * files))
size=$(stat -c %s "$work/train.tar")
echo "archive: $total files, $((size / 1048576)) MiB"

read_all() {  # prints seconds to read every file of $1 with 4 readers
    local t0; t0=$(now)
    find "$1" -type f -print0 | xargs -0 -P4 -n 256 cat > /dev/null
    secs "$t0" "$(now)"
}

run() {  # name mount-command umount-command pid-command
    local name=$1 mnt=$2
    drop
    local t0; t0=$(now)
    eval "$3"
    local index; index=$(secs "$t0" "$(now)")
    local n; n=$(find "$mnt" -type f | wc -l)
    [[ $n == "$total" ]] || { echo "$name lists $n files, not $total" >&2; exit 1; }
    eval "$4"
    drop
    t0=$(now)
    eval "$3"
    local remount; remount=$(secs "$t0" "$(now)")
    local pid; pid=$(eval "$5")
    drop
    local cold; cold=$(read_all "$mnt")
    local warm; warm=$(read_all "$mnt")
    local rss; rss=$(status_kib VmRSS "$pid")
    eval "$4"
    printf '%-13s index %7.2f s  remount %6.2f s  rss %6d KiB (%5.0f B/file)  cold %8.0f files/s  warm %8.0f files/s\n' \
        "$name" "$index" "$remount" "$rss" "$(echo "$rss * 1024 / $total" | bc -l)" \
        "$(echo "$total / $cold" | bc -l)" "$(echo "$total / $warm" | bc -l)"
}

mkdir -p "$work/mnt-stagefs" "$work/mnt-ratar"
run stagefs "$work/mnt-stagefs" \
    "'$bin' mount --recursive --stage none '$work/train.tar' '$work/mnt-stagefs' > /dev/null" \
    "'$bin' umount '$work/mnt-stagefs'" \
    "'$bin' status --json | python3 -c 'import json,sys; print([json.loads(l)[\"pid\"] for l in sys.stdin if \"mnt-stagefs\" in l][0])'"
run ratarmount "$work/mnt-ratar" \
    "'$ratarmount' --recursive '$work/train.tar' '$work/mnt-ratar' > /dev/null 2>&1; while ! mountpoint -q '$work/mnt-ratar'; do sleep 0.05; done" \
    "fusermount3 -u '$work/mnt-ratar'; while pgrep -f 'ratarmount.*mnt-ratar' > /dev/null; do sleep 0.05; done" \
    "pgrep -f 'ratarmount.*mnt-ratar' | head -1"
