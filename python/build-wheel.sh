#!/usr/bin/env bash
# The one command that builds the release wheel of the `stagefs` Python package:
#
#   python/build-wheel.sh            -> target/wheels/stagefs-<version>-cp39-abi3-manylinux*.whl
#
# 1. makes (once) a build venv with pinned maturin, ziglang, cargo-zigbuild, auditwheel
#    (STAGEFS_BUILD_VENV, default .venv-build at the repository root);
# 2. builds the native `stagefs` binary against glibc 2.17 with `cargo zigbuild` and puts it
#    at python/stagefs.data/scripts/stagefs (so pip installs it as the `stagefs` command);
# 3. builds the wheel (pyo3 abi3-py39 module + that binary) with `maturin build --zig`
#    for manylinux2014; refuses to run if step 2 left no binary;
# 4. runs python/check-wheel.sh on it (auditwheel, and the GLIBC versions every ELF needs).
#
# Needs: python3 with venv (Debian: python3-venv), cargo/rustc, binutils (objdump, readelf),
# and network access to PyPI the first time. Honours CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${STAGEFS_BUILD_VENV:-$ROOT/.venv-build}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
WHEELS=$CARGO_TARGET_DIR/wheels

# Pinned so that a wheel built today and one built next month come from the same tools.
TOOLS=(maturin==1.16.0 ziglang==0.17.1 cargo-zigbuild==0.24.0 auditwheel==6.8.2)
if ! "$VENV/bin/python" -c 'import maturin, ziglang, auditwheel' 2>/dev/null \
    || ! [ -x "$VENV/bin/cargo-zigbuild" ]; then
    echo "build-wheel: installing ${TOOLS[*]} into $VENV" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check "${TOOLS[@]}"
fi
export PATH="$VENV/bin:$PATH"

start=$(date +%s)
echo "build-wheel: native binary (cargo zigbuild, glibc 2.17)" >&2
"$VENV/bin/python" python/_build/stagefs_build.py binary --zig >/dev/null
# Keep symbols (backtraces stay readable) but drop the debug line tables: about 3x smaller.
strip --strip-debug python/stagefs.data/scripts/stagefs
"$VENV/bin/python" python/_build/stagefs_build.py check >/dev/null

echo "build-wheel: wheel (maturin --zig, manylinux2014)" >&2
mkdir -p "$WHEELS"
rm -f "$WHEELS"/stagefs-*.whl
maturin build --release --zig --compatibility manylinux2014 --out "$WHEELS" >&2
wheel=$(ls "$WHEELS"/stagefs-*.whl)
echo "build-wheel: built in $(( $(date +%s) - start )) s" >&2

"$ROOT/python/check-wheel.sh" "$wheel" >&2
echo "$wheel"
