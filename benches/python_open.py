#!/usr/bin/env python3
"""Archives read in process (stagefs.open, no FUSE) against their peers, side by side in one run.

  (a) stagefs.Loader(archive, device="cpu")  vs  stagefs.Loader(mount of the same archive)
      vs  stagefs.Loader(the files extracted into /dev/shm): files/s of a steady-state epoch;
  (b) stagefs.open(archive) + a thread pool reading every member  vs  ratarmountcore
      (the library under ratarmount; ratarmount==1.3.0's mount source)  vs  fsspec's own
      `tar` filesystem: seconds to open (index), members read per second. fsspec's tar
      finds a member by a linear search of all of them (tarfile's getmember), so on a large
      archive it reads an even sample of --sample members (its rate per member is the same).

Datasets (made once under --work, packed by GNU tar): "imagenet", 10,000 files of 20-200 KB
in 100 class folders; "small", 100,000 files of 1-4 KB in 100 folders. Every byte read is
checked against the file's size; every round runs the systems in turn (A B C A B C ...),
page cache warm; the medians and their ratios are printed, and written as JSON (--json).

    sudo benches/.venv/bin/python benches/python_open.py [--work DIR] [--rounds 3] [--threads 2]

Needs: the stagefs wheel, ratarmount==1.3.0, fsspec and numpy in the interpreter running it
(benches/README.md: how to make benches/.venv), GNU tar, /dev/shm, and FUSE for the mount.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import threading
import time

import fsspec
import stagefs

DATASETS = {
    "imagenet": dict(files=10_000, dirs=100, lo=20_000, hi=200_000),
    "small": dict(files=100_000, dirs=100, lo=1_000, hi=4_000),
}


def make_dataset(work: str, name: str) -> str:
    """The dataset's tar (made once): returns its path; the tree stays beside it."""
    spec = DATASETS[name]
    tar = os.path.join(work, f"{name}.tar")
    if os.path.exists(tar):
        return tar
    src = os.path.join(work, f"{name}.src")
    shutil.rmtree(src, ignore_errors=True)
    rng = random.Random(name)
    for d in range(spec["dirs"]):
        os.makedirs(os.path.join(src, f"c{d:03d}"))
    for i in range(spec["files"]):
        with open(os.path.join(src, f"c{i % spec['dirs']:03d}", f"f{i:06d}.bin"), "wb") as f:
            f.write(rng.randbytes(rng.randint(spec["lo"], spec["hi"])))
    # Members named c000/f000000.bin, not ./c000/...: fsspec's tar keeps a leading "./".
    dirs = sorted(os.listdir(src))
    subprocess.run(["tar", "--format=gnu", "-cf", tar + ".part", "-C", src, *dirs], check=True)
    os.rename(tar + ".part", tar)
    return tar


def median_ratio(a: list, b: list) -> float:
    return statistics.median(a) / statistics.median(b)


# -- (a) the Loader ---------------------------------------------------------------------


def loader_epoch_rate(source, epochs: int, expected: int) -> float:
    """Files/s of the last of `epochs` epochs (the first ones warm caches up)."""
    ld = stagefs.Loader(source, batch_size=256, shuffle=True, seed=0, device="cpu", output="numpy")
    for epoch in range(epochs):
        ld.set_epoch(epoch)
        start, files = time.perf_counter(), 0
        for b in ld:
            if int(b.lengths.sum()) != b.buffer.nbytes:
                raise SystemExit("python_open: a batch's lengths do not add up to its bytes")
            files += len(b)
        elapsed = time.perf_counter() - start
    if files != expected:
        raise SystemExit(f"python_open: an epoch read {files} files, not {expected}")
    return files / elapsed


def bench_loader(work: str, name: str, tar: str, rounds: int, epochs: int) -> dict:
    shm = f"/dev/shm/stagefs-bench-open-{name}"
    shutil.rmtree(shm, ignore_errors=True)
    os.makedirs(shm)
    subprocess.run(["tar", "-xf", tar, "-C", shm], check=True)
    expected = DATASETS[name]["files"]
    rates: dict = {"archive": [], "mount": [], "shm": []}
    try:
        with stagefs.mount(tar, os.path.join(work, f"mnt-{name}"), stage="none") as root:
            sources = {"archive": stagefs.open(tar), "mount": str(root), "shm": shm}
            for r in range(rounds):
                for system, source in sources.items():
                    rate = loader_epoch_rate(source, epochs, expected)
                    rates[system].append(rate)
                    print(f"  (a) {name} round {r + 1}: {system:8s} {rate:10.0f} files/s", flush=True)
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    return {
        "files_per_s": {k: statistics.median(v) for k, v in rates.items()},
        "archive_vs_mount": median_ratio(rates["archive"], rates["mount"]),
        "archive_vs_shm": median_ratio(rates["archive"], rates["shm"]),
        "rounds": rates,
    }


# -- (b) reading every member -----------------------------------------------------------


class Stagefs:
    name = "stagefs.open"

    def __init__(self, tar: str) -> None:
        # The Loader runs' archive let go of (fsspec caches filesystems), so that this open
        # indexes it afresh instead of reusing this process's open archive.
        stagefs.ArchiveFileSystem.clear_instance_cache()
        gc.collect()
        self.fs = stagefs.ArchiveFileSystem(tar, skip_instance_cache=True)

    def names(self) -> list:
        return self.fs.find("")

    def reader(self):
        return self.fs.cat_file  # one filesystem for all threads: reads release the GIL


