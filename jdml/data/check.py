"""``jdml data check``: what a dataset holds that would bias its retrieval numbers.

For any dataset jdml reads (the registered loaders of :data:`jdml.data.sources.DATASETS`:
``emoji``, ``glyphs``, an image ``folder``, an ``npz`` file, a prepared ``tfds`` set; and the
benchmarks of :data:`jdml.data.benchmarks.BENCHMARKS`: ``cub200``, ``cars196``, ``sop``,
``inshop``, split by split), it reports

* unreadable files (a file that is missing or cannot be decoded),
* single-image classes (a query of such a class has no positive to retrieve),
* copies across classes (:mod:`jdml.data.duplicates`: a picture in two classes is a wrong first
  neighbour whatever the model learns) and copies within a class (a right one),

and how many images have another class's image within each RMS distance. Images are compared
as the loader delivers them at ``image_size`` (benchmark photos: the short side resized and the
centre square cropped).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from jdml.data.benchmarks import BENCHMARKS, read_benchmark
from jdml.data.duplicates import (
    Group,
    cross_class_counts,
    find_groups,
    neighbours,
    split_groups,
)
from jdml.data.sources import DATASETS, load_dataset
from jdml.data.transforms import eval_view
from jdml.errors import DataError

#: RMS pixel distance (0-255) at or under which two images count as copies (the emoji build's).
DEFAULT_THRESHOLD = 6.0
#: Groups listed by name in the printed report (all are in ``--json``).
SHOWN = 8


@dataclasses.dataclass
class Part:
    """One checked part of a dataset (the whole set, or one split of a benchmark)."""

    name: str
    images: np.ndarray
    labels: np.ndarray
    class_names: tuple[str, ...]
    unreadable: list[str]


@dataclasses.dataclass
class PartReport:
    name: str
    images: int
    classes: int
    unreadable: list[str]
    single_image_classes: list[str]
    cross_class: list[dict]
    within_class: list[dict]
    nearest_other_class: dict[str, int]

    @property
    def clean(self) -> bool:
        return not (self.unreadable or self.single_image_classes or self.cross_class)


def _loaded_parts(dataset: str, path: str, image_size: int) -> list[Part]:
    channels = 1 if dataset == "glyphs" else 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arrays = load_dataset(
            dataset,
            path=path,
            image_size=image_size if dataset != "glyphs" else 32,
            cache_dir=None,
            channels=channels,
            skip_unreadable=True,
        )
    skipped = [str(w.message) for w in caught if str(w.message).startswith("skipping")]
    return [
        Part(arrays.source or dataset, arrays.images, arrays.labels, arrays.class_names, skipped)
    ]


def _benchmark_parts(dataset: str, path: str, image_size: int, workers: int = 8) -> list[Part]:
    parts = []
    for split, photos in read_benchmark(
        dataset, path, verify_counts=False, check_files=False
    ).items():

        def view(i: int, photos=photos) -> np.ndarray | str:
            try:
                return eval_view(photos.decode(i), image_size, image_size)
            except DataError as err:
                return str(err)

        with ThreadPoolExecutor(max_workers=workers) as pool:
            out = list(pool.map(view, range(len(photos))))
        ok = np.asarray([not isinstance(o, str) for o in out], bool)
        kept = [o for o in out if not isinstance(o, str)]
        images = np.stack(kept) if kept else np.zeros((0, image_size, image_size, 3), np.uint8)
        parts.append(
            Part(
                f"{dataset} {split}",
                images,
                photos.labels[ok],
                photos.class_names,
                [o for o in out if isinstance(o, str)],
            )
        )
    return parts


def guess_dataset(path: str) -> str:
    """The loader a path is read with: a registered name, an emoji cache folder, an ``.npz``
    file or an image folder."""
    if path in DATASETS.names() and not os.path.exists(path):
        return path
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "emoji.npz")):
        return "emoji"
    if path.endswith(".npz"):
        return "npz"
    if os.path.isdir(path):
        return "folder"
    raise DataError(
        f"{path} is neither a dataset folder, an .npz file nor one of "
        f"{', '.join(DATASETS.names())}; give an existing path, or name the loader with --dataset"
    )


def check(
    path: str,
    dataset: str | None = None,
    *,
    image_size: int = 64,
    threshold: float = DEFAULT_THRESHOLD,
) -> list[PartReport]:
    """Checks the dataset at ``path`` (read by ``dataset``, else :func:`guess_dataset`)."""
    dataset = dataset or guess_dataset(path)
    source = "" if path == dataset else path
    if dataset in BENCHMARKS.names():
        parts = _benchmark_parts(dataset, source, image_size)
    elif dataset in DATASETS.names():
        parts = _loaded_parts(dataset, source, image_size)
    else:
        known = ", ".join([*DATASETS.names(), *BENCHMARKS.names()])
        raise DataError(f"unknown dataset {dataset!r} for --dataset; choose one of: {known}")
    return [report_part(p, threshold) for p in parts]


def _describe(group: Group, part: Part) -> dict:
    return {
        "max_rms": group.max_rms,
        "images": [int(i) for i in group.members],
        "classes": [part.class_names[int(part.labels[i])] for i in group.members],
    }


def report_part(part: Part, threshold: float) -> PartReport:
    cross, within, nearest = [], [], {}
    if len(part.images) > 1:  # nothing to compare in an empty (all unreadable) part
        near = neighbours(part.images, 16)
        cross, within = split_groups(find_groups(part.images, threshold, near=near), part.labels)
        nearest = cross_class_counts(part.images, part.labels, near=near)
    counts = np.bincount(part.labels, minlength=len(part.class_names))
    return PartReport(
        name=part.name,
        images=len(part.labels),
        classes=int((counts > 0).sum()),
        unreadable=part.unreadable,
        single_image_classes=[part.class_names[c] for c in np.flatnonzero(counts == 1)],
        cross_class=[_describe(g, part) for g in cross],
        within_class=[_describe(g, part) for g in within],
        nearest_other_class=nearest,
    )


def _listed(items: Sequence[str], shown: int = SHOWN) -> str:
    more = f", ... ({len(items) - shown} more)" if len(items) > shown else ""
    return ", ".join(items[:shown]) + more


def format_report(reports: Sequence[PartReport], threshold: float) -> str:
    """The printed report."""
    lines = []
    for r in reports:
        lines.append(f"{r.name}: {r.images:,} images, {r.classes:,} classes")
        lines.append(f"  unreadable files: {len(r.unreadable)}" + (
            f" ({_listed(r.unreadable)})" if r.unreadable else ""))  # fmt: skip
        lines.append(f"  single-image classes: {len(r.single_image_classes)}" + (
            f" ({_listed(r.single_image_classes)})" if r.single_image_classes else ""))  # fmt: skip
        n_cross = sum(len(g["images"]) for g in r.cross_class)
        lines.append(
            f"  copies across classes (RMS <= {threshold:g}): {len(r.cross_class)} groups, "
            f"{n_cross} images"
        )
        for g in r.cross_class[:SHOWN]:
            lines.append(f"    {g['max_rms']:5.2f}  " + " | ".join(sorted(set(g["classes"]))))
        if len(r.cross_class) > SHOWN:
            lines.append(f"    ... ({len(r.cross_class) - SHOWN} more groups: --json)")
        n_within = sum(len(g["images"]) - 1 for g in r.within_class)
        lines.append(
            f"  copies within a class (RMS <= {threshold:g}): {len(r.within_class)} groups, "
            f"{n_within} extra images"
        )
        if r.nearest_other_class:
            near = ", ".join(f"{k}: {v}" for k, v in r.nearest_other_class.items())
            lines.append(f"  images with another class's image within RMS {near}")
    verdict = "clean" if all(r.clean for r in reports) else "NOT clean"
    lines.append(f"verdict: {verdict} (unreadable files, single-image classes, cross-class copies)")
    return "\n".join(lines)
