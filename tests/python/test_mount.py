"""stagefs.mount(): context manager, plain handle, errors, cleanup on exceptions and at exit."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
import subprocess
import sys
import textwrap
import threading

import pytest

import stagefs
from conftest import read_tree


def test_context_manager_yields_the_live_mountpoint(tree, fixture_tar, tmp_path):
    mp = tmp_path / "mnt"
    with stagefs.mount(fixture_tar, mp) as root:
        assert isinstance(root, os.PathLike) and root == mp
        assert os.path.ismount(root)
        assert read_tree(root) == read_tree(tree)
    assert not os.path.ismount(mp)


def test_options_are_passed_to_the_command(tree, fixture_tar, tmp_path):
    log = tmp_path / "daemon.log"
    m = stagefs.mount(fixture_tar, tmp_path / "mnt", stage="ram", warm="no", threads=2, idle_timeout=600,
                      max_ram="1G", log_file=log)  # fmt: skip
    try:
        assert read_tree(m.path) == read_tree(tree)
        cmd = " ".join(m.command)
        for part in ("--stage ram", "--warm no", "--threads 2", "--max-ram 1G", "--idle-timeout 600000ms"):
            assert part in cmd
    finally:
        m.unmount()


def test_wait_staged_waits_for_the_background_copy(tree, fixture_tar, tmp_path):
    # The mount serves at once; the copy goes on in the background until wait_staged.
    m = stagefs.mount(fixture_tar, tmp_path / "mnt", stage="copy")
    with m:
        assert read_tree(m.path) == read_tree(tree)
        m.wait_staged(timeout=120)
        progress = m.status()["staging_progress"]
        assert progress["state"] == "done" and progress["done_bytes"] == progress["total_bytes"] > 0
    m = stagefs.mount(fixture_tar, tmp_path / "mnt", stage="none")
    with m:
        m.wait_staged()  # nothing to stage: at once
        assert m.status()["staging_progress"] is None


def test_recursive_opens_tars_inside_the_archive(tree, fixture_tar, tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    (outer / "class1.tar").write_bytes(Path(fixture_tar).read_bytes())
    archive = tmp_path / "train.tar"
    subprocess.run(["tar", "-C", str(outer), "-cf", str(archive), "class1.tar"], check=True)
    with stagefs.mount(archive, tmp_path / "mnt", recursive=True) as root:
        assert read_tree(root / "class1") == read_tree(tree)
        assert not (root / "class1.tar").exists()


@pytest.mark.parametrize("compressor", [["gzip", "-c"], ["bzip2", "-c"], ["xz", "-T2", "--block-size=64KiB", "-c"]])
def test_compressed_tars_mount_as_they_are(tree, fixture_tar, tmp_path, compressor):
    # Served from the compressed file (restart points), or whole with stage="copy".
    archive = tmp_path / "fixture.tar.c"
    with open(archive, "wb") as out:
        subprocess.run([*compressor, str(fixture_tar)], stdout=out, check=True)
    for stage in (None, "copy"):
        with stagefs.mount(archive, tmp_path / "mnt", stage=stage) as root:
            assert read_tree(root) == read_tree(tree)


def test_plain_call_returns_a_handle(fixture_tar, tmp_path):
    m = stagefs.mount(fixture_tar, tmp_path / "mnt")
    assert m.mounted and os.path.ismount(m.path)
    m.unmount()
    assert not m.mounted and not os.path.ismount(m.path)
    m.unmount()  # a second unmount is a no-op


def test_default_mountpoint(fixture_tar):
    expected = Path("/dev/shm") / pwd.getpwuid(os.geteuid()).pw_name / "stagefs" / "fixture"
    with stagefs.mount(fixture_tar) as root:
        assert root == expected and os.path.ismount(root)
    assert not os.path.ismount(expected)


def test_unmounts_when_the_block_raises(fixture_tar, tmp_path):
    mp = tmp_path / "mnt"
    with pytest.raises(ZeroDivisionError):
        with stagefs.mount(fixture_tar, mp):
            1 / 0
    assert not os.path.ismount(mp)


def test_unmounts_on_keyboard_interrupt(fixture_tar, tmp_path):
    mp = tmp_path / "mnt"
    with pytest.raises(KeyboardInterrupt):
        with stagefs.mount(fixture_tar, mp):
            raise KeyboardInterrupt
    assert not os.path.ismount(mp)


def test_unmounts_at_interpreter_exit(fixture_tar, tmp_path):
    mp = tmp_path / "mnt"
    code = textwrap.dedent(f"""
        import os, stagefs
        m = stagefs.mount({str(fixture_tar)!r}, {str(mp)!r})
        assert os.path.ismount(m.path)
        print("mounted", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "mounted" in out.stdout
    assert not os.path.ismount(mp), "atexit did not unmount"


def test_missing_archive_is_mount_error_code_3(tmp_path):
    missing = tmp_path / "nope.tar"
    with pytest.raises(stagefs.MountError) as e:
        stagefs.mount(missing, tmp_path / "mnt")
    assert isinstance(e.value, OSError)
    assert e.value.code == 3
    assert str(missing) in e.value.message
    assert not os.path.ismount(tmp_path / "mnt")


def test_garbage_archive_is_mount_error_code_3(tmp_path):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"this is not an archive" * 100)
    with pytest.raises(stagefs.MountError) as e:
        with stagefs.mount(bad, tmp_path / "mnt"):
            pass
    assert e.value.code == 3


