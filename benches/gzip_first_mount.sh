#!/usr/bin/env bash
# The first mount of a pigz .tar.gz (page cache dropped, no saved index): stagefs's
# parallel gzip first pass (doc/gzip.md) beside ratarmount 1.3.0 (rapidgzip, every core)
# and ratarmount-rs (built from source: RATARMOUNT_RS=its binary; skipped, with a note,
# when unset), and stagefs on one core (taskset: the sequential pass). Two trees like
# compressed.sh's: ImageNet-like (random bytes, 20-200 KB files: pigz stores them or
# nearly) and text-like (words, 4-60 KB files: ~5.7x). Each system mounts each archive
# ROUNDS times, interleaved; prints the median seconds, stagefs's time over each, and the
# compressed file's read rate (`cat`, cold and from the page cache) beside stagefs's.
# A benchmark: it asserts only that every mount lists the tree's file count.
#
#   benches/gzip_first_mount.sh [STAGEFS] [MIB] [ROUNDS]   (defaults: target/release/stagefs 440 3)
#
# Needs GNU tar, pigz, root (drop_caches); installs ratarmount 1.3.0 into benches/.venv
# when missing. Work files go to $TMPDIR (disk).
set -euo pipefail
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
bin=$(realpath "${1:-target/release/stagefs}")
mib=${2:-440}
rounds=${3:-3}
venv=$(dirname "$0")/.venv
ratarmount=${RATARMOUNT:-$venv/bin/ratarmount}
ratarmount_rs=${RATARMOUNT_RS:-}
if [[ ! -x $ratarmount ]]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check 'ratarmount==1.3.0'
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-gzip.XXXXXX")
mnt=$work/mnt
cleanup() {
    "$bin" umount "$mnt" 2>/dev/null || fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$mnt"


# One first mount: prints its seconds. Removes every saved index first, drops the
# page cache, mounts, checks the file count, unmounts.
first_mount() {  # system archive files
    local system=$1 archive=$2 files=$3
    rm -f "$archive".stagefs-index "$archive".index.sqlite "$archive".index.sqlite-shm "$archive".index.sqlite-wal
    drop
    local t0 t1
    t0=$(now)
    case $system in
        stagefs) "$bin" mount "$archive" "$mnt" > /dev/null ;;
        stagefs-1core) taskset -c 0 "$bin" mount "$archive" "$mnt" > /dev/null ;;
        ratarmount) "$ratarmount" "$archive" "$mnt" > /dev/null 2>&1 ;;
        ratarmount-rs) "$ratarmount_rs" "$archive" "$mnt" > /dev/null 2>&1 ;;
    esac
    while ! mountpoint -q "$mnt"; do sleep 0.01; done
    t1=$(now)
    local listed
    listed=$(find "$mnt" -type f | wc -l)
    [[ $listed == "$files" ]] || { echo "$system lists $listed files of $files" >&2; exit 1; }
    case $system in
        stagefs*) "$bin" umount "$mnt" ;;
        *) fusermount3 -u "$mnt"; while pgrep -f "ratarmount.*$mnt" > /dev/null; do sleep 0.05; done ;;
    esac
    secs "$t0" "$t1"
}

median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

systems=(stagefs stagefs-1core ratarmount)
if [[ -n $ratarmount_rs ]]; then
    systems+=(ratarmount-rs)
else
    echo "RATARMOUNT_RS unset: ratarmount-rs skipped (build it from source, see doc/gzip.md)" >&2
fi
echo "$(nproc) cores; $rounds rounds; each line: median first mount, stagefs / this (all in one run)"
for kind in imagenet text; do
    echo "making the $kind tree ($mib MiB)" >&2
    make_tree "$kind" "$work/src" "$mib"
    files=$(find "$work/src" -type f | wc -l)
    tar -C "$work/src" -cf "$work/$kind.tar" .
    rm -rf "$work/src"
    archive=$work/$kind.tar.gz
    pigz -p "$(nproc)" -c "$work/$kind.tar" > "$archive"
    rm "$work/$kind.tar"
    size=$(stat -c %s "$archive")
    drop
    t0=$(now); cat "$archive" > /dev/null; cold=$(secs "$t0" "$(now)")
    t0=$(now); cat "$archive" > /dev/null; warm=$(secs "$t0" "$(now)")
    declare -A times=()
    for ((r = 0; r < rounds; r++)); do
        for system in "${systems[@]}"; do
            times[$system]+="$(first_mount "$system" "$archive" "$files") "
        done
    done
    base=$(tr ' ' '\n' <<< "${times[stagefs]}" | grep . | median)
    echo "$kind.tar.gz: $((size >> 20)) MiB, $files files; cat: cold $(printf %.0f "$(echo "$size / $cold / 1000000" | bc -l)") MB/s," \
        "page cache $(printf %.0f "$(echo "$size / $warm / 1000000" | bc -l)") MB/s; stagefs first mount $(printf %.0f "$(echo "$size / $base / 1000000" | bc -l)") MB/s of compressed file"
    for system in "${systems[@]}"; do
        t=$(tr ' ' '\n' <<< "${times[$system]}" | grep . | median)
        printf '  %-14s %6.2f s   stagefs / this %5.2f   (rounds: %s)\n' "$system" "$t" "$(echo "$base / $t" | bc -l)" "${times[$system]% }"
    done
    unset times
    rm -f "$archive"*
done
