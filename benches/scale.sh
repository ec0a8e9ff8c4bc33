#!/usr/bin/env bash
# The index at scale (issue 41): plain tars of 1M, 4M and 16M tiny members (written by
# benches/tiny_tar.rs: headers written directly, 1,000 members per directory, one member
# in 16 holding 16 bytes, the rest empty), mounted by stagefs, ratarmount-rs (built from
# source: RATARMOUNT_RS=its binary; skipped, with a note, when unset) and ratarmount 1.3.0
# (benches/.venv), one system after the other on the same archive. Per system and count:
#   first    the first mount (no saved index; the tar read once before, so cached where it fits)
#   remount  the mount with the index the first one saved (page cache warm)
#   rss      the daemon's VmRSS right after the remount, and after a `find` of the whole
#            mount (all of it, and its private part: RssAnon; the rest is mapped files, the
#            page cache's, shared by every process that maps them)
#   find     `find MNT | wc -l` on the remount (checked against the member count)
#   index    the saved index's size on disk
# and for stagefs: `stagefs ls -R` beside `tar -tf` of the same tar, the first mount on one
# core (taskset), and the bytes of a member read through the mount. Then shard sets of
# SHARDS tars of PER_SHARD members each, mounted by stagefs: the first mount (each shard
# scanned, merged, the set's index saved) and the remount from the set's saved index,
# whose time should not grow with the members. A benchmark: it asserts only counts and
# the bytes read. Times are seconds of wall clock.
#
#   benches/scale.sh [STAGEFS] [COUNTS]   (defaults: target/release/stagefs "1000000 4000000 16000000"; "": sets only)
#
# Environment: SYSTEMS (default "stagefs ratarmount-rs ratarmount"), EVERY (default 16),
# SHARDS (default 2000), PER_SHARD (default "10 1000"; empty: no sets).
# Root (mounts, drop_caches). Work files go to $TMPDIR (disk: 8.7 GB at 16M members).
set -euo pipefail
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
bin=$(realpath "${1:-target/release/stagefs}")
counts=${2-1000000 4000000 16000000}
every=${EVERY:-16}
venv=$(dirname "$0")/.venv
ratarmount=${RATARMOUNT:-$venv/bin/ratarmount}
ratarmount_rs=${RATARMOUNT_RS:-}
systems=${SYSTEMS:-stagefs ratarmount-rs ratarmount}
if [[ -z $ratarmount_rs ]]; then
    echo "RATARMOUNT_RS unset: ratarmount-rs skipped (build it from source, see doc/scale.md)" >&2
    systems=${systems//ratarmount-rs/}
fi
[ -x "$ratarmount" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q --disable-pip-version-check 'ratarmount==1.3.0'; }
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-scale.XXXXXX")
mnt=$work/mnt
mkdir -p "$mnt"
cleanup() {
    "$bin" umount "$mnt" 2>/dev/null || fusermount3 -u "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
rustc -O --edition 2021 -o "$work/tiny_tar" "$(dirname "$0")/tiny_tar.rs"

forget() {  # tar: every system's saved index of it
    rm -f "$1".stagefs-index "$1".index.sqlite "$1".index.sqlite-shm "$1".index.sqlite-wal
}

mount_it() {  # system tar
    case $1 in
        stagefs) "$bin" mount "$2" "$mnt" > /dev/null ;;
        stagefs-1core) taskset -c 0 "$bin" mount "$2" "$mnt" > /dev/null ;;
        ratarmount-rs) "$ratarmount_rs" "$2" "$mnt" > /dev/null 2>&1 ;;
        ratarmount) "$ratarmount" "$2" "$mnt" > /dev/null 2>&1 ;;
    esac
    while ! mountpoint -q "$mnt"; do sleep 0.01; done
}

umount_it() {  # system
    case $1 in
        stagefs*) "$bin" umount "$mnt" ;;
        *) fusermount3 -u "$mnt"; while pgrep -f "ratarmount.*$mnt" > /dev/null; do sleep 0.05; done ;;
    esac
}

