#!/usr/bin/env python3
"""Side-by-side benchmark: stagefs against tmpfs, kernel SquashFS, squashfuse_ll, ratarmount.

Run through benches/run.sh (it installs the peers and the Python packages); see
doc/benchmarks.md for what every number means. Must run as root (loop mounts,
drop_caches). Exits non-zero when a system that should work fails or returns wrong bytes.
"""

import argparse
import csv
import fcntl
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time

# --------------------------------------------------------------------------- config

PROFILES = {
    # ImageNet-like: incompressible files in class folders; small: text files;
    # large: one incompressible file read sequentially.
    "smoke": dict(img_classes=10, img_files=300, img_min=20_000, img_max=200_000,
                  small_dirs=10, small_files=3_000, small_min=1_024, small_max=4_096,
                  large_bytes=32 << 20, timeout=300, max_runs=2),
    "full": dict(img_classes=100, img_files=10_000, img_min=20_000, img_max=200_000,
                 small_dirs=100, small_files=100_000, small_min=1_024, small_max=4_096,
                 large_bytes=1 << 30, timeout=900, max_runs=5),
}

SYSTEMS = [
    # name, archive format it mounts
    ("tmpfs", "tar"),
    ("kernel-squashfs", "sqsh"),
    ("squashfuse_ll", "sqsh"),
    ("ratarmount", "tar"),
    ("stagefs-tar-none", "tar"),
    ("stagefs-tar-ram", "tar"),
    ("stagefs-sqsh-none", "sqsh"),
    ("stagefs-sqsh-ram", "sqsh"),
]
DATASETS = ["imagenet", "small", "large"]
REFS = ["tmpfs", "squashfuse_ll"]
READ_WORKLOADS = ["cold_1", "warm_1", "cold_N", "warm_N"]
BATCH = 64          # files per DataLoader batch handed to a worker
MIN_SECONDS = 1.0   # a timed read is repeated until this much was measured (or max_runs),
                    # and its median reported: one 0.1 s epoch varies by ±25 % on 2 cores
PREFIX = 16         # bytes of every file checked during timed reads
UNSUPPORTED = "not yet supported"
REMOUNT = {"ratarmount", "stagefs-tar-none", "stagefs-tar-ram", "stagefs-sqsh-none", "stagefs-sqsh-ram"}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class BenchError(Exception):
    pass


class WrongData(BenchError):
    pass


# --------------------------------------------------------------------------- datasets

def gen_dataset(name, prof, seed, ddir):
    """Write the source tree, pack it with GNU tar and mksquashfs, return its manifest."""
    src = os.path.join(ddir, f"{name}.src")
    shutil.rmtree(src, ignore_errors=True)
    os.makedirs(src)
    rng = random.Random(f"{seed}/{name}")
    files = []   # [relpath, size, sha1, prefix_hex]
    dirs = set()

    def put(rel, data):
        path = os.path.join(src, rel)
        d = os.path.dirname(rel)
        if d not in dirs:
            os.makedirs(os.path.join(src, d), exist_ok=True)
            dirs.add(d)
        with open(path, "wb") as f:
            f.write(data)
        files.append([rel, len(data), hashlib.sha1(data).hexdigest(), data[:PREFIX].hex()])

    if name == "imagenet":
        classes = [f"n{rng.randrange(10**8):08d}" for _ in range(prof["img_classes"])]
        for i in range(prof["img_files"]):
            c = classes[i % len(classes)]
            size = rng.randint(prof["img_min"], prof["img_max"])
            put(f"train/{c}/{c}_{i:06d}.JPEG", rng.randbytes(size))
    elif name == "small":
        words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10)))
                 for _ in range(5000)]
        corpus = " ".join(rng.choice(words) for _ in range(1_000_000)).encode()
        for i in range(prof["small_files"]):
            size = rng.randint(prof["small_min"], prof["small_max"])
            off = rng.randrange(len(corpus) - size)
            put(f"d{i % prof['small_dirs']:03d}/f{i:07d}.txt", corpus[off:off + size])
    elif name == "large":
        # Written in 64 MiB pieces so the generator never holds 1 GiB at once.
        path = os.path.join(src, "large.bin")
        h = hashlib.sha1()
        left, first = prof["large_bytes"], None
        with open(path, "wb") as f:
            while left:
                piece = rng.randbytes(min(left, 64 << 20))
                first = first if first is not None else piece[:PREFIX]
                h.update(piece)
                f.write(piece)
                left -= len(piece)
        files.append(["large.bin", prof["large_bytes"], h.hexdigest(), first.hex()])
    all_dirs = set()
    for rel, *_ in files:
        d = os.path.dirname(rel)
        while d:
            all_dirs.add(d)
            d = os.path.dirname(d)
    tar = os.path.join(ddir, f"{name}.tar")
    sqsh = os.path.join(ddir, f"{name}.sqsh")
    top = sorted(os.listdir(src))
    run(["tar", "--format=gnu", "--sort=name", "-C", src, "-cf", tar] + top)
    run(["mksquashfs", src, sqsh, "-comp", "zstd", "-noappend", "-quiet", "-no-progress",
         "-processors", str(os.cpu_count())])
    shutil.rmtree(src)
    return dict(files=files, ndirs=len(all_dirs), total_bytes=sum(f[1] for f in files),
                tar_bytes=os.path.getsize(tar), sqsh_bytes=os.path.getsize(sqsh))


