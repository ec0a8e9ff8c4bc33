#!/usr/bin/env bash
# Parallel readers of large compressed zip members (issue 21, item 4): N readers on N
# deflate members larger than the member cache's share, against the same N read one after
# the other, each on a fresh mount (nothing in the page cache). Prints both times, their
# ratio and the daemon's peak resident memory. A benchmark: it asserts nothing.
#
#   benches/zip_parallel.sh [STAGEFS] [N] [MiB per member]     (defaults: target/release/stagefs 4 100)
set -euo pipefail
bin=${1:-target/release/stagefs}
n=${2:-4}
mib=${3:-100}
bin=$(realpath "$bin")
work=$(mktemp -d /tmp/stagefs-zip-parallel.XXXXXX)
trap 'for m in "$work"/mnt*; do "$bin" umount "$m" 2>/dev/null || true; done; rm -rf "$work"' EXIT
mkdir -p "$work/src"
for i in $(seq 1 "$n"); do
    # Log-like text: compresses about 4:1 with deflate, like CSV, JSON or text corpora.
    python3 - "$work/src/member-$i.txt" "$mib" "$i" <<'PY'
import random, sys
path, mib, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
words = [f"w{rng.randrange(1 << 20):x}" for _ in range(4096)]
with open(path, "w") as f:
    size = 0
    while size < mib << 20:
        line = " ".join(rng.choice(words) for _ in range(12)) + "\n"
        f.write(line)
        size += len(line)
PY
done
(cd "$work/src" && zip -q -1 "$work/large.zip" member-*.txt)
echo "zip: $n deflate members of $mib MiB each, $(du -m "$work/large.zip" | cut -f1) MiB compressed"

peak_of() { awk '/VmHWM/ {print int($2/1024)}' "/proc/$1/status"; }
run() {  # run MODE MOUNTPOINT: prints seconds and the daemon's peak MiB
    local mode=$1 mnt=$2 start end pid
    "$bin" mount "$work/large.zip" "$mnt" >/dev/null
    pid=$(pgrep -n -f "stagefs.*$mnt" || true)
    start=$(date +%s.%N)
    if [[ $mode == parallel ]]; then
        for f in "$mnt"/member-*.txt; do cat "$f" >/dev/null & done
        wait
    else
        for f in "$mnt"/member-*.txt; do cat "$f" >/dev/null; done
    fi
    end=$(date +%s.%N)
    echo "$(python3 -c "print(round($end - $start, 2))") ${pid:+$(peak_of "$pid")}"
    "$bin" umount "$mnt"
}
read -r seq_s seq_peak < <(run sequential "$work/mnt1")
read -r par_s par_peak < <(run parallel "$work/mnt2")
echo "one after the other: ${seq_s} s (daemon peak ${seq_peak} MiB)"
echo "$n at once:          ${par_s} s (daemon peak ${par_peak} MiB)"
echo "ratio parallel / sequential: $(python3 -c "print(round($par_s / $seq_s, 2))")"
