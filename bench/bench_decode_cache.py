"""What the decode cache's pixel checksum costs: once at every open, or per photo as it is read.

Writes ``--photos`` JPEGs of 256 x 341 px (CUB's typical photo at the default cache size, kept as
it is), builds their decode cache, and times, each ``--repeats`` times (min and median):

* the hashes a check could use, over the cache's pixels (GB/s, one thread);
* one photo's hash against one host view of it (Pillow's ``red`` and ``base`` views, 224 px):
  the cost of checking each photo as it is read, every time it is read;
* opening the cache with and without the pixel check (``read_cache``), in 1 and ``--threads``
  threads: the cost of checking once at every open.

    python bench/bench_decode_cache.py                # about a minute on 2 CPU cores
    python bench/bench_decode_cache.py --photos 4000 --threads 4
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from jdml.data.benchmarks import decode_cache as dc
from jdml.data.benchmarks.common import FileList
from jdml.data.photo_augment import base_augment, red_augment

HASHES: dict[str, Callable[[memoryview], object]] = {
    "zlib.crc32": zlib.crc32,
    "zlib.adler32": zlib.adler32,
    "blake2b (16 bytes)": lambda b: hashlib.blake2b(b, digest_size=16).digest(),
}


def times(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """The min and median seconds of ``repeats`` calls of ``fn``."""
    spent = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - begin)
    return min(spent), statistics.median(spent)


def photo_files(folder: Path, count: int) -> FileList:
    """``count`` smooth 256 x 341 JPEGs (gradients and noise) in ``folder``."""
    rng = np.random.default_rng(0)
    rows, cols = np.mgrid[0:256, 0:341]
    paths = []
    for i in range(count):
        base = (rows * (1 + i % 3) + cols * (1 + i % 5)) % 256
        noise = rng.integers(0, 24, (256, 341, 3))
        pixels = np.clip(base[..., None] + noise, 0, 255).astype(np.uint8)
        paths.append(str(folder / f"{i:05d}.jpg"))
        Image.fromarray(pixels).save(paths[-1], quality=90)
    labels = np.zeros(count, np.int32)
    return FileList(labels=labels, class_names=("a",), source="synthetic", paths=tuple(paths))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        files = photo_files(Path(tmp), args.photos)
        cached = dc.open_cache(files, 256, Path(tmp) / "cache", threads=args.threads)
        pixels = memoryview(cached._pixels())[dc._pixels_offset(len(files)) :]
        size = len(pixels)
        print(
            f"{args.photos} photos of 256 x 341 px: {size / 2**20:,.0f} MiB of pixels; "
            f"a shared 2-core machine, {args.repeats} repeats, min / median\n"
        )
        print("| hash, one thread | whole cache (s) | GB/s | one photo (us) |")
        print("|---|---|---|---|")
        photo = cached.decode(0)
        for name, fn in HASHES.items():
            whole = times(lambda fn=fn: fn(pixels), args.repeats)
            one = times(
                lambda fn=fn: [fn(memoryview(photo).cast("B")) for _ in range(100)], args.repeats
            )
            print(
                f"| {name} | {whole[0]:.3f} / {whole[1]:.3f} | {size / whole[0] / 1e9:.2f} / "
                f"{size / whole[1] / 1e9:.2f} | {one[0] * 1e4:.0f} / {one[1] * 1e4:.0f} |"
            )
        rng = np.random.default_rng(0)
        batch = [photo] * 16
        red = times(lambda: red_augment(batch, rng, size=224, resize=256), args.repeats)
        base = times(lambda: base_augment(batch, rng, size=224), args.repeats)
        print(
            f"\none host view of that photo (us): red {red[0] / 16 * 1e6:.0f} / "
            f"{red[1] / 16 * 1e6:.0f}, base {base[0] / 16 * 1e6:.0f} / {base[1] / 16 * 1e6:.0f}"
        )
        key = dc.cache_key(files, 256)
        path = Path(cached.file)
        print("\n| open (read_cache) | threads | s |")
        print("|---|---|---|")
        for check, threads in ((False, 1), (True, 1), (True, args.threads)):
            spent = times(
                lambda c=check, t=threads: dc.read_cache(path, key, files, 256, t, pixels=c),
                args.repeats,
            )
            label = "with the pixel check" if check else "header checks only"
            print(f"| {label} | {threads} | {spent[0]:.3f} / {spent[1]:.3f} |")


if __name__ == "__main__":
    main()
