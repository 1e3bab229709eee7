"""Images/s of jdml's training input pipeline on real JPEG photos, next to a torchvision DataLoader.

Both sides decode the same JPEG files with Pillow and apply RandomResizedCrop(224) + horizontal
flip: jdml through ``read_benchmark("cub200")`` -> class_random sampler -> ``TrainBatch`` with the
``base`` augmentation -> ``train_batches`` (grain reader threads); torchvision through a
``Dataset`` (PIL ``open(...).convert("RGB")``) with ``RandomResizedCrop(224) +
RandomHorizontalFlip() + ToTensor()`` and a ``DataLoader(shuffle=True, drop_last=True)``. There is
no Normalize: jdml normalises on the device, so both sides end with float tensors in [0, 1].

Like is compared with like: jdml with 1 reader thread against torchvision with 0 workers (in
process, torch limited to one intra-op thread, as in DataLoader workers), jdml with
``--threads`` against torchvision with ``--workers``, and jdml with ``--processes`` worker
processes (``data.num_workers``, one thread each) against as many DataLoader workers. Rounds
alternate (jdml, torchvision, jdml, ...) and the table shows the medians. The photos are a
CUB_200_2011-layout tree of JPEGs (quality 90) of typical CUB sizes, cut from scikit-image's
sample photos with a fixed seed; it is built under ``--root`` when absent and reused when
present.

torch is not needed in jdml's environment: the torchvision side runs in a separate interpreter
(``--torch-python``) on a small script written to a temp file. Run on a quiet machine:

    python bench/bench_pipeline.py
    python bench/bench_pipeline.py --photos 40 --batches 2 --batch-size 16 --warmup 1 --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import skimage
from PIL import Image

from jdml.data.benchmarks import FileList, read_benchmark
from jdml.data.photo_augment import base_augment
from jdml.data.pipeline import TrainBatch, train_batches
from jdml.samplers import SAMPLERS

SOURCES = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png")
SOURCES += ("motorcycle_right.png", "hubble_deep_field.jpg", "retina.jpg", "ihc.png")

TORCH_SCRIPT = """
import json, sys, time
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class Photos(Dataset):
    def __init__(self, paths, labels, length):
        self.paths, self.labels, self.length = paths, labels, length
        self.transform = transforms.Compose(
            [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
             transforms.ToTensor()])

    def __len__(self):
        return self.length  # the files repeated: one epoch holds every timed batch

    def __getitem__(self, i):
        i %= len(self.paths)
        with open(self.paths[i], "rb") as f:
            image = Image.open(f).convert("RGB")
        return self.transform(image), self.labels[i]


def rate(spec, workers):
    bs, warmup, batches = spec["batch_size"], spec["warmup"], spec["batches"]
    data = Photos(spec["paths"], spec["labels"], bs * (warmup + batches))
    loader = DataLoader(data, batch_size=bs, shuffle=True, num_workers=workers,
                        drop_last=True, persistent_workers=workers > 0)
    batch_iter = iter(loader)
    for _ in range(warmup):
        next(batch_iter)
    start = time.perf_counter()
    for _ in range(batches):
        images, _ = next(batch_iter)
    elapsed = time.perf_counter() - start
    assert images.shape == (bs, 3, 224, 224) and images.dtype == torch.float32
    del batch_iter, loader
    return bs * batches / elapsed


