"""A dataset that grows between epochs: stagefs.mount(growing=True), Mount.add/remove and
Loader.set_epoch re-listing the mount, over shards made by GNU tar."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import stagefs


def make_shard(tmp: Path, k: int, classes: list) -> Path:
    """``cache/shard-k.tar`` with three files per class folder, each naming its shard."""
    src = tmp / f"src-{k}"
    for c in classes:
        (src / c).mkdir(parents=True)
        for i in range(3):
            (src / c / f"{k}-{i}.bin").write_bytes(f"shard {k} {c} {i}\n".encode() * (i + 1))
    out = tmp / "cache" / f"shard-{k}.tar"
    out.parent.mkdir(exist_ok=True)
    subprocess.run(["tar", "-C", str(src), "-cf", str(out), *classes], check=True)
    return out


def read_epoch(ld: stagefs.Loader, root: Path, epoch: int) -> dict:
    """Each file of the epoch (relative to ``root``): its class name and bytes."""
    ld.set_epoch(epoch)
    out = {}
    for b in ld:
        for path, label, data in zip(b.paths, b.labels, b.data):
            out[Path(path).relative_to(root).as_posix()] = (ld.classes[label], data.tobytes())
    return out


def test_a_dataset_growing_over_three_epochs(tmp_path):
    first = make_shard(tmp_path, 0, ["cat", "dog"])
    m = stagefs.mount(str(tmp_path / "cache" / "shard-*.tar"), tmp_path / "mnt", growing=True)
    with m as root:
        ld = stagefs.Loader(root, batch_size=4, shuffle=True, device="cpu", output="numpy", io_threads=2)
        epochs = []
        for epoch in range(3):
            epochs.append(read_epoch(ld, root, epoch))
            if epoch == 0:  # a new shard arrives, with a new class
                assert "added 1 shard" in m.add(make_shard(tmp_path, 1, ["dog", "bird"]))
            elif epoch == 1:  # the cache is full: the oldest shard goes, another comes
                m.remove(first)
                m.add(make_shard(tmp_path, 2, ["ant"]))
        names = [sorted(e) for e in epochs]
        assert names[0] == [f"{c}/0-{i}.bin" for c in ("cat", "dog") for i in range(3)]
        assert names[1] == sorted(names[0] + [f"{c}/1-{i}.bin" for c in ("bird", "dog") for i in range(3)])
        assert names[2] == sorted([f"{c}/1-{i}.bin" for c in ("bird", "dog") for i in range(3)]
                                  + [f"ant/2-{i}.bin" for i in range(3)])  # fmt: skip
        for e in epochs:
            for name, (label, data) in e.items():
                assert label == name.split("/")[0], "a file's class is its folder"
                assert data == (tmp_path / f"src-{name.split('/')[1][0]}" / name).read_bytes()
        # Classes keep their indices: cat stays 0 although "ant" sorts before it.
        assert ld.classes == ["cat", "dog", "bird", "ant"]
        # A new list of paths replaces the directory.
        picked = [root / "ant" / "2-0.bin", root / "dog" / "1-2.bin"]
        ld.set_epoch(3, files=picked)
        assert sorted(p for b in ld for p in b.paths) == sorted(str(p) for p in picked)
        assert ld.num_files == 2


def test_a_fixed_mount_takes_no_shards(tmp_path):
    shard = make_shard(tmp_path, 0, ["cat"])
    m = stagefs.mount(shard, tmp_path / "mnt")
    with m, pytest.raises(stagefs.MountError) as err:
        m.add(make_shard(tmp_path, 1, ["dog"]))
    assert err.value.code == 2 and "--growing" in str(err.value)
    assert isinstance(err.value, OSError)


def test_a_damaged_shard_changes_nothing(tmp_path):
    make_shard(tmp_path, 0, ["cat"])
    bad = tmp_path / "cache" / "bad.tar"
    bad.write_bytes(b"\x5a" * 4096)
    m = stagefs.mount(str(tmp_path / "cache" / "shard-*.tar"), tmp_path / "mnt", growing=True)
    with m as root:
        with pytest.raises(stagefs.MountError) as err:
            m.add(bad)
        assert err.value.code == 3 and "bad.tar" in str(err.value)
        assert sorted(p.name for p in (root / "cat").iterdir()) == ["0-0.bin", "0-1.bin", "0-2.bin"]
