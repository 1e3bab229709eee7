"""Images/s of jdml's training input pipeline next to the train step's, for the glyph default and
the ImageNet preset, and next to a torchvision DataLoader.

Two workloads, each timed per core and as the pipeline the trainer runs:

* **glyph default**: 32 px grayscale images in memory (the glyph default's shapes; the timing does
  not depend on the pixel values, so they are synthetic), ``class_random`` SPC-2 batches of 112,
  the ``affine`` augmentation. Per core, the batched augmentation (every row's generator drawn
  at once, one warp of the batch) is shown next to one call per image (the way batches were built
  before; the same pixels).
* **ImageNet preset**: ResNet-50's input at 224 px, the ``base`` augmentation
  (RandomResizedCrop(224) + flip) on CUB-like JPEGs (a CUB_200_2011-layout tree cut from
  scikit-image's sample photos, built under ``--root`` when absent), once decoding every JPEG at
  every draw and once from the decode cache (``data.decode_cache``, short side 256).

* **views** (``--sections views``): every photo augmentation on both paths from the decode
  cache (short side 256): ``data.views=host`` (Pillow in the pipeline) and ``data.views=device``
  (the host draws each view's parameters and sends photo indices; the jitted step makes the
  pixels from the device-resident set), plus DiVA's two views and a DM2 cohort of two members'
  views. The device path's pipeline rate includes copying every batch to the device, as the
  trainer does; the last columns time the device's work of making a batch's views (the jitted
  ``make_views`` alone) on this backend. Target: the host side of device views at
  least 10,000 img/s on every row.

* **the views' share of the step** (``--sections fraction``): the device's work of making a
  batch's views against the train step on the same backend, for ResNet-50 at 224 px (random
  weights; bfloat16 on accelerators) on the CUB-like tree, and EfficientNet-Lite0 on the emoji
  set at 64 px (``base`` views; skipped without ``python -m jdml data fetch emoji``): the step
  with device views on a fixed batch of parameters, the same step on the same views made on the
  host, and the jitted ``realize`` alone.
* **end to end** (``--sections e2e``): ``train.py`` on a CUB_200_2011-layout tree of JPEGs
  (train and test classes, the decode cache on) with each view path, a small ResNet at 224 px so
  that a CPU finishes it; the images/s are the run's own train records (their median after the
  first), and the wall time is the whole command's.

"Per core" is images per CPU-second of one thread building batches (``TrainBatch`` called in
this process; on a quiet machine, images/s of one core). "Pipeline" is ``train_batches`` with the
sizes the trainer resolves for this host and backend (``jdml.data.pipeline.
resolve_pipeline_sizes``), or ``--threads`` / ``--processes``. On a CPU host the script also
prints the projection to a 16-core accelerator host: the per-core rate times the cores the
automatic sizes give the pipeline there (14), assuming cores as fast as these and linear scaling:
a projection, not a measurement. Each pipeline figure is compared with the train step's images/s
on a GPU, which this script does not measure: ``--step-ips NAME=VALUE`` (glyphs, resnet50_fp32,
resnet50_bf16) gives them, by default the figures measured on an H200. The targets: the glyph
pipeline above the glyph step's rate, the ImageNet pipeline at least 1.3x the bf16 ResNet-50 step.

``--torch-python`` (an interpreter with torch and torchvision; skipped when absent) adds the
torchvision comparison on the same JPEGs: jdml with 1 reader thread against a DataLoader with 0
workers (torch limited to one intra-op thread, as in DataLoader workers), jdml with
``--compare-threads`` against ``--compare-workers`` workers, and jdml with as many worker
processes (1 thread each) as DataLoader workers; both decode with Pillow and apply
RandomResizedCrop(224) + flip, and end with float tensors in [0, 1] (jdml normalises on the
device). Rounds alternate and the table shows the medians.

    python bench/bench_pipeline.py                 # a few minutes
    python bench/bench_pipeline.py --quick         # under a minute (e.g. on a 16-core GPU host)
    python bench/bench_pipeline.py --quick --threads 14 --processes 7
    python bench/bench_pipeline.py --sections views  # both view paths, every augmentation
    python bench/bench_pipeline.py --sections e2e    # train.py with each view path
    python bench/bench_pipeline.py --sections fraction  # the views' share of the step
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import skimage
from PIL import Image

from jdml.allocator import reexec_with_tcmalloc
from jdml.data.arrays import ImageArrays
from jdml.data.augment import affine_augment, make_augmentation
from jdml.data.benchmarks import FileList, read_benchmark
from jdml.data.benchmarks.decode_cache import open_cache
from jdml.data.device_pixels import device_views, make_views
from jdml.data.photo_augment import base_augment
from jdml.data.pipeline import (
    AUTO,
    PipelineSizes,
    TrainBatch,
    host_cores,
    input_pipeline,
    resolve_pipeline_sizes,
    train_batches,
)
from jdml.evaluate_checkpoint import load_config
from jdml.fileio import cache_root
from jdml.run import Run
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


#: The train step's images/s on a GPU (ResNet-50 at 224 px, batch 112; the glyph default), as
#: measured on an H200 with jdml (platform notes); ``--step-ips`` replaces them.
H200_STEP_IPS = {"glyphs": 66_500.0, "resnet50_fp32": 3_952.0, "resnet50_bf16": 6_838.0}
#: jdml's pipeline on that H200's 16-core host, base augmentation decoding the JPEGs each draw.
H200_PIPELINE = "8 threads: 2,016 img/s; 8 worker processes of 2 threads: 8,585 img/s"
H200_JPEG_IPS, H200_JPEG_THREADS = 8_585.0, 16
#: The projection's host: its cores, and the accelerator backend that sizes the pipeline there.
PROJECTED_CORES = 16
#: The ImageNet pipeline must deliver at least this multiple of the bf16 step's images/s.
PHOTO_MARGIN = 1.3
GLYPH_SIZE, GLYPH_IMAGES, GLYPH_CLASSES, BATCH = 32, 25_000, 1_250, 112


@dataclasses.dataclass(frozen=True)
class Workload:
    """One pipeline to time: its batch maker, and whether its photos are decoded per batch."""

    name: str
    make_batch: TrainBatch
    decodes: bool


def step_rates(items: list[str]) -> tuple[dict[str, float], str]:
    """The step's images/s by name: the H200 figures with ``--step-ips NAME=VALUE`` applied, and
    where they come from."""
    rates, given = dict(H200_STEP_IPS), []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or name not in rates:
            sys.exit(f"error: --step-ips {item!r}: expected NAME=VALUE, NAME one of {list(rates)}")
        rates[name] = float(value)
        given.append(name)
    where = "measured on an H200 (platform notes)"
    if given:
        where = f"{', '.join(given)} as given with --step-ips, the rest {where}"
    return rates, where


def glyph_workload(seed: int = 0) -> Workload:
    """The glyph default's training batches on glyph-shaped images in memory."""
    rng = np.random.default_rng(seed)
    shape = (GLYPH_IMAGES, GLYPH_SIZE, GLYPH_SIZE, 1)
    data = ImageArrays(
        images=rng.integers(0, 256, shape, dtype=np.uint8),
        labels=np.arange(GLYPH_IMAGES, dtype=np.int32) % GLYPH_CLASSES,
        class_names=tuple(str(c) for c in range(GLYPH_CLASSES)),
    )
    sampler = SAMPLERS.get("class_random")(
        data.labels, batch_size=BATCH, samples_per_class=2, seed=seed
    )
    batch = TrainBatch(data=data, sampler=sampler, augment=affine_augment, seed=seed)
    return Workload("glyph default, in memory", batch, decodes=False)


