#!/usr/bin/env bash
# Metadata speed side by side (issue 23): `ls -lR`, `find | wc -l` and Python's os.walk +
# stat over one tree of N small files, as a tmpfs directory, a stagefs mount of its GNU tar
# and a squashfuse_ll mount of its SquashFS image, each run twice on a fresh mount (first
# pass: cold kernel caches; second: warm). Prints seconds and ratios to tmpfs. A benchmark:
# it asserts nothing, except that every system lists N files.
#
#   benches/metadata.sh [STAGEFS] [N]      (defaults: target/release/stagefs 1000000)
#
# Needs GNU tar, mksquashfs and squashfuse_ll (Debian: squashfs-tools, squashfuse).
set -euo pipefail
bin=$(realpath "${1:-target/release/stagefs}")
n=${2:-1000000}
work=$(mktemp -d /dev/shm/stagefs-metadata.XXXXXX)
cleanup() {
    "$bin" umount "$work/mnt-stagefs" 2>/dev/null || true
    fusermount3 -u "$work/mnt-sqfs" 2>/dev/null || umount -l "$work/mnt-sqfs" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

echo "making $n files in $work/tree (1,000 per directory)"
python3 - "$work/tree" "$n" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    d = os.path.join(root, "train", f"n{i // 1000:08d}")
    if i % 1000 == 0:
        os.makedirs(d)
    with open(os.path.join(d, f"img_{i:08d}.JPEG"), "wb") as f:
        f.write(b"x" * (i % 97))
PY
tar --format=gnu -cf "$work/tree.tar" -C "$work/tree" .
mksquashfs "$work/tree" "$work/tree.sqsh" -quiet -no-progress -noI -noD -noF -no-xattrs >/dev/null
"$bin" index "$work/tree.tar" >/dev/null 2>&1 || true

walk_stat='import os, sys
n = 0
for d, dirs, files in os.walk(sys.argv[1]):
    for f in files:
        os.lstat(os.path.join(d, f)); n += 1
print(n)'

declare -A secs
timed() {  # timed KEY CMD...: runs CMD, records seconds, checks the file count it prints
    local key=$1 start end out
    shift
    start=$(date +%s.%N)
    out=$("$@")
    end=$(date +%s.%N)
    secs[$key]=$(python3 -c "print(round($end - $start, 2))")
    [[ -z $out || $out == "$n" ]] || { echo "$key listed $out files, not $n" >&2; exit 1; }
}
mount_stagefs() { "$bin" mount "$work/tree.tar" "$work/mnt-stagefs" >/dev/null; }
umount_stagefs() { "$bin" umount "$work/mnt-stagefs" >/dev/null; }
mount_sqfs() { mkdir -p "$work/mnt-sqfs"; squashfuse_ll "$work/tree.sqsh" "$work/mnt-sqfs"; }
umount_sqfs() { fusermount3 -u "$work/mnt-sqfs" 2>/dev/null || umount "$work/mnt-sqfs"; }
op_cmd() {  # op_cmd OP ROOT: the command line of one operation
    case $1 in
        ls-lR) echo "ls -lR '$2' >/dev/null" ;;
        find) echo "find '$2' -type f | wc -l" ;;
        walk+stat) echo "python3 -c '$walk_stat' '$2'" ;;
    esac
}

# Every operation twice in a row on a fresh mount: pass 1 meets cold kernel caches (for
# tmpfs the tree is always in memory), pass 2 the caches pass 1 filled.
for op in ls-lR find walk+stat; do
    for pass in 1 2; do timed "tmpfs $op $pass" bash -c "$(op_cmd "$op" "$work/tree")"; done
    mount_stagefs
    for pass in 1 2; do timed "stagefs $op $pass" bash -c "$(op_cmd "$op" "$work/mnt-stagefs")"; done
    umount_stagefs
    mount_sqfs
    for pass in 1 2; do timed "squashfuse_ll $op $pass" bash -c "$(op_cmd "$op" "$work/mnt-sqfs")"; done
    umount_sqfs
done

printf '%-14s %-10s %8s %8s %10s %10s\n' system operation "pass 1" "pass 2" "1 / tmpfs" "2 / tmpfs"
for sys in tmpfs stagefs squashfuse_ll; do
    for op in ls-lR find walk+stat; do
        a=${secs[$sys $op 1]} b=${secs[$sys $op 2]} ta=${secs[tmpfs $op 1]} tb=${secs[tmpfs $op 2]}
        printf '%-14s %-10s %7ss %7ss %9sx %9sx\n' "$sys" "$op" "$a" "$b" \
            "$(python3 -c "print(round($a / $ta, 2))")" "$(python3 -c "print(round($b / $tb, 2))")"
    done
done
