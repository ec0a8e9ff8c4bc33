#!/usr/bin/env bash
# The contributors' path, as a newcomer takes it: `pip install .` and `pip install
# git+file://...` from a fresh clone of the committed tree into fresh venvs; each must give
# the native `stagefs` command (an ELF executable, not a Python shim) and `import stagefs`.
#
#   tests/python/install-from-clone.sh
#
# Needs git, python3-venv, cargo. Builds for this machine only (no zig, no manylinux check:
# python/build-wheel.sh makes the release wheel). CARGO_TARGET_DIR defaults to
# target/clone-build of this checkout, so a second run reuses the build.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/stagefs-clone.XXXXXX")
trap 'rm -rf "$work"' EXIT
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target/clone-build}

check() {  # check VENV: the native command and the module, from outside the clone
    local venv=$1
    file -b "$venv/bin/stagefs" | grep -q '^ELF' || { echo "install-from-clone: $venv/bin/stagefs is not an ELF executable" >&2; exit 1; }
    "$venv/bin/stagefs" --version
    (cd / && "$venv/bin/python" -c 'import stagefs, sys; print("import stagefs", stagefs.__version__, "from", stagefs.__file__)')
}

git clone -q "file://$ROOT" "$work/clone"
python3 -m venv "$work/venv-dot"
(cd "$work/clone" && "$work/venv-dot/bin/pip" install --quiet --disable-pip-version-check .)
check "$work/venv-dot"

python3 -m venv "$work/venv-git"
"$work/venv-git/bin/pip" install --quiet --disable-pip-version-check "git+file://$ROOT"
check "$work/venv-git"
echo "install-from-clone: pip install . and pip install git+file:// both give the native stagefs and import stagefs"