def _one_call_per_image(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """affine_augment under another name: the pipeline calls it once per image (as before)."""
    return affine_augment(images, rng)


def photo_workloads(files: FileList, cache: FileList, seed: int = 0) -> list[Workload]:
    """The ImageNet preset's batches: JPEGs decoded at every draw, and from the decode cache."""
    sampler = SAMPLERS.get("class_random")(
        files.labels, batch_size=BATCH, samples_per_class=2, seed=seed
    )
    batch = TrainBatch(data=files, sampler=sampler, augment=base_augment, seed=seed)
    return [
        Workload("ImageNet preset, JPEG decoded per draw", batch, decodes=True),
        Workload(
            "ImageNet preset, decode cache",
            dataclasses.replace(batch, data=cache),
            decodes=False,
        ),
    ]


def per_core_rate(make_batch: TrainBatch, seconds: float, rounds: int) -> tuple[float, float]:
    """Images per CPU-second and per wall second of ``make_batch`` called in this thread: the
    median of ``rounds`` rounds of at least ``seconds`` each, after one warm-up batch."""
    make_batch(0)
    steps: Iterator[int] = iter(range(1, 10**9))
    cpu_rates, wall_rates = [], []
    for _ in range(rounds):
        images, cpu, wall = 0, time.thread_time(), time.perf_counter()
        while time.perf_counter() - wall < seconds or images == 0:
            images += len(make_batch(next(steps))["labels"])
        cpu_rates.append(images / max(time.thread_time() - cpu, 1e-9))
        wall_rates.append(images / (time.perf_counter() - wall))
    return statistics.median(cpu_rates), statistics.median(wall_rates)


def pipeline_rate(
    make_batch: TrainBatch,
    sizes: PipelineSizes,
    batches: int,
    prefetch: int,
    *,
    placed: bool = False,
) -> tuple[float, float]:
    """Images/s of ``train_batches`` with ``sizes`` over ``batches`` batches after 2 warm-up
    batches, and the seconds to the first batch (the worker processes' start-up included);
    ``placed``: every batch copied to the device (the copy finished), as the step receives it."""
    take = (lambda b: jax.block_until_ready(jax.device_put(b))) if placed else (lambda b: b)
    start = time.perf_counter()
    iterator = train_batches(
        make_batch,
        start_step=0,
        total_steps=batches + 2,
        num_threads=sizes.threads,
        prefetch=prefetch,
        num_workers=sizes.workers,
    )
    take(next(iterator))
    first = time.perf_counter() - start
    take(next(iterator))
    begin, images = time.perf_counter(), 0
    for batch in iterator:
        take(batch)
        images += len(batch["labels"])
    return images / (time.perf_counter() - begin), first


def sizes_here(args: argparse.Namespace, decodes: bool) -> PipelineSizes:
    """The pipeline's sizes on this host: ``--threads`` / ``--processes`` where given, the rest
    as the trainer resolves them (``data.num_threads`` / ``data.num_workers`` = -1)."""
    return resolve_pipeline_sizes(
        args.threads,
        args.processes,
        backend=jax.default_backend(),
        cores=host_cores(),
        decodes=decodes,
    )


def report(
    work: Workload,
    args: argparse.Namespace,
    step: dict[str, float],
    step_names: tuple[str, ...],
    target: tuple[str, float],
    *,
    seconds: float,
    speed: float = 0.0,
) -> float:
    """Times one workload per core and as a pipeline, prints it against the step, and returns
    the per-core rate. ``speed``: how much faster the H200 host's cores build photo batches
    (0: unknown), for a second projection."""
    cpu, wall = per_core_rate(work.make_batch, seconds, args.rounds)
    print(f"  per core: {cpu:,.0f} img per CPU-second ({wall:,.0f} img/s of wall time)")
    sizes = sizes_here(args, work.decodes)
    rate, first = pipeline_rate(work.make_batch, sizes, args.batches, args.prefetch)
    print(f"  pipeline on this host, {sizes.describe()}:")
    print(f"    {rate:,.0f} img/s (first batch after {first:.1f} s)")
    rates = [("this host", rate)]
    if jax.default_backend() == "cpu":
        there = resolve_pipeline_sizes(
            AUTO, AUTO, backend="gpu", cores=PROJECTED_CORES, decodes=work.decodes
        )
        cores = there.threads * max(1, there.workers)
        projected = cpu * cores
        print(
            f"  projection to a {PROJECTED_CORES}-core GPU host (a projection, not a measurement:"
            f" {cpu:,.0f} img/s per core x {cores} pipeline cores, {there.describe()}): "
            f"{projected:,.0f} img/s"
        )
        rates.append((f"projected, {PROJECTED_CORES} cores", projected))
        if speed:
            print(
                f"  the same with the H200 host's cores ({speed:.1f}x these, from its measured "
                f"JPEG rate): {projected * speed:,.0f} img/s (a projection)"
            )
            rates.append(("projected with the H200 host's cores", projected * speed))
    name, needed = target
    for label, value in rates:
        versus = ", ".join(f"{value / step[n]:.2f}x the {n} step" for n in step_names)
        verdict = "meets" if value >= needed else "misses"
        print(f"  {label}: {versus}; {verdict} the target ({name}: {needed:,.0f} img/s)")
    return cpu


def glyph_section(args: argparse.Namespace, step: dict[str, float]) -> None:
    work = glyph_workload()
    print(
        f"\n== glyph default: {GLYPH_SIZE} px images in memory ({GLYPH_IMAGES:,}), batch {BATCH}"
        f" SPC-2, affine augmentation; step {step['glyphs']:,.0f} img/s =="
    )
    before = dataclasses.replace(work.make_batch, augment=_one_call_per_image)
    cpu, _ = per_core_rate(before, args.seconds, args.rounds)
    print(f"  per core, one generator and one warp per image (before): {cpu:,.0f} img/CPU-s")
    report(work, args, step, ("glyphs",), ("above the step", step["glyphs"]), seconds=args.seconds)


def photo_section(args: argparse.Namespace, step: dict[str, float], files: FileList) -> None:
    with tempfile.TemporaryDirectory(prefix="jdml-decode-cache-") as folder:
        photo_rates(args, step, files, folder)


def photo_rates(
    args: argparse.Namespace, step: dict[str, float], files: FileList, cache_folder: str
) -> None:
    begin = time.perf_counter()
    cache = open_cache(files, 256, cache_folder, threads=host_cores())
    built = time.perf_counter() - begin
    size = os.path.getsize(cache.file) / 2**20
    print(
        f"\n== ImageNet preset: ResNet-50 at 224 px, batch {BATCH} SPC-2, base augmentation; "
        f"step {step['resnet50_fp32']:,.0f} img/s (fp32), {step['resnet50_bf16']:,.0f} (bf16) =="
    )
    print(
        f"  decode cache: {len(files)} photos decoded at short side 256 in {built:.1f} s "
        f"with {host_cores()} threads ({size:,.0f} MiB)"
    )
    print(f"  jdml on the H200's 16-core host, JPEG decoded per draw: {H200_PIPELINE}")
    target = (f"{PHOTO_MARGIN}x bf16", PHOTO_MARGIN * step["resnet50_bf16"])
    names, speed = ("resnet50_fp32", "resnet50_bf16"), 0.0
    for work in photo_workloads(files, cache):
        print(f" {work.name}:")
        cpu = report(work, args, step, names, target, seconds=args.seconds, speed=speed)
        if work.decodes:  # the H200 host's measurement is of this workload
            speed = H200_JPEG_IPS / (H200_JPEG_THREADS * cpu)


#: The views section's rows: (label, augmentation, views per image, members).
VIEW_ROWS = (
    ("base", "base", 1, 1),
    ("big", "big", 1, 1),
    ("red", "red", 1, 1),
    ("adv", "adv", 1, 1),
    ("realistic", "realistic", 1, 1),
    ("DiVA: base, 2 views", "base", 2, 1),
    ("DM2: base, 2 members", "base", 1, 2),
)
#: The views section's target: the host side of device views, images/s on this host.
DEVICE_VIEWS_TARGET = 10_000.0


def view_batch(cache: Any, name: str, views: int, members: int, where: str) -> tuple:
    """The training batches of augmentation ``name`` on the cached photos with views made on
    the ``where`` side, and the device views (None on the host side)."""
    cfg = ml_collections.ConfigDict(
        {
            "augment": name,
            "image_size": 256 if name == "big" else 224,
            "resize": 256,
            "device_photos_gib": -1.0,
        }
    )
    sampler = SAMPLERS.get("class_random")(
        cache.labels, batch_size=BATCH, samples_per_class=2, seed=0
    )
    device = _device_views(cfg, cache) if where == "device" else None
    batch = TrainBatch(
        data=cache,
        sampler=sampler,
        augment=make_augmentation(cfg),
        seed=0,
        views=views,
        members=tuple(range(members)) if members > 1 else (),
        views_on_device=device.host if device else None,
    )
    return batch, device


_DEVICE_VIEWS: dict[tuple, Any] = {}


def _device_views(cfg: Any, cache: Any) -> Any:
    """One resident set per augmentation shape (the rows share it)."""
    key = (cfg.augment, cfg.image_size)
    if key not in _DEVICE_VIEWS:
        _DEVICE_VIEWS[key] = device_views(cfg, cache)
    return _DEVICE_VIEWS[key]


def render_time(device: Any, make_batch: TrainBatch, rounds: int) -> float:
    """Seconds the device takes to make one batch's views (the jitted ``realize`` alone), the
    median of ``rounds`` rounds of 3 batches after compiling."""
    realize = jax.jit(functools.partial(make_views, device.spec))
    batches = [jax.device_put(make_batch(s)) for s in range(3)]
    jax.block_until_ready(realize(batches[0], device.resident))
    times = []
    for _ in range(rounds):
        begin = time.perf_counter()
        for batch in batches:
            out = realize(batch, device.resident)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - begin) / len(batches))
    return statistics.median(times)


