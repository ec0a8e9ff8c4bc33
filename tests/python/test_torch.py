"""The real torch and torchvision on the CPU: what a PyTorch user does with a mount and
with ``Loader(device="cpu")``. tests/python/run.sh installs both; here a missing torch is
a failure, not a skip (set STAGEFS_TEST_NO_TORCH=1 to deselect these on purpose).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import stagefs
from conftest import read_tree

if os.environ.get("STAGEFS_TEST_NO_TORCH") == "1":
    pytest.skip("STAGEFS_TEST_NO_TORCH=1: torch tests deselected on purpose", allow_module_level=True)

import torch  # noqa: E402  (a missing torch fails collection: CI must not skip these)
import torchvision  # noqa: E402


def raw_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_imagefolder_and_dataloader_workers_read_the_mount_byte_for_byte(tmp_path, tree, fixture_tar):
    expected = read_tree(tree)
    with stagefs.mount(fixture_tar, tmp_path / "mnt") as root:
        dataset = torchvision.datasets.ImageFolder(str(root), loader=raw_bytes, is_valid_file=lambda p: True)
        assert dataset.classes == ["cat", "dog", "eel"]
        loader = torch.utils.data.DataLoader(dataset, batch_size=5, num_workers=4, collate_fn=lambda xs: xs)
        got = [item for batch in loader for item in batch]  # in the dataset's order (no shuffle)
        assert len(got) == len(dataset.samples) == len(expected)
        for (path, label), (data, got_label) in zip(dataset.samples, got):
            assert data == expected[str(Path(path).relative_to(root))], path
            assert got_label == label == dataset.classes.index(Path(path).relative_to(root).parts[0])


def test_cpu_batches_are_torch_tensors_that_share_the_batch_storage(tree):
    ld = stagefs.Loader(tree, batch_size=4, device="cpu")
    for b in ld:
        assert isinstance(b.buffer, torch.Tensor) and b.buffer.dtype == torch.uint8 and b.buffer.dim() == 1
        assert b.offsets.dtype == torch.int64 and b.lengths.dtype == torch.int64
        base = b.buffer.untyped_storage().data_ptr()
        for p, d, o, n in zip(b.paths, b.data, b.offsets.tolist(), b.lengths.tolist()):
            assert d.shape == (n,) and d.dtype == torch.uint8
            # A view of the batch's one buffer: no copy was made through Python.
            assert d.untyped_storage().data_ptr() == base
            assert n == 0 or d.data_ptr() == base + o
            assert d.numpy().tobytes() == Path(p).read_bytes()


def test_decode_jpeg_takes_batch_data_directly(tmp_path):
    (tmp_path / "cls").mkdir()
    images = {}
    for i in range(6):
        img = torch.randint(0, 256, (3, 20 + i, 28), dtype=torch.uint8)
        path = tmp_path / "cls" / f"{i}.jpg"
        path.write_bytes(torchvision.io.encode_jpeg(img, quality=90).numpy().tobytes())
        images[str(path)] = torchvision.io.decode_jpeg(torchvision.io.read_file(str(path)))
    for batch in stagefs.Loader(tmp_path, batch_size=4, device="cpu"):
        decoded = torchvision.io.decode_jpeg(batch.data)
        assert len(decoded) == len(batch)
        for path, img in zip(batch.paths, decoded):
            assert torch.equal(img, images[path]), path


class _LoaderDataset(torch.utils.data.Dataset):
    """A Dataset that (wrongly) iterates a Loader made in the parent."""

    def __init__(self, loader):
        self.loader = loader

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return next(iter(self.loader)).paths


def test_a_loader_inside_a_dataloader_worker_raises_fork_error(tree):
    ld = stagefs.Loader(tree, batch_size=2, device="cpu")
    next(iter(ld))  # its threads run in the parent
    workers = torch.utils.data.DataLoader(_LoaderDataset(ld), batch_size=None, num_workers=2,
                                          multiprocessing_context="fork")  # fmt: skip
    with pytest.raises(stagefs.ForkError, match="DataLoader worker"):
        list(workers)
    assert sum(len(b) for b in ld) == ld.num_files  # the parent's loader still works


RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch.distributed as dist, stagefs
    rank, root, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", rank=rank, world_size=4)
    ld = stagefs.Loader(root, batch_size=3, device="cpu")  # no rank/world_size given
    paths = [p for b in ld for p in b.paths]
    json.dump({"rank": ld.rank, "world": ld.world_size, "paths": paths}, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_torch_distributed_gloo_gives_each_rank_its_shard_by_default(tmp_path, tree):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    env.pop("SLURM_PROCID", None), env.pop("SLURM_NTASKS", None)
    procs = [
        subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, str(r), str(tree), str(tmp_path / f"rank{r}.json")], env=env)
        for r in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    files = sorted(str(p) for p in tree.rglob("*") if p.is_file())
    padded = files + files[: (-len(files)) % 4]
    for r, res in enumerate(results):
        assert (res["rank"], res["world"]) == (r, 4)
        # DistributedSampler's rule without shuffling: every 4th file, padded from the start.
        assert res["paths"] == padded[r::4]
    assert sorted(set(p for res in results for p in res["paths"])) == files
