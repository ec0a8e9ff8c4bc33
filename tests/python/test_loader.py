"""stagefs.Loader on the host backend (device="cpu"), through numpy and DLPack."""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np

import pytest

import stagefs
from conftest import make_tree


def loader(root, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("output", "numpy")  # torch may be installed too: these tests check the numpy face
    kw.setdefault("io_threads", 2)
    return stagefs.Loader(root, **kw)


def epoch_paths(ld, epoch=0):
    ld.set_epoch(epoch)
    return [p for b in ld for p in b.paths]


def image_folder_rule(root: Path) -> dict:
    """torchvision ImageFolder's labels, written out literally: classes are the sorted
    immediate subdirectories of root; every file below class folder i has label i."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    labels = {}
    for i, c in enumerate(classes):
        for dirpath, _dirs, files in os.walk(os.path.join(root, c), followlinks=True):
            for f in files:
                labels[os.path.join(dirpath, f)] = i
    return classes, labels


def test_every_file_arrives_byte_for_byte(tree):
    ld = loader(tree, batch_size=4)
    seen = {}
    for b in ld:
        assert isinstance(b.buffer, np.ndarray) and b.buffer.dtype == np.uint8 and b.buffer.ndim == 1
        assert len(b) <= 4
        assert list(b.lengths) == [len(d) for d in b.data]
        for p, d, o, n in zip(b.paths, b.data, b.offsets, b.lengths):
            assert d.tobytes() == b.buffer[o : o + n].tobytes()
            seen[p] = d.tobytes()
    expected = {str(p): p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    assert seen == expected
    # Without shuffling the order is the sorted walk.
    assert epoch_paths(ld) == sorted(expected)


def test_labels_follow_image_folder(tree):
    (tree / "stray.txt").write_bytes(b"not in a class")  # ImageFolder ignores it: label -1 here
    (tree / "empty_class").mkdir()  # an empty class folder still takes an index
    classes, rule = image_folder_rule(tree)
    ld = loader(tree, batch_size=5, shuffle=True, seed=3)
    assert ld.classes == classes
    got = {p: l for b in ld for p, l in zip(b.paths, b.labels)}
    assert got.pop(str(tree / "stray.txt")) == -1
    assert got == rule


def test_a_list_of_paths_keeps_its_order(tree):
    paths = sorted(str(p) for p in tree.rglob("*.bin"))[::-1][:9]
    ld = loader(paths, batch_size=2)
    batches = list(ld)
    assert [p for b in batches for p in b.paths] == paths
    assert all(l == -1 for b in batches for l in b.labels)
    assert len(ld) == len(batches) == 5


def test_len_and_batch_size(tree):
    n = sum(1 for p in tree.rglob("*") if p.is_file())  # 22
    for bs in (1, 3, 8, 100):
        ld = loader(tree, batch_size=bs)
        batches = list(ld)
        assert len(ld) == len(batches) == -(-n // bs)
        assert all(len(b) == bs for b in batches[:-1])


def test_shuffle_is_seeded_and_changes_per_epoch(tree):
    ld = loader(tree, batch_size=5, shuffle=True, seed=7)
    e0, e1 = epoch_paths(ld, 0), epoch_paths(ld, 1)
    assert sorted(e0) == sorted(e1) and e0 != e1
    assert e0 != sorted(e0)
    assert epoch_paths(loader(tree, batch_size=3, shuffle=True, seed=7), 0) == e0
    assert epoch_paths(loader(tree, batch_size=5, shuffle=True, seed=8), 0) != e0


@pytest.mark.parametrize("per_class", [4, 5])  # 16 and 19 files with the big one: divisible by 4 and not
def test_four_ranks_shard_one_permutation(tmp_path, per_class):
    root = tmp_path / "d"
    make_tree(root, classes=("a", "b", "c"), per_class=per_class)
    n = sum(1 for p in root.rglob("*") if p.is_file())
    world = 4
    for epoch in (0, 1):
        shards = [epoch_paths(loader(root, batch_size=3, shuffle=True, seed=11, rank=r, world_size=world), epoch)
                  for r in range(world)]  # fmt: skip
        per_rank = -(-n // world)
        assert all(len(s) == per_rank for s in shards), "DistributedSampler gives every rank ceil(n/W) files"
        # Interleaving the shards rebuilds one global order: rank r holds positions r, r+W, ...
        order = [shards[k % world][k // world] for k in range(per_rank * world)]
        pad = per_rank * world - n
        assert len(set(order[:n])) == n, "shards overlap"
        assert sorted(order[:n]) == sorted(str(p) for p in root.rglob("*") if p.is_file()), "shards do not cover"
        assert order[n:] == order[:pad], "padding repeats the start of the permutation"
        if epoch == 0:
            first = order
    assert order != first, "a new permutation each epoch"


def test_drop_last_cuts_the_tail_and_short_batches(tmp_path):
    root = tmp_path / "d"
    make_tree(root, classes=("a", "b"), per_class=4)  # 9 files
    world = 4
    shards = [epoch_paths(loader(root, batch_size=2, shuffle=True, seed=1, rank=r, world_size=world, drop_last=True))
              for r in range(world)]  # fmt: skip
    assert all(len(s) == 2 for s in shards)
    assert len({p for s in shards for p in s}) == 8
    ld = loader(root, batch_size=3, drop_last=True)  # 9 files, one rank: 3 full batches
    assert len(ld) == len(list(ld)) == 3
    ld = loader(root, batch_size=4, drop_last=True)  # 9 files: 2 full batches, the short one dropped
    assert [len(b) for b in ld] == [4, 4] and len(ld) == 2


def test_rank_and_world_from_the_environment(tree, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    ld = loader(tree)
    assert (ld.rank, ld.world_size) == (0, 1)
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    assert (loader(tree).rank, loader(tree).world_size) == (2, 3)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ld = loader(tree)
    assert (ld.rank, ld.world_size) == (1, 4)  # RANK/WORLD_SIZE win over SLURM's
    assert loader(tree, rank=0, world_size=2).rank == 0


def test_batches_held_past_the_ring_depth_stay_intact(tree):
    ld = loader(tree, batch_size=2, depth=2)
    held = list(ld)  # every batch kept alive: far more than the ring's 2 slots
    assert len(held) > 4
    gc.collect()
    for b in held:
        for p, d in zip(b.paths, b.data):
            assert d.tobytes() == Path(p).read_bytes()
    del ld
    gc.collect()
    b = held[0]
    assert b.data[0].tobytes() == Path(b.paths[0]).read_bytes()


def test_dlpack_buffer_object(tree):
    ld = loader(tree, batch_size=3, output="dlpack")
    b = next(iter(ld))
    buf = b.buffer
    assert buf.__dlpack_device__() == (1, 0)  # kDLCPU
    arr = np.from_dlpack(buf)
    assert arr.dtype == np.uint8 and arr.shape == (len(buf),)
    assert arr.tobytes() == buf.tobytes()
    assert [bytes(d) for d in b.data] == [Path(p).read_bytes() for p in b.paths]
    with pytest.raises(ValueError):
        buf.__dlpack__(stream=1)  # host memory takes no stream
    del buf, b
    gc.collect()
    assert arr.tobytes()  # the array owns a reference: still readable


def test_dlpack_capsules_legacy_and_versioned(tree):
    b = next(iter(loader(tree, batch_size=3, output="dlpack")))
    assert '"dltensor"' in repr(b.buffer.__dlpack__())
    assert '"dltensor_versioned"' in repr(b.buffer.__dlpack__(max_version=(1, 0)))
    assert '"dltensor"' in repr(b.buffer.__dlpack__(max_version=(0, 8)))
    # Capsules nobody consumed free their tensors in the capsule destructor.
    for _ in range(1000):
        b.buffer.__dlpack__(max_version=(1, 0))
        b.buffer.__dlpack__()
    gc.collect()
    assert np.from_dlpack(b.buffer).tobytes() == b.buffer.tobytes()


def test_missing_root_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        loader(tmp_path / "absent")
    assert e.value.filename == str(tmp_path / "absent")


def test_missing_path_in_a_list_is_file_not_found(tree, tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        loader([str(next(tree.rglob("*.bin"))), str(tmp_path / "gone.bin")])
    assert e.value.filename == str(tmp_path / "gone.bin")


def test_file_vanishing_mid_epoch_names_it_and_the_next_epoch_works(tree):
    ld = loader(tree, batch_size=2)
    victim = sorted(tree.rglob("*.bin"))[9]
    saved = victim.read_bytes()
    victim.unlink()
    with pytest.raises(FileNotFoundError) as e:
        for _ in ld:
            pass
    assert e.value.filename == str(victim)
    victim.write_bytes(saved)
    assert len(epoch_paths(ld, 1)) == ld.num_files


def test_file_replaced_by_a_directory_is_an_os_error(tree):
    ld = loader(tree, batch_size=2)
    victim = sorted(tree.rglob("*.bin"))[3]
    victim.unlink()
    victim.mkdir()
    with pytest.raises(OSError) as e:
        list(ld)
    assert e.value.filename == str(victim)


def test_file_changing_size_is_file_changed_error(tree):
    ld = loader(tree, batch_size=2)
    victim = sorted(tree.rglob("*.bin"))[5]
    with open(victim, "ab") as f:
        f.write(b"more")
    with pytest.raises(stagefs.FileChangedError) as e:
        list(ld)
    assert isinstance(e.value, OSError)
    assert e.value.filename == str(victim)
    assert "changed size" in str(e.value)


def test_file_larger_than_a_forced_slot_is_value_error(tree):
    with pytest.raises(ValueError, match="big.bin"):
        list(loader(tree, batch_size=2, slot_bytes=1 << 20))


def test_bad_arguments(tree):
    with pytest.raises(ValueError):
        loader(tree, batch_size=0)
    with pytest.raises(ValueError):
        loader(tree, rank=4, world_size=4)
    with pytest.raises(ValueError):
        loader(tree, device="tpu")


def test_cuda_without_a_gpu_is_a_clear_error(tree):
    if stagefs._native.cuda_driver_present():
        pytest.skip("this machine has a CUDA driver; the gpu-marked tests cover it")
    with pytest.raises(stagefs.CudaUnavailableError, match="device='cpu'"):
        stagefs.Loader(tree, device="cuda")


def test_without_a_device_a_loader_takes_the_cpu_and_says_so_once(tree, monkeypatch):
    if stagefs._native.cuda_driver_present():
        pytest.skip("this machine has a CUDA driver: the default is the GPU there")
    monkeypatch.setattr(stagefs, "_warned_host_tensors", False)
    with pytest.warns(RuntimeWarning, match="host .CPU. tensors.*device='cpu'"):
        ld = stagefs.Loader(tree, batch_size=2, output="numpy")
    assert ld.device == "cpu"
    batch = next(iter(ld))
    assert len(batch.labels) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert stagefs.Loader(tree, batch_size=2, output="numpy").device == "cpu"


def test_stopping_early_joins_the_threads(tree):
    ld = loader(tree, batch_size=1, io_threads=3)
    base = len(os.listdir("/proc/self/task"))
    it = iter(ld)
    next(it)
    assert len(os.listdir("/proc/self/task")) > base  # I/O + copy threads started lazily
    it.close()
    deadline = time.time() + 5
    while len(os.listdir("/proc/self/task")) > base and time.time() < deadline:
        time.sleep(0.01)
    assert len(os.listdir("/proc/self/task")) == base


def test_ctrl_c_interrupts_a_slow_loader_promptly(tree):
    # Each batch takes 30 s to "upload": the consumer waits inside native code.
    code = textwrap.dedent(f"""
        import signal, sys, time, stagefs
        # A shell's background job inherits SIGINT ignored, and Python then keeps it
        # ignored: install Python's handler explicitly, as an interactive run has it.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        ld = stagefs.Loader({str(tree)!r}, batch_size=2, device="cpu", _upload_delay_ms=30_000)
        print("iterating", flush=True)
        t = time.monotonic()
        try:
            for b in ld:
                pass
        except KeyboardInterrupt:
            print(f"interrupted after {{time.monotonic() - t:.1f}}s", flush=True)
            sys.exit(42)
    """)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "iterating"
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        # Hang guard, well below the 30 s a batch takes: exiting 42 within it means the
        # interrupt stopped the wait inside native code, not the end of an upload.
        out, err = p.communicate(timeout=20)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 42, (out, err)


def _child_iterates(ld, q):
    try:
        next(iter(ld))
        q.put(("no error", ""))
    except BaseException as e:  # noqa: BLE001
        q.put((type(e).__name__, str(e)))


def _child_continues(it, q):
    try:
        next(it)
        q.put(("no error", ""))
    except BaseException as e:  # noqa: BLE001
        q.put((type(e).__name__, str(e)))


def _run_child(target, *args):
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    p.join(20)  # hang guard
    if p.is_alive():
        p.kill()
        pytest.fail("the fork child hung")
    return q.get(timeout=5), p.exitcode


def test_fork_child_using_the_parents_loader_gets_a_clear_error(tree):
    ld = loader(tree, batch_size=2)
    (name, msg), code = _run_child(_child_iterates, ld)
    assert name == "ForkError", msg
    assert "fork" in msg and str(os.getpid()) in msg
    assert code == 0
    assert len(list(ld)) == len(ld)  # the parent's loader is unaffected


def test_fork_child_continuing_a_running_epoch_gets_a_clear_error(tree):
    ld = loader(tree, batch_size=1, depth=2)
    it = iter(ld)
    next(it)  # threads are running in the parent now
    (name, msg), code = _run_child(_child_continues, it)
    assert name == "ForkError", msg
    assert code == 0
    assert len(list(it)) == len(ld) - 1  # the parent goes on


@pytest.mark.gpu
def test_cuda_batches_match_the_files(tree):
    """Needs a GPU and torch. FAILS without them when selected (-m gpu)."""
    assert stagefs._native.cuda_driver_present(), "no CUDA driver (libcuda.so) on this machine"
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.fail("torch is needed for the gpu tests")
    ld = stagefs.Loader(tree, batch_size=4, device="cuda")
    for b in ld:
        assert b.buffer.device.type == "cuda"
        for p, d in zip(b.paths, b.data):
            assert d.cpu().numpy().tobytes() == Path(p).read_bytes()


@pytest.mark.gpu
def test_decode_jpeg_on_the_gpu_from_a_batch(tmp_path):
    """Needs a GPU, torch and torchvision. FAILS without them when selected (-m gpu).
    decode_jpeg takes its input on the CPU (whatever `device`), so the batch is a host one."""
    try:
        import torch
        import torchvision
    except ImportError:
        pytest.fail("torch and torchvision are needed for the gpu tests")
    assert torch.cuda.is_available(), "no usable GPU"
    (tmp_path / "cls").mkdir()
    images = [torch.randint(0, 256, (3, 24 + i, 32), dtype=torch.uint8) for i in range(4)]
    for i, img in enumerate(images):
        (tmp_path / "cls" / f"{i}.jpg").write_bytes(torchvision.io.encode_jpeg(img).numpy().tobytes())
    for batch in stagefs.Loader(tmp_path, batch_size=4, device="cpu"):
        decoded = torchvision.io.decode_jpeg(batch.data, device="cuda")
        for path, img in zip(batch.paths, decoded):
            i = int(Path(path).stem)
            assert img.device.type == "cuda" and tuple(img.shape) == tuple(images[i].shape)