def views_section(args: argparse.Namespace, files: FileList) -> None:
    """Every photo augmentation with its views made on the host and on the device."""
    with tempfile.TemporaryDirectory(prefix="jdml-decode-cache-") as folder:
        cache = open_cache(files, 256, folder, threads=host_cores())
        print(
            f"\n== views: {len(files)} decode-cached photos (short side 256), batch {BATCH} "
            f"SPC-2; pipeline: {sizes_here(args, False).describe()}; backend "
            f"{jax.default_backend()} =="
        )
        print(
            f"  {'augmentation':<22}{'host: img/CPU-s':>16}{'pipeline img/s':>15}"
            f"{'device: img/CPU-s':>18}{'pipeline img/s':>15}{'x host':>8}"
            f"{'device ms/batch':>16}{'views/s':>9}  target"
        )
        for label, name, views, members in VIEW_ROWS:
            row = {}
            for where in ("host", "device"):
                make_batch, device = view_batch(cache, name, views, members, where)
                cpu, _ = per_core_rate(make_batch, args.seconds, args.rounds)
                sizes = sizes_here(args, False)
                rate, _ = pipeline_rate(make_batch, sizes, args.batches, args.prefetch, placed=True)
                row[where] = (cpu, rate)
            made = render_time(device, make_batch, args.rounds)
            per_batch = views * members * BATCH
            verdict = "meets" if row["device"][1] >= DEVICE_VIEWS_TARGET else "misses"
            print(
                f"  {label:<22}{row['host'][0]:>16,.0f}{row['host'][1]:>15,.0f}"
                f"{row['device'][0]:>18,.0f}{row['device'][1]:>15,.0f}"
                f"{row['device'][1] / row['host'][1]:>8.1f}{made * 1e3:>16.1f}"
                f"{per_batch / made:>9,.0f}  {verdict} ({DEVICE_VIEWS_TARGET:,.0f} img/s)"
            )


