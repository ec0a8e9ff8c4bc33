#!/usr/bin/env python3
"""Files into host memory as torch tensors, side by side on the same tree in one run:

  (a) stagefs.Loader(device="cpu")
  (b) torch DataLoader over a raw-bytes Dataset (open + read per file), N workers

    python benches/cpu_loader.py TREE [--batch-size 256] [--workers 2] [--epochs 3] [--rounds 3]

TREE is a directory of files (a stagefs mount, or `stagefs-reader gen TREE`). Each round
runs one loader's epochs, then the other's (A B A B ...); prints each round's last epoch in
files/s and MB/s, the median of the rounds and the ratio of medians. Needs torch.
"""

import argparse
import os
import statistics
import time

import torch

import stagefs


class RawFiles(torch.utils.data.Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def timed_epochs(batches_of_epoch, epochs):
    """Runs `epochs` epochs; returns (files, bytes, seconds) of the last one."""
    for epoch in range(epochs):
        start, files, nbytes = time.perf_counter(), 0, 0
        for n, b in batches_of_epoch(epoch):
            files += n
            nbytes += b
        elapsed = time.perf_counter() - start
    return files, nbytes, elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tree")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    paths = sorted(os.path.join(d, n) for d, _, names in os.walk(a.tree) for n in names)
    loader = stagefs.Loader(a.tree, batch_size=a.batch_size, shuffle=True, device="cpu")
    dataloader = torch.utils.data.DataLoader(RawFiles(paths), batch_size=a.batch_size, shuffle=True,
                                             num_workers=a.workers, collate_fn=lambda xs: xs,
                                             persistent_workers=True)  # fmt: skip

    def ours(epoch):
        loader.set_epoch(epoch)
        for batch in loader:
            yield len(batch), batch.buffer.numel()

    def theirs(_epoch):
        for batch in dataloader:
            yield len(batch), sum(t.numel() for t in batch)

    rates = {"(a) stagefs.Loader(cpu)": [], f"(b) DataLoader({a.workers} workers)": []}
    for r in range(a.rounds):
        for (name, runs), fn in zip(rates.items(), (ours, theirs)):
            files, nbytes, secs = timed_epochs(fn, a.epochs)
            runs.append((files / secs, nbytes / secs / 1e6))
            print(f"round {r}: {name:28} {files / secs:9.0f} files/s {nbytes / secs / 1e6:8.1f} MB/s", flush=True)
    medians = {name: (statistics.median(f for f, _ in runs), statistics.median(m for _, m in runs))
               for name, runs in rates.items()}  # fmt: skip
    for name, (fps, mbs) in medians.items():
        print(f"median   {name:28} {fps:9.0f} files/s {mbs:8.1f} MB/s")
    (a_fps, _), (b_fps, _) = medians.values()
    print(f"(a) / (b): {a_fps / b_fps:.2f}x")


if __name__ == "__main__":
    main()