def test_mountpoint_that_is_a_file_is_mount_error_code_4(fixture_tar, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(stagefs.MountError) as e:
        stagefs.mount(fixture_tar, f)
    assert e.value.code == 4, e.value


def test_non_empty_mountpoint_is_refused(fixture_tar, tmp_path):
    mp = tmp_path / "full"
    mp.mkdir()
    (mp / "x").write_text("x")
    with pytest.raises(stagefs.MountError) as e:
        stagefs.mount(fixture_tar, mp)
    assert e.value.code == 4, e.value


def test_a_second_caller_shares_the_mount_and_only_the_owner_unmounts(fixture_tar, tmp_path):
    mp = tmp_path / "mnt"
    first = stagefs.mount(fixture_tar, mp)
    assert first.owner
    with stagefs.mount(fixture_tar, mp) as root:  # another rank of the node
        assert root == mp
    assert os.path.ismount(mp), "a process that did not mount must not unmount"
    # The owner waits while another process still works inside the mount.
    busy = subprocess.Popen(["sleep", "30"], cwd=mp)
    stopper = threading.Timer(1.0, busy.kill)
    stopper.start()
    try:
        first.unmount(wait_for_others=25)
        assert busy.poll() is not None, "the owner unmounted while another process was inside"
    finally:
        stopper.cancel()
        busy.kill()
        busy.wait()
    assert not os.path.ismount(mp)


def test_an_object_url_mounts_as_the_archive_would(tree, fixture_tar, tmp_path):
    # nginx on 127.0.0.1 (its own configuration, a free port) serves the archive; the URL
    # stays text (a Path would fold its "//"), and the mount shows it without its query.
    import shutil
    import socket
    import time

    www = tmp_path / "www"
    www.mkdir()
    shutil.copy(fixture_tar, www / "data.tar")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"daemon off; master_process off; pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;\n"
        "events { worker_connections 64; }\n"
        f"http {{ access_log off; client_body_temp_path {tmp_path}; proxy_temp_path {tmp_path};\n"
        f"  fastcgi_temp_path {tmp_path}; uwsgi_temp_path {tmp_path}; scgi_temp_path {tmp_path};\n"
        f"  server {{ listen 127.0.0.1:{port}; root {www}; }} }}\n"
    )
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    server = subprocess.Popen([nginx, "-c", str(conf), "-e", str(tmp_path / "error.log")])
    try:
        deadline = time.monotonic() + 20
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline, "nginx did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/data.tar?token=not-shown"
        for stage in (None, "none"):
            with stagefs.mount(url, tmp_path / "mnt", stage=stage) as root:
                assert read_tree(root) == read_tree(tree)
                status = subprocess.run([stagefs.executable(), "status"], capture_output=True, text=True).stdout
                assert f"http://127.0.0.1:{port}/data.tar" in status and "not-shown" not in status
    finally:
        server.kill()
        server.wait()