#: The end-to-end runs' config: a small ResNet at the preset's 224 px crops, so that a CPU
#: finishes them (``--e2e-flag`` adds to it, e.g. the preset's ResNet-50 on a GPU).
E2E_FLAGS = (
    "--config.data.verify_counts=False",
    "--config.data.decode_cache=True",
    "--config.model.backbone=small_resnet",
    "--config.model.pretrained=",
    "--config.data.normalization=mean_std",
    "--config.train.batch_size=56",
    "--config.train.epochs=2",
    "--config.train.log_every_steps=1",
    "--config.train.progress_bar=False",
    "--config.eval.at_start=False",
    "--config.eval.metrics=('recall@1','map@r')",
    "--config.eval.selection_metric=recall@1",
)


#: The e2e section's methods: (label, config argument, extra flags).
E2E_METHODS = {
    "plain": ("margin", "configs/revisiting.py:data=cub200", ()),
    "diva": ("DiVA", "configs/diva.py:data=cub200", ()),
    "dm2": (
        "DM2, cohort of 2",
        "configs/dm2.py:data=cub200",
        ("--config.cohort.size=2", "--config.sampler.samples_per_class=2"),  # preset: SPC-5
    ),
}


def fixed_batch_rate(workdir: Path, steps: int) -> float:
    """Images/s of the run's own jitted step on one fixed batch (views made on the host, so
    the step alone), ``steps`` steps after compiling: what the pipeline must keep fed."""
    config = load_config(str(workdir))
    with config.unlocked():
        config.data.views = "host"
    run = Run(config)
    make_batch, _ = input_pipeline(run.batch_maker(), config.data)
    batch = jax.device_put(make_batch(0))
    step, state = run.make_train_step(), run.prepare(run.initial_state)
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    begin = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state, batch)
    jax.block_until_ready((state, metrics))
    return steps * config.train.batch_size / (time.perf_counter() - begin)