def ensure_datasets(args, prof, datasets):
    ddir = os.path.join(args.work, "data", f"{args.profile}-seed{args.seed}")
    os.makedirs(ddir, exist_ok=True)
    manifests = {}
    for name in datasets:
        mpath = os.path.join(ddir, f"{name}.manifest.json")
        stamp = dict(profile=prof, seed=args.seed, version=1)
        if os.path.exists(mpath):
            with open(mpath) as f:
                m = json.load(f)
            if m.get("stamp") == stamp and all(os.path.exists(os.path.join(ddir, f"{name}.{e}"))
                                               for e in ("tar", "sqsh")):
                log(f"dataset {name}: reusing {ddir}")
                manifests[name] = m
                continue
        log(f"dataset {name}: generating (seed {args.seed})")
        t = time.perf_counter()
        m = gen_dataset(name, prof, args.seed, ddir)
        m["stamp"] = stamp
        with open(mpath, "w") as f:
            json.dump(m, f)
        log(f"dataset {name}: {len(m['files'])} files, {m['total_bytes'] / 2**20:.0f} MiB, "
            f"tar {m['tar_bytes'] / 2**20:.0f} MiB, sqsh {m['sqsh_bytes'] / 2**20:.0f} MiB "
            f"({time.perf_counter() - t:.0f} s)")
        manifests[name] = m
    return ddir, manifests


# --------------------------------------------------------------------------- helpers

def run(cmd, timeout=None, env=None, check=True):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout, env=env)
    if check and p.returncode != 0:
        lines = (p.stderr.strip() or p.stdout.strip()).splitlines()
        err = " / ".join([ln for ln in lines if "error" in ln.lower()] or lines)[-600:]
        raise BenchError(f"{os.path.basename(cmd[0])} {cmd[1] if len(cmd) > 1 else ''} "
                         f"exited {p.returncode}: {err}")
    return p


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def mounted_under(prefix):
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == prefix or mp.startswith(prefix + "/"):
                out.append(mp)
    return out


