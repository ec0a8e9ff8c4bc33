#!/usr/bin/env bash
# Staging an archive from object storage (doc/remote.md): a 2 GiB tar in a local S3
# server (s3s-fs, which checks SigV4) behind 20 ms of latency each way, fetched into RAM
# by stagefs (`mount --stage ram --warm no`: ready when the copy is complete and indexed),
# by rclone with as many streams (`copyto --multi-thread-streams N`, into /dev/shm), and by
# one curl (one stream, into /dev/shm). Prints seconds and MB/s per run and the ratios.
# A benchmark: it checks that every copy has the object's size, and the mount its files.
#
#   benches/remote.sh [STAGEFS] [MIB] [RUNS] [STREAMS]   (defaults: target/release/stagefs 2048 3 16)
#   DELAY_MS=20 WINDOW_MIB=2 benches/remote.sh ...         (the latency model, below)
#
# Latency: this machine's kernel has no netem qdisc, so `tc qdisc add dev lo root netem
# delay 20ms` fails; benches/delay_proxy.rs (built here with rustc) delays every byte by
# 20 ms each way instead, with a 2 MiB queue per direction (one connection: at most
# ~100 MiB/s, as a 4 MiB TCP window at 40 ms RTT). Needs s3s-fs (see .ci/run), rclone
# and curl (Debian), root. Work files go to $TMPDIR; copies to /dev/shm.
set -euo pipefail
# shellcheck source=benches/lib.sh
. "$(dirname "$0")/lib.sh"
bin=$(realpath "${1:-target/release/stagefs}")
mib=${2:-2048}
runs=${3:-3}
streams=${4:-16}
delay_ms=${DELAY_MS:-20}
window_mib=${WINDOW_MIB:-2}
for tool in s3s-fs rclone curl rustc; do
    command -v "$tool" >/dev/null || { echo "benches/remote.sh: needs $tool" >&2; exit 1; }
done
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-remote.XXXXXX")
shm=$(mktemp -d /dev/shm/stagefs-remote.XXXXXX)
pids=()
cleanup() {
    "$bin" umount "$work/mnt" 2>/dev/null || true
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$work" "$shm"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

echo "== making a ${mib} MiB tar of 16 random files"
mkdir -p "$work/src" "$work/s3/bench" "$work/mnt"
for i in $(seq -w 1 16); do head -c $((mib * 1024 * 1024 / 16)) /dev/urandom > "$work/src/part$i.bin"; done
tar -cf "$work/data.tar" -C "$work/src" .
rm -rf "$work/src"
size=$(stat -c %s "$work/data.tar")

ak=AKIASTAGEFSBENCH0001
sk=stagefs/bench/secret/key/0123456789
s3_port=$(port)
s3s-fs --host 127.0.0.1 --port "$s3_port" --access-key $ak --secret-key $sk "$work/s3" > "$work/s3s.log" 2>&1 &
pids+=($!)
rustc -O --edition 2021 -o "$work/delay_proxy" "$(dirname "$0")/delay_proxy.rs"
proxy_port=$(port)
"$work/delay_proxy" "$proxy_port" "$s3_port" "$delay_ms" "$window_mib" &
pids+=($!)
sleep 1
sign=(--aws-sigv4 "aws:amz:us-east-1:s3" --user "$ak:$sk" -H "x-amz-content-sha256: UNSIGNED-PAYLOAD")
# Uploaded (not copied into its directory): s3s-fs then keeps the ETag, instead of hashing
# the whole object again for every range request.
curl -sf "${sign[@]}" -T "$work/data.tar" "http://127.0.0.1:$s3_port/bench/data.tar" -o /dev/null
rm "$work/data.tar"
endpoint="http://127.0.0.1:$proxy_port"
echo "== s3://bench/data.tar: $size bytes; ${delay_ms} ms each way, ${window_mib} MiB in flight per connection and direction; $streams streams; $runs runs each"

export AWS_ACCESS_KEY_ID=$ak AWS_SECRET_ACCESS_KEY=$sk AWS_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
export XDG_CACHE_HOME="$work/cache"
export RCLONE_CONFIG_BENCH_TYPE=s3 RCLONE_CONFIG_BENCH_PROVIDER=Other RCLONE_CONFIG_BENCH_ENDPOINT="$endpoint"
export RCLONE_CONFIG_BENCH_ACCESS_KEY_ID=$ak RCLONE_CONFIG_BENCH_SECRET_ACCESS_KEY=$sk RCLONE_CONFIG_BENCH_REGION=us-east-1

run_stagefs() {
    "$bin" mount --stage ram --warm no --remote-concurrency "$streams" --endpoint-url "$endpoint" \
        s3://bench/data.tar "$work/mnt" > /dev/null 2> "$work/stagefs.err"
    [[ $(find "$work/mnt" -mindepth 1 -maxdepth 1 | wc -l) -eq 16 ]] || { cat "$work/stagefs.err"; exit 1; }
    grep -o 'fetched .*' "$work/stagefs.err" | sed 's/^/    stagefs: /'
    "$bin" umount "$work/mnt" > /dev/null
}
run_rclone() {
    # rclone (the AWS Go SDK) refuses an AWS_CA_BUNDLE with a plain http:// endpoint.
    env -u AWS_CA_BUNDLE rclone copyto "bench:bench/data.tar" "$shm/rclone.tar" --multi-thread-streams "$streams" \
        --multi-thread-cutoff 1M --ignore-checksum 2> "$work/rclone.err" || { cat "$work/rclone.err"; exit 1; }
    [[ $(stat -c %s "$shm/rclone.tar") -eq $size ]] || exit 1
    rm "$shm/rclone.tar"
}
run_curl() {
    curl -sf "${sign[@]}" "$endpoint/bench/data.tar" -o "$shm/curl.tar"
    [[ $(stat -c %s "$shm/curl.tar") -eq $size ]] || exit 1
    rm "$shm/curl.tar"
}

declare -A best
for run in $(seq 1 "$runs"); do
    for tool in stagefs rclone curl; do
        start=$(now)
        "run_$tool"
        t=$(secs "$start" "$(now)")
        printf "run %d  %-8s %7.2f s  %7.1f MB/s\n" "$run" "$tool" "$t" "$(echo "$size / $t / 1000000" | bc -l)"
        if [[ -z ${best[$tool]:-} ]] || (($(echo "$t < ${best[$tool]}" | bc -l))); then best[$tool]=$t; fi
    done
done
echo "== best of $runs: stagefs ${best[stagefs]} s, rclone ${best[rclone]} s, curl ${best[curl]} s"
printf "stagefs / rclone (%d streams): %.2f x   stagefs / single-stream curl: %.2f x\n" "$streams" \
    "$(echo "${best[rclone]} / ${best[stagefs]}" | bc -l)" "$(echo "${best[curl]} / ${best[stagefs]}" | bc -l)"