def e2e_section(args: argparse.Namespace, default_root: Path) -> None:
    """``train.py`` end to end on a CUB-layout tree with the views made on each side, against
    the same step on a fixed batch."""
    root = args.root or Path(f"{default_root}-e2e-{args.photos}")
    if not (root / "CUB_200_2011" / "images.txt").is_file():
        print(f"writing {args.photos} photos in 200 classes to {root} ...", flush=True)
        build_tree(root, args.photos, 200)  # classes 1-100 train, 101-200 test
    flags = [*E2E_FLAGS, *args.e2e_flags]
    print(f"\n== end to end: train.py on {root} ({' '.join(flags)}) ==")
    repo = Path(__file__).resolve().parent.parent
    for name in args.e2e_methods.split(","):
        label, config, extra = E2E_METHODS[name]
        with tempfile.TemporaryDirectory(prefix="jdml-e2e-") as tmp:
            rates = {}
            for where in ("host", "device"):
                workdir = Path(tmp) / where
                command = [
                    sys.executable,
                    str(repo / "train.py"),
                    "--config",
                    f"{repo}/{config}",
                    "--workdir",
                    str(workdir),
                    f"--config.data.path={root}",
                    f"--config.data.cache_dir={tmp}/decoded",
                    f"--config.data.views={where}",
                    *flags,
                    *extra,
                ]
                begin = time.perf_counter()
                proc = subprocess.run(command, capture_output=True, text=True, check=False)
                wall = time.perf_counter() - begin
                if proc.returncode != 0:
                    sys.exit(
                        f"train.py ({name}, data.views={where}) failed:\n{proc.stderr[-3000:]}"
                    )
                with open(workdir / "metrics.jsonl") as f:
                    records = [json.loads(line) for line in f]
                train = [r["img_s"] for r in records if r.get("kind") == "train"][1:]
                rates[where] = statistics.median(train)
                print(
                    f"  {label}, data.views={where:<7} train img/s: median {rates[where]:,.1f} "
                    f"(of {len(train)} records after the first); whole command {wall:.0f} s"
                )
            fixed = fixed_batch_rate(Path(tmp) / "host", args.batches)
            print(
                f"  {label}: the step on a fixed batch {fixed:,.1f} img/s; end to end "
                + ", ".join(f"{w} {r / fixed:.0%}" for w, r in rates.items())
                + " of it (target on an accelerator: device views at 90 % or more)"
            )


