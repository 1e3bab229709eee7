"""The benchmarks as prepared tensorflow-datasets builders, read without TensorFlow.

``data.source=tfds`` reads ``data.name=cub200``, ``cars196`` and ``sop`` from their tfds builders
prepared in ``data.path`` (a tfds data folder) for random access:
``tfds build NAME --data_dir=DIR --file_format=array_record`` on a machine with TensorFlow, then
copy ``DIR`` here (see :mod:`jdml.data.tfds_datasets`, also for why tensorflow-datasets is the
optional extra ``jdml[tfds]``). Each reader is registered in ``TFDS_BENCHMARKS`` under the
benchmark's name and returns the splits the file reader of ``BENCHMARKS`` returns: the same
unseen classes, counts checked against the same numbers, and the same split interface
(:class:`Photos`), so the validation hold-out, the augmentations and the evaluation view are
those of the files.

The builders' own splits are re-cut into the deep-metric-learning ones where they share
classes:

``caltech_birds2011`` (``cub200``)
  train and test together, labels (class id - 1) below 100 for training, the rest for testing.
``cars196`` (``cars196``)
  train and test together, labels below 98 for training, the rest for testing.
``stanford_online_products`` (``sop``)
  its own train and test (disjoint classes already).

Images are kept encoded in the source and decoded on access, with the same conversion to RGB
as the file readers (:func:`jdml.data.benchmarks.images.decode_image`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jdml.data.arrays import compact_labels
from jdml.data.benchmarks import cars, cub, sop
from jdml.data.benchmarks.common import TFDS_BENCHMARKS, Photos, Reader, check_counts
from jdml.data.benchmarks.images import decode_bytes
from jdml.data.tfds_datasets import examples, open_records, text
from jdml.errors import DataError


@dataclasses.dataclass(frozen=True)
class _Builder:
    """How to read one tfds builder: its features and how its splits become the DML ones."""

    benchmark: str  # the name in BENCHMARKS and TFDS_BENCHMARKS
    title: str
    label: str  # the ClassLabel feature
    images: tuple[str, ...]  # encoded image features (read as bytes, not decoded)
    cut: int | None  # labels below it train, the rest test; None: the builder's own splits
    class_name: str | None  # a per-example text feature naming the class
    expected: dict[str, tuple[int, int]]


# The builders' labels are the class ids - 1: label < LAST_TRAIN_CLASS is class id <= it.
BUILDERS = {
    "caltech_birds2011": _Builder(
        benchmark="cub200",
        title=cub.TITLE,
        label="label",
        images=("image", "segmentation_mask"),
        cut=cub.LAST_TRAIN_CLASS,
        class_name="label_name",
        expected=cub.EXPECTED,
    ),
    "cars196": _Builder(
        benchmark="cars196",
        title=cars.TITLE,
        label="label",
        images=("image",),
        cut=cars.LAST_TRAIN_CLASS,
        class_name=None,
        expected=cars.EXPECTED,
    ),
    "stanford_online_products": _Builder(
        benchmark="sop",
        title=sop.TITLE,
        label="class_id",
        images=("image",),
        cut=None,
        class_name=None,
        expected=sop.EXPECTED,
    ),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TfdsSplit(Photos):
    """One deep-metric-learning split of a prepared tfds dataset, with random access.

    Photo ``i`` is example ``indices[i]`` of ``records``, decoded to uint8 (H, W, 3) RGB when it
    is read; its label is in 0..K-1 (sorted order of the builder's labels).

    Attributes:
      records: the tfds data source (picklable: grain's worker processes reopen it).
      indices: int64 (N,), the examples of ``records`` in this split.
      image_key: the image feature.
      (and the :class:`Photos` attributes)
    """

    records: Any
    indices: np.ndarray
    image_key: str = "image"

    def count(self) -> int:
        return len(self.indices)

    def decode(self, i: int) -> np.ndarray:
        index = int(self.indices[i])
        return decode_bytes(self.records[index][self.image_key], f"{index} of {self.source}")

    def select(self, chosen: np.ndarray) -> TfdsSplit:
        return dataclasses.replace(self, indices=self.indices[chosen], labels=self.labels[chosen])


def _scan(records: Any, spec: _Builder) -> tuple[np.ndarray, dict[int, str]]:
    """Every example's label, and class names from the per-example names if there are any."""
    labels = np.empty(len(records), np.int64)
    names: dict[int, str] = {}
    for key, example in examples(records):
        labels[key] = int(example[spec.label])
        if spec.class_name is not None:
            names.setdefault(int(labels[key]), text(example[spec.class_name]))
    return labels, names


def _split(
    records: Any, indices: np.ndarray, labels: np.ndarray, names: Sequence[str], source: str
) -> TfdsSplit:
    """The examples ``indices`` (with their builder ``labels``) relabelled to 0..K-1."""
    compact, present_names = compact_labels(labels, tuple(names))
    return TfdsSplit(
        records=records,
        indices=indices,
        labels=compact,
        class_names=present_names,
        source=source,
    )


def tfds_source(
    name: str, data_dir: str | None = None, *, verify_counts: bool = True
) -> dict[str, TfdsSplit]:
    """Opens a prepared tfds benchmark and cuts it into its deep-metric-learning splits.

    Scanning the labels reads every example once (without decoding the images).

    Args:
      name: ``caltech_birds2011``, ``cars196`` or ``stanford_online_products``.
      data_dir: the tfds data folder (tfds's default when None).
      verify_counts: check the split counts against the full dataset.

    Returns:
      ``{"train": ..., "test": ...}``.

    Raises:
      DataError: for an unknown name, a dataset that is not prepared (or not in a random
        access format), a missing tensorflow-datasets, or a partial copy (with
        ``verify_counts``).
    """
    if name not in BUILDERS:
        raise DataError(f"unknown tfds benchmark {name!r}; known: {', '.join(sorted(BUILDERS))}")
    spec = BUILDERS[name]
    parts = ["train+test"] if spec.cut is not None else ["train", "test"]
    sources = open_records(name, data_dir, parts, spec.images)
    class_label = sources[0].dataset_info.features[spec.label]
    where = f"{name} in {data_dir or 'the default tfds data_dir'}"
    splits = {}
    if spec.cut is not None:
        labels, names = _scan(sources[0], spec)
        all_names = [names.get(c, class_label.names[c]) for c in range(class_label.num_classes)]
        for split, keep in (("train", labels < spec.cut), ("test", labels >= spec.cut)):
            indices = np.flatnonzero(keep)
            source = f"tfds {where} ({split})"
            splits[split] = _split(sources[0], indices, labels[indices], all_names, source)
    else:
        # The builder's class ids start at 0; the dataset's own ones (the class names of the
        # file reader) at 1.
        all_names = [str(c + 1) for c in range(class_label.num_classes)]
        for split, records in zip(parts, sources, strict=True):
            labels, _ = _scan(records, spec)
            indices = np.arange(len(records))
            splits[split] = _split(records, indices, labels, all_names, f"tfds {where} ({split})")
    if verify_counts:
        check_counts(splits, spec.expected, where=where, title=spec.title)
    return splits


def _reader(builder: str) -> Reader:
    """The TFDS_BENCHMARKS reader of the benchmark prepared as tfds ``builder``."""

    def read(
        root: str, *, verify_counts: bool = True, check_files: bool = True
    ) -> dict[str, TfdsSplit]:
        del check_files  # the images are records of the prepared dataset: no files to check
        return tfds_source(builder, root or None, verify_counts=verify_counts)

    read.__doc__ = (
        f"Reads {BUILDERS[builder].title} from the tfds builder {builder} prepared in ``root`` "
        "(a tfds data folder; tfds's default when empty)."
    )
    return read


for _name, _spec in BUILDERS.items():
    TFDS_BENCHMARKS.register(_spec.benchmark)(_reader(_name))