def pids_with_arg(arg):
    """Processes with `arg` as one of their argv elements (the FUSE daemon of a mount)."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if arg.encode() in argv:
            pids.append(int(d))
    return pids


def rss_of(pids):
    tot = dict(VmRSS=0, VmHWM=0, RssAnon=0, RssFile=0, RssShmem=0)
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    k, _, v = line.partition(":")
                    if k in tot:
                        tot[k] += int(v.split()[0]) * 1024
        except OSError:
            pass
    return tot


def wait_gone(pids, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        pids = [p for p in pids if os.path.exists(f"/proc/{p}") and not _zombie(p)]
        if not pids:
            return []
        time.sleep(0.02)
    return pids


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# --------------------------------------------------------------------------- readers
# Workers are forked after these globals are set, like DataLoader workers with fork.

G = {}


def _read_batch(lo_hi):
    lo, hi = lo_hi
    paths, sizes, prefixes, shas = G["paths"], G["sizes"], G["prefixes"], G["shas"]
    order, verify = G["order"], G["verify"]
    buf = bytearray(G["bufsize"])
    mv = memoryview(buf)
    nbytes, bad = 0, []
    for i in range(lo, hi):
        j = order[i]
        try:
            with open(paths[j], "rb", buffering=0) as f:
                n = 0
                while n < len(buf):
                    k = f.readinto(mv[n:])
                    if not k:
                        break
                    n += k
        except OSError as e:
            bad.append(f"{paths[j]}: {e}")
            continue
        nbytes += n
        if n != sizes[j] or bytes(mv[:PREFIX]) != prefixes[j]:
            bad.append(f"{paths[j]}: read {n} bytes (expected {sizes[j]}) or wrong first bytes")
        elif verify and hashlib.sha1(mv[:n]).hexdigest() != shas[j]:
            bad.append(f"{paths[j]}: sha1 mismatch")
    return hi - lo, nbytes, bad


def _read_seq(_):
    path, size, prefix, sha, verify = G["seq"]
    buf = bytearray(1 << 20)
    h = hashlib.sha1() if verify else None
    n, first = 0, None
    with open(path, "rb", buffering=0) as f:
        while True:
            k = f.readinto(buf)
            if not k:
                break
            if first is None:
                first = bytes(buf[:PREFIX])
            if h:
                h.update(memoryview(buf)[:k])
            n += k
    bad = []
    if n != size or first != prefix:
        bad.append(f"{path}: read {n} bytes (expected {size}) or wrong first bytes")
    elif h and h.hexdigest() != sha:
        bad.append(f"{path}: sha1 mismatch")
    return 1, n, bad


def _noop(_):
    return None


def _worker_init():
    # The pool is stopped with SIGTERM; Ctrl-C is for the parent, which then stops the pool.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_workers(fn, tasks, workers, timeout):
    """Fork `workers` processes, then time only the work itself (workers are persistent)."""
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(workers, initializer=_worker_init)
    try:
        pool.map(_noop, range(workers))
        t = time.perf_counter()
        res = pool.map_async(fn, tasks, chunksize=1).get(timeout)
        dt = time.perf_counter() - t
    except multiprocessing.TimeoutError:
        raise BenchError(f"reads did not finish within {timeout} s (hung mount?)")
    finally:
        pool.terminate()
        pool.join()
    nfiles = sum(r[0] for r in res)
    nbytes = sum(r[1] for r in res)
    bad = [b for r in res for b in r[2]]
    return dt, nfiles, nbytes, bad


def epoch(root, manifest, workers, seed, verify, timeout):
    files = manifest["files"]
    order = list(range(len(files)))
    random.Random(seed).shuffle(order)
    G.update(paths=[os.path.join(root, f[0]) for f in files], sizes=[f[1] for f in files],
             prefixes=[bytes.fromhex(f[3]) for f in files], shas=[f[2] for f in files],
             order=order, verify=verify, bufsize=max(f[1] for f in files) + 4096)
    tasks = [(lo, min(lo + BATCH, len(order))) for lo in range(0, len(order), BATCH)]
    dt, nfiles, nbytes, bad = run_workers(_read_batch, tasks, workers, timeout)
    if bad or nfiles != len(files):
        raise WrongData(f"{len(bad)} bad reads, e.g. {bad[:3]}")
    return dt, nfiles, nbytes


def seq_read(root, manifest, verify, timeout):
    rel, size, sha, prefix = manifest["files"][0]
    G["seq"] = (os.path.join(root, rel), size, bytes.fromhex(prefix), sha, verify)
    dt, _, nbytes, bad = run_workers(_read_seq, [0], 1, timeout)
    if bad:
        raise WrongData(bad[0])
    return dt, nbytes


def repeated(measure, prepare, max_runs):
    """Runs `measure(run)` (each after `prepare()`, e.g. dropping caches) until MIN_SECONDS
    were measured or `max_runs` runs, at least once. `measure` returns (seconds, amount,
    ...); the result is the median rate of each amount, then the number of runs."""
    rates, spent = [], 0.0
    while not rates or (spent < MIN_SECONDS and len(rates) < max_runs):
        if prepare:
            prepare()
        dt, *amounts = measure(len(rates))
        rates.append([a / dt for a in amounts])
        spent += dt
    return (*(statistics.median(col) for col in zip(*rates)), len(rates))


def walk(root, manifest, timeout):
    t = time.perf_counter()
    p = run(["find", root, "-mindepth", "1", "-printf", "%y %s\n"], timeout=timeout)
    dt = time.perf_counter() - t
    nf = nd = size = 0
    for line in p.stdout.splitlines():
        kind, sz = line.split()
        if kind == "f":
            nf += 1
            size += int(sz)
        elif kind == "d":
            nd += 1
    want = (len(manifest["files"]), manifest["ndirs"], manifest["total_bytes"])
    if (nf, nd, size) != want:
        raise WrongData(f"find saw {nf} files, {nd} dirs, {size} bytes; expected {want}")
    return dt, nf + nd


# --------------------------------------------------------------------------- mounts

class Mounts:
    """Mounts, daemons and temp dirs made by this run; cleanup() undoes all of them."""

    def __init__(self, args):
        self.args = args
        self.mnt_root = os.path.join(args.work, "mnt")
        self.shm_root = f"/dev/shm/stagefs-bench-{os.getpid()}"
        self.daemons = set()
        os.makedirs(self.mnt_root, exist_ok=True)
        self.env = dict(os.environ, XDG_CACHE_HOME=os.path.join(args.work, "xdg-cache"))

    def mount(self, system, ddir, dataset, manifest, fresh=True):
        fmt = "tar" if system in ("tmpfs", "ratarmount") or "-tar-" in system else "sqsh"
        archive = os.path.join(ddir, f"{dataset}.{fmt}")
        timeout = self.args.timeout
        if system == "tmpfs":
            mnt = os.path.join(self.shm_root, dataset)
            shutil.rmtree(mnt, ignore_errors=True)
            os.makedirs(mnt)
            t = time.perf_counter()
            run(["tar", "-C", mnt, "-xf", archive], timeout=timeout)
            return mnt, time.perf_counter() - t
        mnt = os.path.join(self.mnt_root, f"{dataset}-{system}")
        if mounted_under(mnt):
            raise BenchError(f"{mnt} is still mounted from an earlier step")
        os.makedirs(mnt, exist_ok=True)
        # First mount: no saved index from an earlier mount of the same archive.
        for p in () if not fresh else (archive + ".stagefs-index", os.path.join(self.args.work, "xdg-cache"),
                  os.path.join(self.args.work, "ratarmount.index.sqlite")):
            if os.path.isdir(p):
                shutil.rmtree(p)
            elif os.path.exists(p):
                os.unlink(p)
        if system == "kernel-squashfs":
            cmd = ["mount", "-t", "squashfs", "-o", "loop,ro", archive, mnt]
        elif system == "squashfuse_ll":
            cmd = ["squashfuse_ll", archive, mnt]
        elif system == "ratarmount":
            cmd = [os.path.join(os.path.dirname(sys.executable), "ratarmount"),
                   "--index-file", os.path.join(self.args.work, "ratarmount.index.sqlite"),
                   archive, mnt]
        else:
            cmd = [self.args.stagefs, "mount", "--stage", system.rsplit("-", 1)[1], archive, mnt]
        probe = os.path.join(mnt, manifest["files"][0][0])
        t = time.perf_counter()
        try:
            run(cmd, timeout=timeout, env=self.env)
            # The mount counts as usable once a file in it has the right size.
            end = time.monotonic() + timeout
            while True:
                try:
                    if os.stat(probe).st_size == manifest["files"][0][1]:
                        break
                except OSError:
                    pass
                if time.monotonic() > end:
                    raise BenchError(f"{probe} did not appear within {timeout} s")
                time.sleep(0.002)
            return mnt, time.perf_counter() - t
        finally:
            self.daemons.update(pids_with_arg(mnt))

    def daemon_rss(self, system, mnt):
        if system == "tmpfs":
            # No daemon: the extracted tree itself sits in RAM as shmem.
            used = sum(os.lstat(os.path.join(d, n)).st_blocks * 512
                       for d, ds, fs in os.walk(mnt) for n in ds + fs)
            return dict(VmRSS=0, VmHWM=0, RssAnon=0, RssFile=0, RssShmem=used), 0
        pids = pids_with_arg(mnt)
        self.daemons.update(pids)
        return rss_of(pids), len(pids)

    def unmount(self, system, mnt):
        if system == "tmpfs":
            shutil.rmtree(mnt)
            return
        pids = pids_with_arg(mnt)
        if system.startswith("stagefs"):
            run([self.args.stagefs, "umount", mnt], timeout=60)
        else:
            run(["umount", mnt], timeout=60)
        left = wait_gone(pids, 30)
        if left:
            raise BenchError(f"daemon(s) {left} still running 30 s after unmounting {mnt}")
        self.daemons.difference_update(pids)
        os.rmdir(mnt)

    def cleanup(self):
        """Best effort, never raises: used on errors, Ctrl-C and at the end."""
        for mp in sorted(mounted_under(self.mnt_root), key=len, reverse=True):
            pids = pids_with_arg(mp)
            self.daemons.update(pids)
            for cmd in (["umount", mp], ["umount", "-l", mp]):
                try:
                    if subprocess.run(cmd, stderr=subprocess.DEVNULL, timeout=30).returncode == 0:
                        break
                except Exception:
                    pass
            log(f"cleanup: unmounted {mp}")
        for pid in list(self.daemons):
            if wait_gone([pid], 5):
                log(f"cleanup: killing daemon {pid}")
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass
                    if not wait_gone([pid], 5):
                        break
        self.daemons.clear()
        shutil.rmtree(self.shm_root, ignore_errors=True)
        shutil.rmtree(self.mnt_root, ignore_errors=True)
        shutil.rmtree(os.path.join(self.args.work, "xdg-cache"), ignore_errors=True)
        try:
            os.unlink(os.path.join(self.args.work, "ratarmount.index.sqlite"))
        except OSError:
            pass


# --------------------------------------------------------------------------- one system

def bench_system(m, system, dataset, ddir, manifest, args, record):
    """Mount, measure, unmount one system on one dataset; raises on any failure."""
    to = args.timeout
    nfiles = len(manifest["files"])
    drop_caches()
    log(f"{dataset:8} {system}: mounting")
    mnt, dt = m.mount(system, ddir, dataset, manifest)
    try:
        record("mount", dt, "s")
        log(f"{dataset:8} {system}: usable after {dt:.2f} s")
        if dataset != "large":
            # A job's first epoch: right after the mount returns, nothing dropped.
            dt, n, _ = epoch(mnt, manifest, args.workers, f"{args.seed}/first", False, to)
            record("first_N", n / dt, "files/s")
        drop_caches()
        dt, n = walk(mnt, manifest, to)
        record("walk", dt, "s")
        record("walk_rate", n / dt, "entries/s")
        if dataset == "large":
            for temp in ("cold", "warm"):
                rate, runs = repeated(lambda run: seq_read(mnt, manifest, False, to),
                                      drop_caches if temp == "cold" else None, args.max_runs)
                record(f"seq_{temp}", rate / 2**20, "MiB/s", runs)
            seq_read(mnt, manifest, True, to)   # untimed full-hash check
        else:
            for k, workers in (("1", 1), ("N", args.workers)):
                for temp in ("cold", "warm"):
                    def one(run, k=k, workers=workers, temp=temp):
                        return epoch(mnt, manifest, workers, f"{args.seed}/{k}/{temp}/{run}", False, to)
                    files_s, bytes_s, runs = repeated(one, drop_caches if temp == "cold" else None, args.max_runs)
                    record(f"{temp}_{k}", files_s, "files/s", runs)
                    record(f"{temp}_{k}_mib", bytes_s / 2**20, "MiB/s", runs)
            # Untimed: every file read once more and compared by sha1 with the generator.
            epoch(mnt, manifest, args.workers, args.seed, True, to)
        rss, npids = m.daemon_rss(system, mnt)
        for k in ("VmRSS", "VmHWM", "RssAnon", "RssShmem", "RssFile"):
            record(k, rss[k] / 2**20, "MiB")
        log(f"{dataset:8} {system}: done ({nfiles} files verified; {npids} daemon process(es), "
            f"RSS {rss['VmRSS'] / 2**20:.0f} MiB = anon {rss['RssAnon'] / 2**20:.0f} + "
            f"shmem {rss['RssShmem'] / 2**20:.0f} + file {rss['RssFile'] / 2**20:.0f})")
    finally:
        m.unmount(system, mnt)
    if system in REMOUNT:
        # Second mount of the same archive: ratarmount and stagefs reuse their saved index.
        drop_caches()
        mnt, dt = m.mount(system, ddir, dataset, manifest, fresh=False)
        try:
            record("remount", dt, "s")
            log(f"{dataset:8} {system}: remount usable after {dt:.2f} s")
        finally:
            m.unmount(system, mnt)


# --------------------------------------------------------------------------- reporting

COLS = {
    "read": [("mount", "mount s"), ("remount", "remount s"), ("first_N", "first×N files/s"), ("walk", "find+stat s"),
             ("cold_1", "cold×1 files/s"),
             ("warm_1", "warm×1 files/s"), ("cold_N", "cold×N files/s"),
             ("warm_N", "warm×N files/s"), ("cold_N_mib", "cold×N MiB/s"),
             ("VmRSS", "RSS MiB"), ("VmHWM", "peak MiB"), ("RssAnon", "anon MiB"), ("RssShmem", "shmem MiB"),
             ("RssFile", "file MiB")],
    "large": [("mount", "mount s"), ("remount", "remount s"), ("seq_cold", "seq cold MiB/s"),
              ("seq_warm", "seq warm MiB/s"), ("VmRSS", "RSS MiB"), ("VmHWM", "peak MiB"), ("RssAnon", "anon MiB"),
              ("RssShmem", "shmem MiB"), ("RssFile", "file MiB")],
}
TIME_METRICS = {"mount", "remount", "walk"}
NO_RATIO = {"VmRSS", "VmHWM", "RssAnon", "RssShmem", "RssFile", "walk_rate"}


def ref_value(val, ds, ref, metric):
    # A reference without a saved index has one kind of mount: remounts compare with it.
    got = val.get((ds, ref, metric))
    return val.get((ds, ref, "mount")) if got is None and metric == "remount" else got


def speed_ratio(metric, v, ref):
    """> 1 means faster than the reference (for times: ref/t, for rates: v/ref)."""
    if v is None or ref is None or metric in NO_RATIO or v <= 0 or ref <= 0:
        return None
    return ref / v if metric in TIME_METRICS else v / ref


def fmt(v):
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def report(results, status, manifests, args, meta, datasets, systems):
    out = args.out
    os.makedirs(out, exist_ok=True)
    val = {(r["dataset"], r["system"], r["metric"]): r["value"] for r in results}
    rows = []
    for r in results:
        row = dict(r)
        for ref in REFS:
            ratio = speed_ratio(r["metric"], r["value"], ref_value(val, r["dataset"], ref, r["metric"]))
            row[f"vs_{ref}"] = "" if ratio is None else f"{ratio:.3f}"
        rows.append(row)
    for (ds, sy), (st, err) in status.items():
        if st != "ok":
            rows.append(dict(dataset=ds, system=sy, metric="status", value="", unit="",
                             status=st, error=err, vs_tmpfs="", vs_squashfuse_ll=""))
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, ["dataset", "system", "metric", "value", "unit", "runs", "vs_tmpfs",
                               "vs_squashfuse_ll", "status", "error"], extrasaction="ignore")
        w.writeheader()
        for row in rows:
            row.setdefault("status", status[(row["dataset"], row["system"])][0])
            row.setdefault("error", "")
            w.writerow(row)

    md = [f"# stagefs side-by-side benchmark ({args.profile})", "",
          f"{meta['date']} · {meta['uname']} · {meta['cpus']} CPUs · {meta['mem_gib']:.0f} GiB RAM · "
          f"N = {args.workers} workers · load average before {meta['load_before']}, "
          f"after {meta['load_after']} · {meta['elapsed_s']} s", "",
          f"stagefs binary {meta['stagefs']} built {meta['stagefs_mtime']} (sha1 {meta['stagefs_sha1']}); "
          + ", ".join(f"{k} `{v}`" for k, v in meta["versions"].items() if k != "stagefs"), "",
          "Speed ratios: > 1 means faster than the reference (rates: value/ref; times: ref/value). "
          f"Each cold and warm read is the median of up to {args.max_runs} runs (repeated until "
          f"{MIN_SECONDS:.0f} s was measured). See doc/benchmarks.md for what each column measures.", ""]
    for ds in datasets:
        man = manifests[ds]
        kind = "large" if ds == "large" else "read"
        cols = COLS[kind]
        md += [f"## {ds}: {len(man['files']):,} files, {man['total_bytes'] / 2**20:,.0f} MiB "
               f"(tar {man['tar_bytes'] / 2**20:,.0f} MiB, sqsh zstd {man['sqsh_bytes'] / 2**20:,.0f} MiB)", ""]
        md += ["| system | " + " | ".join(c[1] for c in cols) + " |",
               "|---" * (len(cols) + 1) + "|"]
        for sy in systems:
            st, err = status.get((ds, sy), ("not run", ""))
            if st != "ok":
                md.append(f"| {sy} | **{st}**: {err[:160].replace('|', '/').replace(chr(10), ' ')} |"
                          + " |" * (len(cols) - 1))
                continue
            md.append(f"| {sy} | " + " | ".join(fmt(val.get((ds, sy, c))) for c, _ in cols) + " |")
        md.append("")
        for ref in REFS:
            rc = [c for c in cols if c[0] not in NO_RATIO]
            md += [f"Speed relative to **{ref}** (×):", "",
                   "| system | " + " | ".join(c[1] for c in rc) + " |", "|---" * (len(rc) + 1) + "|"]
            for sy in systems:
                if status.get((ds, sy), ("",))[0] != "ok":
                    continue
                cells = []
                for c, _ in rc:
                    r = speed_ratio(c, val.get((ds, sy, c)), ref_value(val, ds, ref, c))
                    cells.append("–" if r is None else f"{r:.2f}")
                md.append(f"| {sy} | " + " | ".join(cells) + " |")
            md.append("")
    text = "\n".join(md)
    with open(os.path.join(out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print("\n" + text)
    chart(val, status, datasets, systems, os.path.join(out, "results.png"), args)


def chart(val, status, datasets, systems, path, args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no chart")
        return
    panels = [(ds, [("first_N", f"first ×{args.workers}"), ("cold_1", "cold ×1"), ("warm_1", "warm ×1"), ("cold_N", f"cold ×{args.workers}"),
                    ("warm_N", f"warm ×{args.workers}")], "files/s") for ds in datasets if ds != "large"]
    if "large" in datasets:
        panels.append(("large", [("seq_cold", "seq cold"), ("seq_warm", "seq warm")], "MiB/s"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 4.2 * len(panels)), squeeze=False)
    for ax, (ds, metrics, unit) in zip(axes[:, 0], panels):
        width = 0.8 / len(systems)
        for i, sy in enumerate(systems):
            ys = [val.get((ds, sy, m)) or 0 for m, _ in metrics]
            xs = [k + i * width for k in range(len(metrics))]
            st = status.get((ds, sy), ("not run",))[0]
            ax.bar(xs, ys, width, label=sy + ("" if st == "ok" else f" ({st})"))
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(metrics))], [lbl for _, lbl in metrics])
        if any(val.get((ds, sy, m_)) for sy in systems for m_, _ in metrics):
            ax.set_yscale("log")
        ax.set_ylabel(unit)
        ax.set_title(f"{ds} ({args.profile})")
        ax.grid(axis="y", alpha=0.3)
    axes[0, 0].legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.12))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"chart: {path}")


# --------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--smoke", dest="profile", action="store_const", const="smoke",
                   help="tiny datasets, ~1-2 minutes (the CI check; default)")
    g.add_argument("--full", dest="profile", action="store_const", const="full",
                   help="10,000 images + 100,000 small files + 1 GiB file")
    ap.add_argument("--out", help="results directory (default target/bench-results/<profile>-<time>)")
    ap.add_argument("--work", default="/var/tmp/stagefs-bench",
                    help="where archives and mountpoints go; must not be tmpfs (default %(default)s)")
    ap.add_argument("--stagefs", default="target/release/stagefs")
    ap.add_argument("--systems", help="comma list, default all: " + ",".join(s for s, _ in SYSTEMS))
    ap.add_argument("--datasets", help="comma list, default all: " + ",".join(DATASETS))
    ap.add_argument("--workers", type=int, default=2 * os.cpu_count(), help="N (default 2 × cores)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep-data", action="store_true",
                    help="keep the generated archives in --work for the next run (reused when identical)")
    ap.add_argument("--prepare", action="store_true",
                    help="only generate the archives into --work (implies --keep-data), measure nothing")
    ap.set_defaults(profile="smoke")
    args = ap.parse_args()
    prof = PROFILES[args.profile]
    args.keep_data = args.keep_data or args.prepare
    args.timeout = prof["timeout"]
    args.max_runs = prof["max_runs"]
    args.stagefs = os.path.abspath(args.stagefs)
    args.work = os.path.abspath(args.work)
    args.out = os.path.abspath(args.out or os.path.join(
        "target", "bench-results", f"{args.profile}-{time.strftime('%Y%m%d-%H%M%S')}"))
    systems = args.systems.split(",") if args.systems else [s for s, _ in SYSTEMS]
    datasets = args.datasets.split(",") if args.datasets else DATASETS
    for s in systems:
        if s not in dict(SYSTEMS):
            ap.error(f"unknown system {s}")
    for d in datasets:
        if d not in DATASETS:
            ap.error(f"unknown dataset {d}")
    if os.geteuid() != 0:
        sys.exit("compare.py: must run as root (loop mounts, drop_caches)")
    if not os.access(args.stagefs, os.X_OK):
        sys.exit(f"compare.py: no stagefs binary at {args.stagefs}")

    # SIGTERM/SIGHUP behave like Ctrl-C so the finally block below always cleans up.
    def _interrupt(sig, _frame):
        raise KeyboardInterrupt(f"signal {sig}")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    os.makedirs(args.work, exist_ok=True)
    # One run per work directory: two would unmount and overwrite each other's mounts.
    lock = open(os.path.join(args.work, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"compare.py: another benchmark is running in {args.work}; wait for it, or pass another --work")
    # Benchmark a private copy: a rebuild of target/release during the run must not swap
    # binaries between rows.
    src_stagefs = args.stagefs
    args.stagefs = os.path.join(args.work, "stagefs")
    shutil.copy2(src_stagefs, args.stagefs)
    meta = dict(date=time.strftime("%Y-%m-%d %H:%M"), uname=" ".join(os.uname()[2:3]),
                cpus=os.cpu_count(), mem_gib=os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30,
                load_before=" ".join(open("/proc/loadavg").read().split()[:3]), profile=args.profile,
                workers=args.workers, seed=args.seed, stagefs=src_stagefs,
                stagefs_mtime=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.path.getmtime(src_stagefs))),
                stagefs_sha1=hashlib.sha1(open(src_stagefs, "rb").read()).hexdigest()[:12], datasets={})
    meta["versions"] = versions(args)
    m = Mounts(args)
    results, status = [], {}
    t_start = time.perf_counter()
    interrupted = False
    ddir = None
    try:
        ddir, manifests = ensure_datasets(args, prof, datasets)
        if args.prepare:
            log(f"archives ready in {ddir}")
            return
        for ds in datasets:
            meta["datasets"][ds] = {k: v for k, v in manifests[ds].items() if k != "files"}
            for sy in systems:
                def record(metric, value, unit, runs=1, ds=ds, sy=sy):
                    results.append(dict(dataset=ds, system=sy, metric=metric, value=value, unit=unit, runs=runs))
                mark = len(results)
                try:
                    bench_system(m, sy, ds, ddir, manifests[ds], args, record)
                    status[(ds, sy)] = ("ok", "")
                except (BenchError, subprocess.TimeoutExpired, OSError) as e:
                    msg = str(e)
                    st = ("unsupported" if UNSUPPORTED in msg else
                          "WRONG DATA" if isinstance(e, WrongData) else "failed")
                    status[(ds, sy)] = (st, msg)
                    del results[mark:]
                    log(f"{ds:8} {sy}: {st.upper()}: {msg}")
                    m.cleanup()
    except KeyboardInterrupt as e:
        interrupted = True
        log(f"interrupted ({e}); cleaning up")
    finally:
        m.cleanup()
        try:
            os.unlink(args.stagefs)
        except OSError:
            pass
        if ddir and not args.keep_data:
            shutil.rmtree(ddir, ignore_errors=True)
            for d in (os.path.dirname(ddir), args.work):
                try:
                    os.rmdir(d)     # only if nothing else is kept there
                except OSError:
                    pass
    if interrupted:
        sys.exit(130)
    meta["load_after"] = " ".join(open("/proc/loadavg").read().split()[:3])
    meta["elapsed_s"] = round(time.perf_counter() - t_start)
    report(results, status, manifests, args, meta, datasets, systems)
    bad = {k: v for k, v in status.items() if v[0] not in ("ok", "unsupported")}
    unsup = [k for k, v in status.items() if v[0] == "unsupported"]
    log(f"finished in {meta['elapsed_s']} s; results in {args.out}")
    if unsup:
        log(f"not yet supported (recorded, not counted as failures): {', '.join('/'.join(k) for k in unsup)}")
    if bad:
        for (ds, sy), (st, err) in bad.items():
            log(f"FAILED {ds}/{sy}: {st}: {err}")
        sys.exit(1)


def versions(args):
    def first(cmd):
        try:
            p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=20)
            return (p.stdout.strip().splitlines() or [""])[0]
        except Exception as e:
            return f"? ({e})"
    rat = os.path.join(os.path.dirname(sys.executable), "ratarmount")
    return {"stagefs": first([args.stagefs, "--version"]), "squashfuse_ll": first(["squashfuse_ll", "--version"]),
            "ratarmount": first([rat, "--version"]), "mksquashfs": first(["mksquashfs", "-version"]),
            "tar": first(["tar", "--version"]), "python": sys.version.split()[0]}


if __name__ == "__main__":
    main()
