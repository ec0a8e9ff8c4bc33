"""stagefs.open() on bad input: every refusal a Python exception of the right builtin class,
damage named with its offset, the fuzzers' inputs replayed without a crash, Ctrl-C during
a long open. Run without /dev/fuse, as an ordinary user, like test_open.py."""

from __future__ import annotations

import errno
import gzip
import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

import stagefs
from conftest import block_sum

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"


def sh(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, **kw)


def index_file(header: bytes, fuzz_input: bytes) -> bytes:
    """A saved index whose header (key, depth) is `header`'s and whose sections and body
    are the `index_cache` fuzz input's, sealed with valid checksums."""
    n = min(fuzz_input[0], 16) if fuzz_input else 0
    table = fuzz_input[1 : 1 + 9 * n]
    start = min(-(-(1 + len(table)) // 64) * 64, len(fuzz_input))
    body = fuzz_input[start:]
    body += bytes(-len(body) % 64)
    block = 1 << 16
    sums = b"".join(block_sum(body[i : i + block]).to_bytes(8, "little") for i in range(0, len(body), block))
    top = b"".join(block_sum(sums[i : i + block]).to_bytes(8, "little") for i in range(0, len(sums), block))
    top_at = 4096
    sums_at = -(-(top_at + len(top)) // 4096) * 4096
    body_at = -(-(sums_at + len(sums)) // 4096) * 4096
    head = bytearray(header[:4096])
    head[256:4096] = bytes(4096 - 256)
    entries = [table[i : i + 9] for i in range(0, len(table), 9)]
    entries = [e for e in entries if e[0] in (1, 2, 3, 4, 5, 6, 16, 17, 18, 19, 32)]
    head[28:32] = len(entries).to_bytes(4, "little")
    for i, e in enumerate(entries):
        offset = min(int.from_bytes(e[1:5], "little") & ~63, len(body))
        length = min(int.from_bytes(e[5:9], "little"), len(body) - offset)
        at = 256 + 32 * i
        head[at : at + 4] = e[0].to_bytes(4, "little")
        head[at + 8 : at + 16] = offset.to_bytes(8, "little")
        head[at + 16 : at + 24] = length.to_bytes(8, "little")
    fields = [body_at, len(body), sums_at, len(sums), top_at, len(top), block_sum(top)]
    head[88:144] = b"".join(v.to_bytes(8, "little") for v in fields)
    head[4088:4096] = block_sum(bytes(head[:4088])).to_bytes(8, "little")
    out = bytearray(body_at + len(body))
    out[:4096] = head
    out[top_at : top_at + len(top)] = top
    out[sums_at : sums_at + len(sums)] = sums
    out[body_at:] = body
    return bytes(out)


@pytest.fixture
def small_tar(tmp_path) -> Path:
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "f.bin").write_bytes(b"x" * 5000)
    out = tmp_path / "small.tar"
    sh("tar", "-cf", out, "-C", src, "d")
    return out


def test_missing_members_and_wrong_kinds(small_tar):
    with stagefs.open(small_tar) as fs:
        for call in (fs.info, fs.cat_file, fs.open, fs.ls):
            with pytest.raises(FileNotFoundError):
                call("d/missing")
        assert fs.find("d/missing") == [] and fs.glob("missing/*") == []  # as fsspec's own
        with pytest.raises(IsADirectoryError):
            fs.open("d")
        with pytest.raises(NotADirectoryError):
            fs.cat_file("d/f.bin/x")
        with pytest.raises(OSError) as e:
            fs.open("d/new", "wb")
        assert e.value.errno == errno.EROFS
    with pytest.raises(ValueError):
        fs.cat_file("d/f.bin")  # closed


def test_archives_that_cannot_be_opened(small_tar, tmp_path):
    with pytest.raises(FileNotFoundError):
        stagefs.open(tmp_path / "none.tar")
    with pytest.raises(IsADirectoryError):
        stagefs.open(tmp_path)
    with pytest.raises(NotADirectoryError):
        stagefs.open(small_tar / "inner.tar")
    with pytest.raises(FileNotFoundError):
        stagefs.open(tmp_path / "shard-*.tar")  # a pattern that matches nothing
    (tmp_path / "notes.txt").write_text("not an archive\n" * 100)
    with pytest.raises(stagefs.ArchiveError) as e:
        stagefs.open(tmp_path / "notes.txt")
    assert e.value.errno == errno.EINVAL and e.value.offset is None and "not a tar" in str(e.value)
    (tmp_path / "empty.tar").write_bytes(b"")
    with pytest.raises(stagefs.ArchiveError, match="empty"):
        stagefs.open(tmp_path / "empty.tar")
    with pytest.raises(ValueError):
        stagefs.open(small_tar, stage="sideways")
    if os.getuid() != 0:  # root reads anything
        locked = tmp_path / "locked.tar"
        locked.write_bytes(small_tar.read_bytes())
        locked.chmod(0)
        with pytest.raises(PermissionError):
            stagefs.open(locked)


def test_damaged_archives_name_the_offset(small_tar, tmp_path):
    data = bytearray(small_tar.read_bytes())
    with tarfile.open(small_tar) as t:
        second = t.getmembers()[1].offset
    data[second + 148 : second + 156] = b"0000000\0"  # a header checksum that does not add up
    bad = tmp_path / "bad.tar"
    bad.write_bytes(data)
    with pytest.raises(stagefs.ArchiveError) as e:
        stagefs.open(bad)
    assert isinstance(e.value, OSError) and e.value.errno == errno.EIO and e.value.offset == second
    (tmp_path / "random.bin").write_bytes(os.urandom(100_000))
    sh("tar", "-czf", tmp_path / "random.tar.gz", "-C", tmp_path, "random.bin")
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes((tmp_path / "random.tar.gz").read_bytes()[:50_000])
    with pytest.raises(stagefs.ArchiveError) as e:
        stagefs.open(truncated)
    assert e.value.errno == errno.EIO and e.value.offset == 50_000, e.value


def test_a_damaged_member_fails_alone(tmp_path):
    archive = tmp_path / "damaged.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("good.txt", b"good " * 1000)
        z.writestr("bad.txt", b"the quick brown fox " * 2000)
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as z:
        info = z.getinfo("bad.txt")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    data[start + info.compress_size // 2] ^= 0xFF
    archive.write_bytes(data)
    with stagefs.open(archive) as fs:
        with pytest.raises(OSError) as e:
            fs.cat_file("bad.txt")
        assert type(e.value) is OSError and e.value.errno == errno.EIO
        assert fs.cat_file("good.txt") == b"good " * 1000


def test_an_encrypted_zip_member_is_refused(tmp_path):
    (tmp_path / "plain.txt").write_text("plain")
    (tmp_path / "secret.txt").write_text("secret")
    archive = tmp_path / "mixed.zip"
    sh("zip", "-q", archive, "plain.txt", cwd=tmp_path)
    sh("zip", "-q", "-P", "hunter2", archive, "secret.txt", cwd=tmp_path)
    with stagefs.open(archive) as fs:
        assert sorted(fs.find("")) == ["plain.txt", "secret.txt"]
        with pytest.raises(PermissionError):
            fs.cat_file("secret.txt")
        assert fs.cat_file("plain.txt") == b"plain"


def test_an_archive_changed_underneath(small_tar):
    with stagefs.open(small_tar) as fs, stagefs.open(small_tar, stage="copy") as copy:
        with tarfile.open(small_tar) as t:
            offset = t.getmember("d/f.bin").offset_data
        with open(small_tar, "r+b") as f:
            os.pwrite(f.fileno(), b"y", offset)
        with pytest.raises(OSError) as e:
            fs.cat_file("d/f.bin")
        assert e.value.errno == errno.EIO and "changed" in str(e.value)
        assert copy.cat_file("d/f.bin") == b"x" * 5000  # a private copy keeps its bytes


REPLAY = textwrap.dedent("""
    import sys, stagefs, warnings
    warnings.simplefilter("ignore")
    for path in sys.argv[1:]:
        try:
            fs = stagefs.open(path)
        except OSError as e:
            print(f"{path}: refused: {type(e).__name__}: {str(e)[:100]}")
            continue
        budget = 32 << 20  # bytes of content read per input (sparse files can claim exabytes)
        outcome = []
        try:
            names = fs.find("")
        except OSError as e:  # a saved index is read where it is used: damage found there
            print(f"{path}: refused at find: {type(e).__name__}: {str(e)[:100]}")
            continue
        for name in names:
            try:
                with fs.open(name) as f:
                    while budget > 0:
                        chunk = f.read(min(budget, 1 << 20))
                        budget -= len(chunk)
                        if not chunk:
                            break
                outcome.append("ok")
            except OSError as e:
                outcome.append(type(e).__name__)
        print(f"{path}: opened, {len(outcome)} files: {sorted(set(outcome))}")
""")


def test_the_fuzzers_inputs_replay_through_python(tmp_path, venv_stagefs):
    inputs = []
    # Seeds and regressions of the archive readers: opened as archives.
    for target in ("tar", "zip", "squashfs", "decompress"):
        for corpus in ("regressions", "seeds"):
            for p in sorted((FUZZ / corpus / target).glob("*")) if (FUZZ / corpus / target).is_dir() else []:
                copy = tmp_path / f"{corpus}-{target}-{p.name}"
                copy.write_bytes(p.read_bytes())
                inputs.append(copy)
    # Saved-index inputs (a section table and a body, see fuzz/src/exercise.rs): planted as
    # the saved index of a real archive, with its key and depth and valid checksums, so that
    # opening the archive reads them.
    src = tmp_path / "src"
    src.mkdir()
    (src / "blob.bin").write_bytes(os.urandom(1 << 20))
    for corpus in ("regressions", "seeds"):
        for p in sorted((FUZZ / corpus / "index_cache").glob("*")):
            archive = tmp_path / f"{corpus}-index-{p.name}.tar"
            sh("tar", "-cf", archive, "-C", src, "blob.bin")
            sh(venv_stagefs, "index", archive, stdout=subprocess.DEVNULL)
            saved = Path(f"{archive}.stagefs-index")
            saved.write_bytes(index_file(saved.read_bytes()[:4096], p.read_bytes()))
            inputs.append(archive)
    assert len(inputs) > 40, inputs
    # In a child: a crash of the interpreter must fail this test, not end the run.
    run = subprocess.run([sys.executable, "-c", REPLAY, *map(str, inputs)], capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(run.stdout.splitlines()) == len(inputs)
    assert "opened" in run.stdout and "refused" in run.stdout
    # The sections reached the reader: the seed of gnu.tar's index lists gnu.tar's 38 files.
    assert "seeds-index-gnu.tar.v5.tar: opened, 38 files" in run.stdout


def test_ctrl_c_stops_a_long_open(tmp_path):
    # A tar of 6 GiB of zeros as 97 concatenated gzip members (6 MB): the first pass that
    # finds its restart points decodes all of it, seconds of work to interrupt.
    archive = tmp_path / "zeros.tar.gz"
    info = tarfile.TarInfo("zeros.bin")
    info.size = 6 << 30
    zeros = gzip.compress(bytes(64 << 20), compresslevel=1)
    with open(archive, "wb") as f:
        f.write(gzip.compress(info.tobuf(tarfile.GNU_FORMAT)))
        for _ in range(info.size // (64 << 20)):
            f.write(zeros)
        f.write(gzip.compress(bytes(1024)))
    child = textwrap.dedent(f"""
        import os, signal, threading, time, stagefs
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        started = time.monotonic()
        try:
            stagefs.open({str(archive)!r})
            print("opened")
        except KeyboardInterrupt:
            print(f"interrupted after {{time.monotonic() - started:.2f}} s")
    """)
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300)
    print(run.stdout, run.stderr[-2000:])
    assert run.returncode == 0 and run.stdout.startswith("interrupted"), run.stdout + run.stderr[-2000:]
