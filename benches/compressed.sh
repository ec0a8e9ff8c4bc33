#!/usr/bin/env bash
# Compressed tars served in place, beside ratarmount (issue 24, section 2): an
# ImageNet-like tree (random bytes, 20-200 KB files: does not compress) and a text-like
# one (words, 4-60 KB files: compresses ~4x), each packed by GNU tar and compressed as
# .tar.gz (pigz: one gzip member, like gzip), .tar.zst (pzstd: several frames),
# .tar.bz2 (lbzip2) and .tar.xz (xz -T2, 4 MiB blocks). stagefs serves all from restart
# points; ratarmount uses rapidgzip, indexed_zstd, indexed_bzip2 and python-xz. Then the
# same tree packed by `stagefs pack --compress zstd` against `stagefs pack` (plain tar),
# both served in place, and its size against `zstd -3` of the whole tar. Prints, per
# archive and system: first mount (no saved index, page cache dropped), remount (saved
# index), random reads of FILES files by 4 readers after drop_caches (files/s, MB/s,
# per-file latency p50/p99), and the daemon's peak memory (VmHWM).
# A benchmark: it asserts only that every file sampled reads back with the right size.
#
#   benches/compressed.sh [STAGEFS] [MIB] [FILES]   (defaults: target/release/stagefs 2048 2000)
#
# Environment: KINDS (default "imagenet text"), EXTS (default "gz zst bz2 xz pack"),
# BASELINE=/path/to/an/older/stagefs adds its rows (labelled "before") beside the others.
# Needs GNU tar, pigz, pzstd, zstd, lbzip2, xz and ratarmount 1.3.0 with indexed_bzip2
# (installed into benches/.venv when missing). Root (drop_caches). Work files go to
# $TMPDIR (disk).
set -euo pipefail
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
bin=$(realpath "${1:-target/release/stagefs}")
mib=${2:-2048}
files=${3:-2000}
venv=$(dirname "$0")/.venv
ratarmount=${RATARMOUNT:-$venv/bin/ratarmount}
kinds=${KINDS:-imagenet text}
exts=${EXTS:-gz zst bz2 xz pack}
baseline=${BASELINE:+$(realpath "$BASELINE")}
[ -x "$ratarmount" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check 'ratarmount==1.3.0'; }
"$venv/bin/python" -c 'import indexed_bzip2' 2>/dev/null ||
    "$venv/bin/pip" install -q --disable-pip-version-check 'indexed_bzip2>=1.6,<2'
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-compressed.XXXXXX")
cleanup() {
    "$bin" umount "$work/mnt-stagefs" 2>/dev/null || true
    fusermount3 -u "$work/mnt-ratar" 2>/dev/null || umount -l "$work/mnt-ratar" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT



# Random reads: the same FILES files (seeded shuffle of the tree's list) by 4 threads.
random_reads() {  # mnt list -> "files/s MB/s p50_ms p99_ms"
    python3 - "$1" "$2" "$files" <<'PY'
import os, random, sys, threading, time
mnt, listing, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
names = [l.rstrip("\n").split("\t") for l in open(listing)]
random.Random(7).shuffle(names)
names = names[:count]
lat, size, lock = [], [0], threading.Lock()
def reader(part):
    for rel, want in part:
        t0 = time.perf_counter()
        with open(os.path.join(mnt, rel), "rb") as f:
            got = len(f.read())
        dt = time.perf_counter() - t0
        assert got == int(want), f"{rel}: {got} bytes, expected {want}"
        with lock:
            lat.append(dt)
            size[0] += got
t0 = time.perf_counter()
threads = [threading.Thread(target=reader, args=(names[k::4],)) for k in range(4)]
for t in threads: t.start()
for t in threads: t.join()
wall = time.perf_counter() - t0
lat.sort()
print(f"{len(names) / wall:.0f} {size[0] / wall / 1e6:.1f} {lat[len(lat) // 2] * 1e3:.1f} {lat[len(lat) * 99 // 100] * 1e3:.1f}")
PY
}

run() {  # name archive mnt mount-cmd umount-cmd pid-cmd list
    local name=$1 archive=$2 mnt=$3
    rm -f "$archive".stagefs-index "$archive".index.sqlite
    drop
    local t0; t0=$(now)
    eval "$4"
    local first; first=$(secs "$t0" "$(now)")
    eval "$5"
    drop
    t0=$(now)
    eval "$4"
    local remount; remount=$(secs "$t0" "$(now)")
    local pid; pid=$(eval "$6")
    drop
    read -r rate mbs p50 p99 < <(random_reads "$mnt" "$7")
    local hwm; hwm=$(status_kib VmHWM "$pid")
    eval "$5"
    printf '%-9s %-10s first mount %7.2f s  remount %6.2f s  random reads %6d files/s %7.1f MB/s  p50 %6.1f ms  p99 %7.1f ms  peak %7d MiB\n' \
        "$(basename "$archive" | cut -d. -f2-)" "$name" "$first" "$remount" "$rate" "$mbs" "$p50" "$p99" "$((hwm / 1024))"
}

stagefs_run() {  # label binary archive [mount options]
    local label=$1 b=$2 archive=$3 opts=${4:-}
    run "$label" "$archive" "$work/mnt-stagefs" \
        "'$b' mount $opts '$archive' '$work/mnt-stagefs' > /dev/null" \
        "'$b' umount '$work/mnt-stagefs'" \
        "'$b' status --json | python3 -c 'import json,sys; print([d[\"pid\"] for d in map(json.loads, sys.stdin) if \"mnt-stagefs\" in d[\"mountpoint\"] and \"pid\" in d][0])'" \
        "$work/list"
}

mib_of() { echo "$(($(stat -c %s "$1") >> 20)) MiB"; }

mkdir -p "$work/mnt-stagefs" "$work/mnt-ratar"
for kind in $kinds; do
    echo "making the $kind tree ($mib MiB)" >&2
    make_tree "$kind" "$work/src" "$mib"
    (cd "$work/src" && find . -type f -printf '%P\t%s\n') > "$work/list"
    tar -C "$work/src" -cf "$work/$kind.tar" .
    sizes="tar $(mib_of "$work/$kind.tar")"
    for ext in $exts; do
        case $ext in
            gz) pigz -p 2 -c "$work/$kind.tar" > "$work/$kind.tar.gz" ;;
            zst) pzstd -q -p 2 -c "$work/$kind.tar" > "$work/$kind.tar.zst" ;;
            bz2) lbzip2 -n 2 -c "$work/$kind.tar" > "$work/$kind.tar.bz2" ;;
            xz) xz -T2 -1 --block-size=4MiB -c "$work/$kind.tar" > "$work/$kind.tar.xz" ;;
            *) continue ;;
        esac
        sizes="$sizes, $ext $(mib_of "$work/$kind.tar.$ext")"
    done
    echo "$kind: $sizes, $(wc -l < "$work/list") files"
    for ext in $exts; do
        if [ "$ext" = pack ]; then
            # stagefs pack --compress zstd against the plain tar stagefs packs, both in
            # place and cold; its size against zstd -3 of the whole tar (2 threads).
            "$bin" pack "$work/src" "$work/$kind.pack.tar" 2> /dev/null
            t0=$(now)
            "$bin" pack --compress zstd "$work/src" "$work/$kind.pack.tar.zst" 2> /dev/null
            packed=$(secs "$t0" "$(now)")
            zstd -q -3 -T2 -c "$work/$kind.tar" > "$work/$kind.tar.zst3"
            size=$(stat -c %s "$work/$kind.pack.tar.zst")
            z3=$(stat -c %s "$work/$kind.tar.zst3")
            echo "$kind: pack --compress zstd $size bytes in $packed s; zstd -3 $z3 bytes; ratio $(echo "scale=4; $size / $z3" | bc)"
            # run() removes the indexes pack saved: the first mount scans (the zstd one
            # by its seek table), the remount uses the index that scan saved.
            stagefs_run stagefs "$bin" "$work/$kind.pack.tar" "--stage none"
            stagefs_run stagefs "$bin" "$work/$kind.pack.tar.zst" "--stage none"
            rm -f "$work/$kind".pack.* "$work/$kind.tar.zst3"
            continue
        fi
        archive="$work/$kind.tar.$ext"
        stagefs_run stagefs "$bin" "$archive"
        [ -z "$baseline" ] || stagefs_run before "$baseline" "$archive"
        run ratarmount "$archive" "$work/mnt-ratar" \
            "'$ratarmount' '$archive' '$work/mnt-ratar' > /dev/null 2>&1; while ! mountpoint -q '$work/mnt-ratar'; do sleep 0.05; done" \
            "fusermount3 -u '$work/mnt-ratar'; while pgrep -f 'ratarmount.*mnt-ratar' > /dev/null; do sleep 0.05; done" \
            "pgrep -f 'ratarmount.*mnt-ratar' | head -1" \
            "$work/list"
    done
    rm -rf "$work/src" "$work/$kind".tar*
done