spec = json.load(open(sys.argv[1]))
torch.set_num_threads(1)  # as in DataLoader workers
torch.manual_seed(spec["seed"])
print(json.dumps({str(w): rate(spec, w) for w in spec["workers"]}))
"""


def cub_size(rng: np.random.Generator) -> tuple[int, int]:
    """A (width, height) like CUB's (mean about 470x385): the long side mostly 500, the short
    one 0.6-0.9 of it, mostly landscape."""
    long = 500 if rng.random() < 0.85 else int(rng.integers(300, 500))
    short = round(long * rng.uniform(0.6, 0.9))
    return (long, short) if rng.random() < 0.85 else (short, long)


def build_tree(root: Path, photos: int, classes: int, seed: int = 0) -> None:
    """Writes ``root/CUB_200_2011`` with ``photos`` JPEGs in training classes 1..``classes``.

    Each photo is a random crop of a scikit-image sample photo (at least half of the largest crop
    of the drawn aspect ratio) resized to a CUB-like size. The index files are written last, so
    an interrupted build is not taken for a tree.
    """
    data = Path(skimage.__file__).parent / "data"
    sources = [Image.open(data / name).convert("RGB") for name in SOURCES]
    rng = np.random.default_rng(seed)
    folder = root / "CUB_200_2011"
    images, labels = [], []
    for i in range(photos):
        class_id = i % classes + 1
        source = sources[int(rng.integers(len(sources)))]
        width, height = cub_size(rng)
        scale = min(source.width / width, source.height / height) * rng.uniform(0.5, 1.0)
        cw, ch = round(width * scale), round(height * scale)
        left = int(rng.integers(0, source.width - cw + 1))
        top = int(rng.integers(0, source.height - ch + 1))
        photo = source.resize((width, height), Image.BICUBIC, box=(left, top, left + cw, top + ch))
        if rng.random() < 0.5:
            photo = photo.transpose(Image.FLIP_LEFT_RIGHT)
        relative = f"{class_id:03d}.Class_{class_id}/Photo_{i:05d}.jpg"
        (folder / "images" / relative).parent.mkdir(parents=True, exist_ok=True)
        photo.save(folder / "images" / relative, format="JPEG", quality=90)
        images.append(f"{i + 1} {relative}")
        labels.append(f"{i + 1} {class_id}")
    (folder / "classes.txt").write_text("".join(f"{c} {c:03d}.Class_{c}\n" for c in range(1, 201)))
    (folder / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (folder / "images.txt").write_text("\n".join(images) + "\n")


def image_size(path: str) -> tuple[int, int]:
    with Image.open(path) as image:
        return image.size


def describe(files: FileList) -> str:
    """One line: the photo count, classes, mean size in pixels and mean file size."""
    sizes = np.array([image_size(p) for p in files.paths])
    kb = np.mean([os.path.getsize(p) for p in files.paths]) / 1024
    w, h = sizes.mean(axis=0)
    return (
        f"photos: {len(files)} JPEGs in {files.num_classes} classes, mean {w:.0f}x{h:.0f} px "
        f"(width {sizes[:, 0].min()}-{sizes[:, 0].max()}, height {sizes[:, 1].min()}-"
        f"{sizes[:, 1].max()}), mean {kb:.0f} KB"
    )


def jdml_rate(
    files: FileList, args: argparse.Namespace, threads: int, seed: int, processes: int = 0
) -> float:
    """Images/s of ``train_batches`` with ``threads`` reader threads (in each of ``processes``
    worker processes, if any), after the warm-up (which includes starting the workers)."""
    sampler = SAMPLERS.get("class_random")(
        files.labels, batch_size=args.batch_size, samples_per_class=2, seed=seed
    )
    make_batch = TrainBatch(data=files, sampler=sampler, augment=base_augment, seed=seed)
    batches = train_batches(
        make_batch,
        start_step=0,
        total_steps=args.warmup + args.batches,
        num_threads=threads,
        prefetch=args.prefetch,
        num_workers=processes,
    )
    for _ in range(args.warmup):
        next(batches)
    start = time.perf_counter()
    for _ in range(args.batches):
        batch = next(batches)
    elapsed = time.perf_counter() - start
    assert batch["images"].shape == (args.batch_size, 224, 224, 3)
    return args.batch_size * args.batches / elapsed


def torch_rates(args: argparse.Namespace, script: Path, spec: Path) -> dict[int, float]:
    """Images/s of the DataLoader by worker count, from the reference interpreter's JSON line."""
    proc = subprocess.run(
        [args.torch_python, str(script), str(spec)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"the torchvision side failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_root = Path(tempfile.gettempdir()) / "jdml-bench-pipeline"
    parser.add_argument("--root", type=Path, help=f"photo tree (default {default_root}-N)")
    parser.add_argument("--photos", type=int, default=1200, help="photos of a new tree")
    parser.add_argument("--classes", type=int, default=40, help="classes of a new tree")
    parser.add_argument("--batches", type=int, default=30, help="timed batches per run")
    parser.add_argument("--batch-size", type=int, default=112)
    parser.add_argument("--warmup", type=int, default=3, help="untimed batches first")
    parser.add_argument("--threads", type=int, default=2, help="jdml reader threads")
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument(
        "--processes", type=int, default=2, help="jdml worker processes (1 thread each; 0: none)"
    )
    parser.add_argument("--prefetch", type=int, default=4, help="jdml batches ahead")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--torch-python", default="/work/refenv/bin/python")
    args = parser.parse_args()

    root = args.root or Path(f"{default_root}-{args.photos}")
    if not (root / "CUB_200_2011" / "images.txt").is_file():
        print(f"writing {args.photos} photos to {root} ...", flush=True)
        build_tree(root, args.photos, args.classes)
    files = read_benchmark("cub200", str(root), verify_counts=False)["train"]
    print(describe(files), f"under {root}", flush=True)

    threads = sorted({1, args.threads})
    workers = sorted({0, args.workers})
    have_torch = Path(args.torch_python).is_file()
    if not have_torch:
        print(f"torchvision comparison skipped: no interpreter at {args.torch_python}")

    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script, spec = Path(tmp) / "torch_side.py", Path(tmp) / "spec.json"
        script.write_text(TORCH_SCRIPT)
        shared = {"paths": list(files.paths), "labels": files.labels.tolist(), "workers": workers}
        shared |= {k: getattr(args, k) for k in ("batch_size", "warmup", "batches")}
        for r in range(args.rounds):
            for t in threads:
                rate = jdml_rate(files, args, t, seed=r)
                results.setdefault(f"jdml|{t}", []).append(rate)
                print(f"round {r + 1}: jdml, {t} thread(s): {rate:.1f} images/s", flush=True)
            if args.processes:
                rate = jdml_rate(files, args, 1, seed=r, processes=args.processes)
                results.setdefault(f"jdmlp|{args.processes}", []).append(rate)
                print(f"round {r + 1}: jdml, {args.processes} processes: {rate:.1f} images/s")
            if have_torch:
                spec.write_text(json.dumps({**shared, "seed": r}))
                for w, rate in torch_rates(args, script, spec).items():
                    results.setdefault(f"torch|{w}", []).append(rate)
                    print(f"round {r + 1}: torchvision, {w} workers: {rate:.1f} images/s")

    median = {k: statistics.median(v) for k, v in results.items()}
    print(f"\nmedians of {args.rounds} rounds, {args.batches} batches of {args.batch_size}")
    print(f"{'configuration':<26}{'images/s':>10}  vs torchvision, same parallelism")
    rows = [(f"jdml|{t}", f"torch|{0 if t == 1 else args.workers}") for t in threads]
    if args.processes:
        rows.append((f"jdmlp|{args.processes}", f"torch|{args.processes}"))
    rows += [(f"torch|{w}", "") for w in workers if have_torch]
    for key, ref in rows:
        side, n = key.split("|")
        name = {
            "jdml": f"jdml, {n} thread{'s' * (n != '1')}",
            "jdmlp": f"jdml, {n} processes",
            "torch": f"torchvision, {n} workers",
        }[side]
        if ref in median:
            versus = f"{median[key] / median[ref]:.2f}x (vs {ref.split('|')[1]} workers)"
        else:
            versus = "reference" if side == "torch" else "n/a"
        print(f"{name:<26}{median[key]:>10.1f}  {versus}")


if __name__ == "__main__":
    main()
