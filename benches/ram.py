#!/usr/bin/env python3
"""RAM one copy: how much RAM a staged dataset holds, side by side with untar into /dev/shm,
on the same data. Counted per dataset (mincore over its files and the archive, plus any
private copy), so other work on the machine does not blur it; the growth of Cached in
/proc/meminfo (which includes Shmem) is printed beside it.

    sudo benches/ram.py [--files 5000] [--size-kb 100] [--work /var/tmp/stagefs-ram] [--stagefs PATH]

For each system: drop caches, stage, read Cached (after the command returns), read every
file once with 4 readers (the first epoch, timed), read Cached again, then a warm epoch
(timed). Reports growth / archive size and first / warm epoch rates. Data is random, so
SquashFS does not shrink it. Needs root (drop_caches), GNU tar, mksquashfs.
"""

import argparse
import ctypes
import json
import concurrent.futures
import os
import random
import shutil
import subprocess
import time


def cached_bytes():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Cached:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Cached: in /proc/meminfo")


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3")
    time.sleep(0.5)


def read_all(root, files, readers=4):
    def one(name):
        with open(os.path.join(root, name), "rb") as f:
            return len(f.read())

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(readers) as pool:
        total = sum(pool.map(one, files))
    return total, time.perf_counter() - start


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident(path):
    """Bytes of `path` in the page cache (mincore over a map of it): counts this dataset
    only, whatever else the machine caches meanwhile."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = _libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        pages = (size + 4095) // 4096
        vec = ctypes.create_string_buffer(pages)
        if _libc.mincore(addr, size, vec) != 0:
            raise OSError(ctypes.get_errno(), f"mincore {path}")
        _libc.munmap(addr, size)
        return sum(b & 1 for b in vec.raw) * 4096
    finally:
        os.close(fd)


def held(root, files, archive, mountpoint):
    """RAM the dataset holds: its files' pages, the archive's pages, a private copy."""
    total = sum(resident(os.path.join(root, f)) for f in files)
    if archive:
        total += resident(archive)
    if mountpoint:
        out = subprocess.run([STAGEFS[0], "status", "--json"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            record = json.loads(line)
            if record.get("mountpoint") == mountpoint:
                total += record.get("staged_bytes", 0)
    return total


def daemon_reads(mountpoint):
    """Read requests the stagefs daemon at `mountpoint` served, from `stagefs status --json`."""
    out = subprocess.run([STAGEFS[0], "status", "--json"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        record = json.loads(line)
        if record.get("mountpoint") == mountpoint:
            return record.get("reads")
    return None


STAGEFS = ["stagefs"]


def measure(name, stage, unstage, root, files, archive):
    archive_len = os.path.getsize(archive)
    mountpoint = root if name.startswith("stagefs") else None
    source = archive if mountpoint else None
    drop_caches()
    before = cached_bytes()
    start = time.perf_counter()
    stage()
    staged_in = time.perf_counter() - start
    cached_stage = cached_bytes() - before
    after_stage = held(root, files, source, mountpoint)
    total, first = read_all(root, files)
    cached_read = cached_bytes() - before
    after_read = held(root, files, source, mountpoint)
    # FUSE reads the daemon served during the first epoch: 0 means it ran from the page cache.
    time.sleep(2.5)  # the daemon refreshes its counter every 2 s
    served = daemon_reads(root)
    _, warm = read_all(root, files)
    unstage()
    row = dict(system=name, stage_s=staged_in, after_stage=after_stage / archive_len,
               after_read=after_read / archive_len, cached_stage=cached_stage / archive_len,
               cached_read=cached_read / archive_len, first_files_s=len(files) / first,
               warm_files_s=len(files) / warm, first_vs_warm=warm / first, bytes=total, fuse_reads=served)
    print(f"{name:28} staged in {staged_in:6.2f} s  RAM held {row['after_stage']:.2f}x the archive after staging, "
          f"{row['after_read']:.2f}x after one read (Cached grew {row['cached_stage']:.2f}x / {row['cached_read']:.2f}x)  "
          f"first epoch {row['first_files_s']:8.0f} files/s, "
          f"warm {row['warm_files_s']:8.0f} files/s, first/warm {row['first_vs_warm']:.2f}  "
          f"FUSE reads in the first epoch: {served if served is not None else '-'}", flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=5000)
    p.add_argument("--size-kb", type=int, default=100)
    p.add_argument("--work", default="/var/tmp/stagefs-ram")
    p.add_argument("--stagefs", default=shutil.which("stagefs") or "target/release/stagefs")
    a = p.parse_args()
    STAGEFS[0] = a.stagefs
    if os.geteuid() != 0:
        raise SystemExit("benches/ram.py: run as root (it drops the page cache)")
    shutil.rmtree(a.work, ignore_errors=True)
    src = os.path.join(a.work, "src")
    os.makedirs(src)
    rng = random.Random(0)
    files = []
    for i in range(a.files):
        name = f"c{i % 10}/f{i:06}.bin"
        os.makedirs(os.path.join(src, os.path.dirname(name)), exist_ok=True)
        with open(os.path.join(src, name), "wb") as f:
            f.write(rng.randbytes(a.size_kb * 1024 * rng.randint(5, 15) // 10))
        files.append(name)
    tar = os.path.join(a.work, "data.tar")
    sqsh = os.path.join(a.work, "data.sqsh")
    subprocess.run(["tar", "-C", src, "-cf", tar, "."], check=True)
    subprocess.run(["mksquashfs", src, sqsh, "-quiet", "-no-progress", "-comp", "zstd"], check=True,
                   stdout=subprocess.DEVNULL)
    shutil.rmtree(src)
    tar_len = os.path.getsize(tar)
    print(f"data: {a.files} files, tar {tar_len / 2**20:.0f} MiB, SquashFS {os.path.getsize(sqsh) / 2**20:.0f} MiB; "
          f"kernel {os.uname().release}, {os.cpu_count()} cores", flush=True)
    shm = f"/dev/shm/stagefs-ram-bench-{os.getpid()}"
    mnt = os.path.join(a.work, "mnt")

    def untar():
        os.makedirs(shm)
        subprocess.run(["tar", "-C", shm, "-xf", tar], check=True)

    def mount(archive, *args):
        return lambda: subprocess.run([a.stagefs, "mount", *args, archive, mnt], check=True, stdout=subprocess.DEVNULL)

    def umount():
        subprocess.run([a.stagefs, "umount", mnt], check=True)

    rows = [measure("untar into /dev/shm", untar, lambda: shutil.rmtree(shm), shm, files, tar)]
    for label, archive, args in [
        ("stagefs tar --stage ram", tar, ["--stage", "ram"]),
        ("stagefs sqsh --stage ram", sqsh, ["--stage", "ram"]),
        ("stagefs tar --stage copy", tar, ["--stage", "copy"]),
        ("stagefs tar --stage none", tar, ["--stage", "none"]),
    ]:
        rows.append(measure(label, mount(archive, *args), umount, mnt, files, archive))
    shutil.rmtree(a.work, ignore_errors=True)


if __name__ == "__main__":
    main()
