#!/usr/bin/env bash
# Serving while staging (`--stage copy`, issue 42): a large ImageNet-like tar (random
# bytes, 20-200 KB files; its index saved beforehand, as `stagefs index` or `pack` leave
# it), the page cache dropped before every measurement. Side by side in one run:
#   first member  seconds from the start of `stagefs mount` until one member (in the
#                 middle of the archive) is read, vs mount + `wait --staged` + that read
#                 (what the first read cost when mounts returned only once staged);
#   full read     every file read (archive order, 4 readers) started at once after the
#                 mount, vs mount, `wait --staged`, then the same read;
#   reads         a shuffled sample of the files (SAMPLE MiB) read during staging, vs the
#                 same sample read from a mount served in place (`--stage none`), as MB/s;
#                 and the full read during staging vs in place.
# Each measurement ROUNDS times, interleaved; prints the medians and the ratios. A
# benchmark: it asserts only that every read read the bytes expected (a checksum).
#
#   benches/serve_staging.sh [STAGEFS] [MIB] [ROUNDS] [SAMPLE]
#   (defaults: target/release/stagefs 4096 3 256)
#
# Needs GNU tar, python3, root (drop_caches). Work files go to $TMPDIR (disk): about MIB
# of tar; RAM: twice MIB (the copy and its warmed page cache).
set -euo pipefail
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
bin=$(realpath "${1:-target/release/stagefs}")
mib=${2:-4096}
rounds=${3:-3}
sample_mib=${4:-256}
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-serve.XXXXXX")
mnt=$work/mnt
cleanup() {
    "$bin" umount "$mnt" 2> /dev/null || umount -l "$mnt" 2> /dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$mnt"

echo "making the tree ($mib MiB)" >&2
make_tree imagenet "$work/src" "$mib"
archive=$work/data.tar
tar -C "$work/src" -cf "$archive" .
rm -rf "$work/src"
"$bin" index "$archive" > /dev/null
size=$(stat -c %s "$archive")
# Members in archive order, a shuffled sample, and the one in the middle.
tar -tf "$archive" | grep -v '/$' | sed 's|^\./||' > "$work/all"
python3 - "$work/all" "$work/sample" "$sample_mib" "$archive" <<'PY'
import random, sys, tarfile
names = [l.rstrip("\n") for l in open(sys.argv[1])]
sizes = {m.name.lstrip("./"): m.size for m in tarfile.open(sys.argv[4]) if m.isfile()}
random.Random(7).shuffle(names)
out, total = [], 0
for n in names:
    if total >= int(sys.argv[3]) << 20:
        break
    out.append(n)
    total += sizes[n]
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
middle=$(sed -n "$(($(wc -l < "$work/all") / 2))p" "$work/all")
files=$(wc -l < "$work/all")
sample_bytes=$(cd "$(dirname "$archive")" && python3 -c "
import sys, tarfile
want = set(l.rstrip() for l in open('$work/sample'))
print(sum(m.size for m in tarfile.open('$archive') if m.isfile() and m.name.lstrip('./') in want))")
echo "$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 2^20}' /proc/meminfo) RAM; tar $((size >> 20)) MiB, $files files; sample $((sample_bytes >> 20)) MiB; $rounds rounds" >&2

# Reads the files listed in $1 (relative to the mount), 4 readers; prints the bytes read.
read_list() {
    (cd "$mnt" && xargs -a "$1" -d '\n' -P 4 -n 64 cat | wc -c)
}
mount_as() {  # stage
    "$bin" mount --stage "$1" "$archive" "$mnt" > /dev/null
}
done_mount() {
    "$bin" umount "$mnt"
}
check() {  # got want what
    [[ $1 == "$2" ]] || { echo "$3: read $1 bytes, expected $2" >&2; exit 1; }
}
all_bytes=$(python3 -c "
import tarfile
print(sum(m.size for m in tarfile.open('$archive') if m.isfile()))")

declare -A results
record() { results[$1]+="$2 "; }
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

for round in $(seq "$rounds"); do
    echo "round $round" >&2
    # First member, serving while staging.
    drop
    t0=$(now)
    mount_as copy
    cat "$mnt/$middle" > /dev/null
    t1=$(now)
    "$bin" wait --staged "$mnt"
    t2=$(now)
    done_mount
    record first_at_once "$(secs "$t0" "$t1")"
    record staged_in "$(secs "$t0" "$t2")"
    # First member after staging (what mounts did before).
    drop
    t0=$(now)
    mount_as copy
    "$bin" wait --staged "$mnt"
    cat "$mnt/$middle" > /dev/null
    t1=$(now)
    done_mount
    record first_after "$(secs "$t0" "$t1")"
    # Full read at once.
    drop
    t0=$(now)
    mount_as copy
    check "$(read_list "$work/all")" "$all_bytes" "full read during staging"
    t1=$(now)
    done_mount
    record full_at_once "$(secs "$t0" "$t1")"
    # Stage, then read.
    drop
    t0=$(now)
    mount_as copy
    "$bin" wait --staged "$mnt"
    check "$(read_list "$work/all")" "$all_bytes" "full read after staging"
    t1=$(now)
    done_mount
    record full_after "$(secs "$t0" "$t1")"
    # Full read in place.
    drop
    mount_as none
    t0=$(now)
    check "$(read_list "$work/all")" "$all_bytes" "full read in place"
    t1=$(now)
    done_mount
    record full_in_place "$(secs "$t0" "$t1")"
    # A shuffled sample during staging, and in place.
    drop
    mount_as copy
    t0=$(now)
    check "$(read_list "$work/sample")" "$sample_bytes" "sample during staging"
    t1=$(now)
    done_mount
    record sample_staging "$(secs "$t0" "$t1")"
    drop
    mount_as none
    t0=$(now)
    check "$(read_list "$work/sample")" "$sample_bytes" "sample in place"
    t1=$(now)
    done_mount
    record sample_in_place "$(secs "$t0" "$t1")"
done

m() { echo "${results[$1]}" | median; }
mbps() { echo "scale=0; $1 / 1000000 / $2" | bc; }
ratio() { echo "scale=3; $1 / $2" | bc; }
printf '%-44s %8s\n' "median of $rounds rounds" seconds
printf '%-44s %8.2f\n' "staging complete (mount to wait --staged)" "$(m staged_in)"
printf '%-44s %8.2f\n' "first member, served while staging" "$(m first_at_once)"
printf '%-44s %8.2f\n' "first member, mount + wait --staged + read" "$(m first_after)"
printf '%-44s %8.2f   ratio %s (target <= 1.1)\n' "full read started at once" "$(m full_at_once)" "$(ratio "$(m full_at_once)" "$(m full_after)")"
printf '%-44s %8.2f\n' "stage, then full read" "$(m full_after)"
printf '%-44s %8.2f   %s MB/s\n' "full read in place (--stage none)" "$(m full_in_place)" "$(mbps "$all_bytes" "$(m full_in_place)")"
printf '%-44s %8.2f   %s MB/s; during / in place %s (target >= 0.9)\n' "full read during staging (incl. mount)" "$(m full_at_once)" "$(mbps "$all_bytes" "$(m full_at_once)")" "$(ratio "$(m full_in_place)" "$(m full_at_once)")"
printf '%-44s %8.2f   %s MB/s\n' "shuffled sample in place" "$(m sample_in_place)" "$(mbps "$sample_bytes" "$(m sample_in_place)")"
printf '%-44s %8.2f   %s MB/s; during / in place %s (target >= 0.9)\n' "shuffled sample during staging" "$(m sample_staging)" "$(mbps "$sample_bytes" "$(m sample_staging)")" "$(ratio "$(m sample_in_place)" "$(m sample_staging)")"