daemon_pid() {  # system
    case $1 in
        stagefs*) "$bin" status --json | python3 -c "import json,sys; print([d['pid'] for d in map(json.loads, sys.stdin) if d['mountpoint'] == '$mnt'][0])" ;;
        *) pgrep -f "ratarmount.*$mnt" | head -1 ;;
    esac
}

timed() {  # command...: prints the seconds it took
    local t0; t0=$(now)
    "$@"
    secs "$t0" "$(now)"
}

echo "$(nproc) cores, $(awk '/MemTotal/ {print int($2 / 1048576)}' /proc/meminfo) GiB; load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-9s %-14s %8s %8s %8s %9s %9s %8s %10s\n' members system first remount rss_MiB find_rss find_anon find index_MiB
for n in $counts; do
    tar=$work/$n.tar
    echo "writing $n members" >&2
    "$work/tiny_tar" "$n" "$tar" "$every"
    entries=$((n + (n + 999) / 1000))
    for system in $systems; do
        forget "$tar"
        cat "$tar" > /dev/null
        first=$(timed mount_it "$system" "$tar")
        umount_it "$system"
        remount=$(timed mount_it "$system" "$tar")
        pid=$(daemon_pid "$system")
        rss=$(status_kib VmRSS "$pid")
        find_s=$(timed bash -c "find '$mnt' | wc -l > '$work/found'")
        found=$(($(cat "$work/found") - 1))
        [[ $found == "$entries" ]] || { echo "$system lists $found entries of $entries" >&2; exit 1; }
        find_rss=$(status_kib VmRSS "$pid")
        find_anon=$(status_kib RssAnon "$pid")
        if [[ $system == stagefs ]]; then
            want="member $((n / every / 2 * every))"
            got=$(cat "$mnt/d$(printf %07d $((n / every / 2 * every / 1000)))/f$(printf %010d $((n / every / 2 * every))).txt")
            [[ $got == "$want" ]] || { echo "stagefs read '$got', not '$want'" >&2; exit 1; }
        fi
        umount_it "$system"
        index=$({ du -m "$tar".stagefs-index "$tar".index.sqlite 2>/dev/null || true; } | awk '{s += $1} END {print s + 0}')
        printf '%-9s %-14s %8.2f %8.3f %8d %9d %9d %8.2f %10d\n' "$n" "$system" "$first" "$remount" $((rss / 1024)) \
            $((find_rss / 1024)) $((find_anon / 1024)) "$find_s" "$index"
        if [[ $system == stagefs ]]; then
            forget "$tar"
            one=$(timed mount_it stagefs-1core "$tar")
            umount_it stagefs-1core
            ls_s=$(timed bash -c "'$bin' ls -R '$tar' | wc -l > /dev/null")
            tar_s=$(timed bash -c "tar -tf '$tar' | wc -l > /dev/null")
            printf '%-9s %-14s first mount on one core %.2f s; ls -R %.2f s, tar -tf %.2f s\n' "$n" stagefs "$one" "$ls_s" "$tar_s"
        fi
    done
    forget "$tar"
    rm -f "$tar"
done

shards=${SHARDS:-2000}
printf '%-9s %-14s %8s %8s %8s\n' members set first remount rss_MiB
for per in ${PER_SHARD-10 1000}; do
    dir=$work/set-$per
    mkdir -p "$dir"
    for ((k = 0; k < shards; k++)); do
        "$work/tiny_tar" "$per" "$dir/$(printf 'train-%05d.tar' "$k")" "$every" $((k * per))
    done
    set_mount() { "$bin" mount --index-dir "$work/index-$per" "$dir/train-*.tar" "$mnt" > /dev/null; }
    first=$(timed set_mount)
    umount_it stagefs
    remount=$(timed set_mount)
    rss=$(status_kib VmRSS "$(daemon_pid stagefs)")
    found=$(($(find "$mnt" -type f | wc -l)))
    [[ $found == $((shards * per)) ]] || { echo "the set lists $found files of $((shards * per))" >&2; exit 1; }
    umount_it stagefs
    printf '%-9s %-14s %8.2f %8.3f %8d\n' $((shards * per)) "$shards x $per" "$first" "$remount" $((rss / 1024))
    rm -rf "$dir" "$work/index-$per"
done
