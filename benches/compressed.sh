#!/usr/bin/env bash
# Compressed tars served in place, beside ratarmount (issue 24, section 2): an
# ImageNet-like tree (random bytes, 20-200 KB files: does not compress) and a text-like
# one (words, 4-60 KB files: compresses ~4x), each packed by GNU tar and compressed as
# .tar.gz (pigz: one gzip member, like gzip), .tar.zst (pzstd: several frames) and
# .tar.bz2 (lbzip2). stagefs serves gzip and multi-frame zstd from restart points and
# decompresses bzip2 whole into RAM; ratarmount uses rapidgzip, indexed_zstd and
# indexed_bzip2. Prints, per archive and system: first mount (no saved index, page
# cache dropped), remount (saved index), random reads of FILES files by 4 readers after
# drop_caches (files/s, MB/s, per-file latency p50/p99), and the daemon's peak memory.
# A benchmark: it asserts only that every file sampled reads back with the right size.
#
#   benches/compressed.sh [STAGEFS] [MIB] [FILES]   (defaults: target/release/stagefs 2048 2000)
#
# Needs GNU tar, pigz, pzstd, lbzip2, xz and ratarmount with indexed_bzip2 (installed into
# benches/.venv when missing). Root (drop_caches). Work files go to $TMPDIR (disk).
set -euo pipefail
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
bin=$(realpath "${1:-target/release/stagefs}")
mib=${2:-2048}
files=${3:-2000}
venv=$(dirname "$0")/.venv
ratarmount=${RATARMOUNT:-$venv/bin/ratarmount}
"$venv/bin/python" -c 'import indexed_bzip2' 2>/dev/null ||
    "$venv/bin/pip" install -q --disable-pip-version-check 'indexed_bzip2>=1.6,<2'
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-compressed.XXXXXX")
cleanup() {
    "$bin" umount "$work/mnt-stagefs" 2>/dev/null || true
    fusermount3 -u "$work/mnt-ratar" 2>/dev/null || umount -l "$work/mnt-ratar" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

make_tree() {  # kind dir: about $mib MiB of files
    python3 - "$1" "$2" "$mib" <<'PY'
import os, random, sys
kind, root, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(1)
words = [w.encode() for w in "tensor batch epoch gradient loss node shard the of and a to in is".split()]
total, i = 0, 0
while total < mib << 20:
    d = os.path.join(root, f"n{i // 1000:08d}")
    os.makedirs(d, exist_ok=True)
    if kind == "imagenet":
        data = rng.randbytes(rng.randint(20_000, 200_000))
        name = f"n{i // 1000:08d}_{i}.JPEG"
    else:
        n = rng.randint(4_000, 60_000)
        data = b" ".join(rng.choice(words) for _ in range(n // 5))[:n]
        name = f"doc{i}.txt"
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    total += len(data)
    i += 1
PY
}


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

mkdir -p "$work/mnt-stagefs" "$work/mnt-ratar"
for kind in imagenet text; do
    echo "making the $kind tree ($mib MiB)" >&2
    make_tree "$kind" "$work/src"
    (cd "$work/src" && find . -type f -printf '%P\t%s\n') > "$work/list"
    tar -C "$work/src" -cf "$work/$kind.tar" .
    rm -rf "$work/src"
    pigz -p 2 -c "$work/$kind.tar" > "$work/$kind.tar.gz"
    pzstd -q -p 2 -c "$work/$kind.tar" > "$work/$kind.tar.zst"
    lbzip2 -n 2 -c "$work/$kind.tar" > "$work/$kind.tar.bz2"
    xz -T2 -1 --block-size=4MiB -c "$work/$kind.tar" > "$work/$kind.tar.xz"
    echo "$kind: tar $(($(stat -c %s "$work/$kind.tar") >> 20)) MiB, gz $(($(stat -c %s "$work/$kind.tar.gz") >> 20)) MiB," \
        "zst $(($(stat -c %s "$work/$kind.tar.zst") >> 20)) MiB, bz2 $(($(stat -c %s "$work/$kind.tar.bz2") >> 20)) MiB," \
        "xz $(($(stat -c %s "$work/$kind.tar.xz") >> 20)) MiB," \
        "$(wc -l < "$work/list") files"
    rm "$work/$kind.tar"
    for ext in gz zst bz2 xz; do
        archive="$work/$kind.tar.$ext"
        run stagefs "$archive" "$work/mnt-stagefs" \
            "'$bin' mount '$archive' '$work/mnt-stagefs' > /dev/null" \
            "'$bin' umount '$work/mnt-stagefs'" \
            "'$bin' status --json | python3 -c 'import json,sys; print([json.loads(l)[\"pid\"] for l in sys.stdin if \"mnt-stagefs\" in l][0])'" \
            "$work/list"
        run ratarmount "$archive" "$work/mnt-ratar" \
            "'$ratarmount' '$archive' '$work/mnt-ratar' > /dev/null 2>&1; while ! mountpoint -q '$work/mnt-ratar'; do sleep 0.05; done" \
            "fusermount3 -u '$work/mnt-ratar'; while pgrep -f 'ratarmount.*mnt-ratar' > /dev/null; do sleep 0.05; done" \
            "pgrep -f 'ratarmount.*mnt-ratar' | head -1" \
            "$work/list"
    done
    rm -f "$work/$kind".tar.*
done
