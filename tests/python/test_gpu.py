"""Loader(device="cuda") on a real GPU with torch: batches that outlive the ring, stream
ordering for a consumer on its own stream, and device memory over many epochs.

Marked ``gpu``: deselected by default, FAILS (never skips) when selected without a GPU
(``tests/python/run.sh -m gpu``, or ``tests/gpu/device-run.sh`` on the GPU machine).
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

import stagefs

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def torch():
    try:
        import torch
    except ImportError:
        pytest.fail("torch is needed for the gpu tests")
    assert torch.cuda.is_available(), "no usable GPU for the gpu tests"
    return torch


def expected_on_gpu(torch, paths):
    """Each file's bytes as a uint8 CUDA tensor, uploaded by torch (not by stagefs)."""
    import numpy as np

    return {p: torch.from_numpy(np.fromfile(p, dtype=np.uint8)).cuda() for p in paths}


def test_batches_held_for_a_whole_epoch_outlive_a_two_slot_ring(torch, tree):
    """Every batch of an epoch is kept while the 2-slot ring is reused many times over:
    each one must still hold its own files' bytes, compared on the GPU."""
    ld = stagefs.Loader(tree, batch_size=2, shuffle=True, device="cuda", depth=2, io_threads=2)
    held = list(ld)
    assert len(held) == len(ld) >= 8, "the epoch must cycle the 2-slot ring several times"
    torch.cuda.synchronize()
    files = [str(p) for p in tree.rglob("*") if p.is_file()]
    want = expected_on_gpu(torch, files)
    seen = []
    for b in held:
        assert b.buffer.device.type == "cuda" and b.buffer.dtype == torch.uint8
        for p, d in zip(b.paths, b.data):
            assert d.device == b.buffer.device
            assert torch.equal(d, want[p]), f"{p}: bytes on the GPU differ from the file"
            seen.append(p)
    assert sorted(seen) == sorted(files)


def test_a_kernel_on_the_consumers_stream_sees_the_batch(torch, tmp_path):
    """A consumer on a non-default stream launches work on the batch right after
    __next__: the upload must be ordered before it (DLPack's stream argument). Batches of
    24 MiB take far longer to upload than a kernel takes to launch, so a missing wait
    shows as wrong sums."""
    import random

    rng = random.Random(7)
    files = {}
    for i in range(24):
        p = tmp_path / "big" / f"{i:02d}.bin"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(rng.randbytes(4 << 20))
        files[str(p)] = sum(p.read_bytes())
    stream = torch.cuda.Stream()
    sums = {}
    with torch.cuda.stream(stream):
        ld = stagefs.Loader(tmp_path, batch_size=6, device="cuda", depth=2, slot_bytes=32 << 20)
        for epoch in range(3):
            ld.set_epoch(epoch)
            for b in ld:
                # Launched at once on `stream`, before anything synchronises.
                totals = [d.to(torch.int64).sum() for d in b.data]
                for p, t in zip(b.paths, totals):
                    sums[(epoch, p)] = t
    stream.synchronize()
    for (epoch, p), t in sums.items():
        assert int(t) == files[p], f"{p} (epoch {epoch}): the kernel saw other bytes"
    assert len(sums) == 3 * len(files)


def test_device_memory_is_flat_over_50_epochs(torch, tree):
    """The ring's device buffers and every batch's allocation are returned: free device
    memory (all allocators, not only torch's) after epoch 50 equals that after epoch 1."""
    ld = stagefs.Loader(tree, batch_size=4, shuffle=True, device="cuda", depth=3)

    def run_epoch(epoch):
        ld.set_epoch(epoch)
        n = 0
        for b in ld:
            n += int(b.buffer.numel())
        torch.cuda.synchronize()
        gc.collect()
        return n

    total = run_epoch(0)
    free_after_first = torch.cuda.mem_get_info()[0]
    for epoch in range(1, 50):
        assert run_epoch(epoch) == total
    free_after_last = torch.cuda.mem_get_info()[0]
    # The driver allocates in 2 MiB pages; anything beyond a page or two is a leak
    # (50 epochs of this tree move ~80 MB through the ring).
    assert free_after_first - free_after_last <= 4 << 20, (
        f"device memory fell by {(free_after_first - free_after_last) >> 20} MiB over 49 epochs"
    )
