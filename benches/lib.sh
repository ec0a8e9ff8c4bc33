# shellcheck shell=bash
# Helpers the side-by-side benchmark scripts share (compressed.sh, gzip_first_mount.sh, nested.sh); sourced, not run.

now() { date +%s.%N; }
secs() { echo "$2 - $1" | bc; }   # secs START END: the seconds between two `now`s
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
status_kib() { awk -v key="$1:" '$1 == key {print $2}' "/proc/$2/status"; }   # status_kib VmHWM PID
make_tree() {  # kind dir mib: about mib MiB of ImageNet-like (random, 20-200 KB) or text-like files
    python3 - "$1" "$2" "$3" <<'PY'
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
