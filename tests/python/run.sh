#!/usr/bin/env bash
# The Python package's whole test: build the wheel with the documented command, install it
# into a fresh venv with numpy and pytest, run tests/python against the installed package:
# as root with FUSE, then the archive tests of stagefs.open (test_open*.py) as an ordinary
# user in a mount namespace without /dev/fuse (no-fuse.sh).
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
# Parts of the suite run as other users (no-fuse.sh, test_open_users.py): the venv's
# interpreter must be one they can run, not one under /root (pyenv's, say).
PYTHON=${STAGEFS_TEST_PYTHON:-python3}
real=$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable))')
# Through env, as the tests run it: setpriv's own exec can succeed where the user's cannot.
if ! setpriv --reuid=65534 --regid=65534 --clear-groups -- env "$real" -c '' 2>/dev/null; then
    echo "run.sh: other users cannot run $real; making the test venv with /usr/bin/python3" >&2
    PYTHON=/usr/bin/python3
fi
"$PYTHON" -m venv "$VENV"
extra=(torch torchvision)
[[ ${STAGEFS_TEST_NO_TORCH:-0} == 1 ]] && extra=()
"$VENV/bin/pip" install --quiet --disable-pip-version-check "$wheel" numpy pytest "${extra[@]}"
# test_open_remote.py starts s3s-fs as the no-FUSE test user, who cannot reach /root/.cargo/bin.
if command -v s3s-fs >/dev/null; then cp "$(command -v s3s-fs)" "$VENV/bin/"; fi

# Run from tests/python so that nothing in the source tree shadows the installed package.
cd "$ROOT/tests/python"
status=0
no_fuse=(test_open.py test_open_errors.py test_open_doors.py test_open_remote.py)
"$VENV/bin/python" -m pytest -p no:cacheprovider -q "${no_fuse[@]/#/--ignore=}" "$@" . || status=$?
# Exit 5: the arguments selected none of the no-FUSE tests (e.g. -m gpu), not a failure.
bash no-fuse.sh "$VENV/bin/python" -p no:cacheprovider -q "$@" "${no_fuse[@]}" || { rc=$?; [[ $rc == 5 ]] || status=$rc; }
exit "$status"
