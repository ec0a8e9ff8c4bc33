"""stagefs.open(): archives read in process, without FUSE, byte for byte as the archivers
extract them; the fsspec face (``stagefs://``); the Loader over an archive.

tests/python/run.sh runs this file as an ordinary user in a mount namespace where
/dev/fuse does not exist (tests/python/no-fuse.sh), and says so with
STAGEFS_TEST_NO_FUSE=1, which the first test checks.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import subprocess
from pathlib import Path

import fsspec
import numpy as np
import pytest

import stagefs
from conftest import make_archive_tree, read_tree


def sh(*args, **kw):
    return subprocess.run([str(a) for a in args], check=True, **kw)


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("open")


@pytest.fixture(scope="module")
def tree(work) -> Path:
    root = work / "tree"
    make_archive_tree(root)
    return root


@pytest.fixture(scope="module")
def plain_tar(work, tree) -> Path:
    out = work / "tree.tar"
    sh("tar", "--format=gnu", "-cf", out, "-C", tree, ".")
    return out


def compressed(plain: Path, *cmd) -> Path:
    out = plain.with_name(plain.name + "." + "-".join(cmd))
    if not out.exists():  # once per compressor, whatever the staging tested
        with open(out, "wb") as f:
            sh(*cmd, "-c", plain, stdout=f)
    return out


def extract_tar(archive: Path, dest: Path) -> Path:
    dest.mkdir()
    sh("tar", "-xf", archive, "-C", dest)  # GNU tar detects the compression itself
    return dest


def members(fs) -> dict:
    return {p: fs.cat_file(p) for p in fs.find("")}


def test_there_is_no_fuse_here(plain_tar, tmp_path):
    if os.environ.get("STAGEFS_TEST_NO_FUSE") != "1":
        pytest.skip("run by tests/python/no-fuse.sh, in a namespace without /dev/fuse")
    assert not os.path.exists("/dev/fuse") and os.getuid() != 0
    with pytest.raises(stagefs.MountError) as e:
        stagefs.mount(plain_tar, tmp_path / "mnt")
    assert e.value.code == 7, e.value  # FUSE unavailable: a mount is no option here
    with stagefs.open(plain_tar) as fs:
        assert fs.find("")


@pytest.mark.parametrize("codec", [None, ("gzip",), ("bzip2",), ("xz", "-T2", "--block-size=256KiB"), ("xz",),
                                   ("zstd", "-q"), ("pigz", "-p2")])  # fmt: skip
@pytest.mark.parametrize("stage", ["none", "copy"])
def test_tars_read_as_gnu_tar_extracts_them(work, tree, plain_tar, codec, stage, tmp_path):
    archive = plain_tar if codec is None else compressed(plain_tar, *codec)
    expected = read_tree(extract_tar(archive, tmp_path / "x"))
    assert expected == read_tree(tree)
    with stagefs.open(archive, stage=stage) as fs:
        assert fs.format == "tar"
        assert members(fs) == expected
        assert set(fs.find("", withdirs=True)) - set(expected) >= {"empty_class", "dog/d1/d2"}


def test_zip_reads_as_unzip_extracts_it(work, tree, tmp_path):
    archive = tmp_path / "tree.zip"
    sh("zip", "-q", "-r", "-y", archive, ".", cwd=tree)  # -y: links stored as links
    out = tmp_path / "x"
    sh("unzip", "-q", archive, "-d", out)
    with stagefs.open(archive) as fs:
        assert fs.format == "zip"
        assert members(fs) == read_tree(out) == read_tree(tree)
        assert fs.info("dog/link_to_cat.bin")["islink"]


@pytest.mark.parametrize("comp", ["gzip", "zstd", "xz"])
def test_squashfs_reads_as_unsquashfs_extracts_it(work, tree, tmp_path, comp):
    image = tmp_path / "tree.sqsh"
    sh("mksquashfs", tree, image, "-comp", comp, "-quiet", "-no-progress", "-b", "64K")
    out = tmp_path / "x"
    sh("unsquashfs", "-q", "-no-xattrs", "-d", out, image, stdout=subprocess.DEVNULL)
    with stagefs.open(image) as fs:
        assert fs.format == "squashfs"
        assert members(fs) == read_tree(out) == read_tree(tree)
        big, hard = fs.info("eel/big.bin"), fs.info("eel/big_hardlink.bin")
        assert big["ino"] == hard["ino"] and big["nlink"] == 2


def test_recursive_opens_inner_tars_as_directories(work, tree, tmp_path):
    outer = tmp_path / "outer"
    outer.mkdir()
    for cls in ("cat", "dog", "eel"):
        sh("tar", "-cf", outer / f"{cls}.tar", "-C", tree / cls, ".")
    archive = tmp_path / "train.tar"
    sh("tar", "-cf", archive, "-C", outer, "cat.tar", "dog.tar", "eel.tar")
    out = tmp_path / "x"
    out.mkdir()
    for cls in ("cat", "dog", "eel"):
        extract_tar(outer / f"{cls}.tar", out / cls)
    expected = read_tree(out)  # dog's link to ../cat resolves across the inner tars, as in the tree
    assert "dog/link_to_cat.bin" in expected
    with stagefs.open(archive, recursive=True) as fs:
        assert members(fs) == expected
    with stagefs.open(archive) as fs:
        assert sorted(fs.find("")) == ["cat.tar", "dog.tar", "eel.tar"]


def test_a_shard_pattern_is_one_tree(work, tree, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    for i, part in enumerate([["cat"], ["dog", "empty_class"], ["eel"]]):
        sh("tar", "-cf", shards / f"train-{i}.tar", "-C", tree, *part)
    out = tmp_path / "x"
    out.mkdir()
    for i in range(3):
        sh("tar", "-xf", shards / f"train-{i}.tar", "-C", out)
    # dog's link to ../cat (another shard) resolves in the merged tree, as on a mounted set.
    with stagefs.open(shards / "train-*.tar") as fs:
        assert fs.archive.shards == 3
        assert members(fs) == read_tree(out) == read_tree(tree)


def test_file_objects_seek_read_and_readinto(plain_tar, tree):
    data = (tree / "eel" / "big.bin").read_bytes()
    with stagefs.open(plain_tar) as fs, fs.open("eel/big.bin") as f:
        assert f.size == len(data) and f.seekable() and f.readable() and not f.writable()
        assert f.read(10) == data[:10] and f.tell() == 10
        assert f.seek(-100, os.SEEK_END) == len(data) - 100
        assert f.read() == data[-100:] and f.read() == b""
        f.seek(1000)
        buf = bytearray(5000)
        assert f.readinto(buf) == 5000 and bytes(buf) == data[1000:6000]
        arr = np.zeros(300, dtype=np.uint8)
        assert f.readinto(memoryview(arr)[100:]) == 200 and arr[100:].tobytes() == data[6000:6200]
        f.seek(len(data) + 10)
        assert f.read(5) == b"" and f.readinto(bytearray(3)) == 0
        with pytest.raises(ValueError):
            f.seek(-1)
    assert f.closed
    with pytest.raises(ValueError):
        f.read()
    with stagefs.open(plain_tar) as fs:
        assert fs.cat_file("eel/big.bin", start=-5) == data[-5:]
        assert fs.cat_file("eel/big.bin", start=10, end=20) == data[10:20]
        with fs.open("cat/cat_002.bin", "r", encoding="latin-1", newline="") as text:
            assert text.read() == (tree / "cat" / "cat_002.bin").read_bytes().decode("latin-1")


@pytest.mark.parametrize("stage", ["copy", "none"])
def test_views_show_the_bytes_and_keep_them_alive(plain_tar, tree, stage):
    data = (tree / "eel" / "big.bin").read_bytes()
    fs = stagefs.open(plain_tar, stage=stage)
    first, second = fs.view("eel/big.bin"), fs.open("eel/big.bin").getbuffer()
    assert first.readonly and first == data and second == data
    address = [np.frombuffer(v, dtype=np.uint8).ctypes.data for v in (first, second)]
    if stage == "copy":
        # Both views show the staged copy itself: the same memory, no copy made.
        assert address[0] == address[1]
    with pytest.raises(TypeError):
        first[0] = 1
    piece = first[100:200]
    fs.close()
    del fs, first, second
    gc.collect()
    assert piece == data[100:200], "a view outlives the filesystem and its other views"


def test_fsspec_finds_it_by_name_and_url(plain_tar, tree, tmp_path):
    assert fsspec.get_filesystem_class("stagefs") is stagefs.ArchiveFileSystem
    fs = fsspec.filesystem("stagefs", fo=str(plain_tar))
    assert isinstance(fs, stagefs.ArchiveFileSystem)
    expected = (tree / "dog" / "dog_001.bin").read_bytes()
    with fsspec.open("stagefs://dog/dog_001.bin", fo=str(plain_tar)) as f:
        assert f.read() == expected
    for url in (f"stagefs://dog/dog_001.bin::file://{plain_tar}", f"stagefs://dog/dog_001.bin::{plain_tar}"):
        with fsspec.open(url) as f:
            assert f.read() == expected, url
    cached = f"stagefs://dog/dog_001.bin::simplecache::file://{plain_tar}"
    with fsspec.open(cached, simplecache={"cache_storage": str(tmp_path / "cache")}) as f:
        assert f.read() == expected
    files = fsspec.open_files("stagefs://cat/*.bin", fo=str(plain_tar))
    assert sorted(f.path for f in files) == sorted(f"cat/{p.name}" for p in (tree / "cat").glob("*.bin"))
    assert sorted(fs.glob("**/deep.bin")) == ["dog/d1/d2/d3/deep.bin"]
    walked = {os.path.join(d, f) for d, _, fs_ in fs.walk("") for f in fs_}
    assert walked == set(read_tree(tree))
    assert fs.isdir("dog/d1") and fs.isfile("dog/d1/d2/d3/deep.bin") and not fs.exists("nope")
    assert fs.cat_file(Path("dog") / "dog_001.bin") == expected and fs.isdir(Path("dog/d1"))  # pathlib paths
    assert fs.ls("cat", detail=False) == sorted(f"cat/{p.name}" for p in (tree / "cat").iterdir())
    assert fs.info("cat/cat_002.bin")["size"] == (tree / "cat" / "cat_002.bin").stat().st_size
    with pytest.raises(OSError) as e:
        fs.open("cat/new.bin", "wb")
    assert e.value.errno == 30  # EROFS
    again = pickle.loads(pickle.dumps(fs))  # how DataLoader workers (spawn) get it
    assert again.cat_file("dog/dog_001.bin") == expected


def _read_in_child(fs, path, queue):
    queue.put(fs.cat_file(path))


def test_a_fork_child_reads_the_parent_s_archive(plain_tar, tree):
    # DataLoader workers are forked after the dataset opened the archive: no thread to lose.
    fs = stagefs.open(plain_tar)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(fs, "eel/big.bin", queue))
    child.start()
    got = queue.get(timeout=60)
    child.join(60)
    assert child.exitcode == 0 and got == (tree / "eel" / "big.bin").read_bytes()


def loader_batches(source, rank, **kw):
    kw = dict(batch_size=4, shuffle=True, seed=7, rank=rank, world_size=2, device="cpu", output="numpy",
              io_threads=2, **kw)  # fmt: skip
    ld = stagefs.Loader(source, **kw)
    out = []
    for epoch in (0, 1):
        ld.set_epoch(epoch)
        out += [(b.paths, b.labels, [d.tobytes() for d in b.data]) for b in ld]
    return ld, out


@pytest.mark.parametrize("how", ["path", "fs", "gzip", "squashfs"])
def test_the_loader_over_an_archive_gives_the_extracted_tree_s_batches(plain_tar, tree, tmp_path, how):
    source = plain_tar
    if how == "gzip":  # read through its restart points by the I/O threads
        source = compressed(plain_tar, "gzip")
    if how == "squashfs":
        source = tmp_path / "tree.sqsh"
        sh("mksquashfs", tree, source, "-quiet", "-no-progress")
    if how == "fs":
        source = stagefs.open(plain_tar)
    out = extract_tar(plain_tar, tmp_path / "x")
    for rank in (0, 1):
        on_disk, disk_batches = loader_batches(out, rank)
        in_archive, archive_batches = loader_batches(source, rank)
        assert in_archive.classes == on_disk.classes == ["cat", "dog", "eel", "empty_class"]
        assert len(in_archive) == len(on_disk) and in_archive.num_files == on_disk.num_files
        relative = [([os.path.relpath(p, out) for p in paths], labels, data) for paths, labels, data in disk_batches]
        assert archive_batches == relative


def test_the_loader_takes_a_directory_inside_the_archive(tree, tmp_path):
    archive = tmp_path / "prefixed.tar"
    sh("cp", "-a", tree, tmp_path / "train")
    sh("tar", "-cf", archive, "-C", tmp_path, "train")
    with stagefs.open(archive) as fs:
        ld = stagefs.Loader(fs, archive_root="train", batch_size=100, device="cpu", output="numpy")
        assert ld.classes == ["cat", "dog", "eel", "empty_class"]
        got = {p: (label, d.tobytes()) for b in ld for p, label, d in zip(b.paths, b.labels, b.data)}
        assert {p: v[1] for p, v in got.items()} == {f"train/{k}": v for k, v in read_tree(tree).items()}
        assert got["train/dog/d1/d2/d3/deep.bin"][0] == 1
        ld.set_epoch(1, files=["train/eel/big.bin", "train/cat/cat_002.bin"])
        assert [p for b in ld for p in b.paths] == ["train/eel/big.bin", "train/cat/cat_002.bin"]
        with pytest.raises(NotADirectoryError):
            stagefs.Loader(fs, archive_root="train/eel/big.bin", device="cpu")


def test_stage_ram_reads_it_into_the_page_cache_within_the_budget(plain_tar, tree):
    with stagefs.open(plain_tar, stage="ram") as fs:
        assert fs.staging == "page cache" and fs.archive.staged_bytes == 0  # shared, not private
        assert members(fs) == read_tree(tree)
    with stagefs.open(plain_tar, stage="copy", max_ram="1G") as fs:
        assert fs.staging == "copy" and fs.archive.staged_bytes == plain_tar.stat().st_size
    with pytest.raises(OSError) as e:
        stagefs.open(plain_tar, stage="ram", max_ram=4096)
    assert e.value.errno == 12 and "max-ram" in str(e.value)  # ENOMEM: the budget refuses it