class Ratarmount:
    name = "ratarmountcore"

    def __init__(self, tar: str) -> None:
        from ratarmountcore.mountsource.factory import open_mount_source

        index = tar + ".ratarmount-bench.sqlite"
        self.source = open_mount_source(tar, writeIndex=True, indexFilePath=index)

    def names(self) -> list:
        out, todo = [], [""]
        while todo:
            d = todo.pop()
            for entry, mode in (self.source.list_mode(d or "/") or {}).items():
                path = f"{d}/{entry}" if d else entry
                (todo if (mode & 0o170000) == 0o040000 else out).append(path)
        return sorted(out)

    def reader(self):
        source = self.source  # thread-safe: its file object is shared under a lock

        def read(path: str) -> bytes:
            info = source.lookup("/" + path)
            with source.open(info) as f:
                return f.read()

        return read


class FsspecTar:
    name = "fsspec tar"
    sampled = True  # reads a sample: see the module's doc

    def __init__(self, tar: str) -> None:
        self.tar = tar
        self.fs = fsspec.filesystem("tar", fo=tar)

    def names(self) -> list:
        return sorted(self.fs.find(""))

    def reader(self):
        # tarfile reads through one shared file object: one filesystem per thread.
        return fsspec.filesystem("tar", fo=self.tar).cat_file


def read_all(lib, names: list, sizes: dict, threads: int) -> float:
    """Seconds for `threads` threads to read every member (each thread its share)."""
    readers = [lib.reader() for _ in range(threads)]  # made before the clock starts
    start_line = threading.Barrier(threads + 1)
    failures = []

    def work(k: int) -> None:
        read = readers[k]
        start_line.wait()
        for path in names[k::threads]:
            if len(read(path)) != sizes[path]:
                failures.append(path)

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    start_line.wait()
    start = time.perf_counter()
    for t in pool:
        t.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise SystemExit(f"python_open: {lib.name} read {len(failures)} members short, e.g. {failures[0]}")
    return elapsed


def bench_members(name: str, tar: str, rounds: int, threads: int, sample: int) -> dict:
    for stale in (tar + ".stagefs-index", tar + ".ratarmount-bench.sqlite"):
        if os.path.exists(stale):
            os.unlink(stale)
    libs, opened = [], {}
    for cls in (Stagefs, Ratarmount, FsspecTar):
        start = time.perf_counter()
        lib = cls(tar)
        opened[cls.name] = time.perf_counter() - start
        libs.append(lib)
        print(f"  (b) {name}: {cls.name:14s} opened (indexed) in {opened[cls.name]:.2f} s", flush=True)
    names = libs[0].names()
    with stagefs.open(tar) as fs:
        sizes = {p: fs.info(p)["size"] for p in names}
    for lib in libs[1:]:
        if lib.names() != names:
            raise SystemExit(f"python_open: {lib.name} lists other members than stagefs")
    times: dict = {lib.name: [] for lib in libs}
    step = max(1, len(names) // sample)
    read = {lib.name: names[::step] if getattr(lib, "sampled", False) else names for lib in libs}
    for lib in libs:
        read_all(lib, read[lib.name], sizes, threads)  # warm: the tar's pages in the cache
    for r in range(rounds):
        for lib in libs:
            seconds = read_all(lib, read[lib.name], sizes, threads)
            times[lib.name].append(seconds)
            rate = len(read[lib.name]) / seconds
            print(f"  (b) {name} round {r + 1}: {lib.name:14s} {rate:10.0f} members/s", flush=True)
    rate = {k: len(read[k]) / statistics.median(v) for k, v in times.items()}
    return {
        "open_s": opened,
        "members_per_s": rate,
        "stagefs_vs_ratarmountcore": rate["stagefs.open"] / rate["ratarmountcore"],
        "stagefs_vs_fsspec_tar": rate["stagefs.open"] / rate["fsspec tar"],
        "threads": threads,
        "members_read": {k: len(v) for k, v in read.items()},
        "rounds": times,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="/var/tmp/stagefs-bench-open")
    p.add_argument("--datasets", default="imagenet,small")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2, help="epochs per Loader run; the last is timed")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="reader threads in (b)")
    p.add_argument("--sample", type=int, default=5000, help="members fsspec's tar reads per round in (b)")
    p.add_argument("--only", choices=["loader", "members"])
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    print(f"python_open: stagefs {stagefs.__version__}, python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs, work dir {a.work}", flush=True)  # fmt: skip
    results: dict = {}
    for name in a.datasets.split(","):
        tar = make_dataset(a.work, name)
        results[name] = {}
        if a.only in (None, "loader"):
            results[name]["loader"] = bench_loader(a.work, name, tar, a.rounds, a.epochs)
        if a.only in (None, "members"):
            results[name]["members"] = bench_members(name, tar, a.rounds, a.threads, a.sample)
    print("\nmedians (ratios are stagefs.open's rate over the other's):")
    for name, r in results.items():
        if "loader" in r:
            lr = r["loader"]
            rates = ", ".join(f"{k} {v:.0f} files/s" for k, v in lr["files_per_s"].items())
            print(f"  (a) {name}: {rates}; archive/mount {lr['archive_vs_mount']:.2f}x, "
                  f"archive/shm {lr['archive_vs_shm']:.2f}x")  # fmt: skip
        if "members" in r:
            mr = r["members"]
            rates = ", ".join(f"{k} {v:.0f}/s" for k, v in mr["members_per_s"].items())
            opens = ", ".join(f"{k} {v:.2f} s" for k, v in mr["open_s"].items())
            print(f"  (b) {name}, {mr['threads']} threads: {rates}; vs ratarmountcore "
                  f"{mr['stagefs_vs_ratarmountcore']:.2f}x, vs fsspec tar {mr['stagefs_vs_fsspec_tar']:.2f}x; "
                  f"open: {opens}")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
