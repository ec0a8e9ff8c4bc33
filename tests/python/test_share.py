"""One copy per node: stagefs.open() of an archive that a mount of the same user holds a
complete copy of in RAM (--stage copy) maps that copy and its saved index, handed over by
the daemon, instead of staging its own; another user's daemon is never asked, and never
answers. Real mounts (root, FUSE); the two-user test makes accounts."""

from __future__ import annotations

import array
import glob
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import stagefs
from conftest import read_tree, run_as, user


def memfds(pid: str = "self") -> set:
    """The inodes of the stagefs memfds mapped in process `pid` (one inode: one copy)."""
    inodes = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5].startswith("/memfd:stagefs:"):
            inodes.add(int(fields[4]))
    return inodes


def mapped_paths() -> set:
    return {line.split(maxsplit=5)[5] for line in Path("/proc/self/maps").read_text().splitlines()
            if len(line.split(maxsplit=5)) == 6}  # fmt: skip


def daemon_pid(mountpoint: Path) -> str:
    out = subprocess.run([Path(sys.executable).parent / "stagefs", "status", "--json"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return str(next(r["pid"] for r in map(json.loads, out.splitlines()) if r["mountpoint"] == str(mountpoint)))


def files_of(fs) -> dict:
    return {p: fs.cat_file(p) for p in fs.find("")}


def test_a_compressed_tar_a_mount_copied_is_read_from_that_copy(tree, fixture_tar, tmp_path):
    archive = tmp_path / "fixture.tar.zst"
    subprocess.run(["zstd", "-q", "-o", archive, fixture_tar], check=True)
    expected = read_tree(tree)
    m = stagefs.mount(archive, tmp_path / "mnt", stage="copy")
    try:
        m.wait_staged()
        daemon = memfds(daemon_pid(tmp_path / "mnt"))
        assert len(daemon) == 1, daemon
        with stagefs.open(archive) as fs:
            assert fs.staging == "shared"
            assert files_of(fs) == expected
            # The pages this process reads are the daemon's memfd: one copy on the node.
            assert memfds() == daemon
            m.unmount()
            # Handed over, the copy outlives the mount, as an open file does.
            assert files_of(fs) == expected
        assert memfds() == set(), "closed: the copy is no longer mapped here"
    finally:
        m.unmount()


def test_a_plain_tar_and_its_saved_index_are_shared_once_the_copy_is_in(tree, fixture_tar, tmp_path, venv_stagefs):
    subprocess.run([venv_stagefs, "index", fixture_tar], check=True, capture_output=True)
    saved = Path(f"{fixture_tar}.stagefs-index")
    assert saved.exists()
    with stagefs.mount(fixture_tar, tmp_path / "mnt", stage="copy") as root:
        subprocess.run([venv_stagefs, "wait", "--staged", root], check=True)
        with stagefs.open(fixture_tar) as fs:
            assert fs.staging == "shared"
            assert files_of(fs) == read_tree(tree)
            # The index came with the copy: mapped from the daemon's descriptor.
            assert str(saved) in mapped_paths()


def test_without_a_complete_copy_in_ram_a_process_opens_its_own(tree, fixture_tar, tmp_path):
    other = tmp_path / "other.tar"
    subprocess.run(["tar", "-cf", other, "-C", tree, "cat"], check=True)
    with stagefs.mount(fixture_tar, tmp_path / "in-place", stage="none"):
        with stagefs.open(fixture_tar) as fs:
            assert fs.staging == "in place"
    with stagefs.mount(other, tmp_path / "copied", stage="copy"):
        # A copy of another archive: never taken for this one.
        with stagefs.open(fixture_tar) as fs:
            assert fs.staging == "in place"
            assert files_of(fs) == read_tree(tree)
        with stagefs.open(fixture_tar, stage="copy") as fs:
            assert fs.staging == "copy"


# As a user: open the archive, say how it is staged and whether every file is right.
OPEN = textwrap.dedent("""
    import json, os, sys, stagefs
    with stagefs.open(sys.argv[1]) as fs:
        ok = all(fs.cat_file(p) == open(os.path.join(sys.argv[2], p), "rb").read() for p in fs.find(""))
        print(json.dumps({"staging": fs.staging, "ok": ok}))
""")


def test_another_users_daemon_is_never_asked_and_never_answers(tmp_path):
    owner, eve = user("sfpy-owner"), user("sfpy-eve")
    base = Path(tempfile.mkdtemp(prefix="stagefs-share-"))
    base.chmod(0o755)
    data = base / "data"
    data.mkdir()
    src = data / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.bin").write_bytes(os.urandom(300_000))
    (src / "y.txt").write_bytes(b"the owner's data\n")
    subprocess.run(["tar", "-cf", data / "d.tar", "-C", src, "."], check=True)
    for p in [data, src, src / "a", src / "a" / "x.bin", src / "y.txt", data / "d.tar"]:
        os.chown(p, owner.pw_uid, owner.pw_gid)
    stagefs_bin = Path(sys.executable).parent / "stagefs"
    mnt = f"/dev/shm/{owner.pw_name}-share-mnt"
    run = run_as(owner, [stagefs_bin, "mount", "--stage", "copy", data / "d.tar", mnt])
    assert run.returncode == 0, run.stderr
    try:
        assert run_as(owner, [stagefs_bin, "wait", "--staged", mnt]).returncode == 0
        asks = {}
        for account in (owner, eve):
            run = run_as(account, [sys.executable, "-c", OPEN, data / "d.tar", src])
            assert run.returncode == 0, run.stderr[-3000:]
            asks[account.pw_name] = run.stdout.strip().splitlines()[-1]
        assert asks["sfpy-owner"] == '{"staging": "shared", "ok": true}', asks
        # Eve reads the archive herself: the owner's daemon is not hers to ask.
        assert asks["sfpy-eve"] == '{"staging": "in place", "ok": true}', asks
        # Even root, who can reach the owner's socket, is handed nothing.
        sockets = glob.glob(f"/tmp/stagefs-{owner.pw_uid}/*.share")
        assert len(sockets) == 1, sockets
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(sockets[0])
            fds = array.array("i")
            msg, ancdata, _flags, _addr = s.recvmsg(4096, socket.CMSG_SPACE(2 * fds.itemsize))
            assert (msg, ancdata) == (b"", []), "another user's caller got an answer"
    finally:
        run_as(owner, [stagefs_bin, "umount", mnt])
        shutil.rmtree(base)


def loader_output(source, **kw) -> tuple:
    loader = stagefs.Loader(source, batch_size=4, shuffle=True, seed=3, device="cpu", output="numpy", **kw)
    seen = [(p, label, d.tobytes()) for b in loader for p, label, d in zip(b.paths, b.labels, b.data)]
    return loader.classes, loader.num_files, seen


def test_a_loader_over_a_mount_reads_its_copy_in_process_and_sees_the_same(tree, fixture_tar, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="stagefs")
    stagefs_bin = Path(sys.executable).parent / "stagefs"
    archive = tmp_path / "data.tar.gz"
    subprocess.run(["tar", "-czf", archive, "-C", tree.parent, "data"], check=True)
    # A compressed tar decompressed whole, shown from its directory data/ (--prefix); a
    # plain tar copied, shown whole.
    prefixed, whole = tmp_path / "prefixed", tmp_path / "whole"
    subprocess.run([stagefs_bin, "mount", "--stage", "copy", "--prefix", "data", archive, prefixed], check=True)
    subprocess.run([stagefs_bin, "mount", "--stage", "copy", fixture_tar, whole], check=True)
    try:
        for root in (prefixed, whole):
            subprocess.run([stagefs_bin, "wait", "--staged", root], check=True)
            for source in (root, root / "cat", f"{root}/dog/"):
                through_fuse = loader_output(source, in_process=False)
                caplog.clear()
                in_process = loader_output(source)
                assert any("in this process" in r.getMessage() for r in caplog.records), "read through the mount"
                assert in_process == through_fuse
                assert through_fuse[1] > 0 and through_fuse[2], through_fuse
                # set_epoch with files names them as the mount does.
                loader = stagefs.Loader(source, batch_size=100, device="cpu", output="numpy")
                some = [path for path, _, _ in through_fuse[2]][:3]
                loader.set_epoch(1, files=some)
                assert sorted(p for b in loader for p in b.paths) == sorted(some)
    finally:
        for root in (prefixed, whole):
            subprocess.run([stagefs_bin, "umount", root])
    # Without a copy in RAM the mount is read through FUSE, as before.
    with stagefs.mount(fixture_tar, tmp_path / "plain", stage="none") as root:
        caplog.clear()
        assert loader_output(root)[2]
        assert not any("in this process" in r.getMessage() for r in caplog.records)