def timed(fn: Any, repeats: int) -> float:
    """Median seconds of ``fn()`` (its outputs waited for) over ``repeats`` calls after one."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def fraction_configs(args: argparse.Namespace, default_root: Path) -> list[tuple[str, Any]]:
    """The fraction section's runs: (label, config) with device views."""
    from configs.revisiting import get_config
    from jdml.config import set_keys

    accelerator = jax.default_backend() != "cpu"
    out = []
    root = args.root or Path(f"{default_root}-e2e-{args.photos}")
    if not (root / "CUB_200_2011" / "images.txt").is_file():
        build_tree(root, args.photos, 200)
    c = get_config("data=cub200")
    set_keys(
        c,
        {
            "data.path": str(root),
            "data.verify_counts": False,
            "data.decode_cache": True,
            "data.views": "device",
            "model.pretrained": "",
            "model.dtype": "bfloat16" if accelerator else "float32",
            "eval.at_start": False,
        },
    )
    out.append((f"ResNet-50, 224 px, {c.model.dtype}, batch 112", c))
    if os.path.exists(Path(cache_root("emoji")) / "emoji.npz"):
        c = get_config("data=emoji")
        set_keys(c, {"data.augment": "base", "data.views": "device"})
        out.append(("EfficientNet-Lite0, emoji 64 px, batch 112", c))
    return out


def fraction_section(args: argparse.Namespace, default_root: Path) -> None:
    """The device's work of making a batch's views against the train step."""
    print(f"\n== the views' share of the step ({jax.default_backend()}) ==")
    for label, config in fraction_configs(args, default_root):
        print(f"  {label}: {step_fraction(config, max(2, args.rounds))}")


