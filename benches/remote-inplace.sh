#!/usr/bin/env bash
# An archive on an HTTP server, mounted by stagefs and by ratarmount 1.3.0 (which reads
# http:// URLs through fsspec), side by side: an ImageNet-like tar (random 20-200 KB files)
# served by nginx behind 20 ms of latency each way (benches/delay_proxy.rs: this kernel has
# no netem qdisc). Per system: seconds until the mount is usable (the first mount: no saved
# index anywhere), then one epoch of shuffled whole-file reads by 4 threads (files/s), with
# every file's size checked. stagefs twice: staged (`--stage ram`, the default for an object
# that fits) and in place (`--stage none`: ranges through its read-ahead cache).
#
#   benches/remote-inplace.sh [STAGEFS] [FILES]   (defaults: target/release/stagefs 4000)
#
# Needs nginx (Debian nginx-light), rustc, and ratarmount==1.3.0 with fsspec and aiohttp
# (installed into benches/.venv when missing). Root. Work files go to $TMPDIR.
set -euo pipefail
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
bin=$(realpath "${1:-target/release/stagefs}")
files=${2:-4000}
delay_ms=${DELAY_MS:-20}
venv=$(dirname "$0")/.venv
[[ -x $venv/bin/ratarmount ]] || { python3 -m venv "$venv"; "$venv/bin/pip" install -q --disable-pip-version-check 'ratarmount==1.3.0' fsspec aiohttp requests; }
export PATH="/usr/sbin:$PATH"
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-remote-inplace.XXXXXX")
pids=()
cleanup() {
    "$bin" umount "$work/mnt" 2>/dev/null || true
    fusermount3 -u "$work/mnt" 2>/dev/null || true
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

python3 - "$work/src" "$files" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
rng = random.Random(1)
for i in range(n):
    d = os.path.join(root, f"n{i % 100:08d}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{i}.JPEG"), "wb") as f:
        f.write(rng.randbytes(rng.randint(20_000, 200_000)))
PY
mkdir -p "$work/www" "$work/mnt"
tar -cf "$work/www/data.tar" -C "$work/src" .
(cd "$work/src" && find . -type f -printf '%P %s\n') > "$work/list"
rm -rf "$work/src"
web=$(port)
cat > "$work/nginx.conf" <<EOF
daemon off; master_process off; pid $work/nginx.pid; error_log $work/error.log;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $work; proxy_temp_path $work; fastcgi_temp_path $work;
  uwsgi_temp_path $work; scgi_temp_path $work; server { listen 127.0.0.1:$web; root $work/www; } }
EOF
nginx -c "$work/nginx.conf" -e "$work/error.log" &
pids+=($!)
rustc -O --edition 2021 -o "$work/delay_proxy" "$(dirname "$0")/delay_proxy.rs"
proxy=$(port)
"$work/delay_proxy" "$proxy" "$web" "$delay_ms" &
pids+=($!)
sleep 1
url="http://127.0.0.1:$proxy/data.tar"
echo "== $url: $files files, $(stat -c %s "$work/www/data.tar") bytes; ${delay_ms} ms each way (2 cores, shared machine)"

epoch() {  # epoch NAME: every file once, shuffled, 4 threads; checks sizes
    python3 - "$work/mnt" "$work/list" "$1" <<'PY'
import os, random, sys, time
from concurrent.futures import ThreadPoolExecutor
root, listing, name = sys.argv[1], sys.argv[2], sys.argv[3]
files = [l.rsplit(" ", 1) for l in open(listing).read().splitlines()]
random.Random(7).shuffle(files)
def read(item):
    path, size = item
    with open(os.path.join(root, path), "rb") as f:
        data = f.read()
    assert len(data) == int(size), (path, len(data), size)
    return len(data)
start = time.monotonic()
with ThreadPoolExecutor(4) as pool:
    total = sum(pool.map(read, files))
secs = time.monotonic() - start
print(f"{name:<22} epoch {secs:7.2f} s  {len(files) / secs:8.0f} files/s  {total / secs / 1e6:7.1f} MB/s")
PY
}

for stage in ram none; do
    export XDG_CACHE_HOME="$work/cache-$stage"
    start=$(now)
    "$bin" mount --stage "$stage" "$url" "$work/mnt" > /dev/null 2>&1
    printf "%-22s ready %7.2f s\n" "stagefs --stage $stage" "$(secs "$start" "$(now)")"
    epoch "stagefs --stage $stage"
    "$bin" umount "$work/mnt" > /dev/null
done

rm -rf ~/.cache/ratarmount "$work"/*.index.sqlite
start=$(now)
"$venv/bin/ratarmount" -f "$url" "$work/mnt" > "$work/ratarmount.log" 2>&1 &
pids+=($!)
until [[ $(find "$work/mnt" -maxdepth 1 -name 'n*' 2>/dev/null | wc -l) -gt 0 ]]; do
    kill -0 "${pids[-1]}" 2>/dev/null || { cat "$work/ratarmount.log"; exit 1; }
    sleep 0.05
done
printf "%-22s ready %7.2f s\n" "ratarmount 1.3.0" "$(secs "$start" "$(now)")"
epoch "ratarmount 1.3.0"
fusermount3 -u "$work/mnt"
