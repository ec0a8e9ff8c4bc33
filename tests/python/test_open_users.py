"""stagefs.open() keeps the daemon's trust rules, shown with real accounts: a saved index or a
shard that another user planted in a shared dataset directory is not used from Python
either. Needs root (to make the accounts); each step runs as its user through setpriv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from conftest import reseal, run_as, user

pytestmark = pytest.mark.skipif(os.getuid() != 0, reason="makes user accounts: run as root (tests/python/run.sh)")

# What the dataset owner's job runs: open the archive, list it, collect the warnings.
LIST = textwrap.dedent("""
    import json, sys, warnings, stagefs
    warnings.simplefilter("always")
    with warnings.catch_warnings(record=True) as logged:
        try:
            with stagefs.open(sys.argv[1], trust_shards=sys.argv[2] == "trust") as fs:
                result = {"files": fs.find(""), "shards": fs.archive.shards}
        except OSError as e:
            result = {"error": type(e).__name__, "message": str(e)}
    result["warnings"] = [str(w.message) for w in logged]
    print(json.dumps(result))
""")


@pytest.fixture
def shared_dir():
    """A dataset directory of the owner's that other users may add files to (mode 1777,
    as a project's shared space often is), below a directory everyone can enter."""
    owner, eve = user("sfpy-owner"), user("sfpy-eve")
    base = Path(tempfile.mkdtemp(prefix="stagefs-users-"))
    base.chmod(0o755)
    data = base / "data"
    data.mkdir()
    shutil.chown(data, owner.pw_uid, owner.pw_gid)
    data.chmod(0o1777)
    yield owner, eve, data
    shutil.rmtree(base)


def as_user(account, *args) -> dict:
    run = run_as(account, [sys.executable, "-c", LIST, *args])
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def owned_tar(account, data: Path, name: str, files: dict) -> Path:
    """A tar of `files` made by `account` in `data`."""
    src = data / f".src-{name}"
    script = "import os, sys, json\n" + "".join(
        f"os.makedirs(os.path.dirname({str(src / rel)!r}), exist_ok=True); open({str(src / rel)!r}, 'wb').write({body!r})\n"
        for rel, body in files.items()
    )
    assert run_as(account, [sys.executable, "-c", script]).returncode == 0
    run = run_as(account, ["tar", "-cf", data / name, "-C", src, "."])
    assert run.returncode == 0, run.stderr
    return data / name


def test_another_user_s_saved_index_is_not_used(shared_dir):
    owner, eve, data = shared_dir
    archive = owned_tar(owner, data, "a.tar", {"good.txt": b"the owner's data", "sub/other.bin": b"x" * 100})
    run = run_as(owner, [Path(sys.executable).parent / "stagefs", "index", archive])
    assert run.returncode == 0, run.stderr
    saved = Path(f"{archive}.stagefs-index")
    genuine = saved.read_bytes()
    # The forgery: the same index with a name changed, its checksums made right again.
    forged = reseal(genuine.replace(b"good.txt", b"evil.txt"))
    assert forged != genuine
    # Copied into place by each user (the bytes are too long for a command line).
    copy = data.parent / "forged-index"
    copy.write_bytes(forged)
    copy.chmod(0o644)
    # Control: written by the owner, the forged index is used (so the check below can fail).
    saved.unlink()
    assert run_as(owner, ["cp", copy, saved]).returncode == 0
    assert "evil.txt" in as_user(owner, archive, "")["files"]
    saved.unlink()
    # Planted by eve, who may add files to the shared directory: ignored, with a warning.
    assert run_as(eve, ["cp", copy, saved]).returncode == 0
    assert saved.stat().st_uid == eve.pw_uid
    seen = as_user(owner, archive, "")
    assert sorted(seen["files"]) == ["good.txt", "sub/other.bin"], seen
    assert any("ignoring saved index" in w and "sfpy-eve" in w for w in seen["warnings"]), seen["warnings"]


def test_another_user_s_shard_is_refused_unless_trusted(shared_dir):
    owner, eve, data = shared_dir
    owned_tar(owner, data, "train-0.tar", {"a/0.bin": b"zero"})
    owned_tar(owner, data, "train-1.tar", {"a/1.bin": b"one"})
    pattern = str(data / "train-*.tar")
    before = as_user(owner, pattern, "")
    assert before.get("shards") == 2 and sorted(before["files"]) == ["a/0.bin", "a/1.bin"], before
    owned_tar(eve, data, "train-2.tar", {"a/0.bin": b"eve's replacement"})
    refused = as_user(owner, pattern, "")
    assert refused.get("error") == "PermissionError", refused
    assert "train-2.tar" in refused["message"] and "trust-shards" in refused["message"]
    trusted = as_user(owner, pattern, "trust")
    assert trusted.get("shards") == 3, trusted
    # The Loader opens a pattern the same way.
    loader = f"import stagefs, sys\ntry:\n    stagefs.Loader({pattern!r}, device='cpu')\nexcept PermissionError:\n    print('refused')"
    run = run_as(owner, [sys.executable, "-c", loader])
    assert run.stdout.strip() == "refused", run.stdout + run.stderr