def step_fraction(config: Any, repeats: int) -> str:
    """One line: the step on host-made views, with device views, and ``realize`` alone."""
    run = Run(config)
    views = run.device_views
    placed = jax.device_put(input_pipeline(run.batch_maker(), config.data)[0](0))
    realize = jax.jit(functools.partial(make_views, views.spec))
    host_batch = jax.device_put(realize(placed, views.resident))
    made = timed(lambda: realize(placed, views.resident), repeats)
    plain = run.program.make_train_step(run.tx, run.initial_state)
    step = run.make_train_step()
    states = {"views": run.initial_state, "plain": jax.tree.map(jnp.copy, run.initial_state)}

    def with_views() -> Any:
        states["views"], metrics = step(states["views"], placed)
        return metrics

    def without() -> Any:
        states["plain"], metrics = plain(states["plain"], host_batch)
        return metrics

    t_views, t_plain = timed(with_views, repeats), timed(without, repeats)
    return (
        f"the step {t_plain * 1e3:,.1f} ms on views made on the host; {t_views * 1e3:,.1f} ms "
        f"with device views ({t_views / t_plain - 1:+.1%}); realize alone {made * 1e3:,.1f} ms "
        f"({made / t_plain:.1%} of the step; target on an accelerator: at most 10 %)"
    )


def jdml_rate(
    files: FileList, args: argparse.Namespace, threads: int, seed: int, processes: int = 0
) -> float:
    """Images/s of ``train_batches`` with ``threads`` reader threads (in each of ``processes``
    worker processes, if any), after the warm-up (which includes starting the workers)."""
    sampler = SAMPLERS.get("class_random")(
        files.labels, batch_size=BATCH, samples_per_class=2, seed=seed
    )
    make_batch = TrainBatch(data=files, sampler=sampler, augment=base_augment, seed=seed)
    sizes = PipelineSizes(threads, processes, "as set")
    return pipeline_rate(make_batch, sizes, args.batches, args.prefetch)[0]


