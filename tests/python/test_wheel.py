"""The installed wheel: the native command, the module, and a real mount through the command."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import stagefs
from conftest import read_tree


def test_stagefs_command_is_the_native_binary(venv_stagefs):
    assert venv_stagefs.is_file()
    assert os.access(venv_stagefs, os.X_OK)
    with open(venv_stagefs, "rb") as f:
        assert f.read(4) == b"\x7fELF", "the venv's stagefs is a script shim, not the native binary"
    assert Path(stagefs.executable()) == venv_stagefs
    out = subprocess.run([str(venv_stagefs), "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("stagefs ")


def test_module_is_the_abi3_extension():
    native = Path(stagefs._native.__file__)
    assert native.name == "_native.abi3.so"
    assert stagefs.__version__ == stagefs._native.__version__


def test_import_starts_no_thread():
    # Safe before DataLoader workers fork: importing must not start threads or touch CUDA.
    code = "import os, stagefs; print(len(os.listdir('/proc/self/task')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_cli_mounts_a_gnu_tar_and_reads_it_back(venv_stagefs, tree, fixture_tar, tmp_path):
    mp = tmp_path / "mnt"
    subprocess.run([str(venv_stagefs), "mount", str(fixture_tar), str(mp)], check=True, timeout=120)
    try:
        assert os.path.ismount(mp)
        assert read_tree(mp) == read_tree(tree)
    finally:
        subprocess.run([str(venv_stagefs), "umount", str(mp)], check=True, timeout=120)
    assert not os.path.ismount(mp)


def test_the_wheel_registers_the_fsspec_protocol():
    from importlib import metadata

    import fsspec

    eps = metadata.entry_points()
    group = eps.select(group="fsspec.specs") if hasattr(eps, "select") else eps.get("fsspec.specs", [])
    specs = {ep.name: ep.value for ep in group}
    assert specs.get("stagefs") == "stagefs.archive:ArchiveFileSystem"
    assert any(r.startswith("fsspec") for r in metadata.requires("stagefs") or [])
    assert fsspec.get_filesystem_class("stagefs") is stagefs.ArchiveFileSystem
