#!/usr/bin/env python3
"""An ImageNet-shaped tree of real JPEG files for the GPU benchmarks:

    python3 tests/gpu/make_jpeg_tree.py DIR CLASSES PER_CLASS

DIR/n0000000k/img_j.JPEG, 256-400 pixels a side, smooth colour fields plus noise so the
files are ~60-130 KB like ImageNet's. Deterministic (seeded); uses numpy and Pillow.
"""

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image


def make_class(args):
    root, c, per_class = args
    rng = np.random.default_rng(c)
    d = Path(root) / f"n{c:08d}"
    d.mkdir(parents=True, exist_ok=True)
    for j in range(per_class):
        h, w = (int(x) for x in rng.integers(256, 400, size=2))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([(x * rng.uniform(0.2, 1) + y * rng.uniform(0.2, 1)) % 256 for _ in range(3)], axis=-1)
        img = np.clip(base + rng.normal(0, 24, size=(h, w, 3)), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(d / f"img_{j:05d}.JPEG", quality=90)


def main():
    root, classes, per_class = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with ProcessPoolExecutor() as pool:
        list(pool.map(make_class, [(root, c, per_class) for c in range(classes)]))


if __name__ == "__main__":
    main()
