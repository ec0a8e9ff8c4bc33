#!/usr/bin/env python3
"""Objects in a store read from Python without FUSE (issue 43), side by side in one run.

A tar in a local S3 server (s3s-fs, which checks SigV4 signatures), optionally behind
benches/delay_proxy.rs (--delay-ms, per direction), read by:

  (a) staging: `stagefs mount --stage ram --warm no s3://...` (the CLI, ready once the copy
      is complete and indexed)  vs  `stagefs.open("s3://...", stage="ram")` in process;
  (b) a Loader epoch: `stagefs.Loader("s3://...", stage="ram")` (in process, opening
      included)  vs  `stagefs.Loader(<the mount of the same URL>)` (mount included);
  (c) every member read once: `stagefs.open(url, stage="ram")` + a thread pool  vs
      ratarmountcore over s3fs (its in-process S3 path: `SQLiteIndexedTar` on an s3fs file
      object, index included; its SQLite index is used from one thread). It takes minutes
      a round, so it runs in the first round only.

Every byte read is checked against the member's size; each system runs --rounds times in
turn; medians and ratios are printed (and written as JSON with --json).

    sudo benches/.venv/bin/python benches/python_remote.py [--mib 2048] [--rounds 3]

Needs: the stagefs wheel, ratarmountcore (ratarmount==1.3.0's), s3fs, numpy in the
interpreter running it; s3s-fs and rustc on PATH (see .ci/run); root and /dev/fuse for (a)
and (b)'s mounts.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import stagefs

AK, SK = "AKIASTAGEFSBENCH0001", "stagefs/bench/secret/key/0123456789"


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(p: int) -> None:
    for _ in range(400):
        try:
            socket.create_connection(("127.0.0.1", p), timeout=0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {p}")


def make_tar(work: str, mib: int) -> tuple[str, int]:
    """An ImageNet-like tree (files of 20-200 KB in 100 folders) of about `mib` MiB, tarred."""
    src, tar = os.path.join(work, "src"), os.path.join(work, "data.tar")
    rng = random.Random(1)
    total, i = 0, 0
    while total < mib << 20:
        d = os.path.join(src, f"c{i % 100:03d}")
        os.makedirs(d, exist_ok=True)
        n = rng.randint(20_000, 200_000)
        with open(os.path.join(d, f"f{i:06d}.bin"), "wb") as f:
            f.write(rng.randbytes(n))
        total, i = total + n, i + 1
    subprocess.run(["tar", "-cf", tar, "-C", src, "."], check=True)
    shutil.rmtree(src)
    return tar, i


def timed(f):
    started = time.perf_counter()
    value = f()
    return time.perf_counter() - started, value


def read_all(open_member, names_sizes, threads: int) -> int:
    def one(item):
        name, size = item
        data = open_member(name)
        assert len(data) == size, (name, len(data), size)
        return size

    if threads == 1:  # on this thread (ratarmountcore's SQLite index may not move)
        return sum(map(one, names_sizes))
    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one, names_sizes))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--delay-ms", type=int, default=0, help="latency each way (benches/delay_proxy.rs)")
    ap.add_argument("--json")
    args = ap.parse_args()
    stagefs_bin = stagefs.executable()
    work = tempfile.mkdtemp(prefix="stagefs-pyremote-")
    procs = []
    try:
        tar, files = make_tar(work, args.mib)
        size = os.path.getsize(tar)
        print(f"== {size / 2**20:.0f} MiB tar of {files} files", flush=True)
        s3_dir = os.path.join(work, "s3", "bench")
        os.makedirs(s3_dir)
        s3_port = port()
        procs.append(subprocess.Popen(["s3s-fs", "--host", "127.0.0.1", "--port", str(s3_port), "--access-key", AK,
                                       "--secret-key", SK, os.path.dirname(s3_dir)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))  # fmt: skip
        wait(s3_port)
        endpoint = f"http://127.0.0.1:{s3_port}"
        if args.delay_ms:
            proxy = os.path.join(work, "delay_proxy")
            here = os.path.dirname(os.path.abspath(__file__))
            subprocess.run(["rustc", "-O", "--edition", "2021", "-o", proxy, os.path.join(here, "delay_proxy.rs")],
                           check=True)  # fmt: skip
            proxy_port = port()
            procs.append(subprocess.Popen([proxy, str(proxy_port), str(s3_port), str(args.delay_ms), "2"]))
            wait(proxy_port)
            endpoint = f"http://127.0.0.1:{proxy_port}"
        # Uploaded, not copied in: s3s-fs then keeps the ETag instead of hashing per request.
        subprocess.run(["curl", "-sf", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{AK}:{SK}", "-H",
                        "x-amz-content-sha256: UNSIGNED-PAYLOAD", "-T", tar, f"http://127.0.0.1:{s3_port}/bench/data.tar",
                        "-o", "/dev/null"], check=True)  # fmt: skip
        os.environ.update(AWS_ACCESS_KEY_ID=AK, AWS_SECRET_ACCESS_KEY=SK, AWS_REGION="us-east-1",
                          AWS_EC2_METADATA_DISABLED="true", XDG_CACHE_HOME=os.path.join(work, "cache"))  # fmt: skip
        url = "s3://bench/data.tar"
        mnt = os.path.join(work, "mnt")
        members = None
        times: dict = {k: [] for k in ("cli_stage", "open_stage", "loader_url", "loader_mount", "open_read",
                                       "ratarmount_read")}  # fmt: skip

        def cli_stage():
            subprocess.run([stagefs_bin, "mount", "--stage", "ram", "--warm", "no", "--endpoint-url", endpoint, url,
                            mnt], check=True, capture_output=True)  # fmt: skip

        def umount():
            subprocess.run([stagefs_bin, "umount", mnt], check=True, capture_output=True)

        def loader_epoch(source, **kw):
            n = 0
            for batch in stagefs.Loader(source, batch_size=64, device="cpu", output="numpy", **kw):
                n += int(sum(batch.lengths))
            return n

        for r in range(args.rounds):
            shutil.rmtree(os.path.join(work, "cache"), ignore_errors=True)
            # Nothing of the last round's opens is reused: fsspec's instance cache and
            # stagefs's per-process one let go.
            stagefs.ArchiveFileSystem.clear_instance_cache()
            gc.collect()
            t, _ = timed(cli_stage)
            times["cli_stage"].append(t)
            umount()
            t, fs = timed(lambda: stagefs.open(url, stage="ram", endpoint_url=endpoint))
            times["open_stage"].append(t)
            if members is None:
                members = [(m["name"], m["size"]) for m in fs.find("", detail=True).values()]
            t, _ = timed(lambda: read_all(fs.cat_file, members, args.threads))
            times["open_read"].append(times["open_stage"][-1] + t)
            fs.close()
            del fs
            t, n = timed(lambda: loader_epoch(url, endpoint_url=endpoint))
            assert n == sum(s for _, s in members)
            times["loader_url"].append(t)
            t, n = timed(lambda: (cli_stage(), loader_epoch(mnt))[1])
            times["loader_mount"].append(t)
            umount()
            if r == 0:  # minutes per round (see the module's doc): once is enough for its ratio
                t, _ = timed(lambda: ratarmount_read(endpoint, members, args.threads))
                times["ratarmount_read"].append(t)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items() if v), flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        mbs = lambda s: size / s / 1e6  # noqa: E731
        result = {
            "bytes": size, "files": files, "delay_ms": args.delay_ms, "medians_s": med,
            "stage_rate_in_process_vs_cli": med["cli_stage"] / med["open_stage"],
            "loader_url_vs_mount": med["loader_mount"] / med["loader_url"],
            "stagefs_vs_ratarmountcore_s3fs": med["ratarmount_read"] / med["open_read"],
        }  # fmt: skip
        print(f"staging: CLI {mbs(med['cli_stage']):.0f} MB/s, in process {mbs(med['open_stage']):.0f} MB/s "
              f"({result['stage_rate_in_process_vs_cli']:.2f}x)")  # fmt: skip
        print(f"Loader epoch incl. staging: URL {med['loader_url']:.2f} s, mount {med['loader_mount']:.2f} s "
              f"({result['loader_url_vs_mount']:.2f}x)")  # fmt: skip
        print(f"every member read once: stagefs {med['open_read']:.2f} s, ratarmountcore+s3fs "
              f"{med['ratarmount_read']:.2f} s ({result['stagefs_vs_ratarmountcore_s3fs']:.2f}x)")  # fmt: skip
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
    finally:
        subprocess.run([stagefs_bin, "umount", os.path.join(work, "mnt")], capture_output=True)
        for p in procs:
            p.kill()
        shutil.rmtree(work, ignore_errors=True)


def ratarmount_read(endpoint: str, members, threads: int) -> int:
    """ratarmountcore over s3fs: its index built from the object, then every member read."""
    import s3fs
    from ratarmountcore.mountsource.formats.tar import SQLiteIndexedTar

    fs = s3fs.S3FileSystem(key=AK, secret=SK, client_kwargs={"endpoint_url": endpoint, "region_name": "us-east-1"})
    with fs.open("bench/data.tar", "rb", block_size=8 << 20) as f:
        tar = SQLiteIndexedTar(fileObject=f, writeIndex=False)

        def member(name: str) -> bytes:
            info = tar.lookup("/" + name)
            with tar.open(info) as m:
                return m.read()

        # ratarmountcore's file object is shared: its reads are serialized, so one thread.
        return read_all(member, members, 1)


if __name__ == "__main__":
    sys.exit(main())
