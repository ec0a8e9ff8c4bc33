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
    """{relative path: bytes} of every file below root, links to files followed (as a walk
    of a directory lists them)."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def make_archive_tree(root: Path) -> dict:
    """make_tree's ImageFolder tree plus what archives carry beyond plain files: a symbolic
    link to a file, a hard link, an empty class folder, names with a space and non-ASCII
    letters, a deep path. Returns {relative path: bytes} of the files (links followed)."""
    content = make_tree(root)
    (root / "cat" / "a name with spaces é.bin").write_bytes(b"spaces and an accent")
    content["cat/a name with spaces é.bin"] = b"spaces and an accent"
    deep = root / "dog" / "d1" / "d2" / "d3"
    deep.mkdir(parents=True)
    (deep / "deep.bin").write_bytes(b"deep" * 1000)
    content["dog/d1/d2/d3/deep.bin"] = b"deep" * 1000
    os.symlink("../cat/cat_002.bin", root / "dog" / "link_to_cat.bin")
    content["dog/link_to_cat.bin"] = content["cat/cat_002.bin"]
    os.link(root / "eel" / "big.bin", root / "eel" / "big_hardlink.bin")
    content["eel/big_hardlink.bin"] = content["eel/big.bin"]
    (root / "empty_class").mkdir()
    return content



def user(name: str):
    """The account `name` (created with a home and a group of its own if missing; root only)."""
    import pwd

    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name], check=True)
        return pwd.getpwnam(name)


def run_as(account, args, timeout: float = 300, cwd=None) -> subprocess.CompletedProcess:
    """`args` run as `account` (a pwd entry) with a login-like environment, the way the Rust
    tests' `User::command` runs them (setpriv, groups initialised, environment reset)."""
    env = [f"HOME={account.pw_dir}", f"USER={account.pw_name}", "PATH=/usr/local/bin:/usr/bin:/bin"]
    cmd = ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--init-groups", "--reset-env",
           "--", "env", *env, *map(str, args)]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def block_sum(data: bytes) -> int:
    """The checksum of a saved index's block (doc/index-format.md): four lanes of
    64-bit FNV-1a over words, then the lanes, the tail and the length."""
    mask, prime = (1 << 64) - 1, 0x100000001B3
    lanes = [0xCBF29CE484222325, 0x84222325CBF29CE4, 0x9E3779B97F4A7C15, 0x7F4A7C159E3779B9]
    whole = len(data) // 32 * 32
    for at in range(0, whole, 32):
        for i in range(4):
            word = int.from_bytes(data[at + 8 * i : at + 8 * i + 8], "little")
            lanes[i] = ((lanes[i] ^ word) * prime) & mask
    rest = b"".join(lane.to_bytes(8, "little") for lane in lanes) + data[whole:]
    rest += len(data).to_bytes(8, "little")
    return fnv(rest)


def reseal(index: bytes) -> bytes:
    """A saved index changed in its body, sealed again with the checksums stagefs expects
    (they catch damage, they are no secret): doc/index-format.md."""
    out = bytearray(index)
    field = lambda at: int.from_bytes(out[at : at + 8], "little")
    body_at, body_len, sums_at, top_at = field(88), field(96), field(104), field(120)
    block = 1 << 16
    body = bytes(out[body_at : body_at + body_len])
    sums = b"".join(block_sum(body[i : i + block]).to_bytes(8, "little") for i in range(0, len(body), block))
    top = b"".join(block_sum(sums[i : i + block]).to_bytes(8, "little") for i in range(0, len(sums), block))
    out[sums_at : sums_at + len(sums)] = sums
    out[top_at : top_at + len(top)] = top
    out[136:144] = block_sum(top).to_bytes(8, "little")
    out[4088:4096] = block_sum(bytes(out[:4088])).to_bytes(8, "little")
    return bytes(out)


def fnv(data: bytes) -> int:
    """stagefs_archive::hash::hash: FNV-1a over little-endian 8-byte words, then bytes."""
    h, prime, mask = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1
    whole = len(data) // 8 * 8
    for i in range(0, whole, 8):
        h = ((h ^ int.from_bytes(data[i : i + 8], "little")) * prime) & mask
    for b in data[whole:]:
        h = ((h ^ b) * prime) & mask
    return h
