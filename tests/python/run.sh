#!/usr/bin/env bash
# The Python package's whole test: build the wheel with the documented command, install it
# into a fresh venv with numpy and pytest, run tests/python against the installed package.
#
#   tests/python/run.sh [pytest args...]      e.g. tests/python/run.sh -m gpu
#
# Needs: python3 + venv (Debian: python3-venv), cargo, binutils, GNU tar, /dev/fuse (root,
# or fuse3's fusermount3), PyPI reachable (maturin, ziglang, cargo-zigbuild, auditwheel,
# numpy, pytest, torch, torchvision). PyPI's torch for x86-64 Linux is the CUDA build: it
# pulls ~2.9 GB of nvidia-* wheels (measured: 30 s to download, about a minute to install
# here); torch runs on the CPU without a GPU, and test_torch.py needs it.
# STAGEFS_TEST_NO_TORCH=1 skips torch (and test_torch.py) for a quick local run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

# From a clean clone, as a contributor installs it (pip install . and git+file://).
tests/python/install-from-clone.sh

wheel=$(python/build-wheel.sh)

VENV=${STAGEFS_TEST_VENV:-$ROOT/.venv-test}
rm -rf "$VENV"
python3 -m venv "$VENV"
extra=(torch torchvision)
[[ ${STAGEFS_TEST_NO_TORCH:-0} == 1 ]] && extra=()
"$VENV/bin/pip" install --quiet --disable-pip-version-check "$wheel" numpy pytest "${extra[@]}"

# Run from tests/python so that nothing in the source tree shadows the installed package.
cd "$ROOT/tests/python"
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q "$@" .