def torch_rates(args: argparse.Namespace, script: Path, spec: Path) -> dict[int, float]:
    """Images/s of the DataLoader by worker count, from the reference interpreter's JSON line."""
    proc = subprocess.run(
        [args.torch_python, str(script), str(spec)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"the torchvision side failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}


def torch_section(args: argparse.Namespace, files: FileList) -> None:
    """jdml against a torchvision DataLoader on the same JPEGs, alternating rounds."""
    threads = sorted({1, args.compare_threads})
    workers = sorted({0, args.compare_workers})
    processes = args.compare_workers
    results: dict[str, list[float]] = {}
    print("\n== torchvision comparison (same JPEGs, decoded per draw) ==")
    with tempfile.TemporaryDirectory() as tmp:
        script, spec = Path(tmp) / "torch_side.py", Path(tmp) / "spec.json"
        script.write_text(TORCH_SCRIPT)
        shared = {"paths": list(files.paths), "labels": files.labels.tolist(), "workers": workers}
        shared |= {"batch_size": BATCH, "warmup": 2, "batches": args.batches}
        for r in range(args.rounds):
            for t in threads:
                results.setdefault(f"jdml|{t}", []).append(jdml_rate(files, args, t, seed=r))
            if processes:
                rate = jdml_rate(files, args, 1, seed=r, processes=processes)
                results.setdefault(f"jdmlp|{processes}", []).append(rate)
            spec.write_text(json.dumps({**shared, "seed": r}))
            for w, rate in torch_rates(args, script, spec).items():
                results.setdefault(f"torch|{w}", []).append(rate)
    median = {k: statistics.median(v) for k, v in results.items()}
    print(f"  medians of {args.rounds} rounds, {args.batches} batches of {BATCH}")
    print(f"  {'configuration':<26}{'images/s':>10}  vs torchvision, same parallelism")
    rows = [(f"jdml|{t}", f"torch|{0 if t == 1 else args.compare_workers}") for t in threads]
    if processes:
        rows.append((f"jdmlp|{processes}", f"torch|{processes}"))
    rows += [(f"torch|{w}", "") for w in workers]
    for key, ref in rows:
        side, n = key.split("|")
        name = {
            "jdml": f"jdml, {n} thread{'s' * (n != '1')}",
            "jdmlp": f"jdml, {n} processes",
            "torch": f"torchvision, {n} workers",
        }[side]
        versus = "reference"
        if ref in median:
            versus = f"{median[key] / median[ref]:.2f}x (vs {ref.split('|')[1]} workers)"
        print(f"  {name:<26}{median[key]:>10.1f}  {versus}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_root = Path(tempfile.gettempdir()) / "jdml-bench-pipeline"
    parser.add_argument("--quick", action="store_true", help="small sizes: under a minute")
    parser.add_argument(
        "--sections", default="glyphs,imagenet,views", help="glyphs, imagenet, views, e2e, fraction"
    )
    parser.add_argument(
        "--e2e-flag",
        dest="e2e_flags",
        action="append",
        default=[],
        help="a train.py flag added to the e2e runs (repeat it), e.g. "
        "--e2e-flag=--config.model.backbone=resnet50",
    )
    parser.add_argument(
        "--e2e-methods", default="plain", help=f"e2e methods: {', '.join(E2E_METHODS)}"
    )
    parser.add_argument("--root", type=Path, help=f"photo tree (default {default_root}-N)")
    parser.add_argument("--photos", type=int, help="photos of a new tree (default 1200; 240)")
    parser.add_argument("--classes", type=int, default=40, help="classes of a new tree")
    parser.add_argument("--batches", type=int, help="timed pipeline batches (default 30; 8)")
    parser.add_argument("--seconds", type=float, help="per-core round length (default 3; 1)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; 1)")
    parser.add_argument("--threads", type=int, default=AUTO, help="reader threads (-1: auto)")
    parser.add_argument(
        "--processes", type=int, default=AUTO, help="worker processes (0: none; -1: auto)"
    )
    parser.add_argument("--prefetch", type=int, default=4, help="batches ahead")
    parser.add_argument(
        "--step-ips",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"the step's images/s on the accelerator, NAME in {', '.join(H200_STEP_IPS)}",
    )
    parser.add_argument("--torch-python", default="/work/refenv/bin/python")
    parser.add_argument("--compare-threads", type=int, default=2, help="torchvision comparison")
    parser.add_argument("--compare-workers", type=int, default=2, help="torchvision comparison")
    args = parser.parse_args()
    quick = args.quick
    args.photos = args.photos or (240 if quick else 1200)
    args.batches = args.batches or (8 if quick else 30)
    args.seconds = args.seconds or (1.0 if quick else 3.0)
    args.rounds = args.rounds or (1 if quick else 3)
    sections = set(args.sections.split(","))
    if sections & {"e2e", "fraction"}:
        # The steps timed here run as train.py runs them: under tcmalloc (jdml.allocator).
        reexec_with_tcmalloc()

    step, where = step_rates(args.step_ips)
    affinity = "os.sched_getaffinity" if hasattr(os, "sched_getaffinity") else "os.cpu_count"
    print(
        f"host: {host_cores()} cores for this process ({affinity}; {os.cpu_count()} in the "
        f"machine), JAX backend {jax.default_backend()}"
    )
    print(f"step images/s {where}: " + ", ".join(f"{k} {v:,.0f}" for k, v in step.items()))
    if "glyphs" in sections:
        glyph_section(args, step)
    if sections & {"imagenet", "views"}:
        files = photo_files(args, default_root)
    if "imagenet" in sections:
        photo_section(args, step, files)
        if Path(args.torch_python).is_file() and not quick:
            torch_section(args, files)
        else:
            reason = "--quick" if quick else f"no interpreter at {args.torch_python}"
            print(f"\ntorchvision comparison skipped ({reason})")
    if "views" in sections:
        views_section(args, files)
    if "e2e" in sections:
        e2e_section(args, default_root)
    if "fraction" in sections:
        fraction_section(args, default_root)


def photo_files(args: argparse.Namespace, default_root: Path) -> FileList:
    """The CUB-like photo tree's training split (written under ``--root`` when absent)."""
    root = args.root or Path(f"{default_root}-{args.photos}")
    if not (root / "CUB_200_2011" / "images.txt").is_file():
        print(f"writing {args.photos} photos to {root} ...", flush=True)
        build_tree(root, args.photos, args.classes)
    files = read_benchmark("cub200", str(root), verify_counts=False)["train"]
    print(f"\n{describe(files)} under {root}")
    return files


if __name__ == "__main__":
    main()
