#!/usr/bin/env python3
"""Files into GPU memory, side by side on the same tree in one run (issue: Python loader):

  (a) stagefs.Loader(device="cuda")
  (b) stagefs-reader bench --backend cuda (the Rust pipeline alone)
  (c) torch DataLoader(num_workers=N, pin_memory=True) + .cuda(non_blocking=True)
  and the pinned host-to-device bandwidth alone (from (b)'s --h2d-reps measurement).

    python benches/gpu_loader.py TREE [--batch-size 256] [--workers 16] [--epochs 2]

TREE is a directory of files (e.g. a stagefs mount, or `stagefs-reader gen TREE`).
Prints files/s and GB/s of the last epoch of each, and the ratios a/b and a/c.
Needs a GPU, torch and the stagefs wheel (the `stagefs-reader` binary: --reader-bin).
"""

import argparse
import os
import re
import subprocess
import time

import torch

import stagefs
from cpu_loader import RawFiles  # the same raw-bytes Dataset as the CPU comparison


def files_of(root):
    out = []
    for d, _, names in os.walk(root):
        out.extend(os.path.join(d, n) for n in sorted(names))
    return sorted(out)


def run_stagefs(root, batch_size, epochs):
    loader = stagefs.Loader(root, batch_size=batch_size, shuffle=True, seed=0, device="cuda")
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        start, files, nbytes = time.perf_counter(), 0, 0
        for batch in loader:
            files += len(batch)
            nbytes += batch.buffer.numel()
        torch.cuda.synchronize()
    return files, nbytes, time.perf_counter() - start


def run_dataloader(paths, batch_size, workers, epochs):
    loader = torch.utils.data.DataLoader(RawFiles(paths), batch_size=batch_size, shuffle=True, num_workers=workers,
                                         pin_memory=True, collate_fn=lambda xs: torch.cat(xs))  # fmt: skip
    for _ in range(epochs):
        start, nbytes = time.perf_counter(), 0
        for packed in loader:
            packed.cuda(non_blocking=True)
            nbytes += packed.numel()
        torch.cuda.synchronize()
    return len(paths), nbytes, time.perf_counter() - start


def run_reader_bench(binary, root, epochs):
    out = subprocess.run([binary, "bench", root, "--backend", "cuda", "--shuffle", "0", "--epochs", str(epochs), "--h2d-reps", "20"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    print(out)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tree")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--reader-bin", default="stagefs-reader")
    a = p.parse_args()
    paths = files_of(a.tree)
    rows = {
        "(a) stagefs.Loader(cuda)": run_stagefs(a.tree, a.batch_size, a.epochs),
        f"(c) DataLoader({a.workers} workers, pin_memory)": run_dataloader(paths, a.batch_size, a.workers, a.epochs),
    }
    for name, (files, nbytes, secs) in rows.items():
        print(f"{name:40} {files / secs:10.0f} files/s {nbytes / secs / 1e9:7.2f} GB/s")
    (_, a_bytes, a_secs), (_, c_bytes, c_secs) = rows.values()
    print(f"(a) / (c): {(a_bytes / a_secs) / (c_bytes / c_secs):.2f}x")
    report = run_reader_bench(a.reader_bin, a.tree, a.epochs)
    # (b)'s last epoch, as (a) and (c) report theirs; then the pinned ring's H2D rate alone.
    epochs = re.findall(r"^epoch \d+: .* ([0-9.]+) GB/s$", report, re.M)
    h2d = re.search(r"H2D from the pinned ring slot, alone: ([0-9.]+) GB/s", report)
    ours = a_bytes / a_secs / 1e9
    if not epochs or not h2d:
        raise SystemExit(f"could not read stagefs-reader bench's report:\n{report}")
    b_gbs, h2d_gbs = float(epochs[-1]), float(h2d.group(1))
    print(f"(b) stagefs-reader bench (last epoch)      {b_gbs:7.2f} GB/s")
    print(f"pinned H2D alone                           {h2d_gbs:7.2f} GB/s")
    print(f"(a) / (b): {ours / b_gbs:.2f}x   (a) / H2D alone: {ours / h2d_gbs:.2f}x")

if __name__ == "__main__":
    main()
