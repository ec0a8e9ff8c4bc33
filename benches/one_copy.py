#!/usr/bin/env python3
"""One copy per node (issue 42, part 1), side by side in one run.

(a) Memory: N processes (4, 8) each open one compressed tar in process
    (`stagefs.open(archive)`) and read every member twice, with and without a
    `stagefs mount --stage copy` of the same archive running. With it they read the
    daemon's copy (staging "shared"); without it each decodes for itself (restart points of
    a pzstd or pigz tar). While all of them hold the archive, the PSS of every process and
    the daemon is summed and divided by the decoded size: copies of the data on the node.
(b) Speed: a Loader epoch (device cpu, numpy) over the mount of a plain tar staged
    `--stage copy`: `Loader(mount)` reading in process from the copy (the default) against
    `Loader(mount, in_process=False)` (FUSE, what a Loader over a mount did before) and
    `Loader(archive)` (the tar read in place, in process). Files/s, medians of --rounds,
    after one warm epoch each; both shapes: 10k files of 20–200 KB and 100k of 1–4 KB.

Every byte read is checked against the member's size.

    sudo benches/.venv/bin/python benches/one_copy.py [--rounds 3] [--small]

Needs the stagefs wheel (release build) and numpy in the interpreter; pzstd, pigz, GNU tar;
root and /dev/fuse.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import stagefs

STAGEFS = str(Path(sys.executable).parent / "stagefs")


def make_tree(root: Path, files: int, low: int, high: int, seed: int = 42) -> int:
    """`files` files of random sizes in [low, high) under 100 class folders (bytes that
    compress about 2:1, as images in a tar do not, but decoding has work); returns bytes."""
    rng = random.Random(seed)
    block = rng.randbytes(1 << 20)
    total = 0
    for i in range(files):
        d = root / f"class{i % 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        size = rng.randrange(low, high)
        start = rng.randrange(0, len(block) - size // 2)
        body = block[start : start + size // 2] + bytes(size - size // 2)
        (d / f"f{i:06d}.bin").write_bytes(body)
        total += size
    return total


def pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def daemon_pid(mountpoint: Path) -> int:
    out = subprocess.run([STAGEFS, "status", "--json"], capture_output=True, text=True, check=True).stdout
    return next(r["pid"] for r in map(json.loads, out.splitlines()) if r["mountpoint"] == str(mountpoint))


def reader(archive: str, ready, release, result) -> None:
    before = pss_kib(os.getpid())  # the interpreter and stagefs, before the archive
    with stagefs.open(archive) as fs:
        files = fs.find("")
        sizes = {p: fs.info(p)["size"] for p in files}
        for _ in range(2):
            for p in files:
                assert len(fs.cat_file(p)) == sizes[p]
        result.put((fs.staging, before))
        ready.release()
        release.wait()


def copies(archive: Path, n: int, decoded: int, mountpoint: Path | None) -> tuple[float, float, str]:
    """Copies of the data the N readers and the daemon hold: all their PSS, and the same
    less what each reader held before it opened the archive (the interpreter's own)."""
    ctx = mp.get_context("spawn")
    ready, release, result = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=reader, args=(str(archive), ready, release, result)) for _ in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    total = sum(pss_kib(p.pid) for p in procs) + (pss_kib(daemon_pid(mountpoint)) if mountpoint else 0)
    told = [result.get() for _ in procs]
    release.set()
    for p in procs:
        p.join()
    baseline = sum(before for _, before in told)
    stagings = "/".join(sorted({staging for staging, _ in told}))
    return total * 1024 / decoded, (total - baseline) * 1024 / decoded, stagings


def epoch_rate(source, rounds: int, **kw) -> float:
    loader = stagefs.Loader(source, batch_size=64, device="cpu", output="numpy", **kw)
    rates = []
    for r in range(rounds + 1):
        loader.set_epoch(r)
        started, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch)
            assert all(len(d) == int(l) for d, l in zip(batch.data, batch.lengths))
        if r:  # the first epoch warms
            rates.append(n / (time.perf_counter() - started))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="smaller trees (a smoke run)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="stagefs-one-copy-"))
    scale = 10 if args.small else 1
    try:
        print(f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}")
        # (a) memory
        tree = work / "mem"
        decoded_files = make_tree(tree, 4000 // scale, 20_000, 200_000)
        tar = work / "mem.tar"
        subprocess.run(["tar", "-cf", tar, "-C", tree, "."], check=True)
        decoded = tar.stat().st_size
        shutil.rmtree(tree)
        archives = {"pzstd": work / "mem.tar.zst", "pigz": work / "mem.tar.gz"}
        subprocess.run(["pzstd", "-q", "-p", "2", "-o", archives["pzstd"], tar], check=True)
        with archives["pigz"].open("wb") as out:
            subprocess.run(["pigz", "-c", tar], stdout=out, check=True)
        print(f"\n(a) copies of the data: summed PSS / decoded size ({decoded / 2**20:.0f} MiB, "
              f"{decoded_files / 2**20:.0f} MiB of files)")  # fmt: skip
        print(f"{'archive':8} {'N':>2} {'own decoding':>13} {'with a mount':>13} {'(less interpreters)':>20}  staging")
        for name, archive in archives.items():
            for n in (4, 8):
                alone, _, how_alone = copies(archive, n, decoded, None)
                mnt = work / f"mnt-{name}"
                subprocess.run([STAGEFS, "mount", "--stage", "copy", archive, mnt], check=True, capture_output=True)
                try:
                    subprocess.run([STAGEFS, "wait", "--staged", mnt], check=True)
                    shared, net, how_shared = copies(archive, n, decoded, mnt)
                finally:
                    subprocess.run([STAGEFS, "umount", mnt], check=True)
                print(f"{name:8} {n:>2} {alone:>12.2f}x {shared:>12.2f}x {net:>19.2f}x  {how_alone} / {how_shared}")
        # (b) speed
        print(f"\n(b) Loader epochs, files/s (median of {args.rounds})")
        print(f"{'shape':22} {'in process':>11} {'via FUSE':>11} {'archive':>11} {'vs FUSE':>8} {'vs archive':>10}")
        for label, files, low, high in [("10k x 20-200 KB", 10_000, 20_000, 200_000), ("100k x 1-4 KB", 100_000, 1_000, 4_000)]:
            files //= scale
            tree = work / "speed"
            make_tree(tree, files, low, high)
            tar = work / "speed.tar"
            subprocess.run(["tar", "-cf", tar, "-C", tree, "."], check=True)
            shutil.rmtree(tree)
            mnt = work / "mnt-speed"
            subprocess.run([STAGEFS, "mount", "--stage", "copy", tar, mnt], check=True, capture_output=True)
            try:
                subprocess.run([STAGEFS, "wait", "--staged", mnt], check=True)
                inproc = epoch_rate(mnt, args.rounds)
                fuse = epoch_rate(mnt, args.rounds, in_process=False)
                arch = epoch_rate(tar, args.rounds)
            finally:
                subprocess.run([STAGEFS, "umount", mnt], check=True)
            print(f"{label:22} {inproc:>11.0f} {fuse:>11.0f} {arch:>11.0f} {inproc / fuse:>7.2f}x {inproc / arch:>9.2f}x")
            tar.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
