#!/usr/bin/env python3
"""JPEG files from a stagefs mount -> stagefs.Loader -> decode_jpeg on the GPU -> resize,
against torchvision's ImageFolder + DataLoader with PIL decoding, on the same files.

    python examples/jpeg_pipeline.py DATA.tar [--batch-size 256] [--workers 16]

DATA.tar holds class folders of JPEG files (ImageNet layout); it is mounted staged in RAM.
A directory is read as it is (for machines without FUSE). Prints images/s for both
pipelines, each after one warm-up epoch. Needs torch, torchvision and a GPU.
"""

import argparse
import time

import torch
import torchvision
from torchvision.transforms import v2

import stagefs


def stagefs_epoch(root, batch_size, size, decode=True, resize=True):
    loader = stagefs.Loader(root, batch_size=batch_size, shuffle=True, seed=0, device="cpu")
    resizer = v2.Resize((size, size), antialias=True)
    for epoch in range(2):  # the first epoch warms up
        loader.set_epoch(epoch)
        start = time.perf_counter()
        n = 0
        for batch in loader:
            if decode:
                # decode_jpeg takes its input on the CPU and decodes on the GPU (nvjpeg).
                images = torchvision.io.decode_jpeg(batch.data, device="cuda", mode=torchvision.io.ImageReadMode.RGB)
                if resize:
                    torch.stack([resizer(img) for img in images])
            n += len(batch)
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def imagefolder_epoch(root, batch_size, size, workers):
    transform = v2.Compose([v2.PILToTensor(), v2.Resize((size, size), antialias=True)])
    dataset = torchvision.datasets.ImageFolder(root, transform=transform)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers, pin_memory=True
    )
    for _epoch in range(2):  # the first epoch warms up
        start = time.perf_counter()
        n = 0
        for images, _labels in loader:
            images.cuda(non_blocking=True)
            n += len(images)
        torch.cuda.synchronize()
    return n / (time.perf_counter() - start)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("archive")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--size", type=int, default=224)
    a = p.parse_args()
    import contextlib
    from pathlib import Path

    source = Path(a.archive)
    with contextlib.nullcontext(source) if source.is_dir() else stagefs.mount(source, stage="ram") as root:
        ours = stagefs_epoch(root, a.batch_size, a.size)
        theirs = imagefolder_epoch(root, a.batch_size, a.size, a.workers)
        # Where the time goes: the loader alone, then with the GPU decode but no resize.
        loading = stagefs_epoch(root, a.batch_size, a.size, decode=False)
        decoding = stagefs_epoch(root, a.batch_size, a.size, resize=False)
    print(f"stagefs.Loader alone (no decode): {loading:9.0f} images/s")
    print(f"stagefs.Loader + decode_jpeg(cuda), no resize: {decoding:9.0f} images/s")
    print(f"stagefs.Loader + decode_jpeg(cuda) + resize: {ours:9.0f} images/s")
    print(f"ImageFolder + DataLoader({a.workers} workers, PIL): {theirs:9.0f} images/s")
    print(f"ratio: {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
