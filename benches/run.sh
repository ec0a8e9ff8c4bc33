#!/usr/bin/env bash
# Side-by-side benchmark of stagefs against tmpfs (untar into /dev/shm), kernel SquashFS,
# squashfuse_ll and ratarmount. See doc/benchmarks.md.
#
#   benches/run.sh              # smoke run: tiny datasets, ~2 minutes, the CI check
#   benches/run.sh --full       # 10,000 images + 100,000 small files + 1 GiB file
#   benches/run.sh --full --out DIR --keep-data
#
# Run as root on Debian 12. Installs the peers (apt: squashfuse squashfs-tools fuse3)
# when missing, and ratarmount + matplotlib into a virtualenv (benches/.venv, or
# $STAGEFS_BENCH_VENV). Builds target/release/stagefs when it is missing
# (or use --stagefs PATH). Exits non-zero when a system fails or returns wrong bytes.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ $(id -u) -ne 0 ]]; then
    echo "benches/run.sh: must run as root (loop mounts, drop_caches)" >&2
    exit 1
fi

missing=()
for tool in mksquashfs:squashfs-tools squashfuse_ll:squashfuse fusermount3:fuse3 tar:tar find:findutils; do
    command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}")
done
if ((${#missing[@]})); then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

venv=${STAGEFS_BENCH_VENV:-benches/.venv}
py=${PYTHON:-$(command -v python3.11 || command -v python3)}
if [[ ! -x $venv/bin/ratarmount ]] || ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check 'ratarmount==1.3.0' 'matplotlib>=3.8,<4'
fi

stagefs=target/release/stagefs
for arg in "$@"; do
    if [[ ${prev:-} == --stagefs ]]; then stagefs=$arg; fi
    prev=$arg
done
if [[ ! -x $stagefs ]]; then
    export PATH="/root/.cargo/bin:$HOME/.cargo/bin:$PATH"
    cargo build --release --bin stagefs
fi

# exec: Ctrl-C and SIGTERM reach the driver directly; it unmounts everything on the way out.
exec "$venv/bin/python" -u benches/compare.py "$@"
