"""In-tree PEP 517 backend: build the native ``stagefs`` binary, then let maturin build the wheel.

maturin cannot build a pyo3 module and a Rust binary in one pass, so the binary is
built first and placed at ``python/stagefs.data/scripts/stagefs``; maturin puts
everything under ``stagefs.data/scripts`` into the wheel, and pip installs it into
the environment's ``bin`` as the native ``stagefs`` command.

Two callers:

* ``pip install .`` (contributors): pip calls :func:`build_wheel` below. The binary
  is built with plain ``cargo build --release`` for *this* machine, and maturin's
  PEP 517 default (``--compatibility off``) tags the wheel ``linux_x86_64``: it is
  for local use, not for distribution.
* ``python/build-wheel.sh`` (releases, CI): runs ``python3 python/_build/stagefs_build.py
  binary --zig`` (``cargo zigbuild`` against glibc 2.17), then ``maturin build --zig``
  for ``manylinux2014``, then ``python/check-wheel.sh``.

Either way a wheel is never built without the binary: :func:`ensure_binary` raises.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import maturin as _maturin

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "python" / "stagefs.data" / "scripts" / "stagefs"
ZIG_TARGET = "x86_64-unknown-linux-gnu.2.17"


class BinaryMissing(RuntimeError):
    """The native ``stagefs`` binary could not be built or found."""


def build_binary(zig: bool) -> Path:
    """Builds ``stagefs`` (release) and returns the path cargo reports for the executable."""
    cargo = shutil.which("cargo")
    if cargo is None:
        raise BinaryMissing("cargo is needed to build the native stagefs binary (https://rustup.rs)")
    if zig:
        cmd = [cargo, "zigbuild", "--release", "--target", ZIG_TARGET]
    else:
        cmd = [cargo, "build", "--release"]
    cmd += ["-p", "stagefs", "--bin", "stagefs", "--message-format=json-render-diagnostics"]
    print("stagefs_build: " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise BinaryMissing(f"building the stagefs binary failed (exit {proc.returncode}): {' '.join(cmd)}")
    exe = None
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
            if msg.get("target", {}).get("name") == "stagefs":
                exe = msg["executable"]
    if exe is None or not Path(exe).is_file():
        raise BinaryMissing("cargo did not report a stagefs executable")
    return Path(exe)


def install_binary(exe: Path) -> Path:
    """Copies ``exe`` to ``python/stagefs.data/scripts/stagefs`` (mode 0755)."""
    SCRIPT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(exe, SCRIPT)
    os.chmod(SCRIPT, 0o755)
    return SCRIPT


def check_binary() -> Path:
    """Raises unless the data script is there and is an executable ELF file (not a shim)."""
    if not SCRIPT.is_file():
        raise BinaryMissing(
            f"{SCRIPT} is missing: the wheel would have no native stagefs command. "
            "Build it with python/build-wheel.sh (or `python3 python/_build/stagefs_build.py binary`)."
        )
    with open(SCRIPT, "rb") as f:
        if f.read(4) != b"\x7fELF":
            raise BinaryMissing(f"{SCRIPT} is not an ELF executable")
    if not SCRIPT.stat().st_mode & stat.S_IXUSR:
        raise BinaryMissing(f"{SCRIPT} is not executable")
    return SCRIPT


def ensure_binary(zig: bool = False) -> Path:
    """Builds and installs the binary unless ``STAGEFS_PREBUILT_BINARY`` names one to use."""
    prebuilt = os.environ.get("STAGEFS_PREBUILT_BINARY")
    install_binary(Path(prebuilt) if prebuilt else build_binary(zig))
    return check_binary()


# --- PEP 517 hooks: maturin's, with the binary built first -------------------------------

get_requires_for_build_wheel = _maturin.get_requires_for_build_wheel
get_requires_for_build_editable = _maturin.get_requires_for_build_editable
get_requires_for_build_sdist = _maturin.get_requires_for_build_sdist
build_sdist = _maturin.build_sdist


def _data_dir() -> None:
    """maturin refuses to write metadata unless the ``data`` directory exists; in a fresh
    clone it does not yet (the binary is built later, by ``build_wheel``)."""
    SCRIPT.parent.mkdir(parents=True, exist_ok=True)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _data_dir()
    return _maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _data_dir()
    hook = getattr(_maturin, "prepare_metadata_for_build_editable", _maturin.prepare_metadata_for_build_wheel)
    return hook(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    ensure_binary(zig=False)
    return _maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    ensure_binary(zig=False)
    return _maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def main(argv: list[str]) -> int:
    if argv[:1] == ["binary"]:
        print(ensure_binary(zig="--zig" in argv[1:]))
        return 0
    if argv[:1] == ["check"]:
        print(check_binary())
        return 0
    print("usage: stagefs_build.py binary [--zig] | check", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
