"""Shared fixtures for the Python package's tests.

These tests run against the INSTALLED wheel (tests/python/run.sh builds it, installs
it into a fresh venv and runs pytest with that venv's python), never the sources.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; FAILS (not skips) when selected without one")


def pytest_collection_modifyitems(config, items):
    # GPU tests run only when asked for (-m gpu); then they fail loudly without a GPU.
    if "gpu" in (config.option.markexpr or ""):
        return
    keep = [i for i in items if "gpu" not in i.keywords]
    dropped = [i for i in items if "gpu" in i.keywords]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session", autouse=True)
def installed_package():
    """Refuses to test a source checkout by accident: stagefs must come from the venv."""
    import stagefs

    site = Path(stagefs.__file__).resolve()
    prefix = Path(sys.prefix).resolve()
    assert prefix in site.parents, (
        f"stagefs imported from {site}, not from this interpreter's environment {prefix}: "
        "run the tests with tests/python/run.sh"
    )
    return stagefs


@pytest.fixture(scope="session")
def venv_stagefs() -> Path:
    """The `stagefs` command pip installed next to this interpreter."""
    return Path(sys.executable).parent / "stagefs"


def make_tree(root: Path, classes=("cat", "dog", "eel"), per_class=7, seed=1) -> dict:
    """An ImageFolder-like tree with nested folders, an empty file and a 1.5 MB file.
    Returns {relative path: bytes}."""
    rng = random.Random(seed)
    content = {}
    for ci, c in enumerate(classes):
        for i in range(per_class):
            sub = f"{c}/part{i % 2}" if i % 3 == 0 else c
            rel = f"{sub}/{c}_{i:03d}.bin"
            size = 0 if (ci, i) == (0, 1) else rng.randint(1, 40_000)
            content[rel] = rng.randbytes(size)
    content[f"{classes[-1]}/big.bin"] = rng.randbytes(1_500_000)
    for rel, data in content.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return content


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "data"
    make_tree(root)
    return root


@pytest.fixture
def fixture_tar(tmp_path, tree) -> Path:
    """The tree packed by GNU tar (the format users produce)."""
    tar = tmp_path / "fixture.tar"
    subprocess.run(["tar", "--format=gnu", "-cf", str(tar), "-C", str(tree), "."], check=True)
    return tar


def read_tree(root: Path) -> dict:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out
