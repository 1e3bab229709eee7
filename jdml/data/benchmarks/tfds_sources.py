"""The benchmarks as prepared tensorflow-datasets builders, read without TensorFlow.

``tfds.data_source`` gives random access to a dataset prepared in the ArrayRecord format; this
needs no TensorFlow. Preparing one does (the builders read their archives through TensorFlow):
``tfds build NAME --data_dir=DIR --file_format=array_record`` on a machine with TensorFlow, then
copy ``DIR`` here.

The builders' own splits are re-cut into the deep-metric-learning ones where they share
classes:

``caltech_birds2011``
  train and test together, labels (class id - 1) below 100 for training, the rest for testing.
``cars196``
  train and test together, labels below 98 for training, the rest for testing.
``stanford_online_products``
  its own train and test (disjoint classes already).

Images are kept encoded in the source and decoded on access, with the same conversion to RGB
as the file readers (:func:`jdml.data.benchmarks.images.decode_image`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from jdml.data.benchmarks.common import check_counts
from jdml.data.benchmarks.images import decode_bytes
from jdml.errors import DataError

# Records read at a time when scanning a source for its labels.
_SCAN_CHUNK = 1024


@dataclasses.dataclass(frozen=True)
class _Builder:
    """How to read one tfds builder: its features and how its splits become the DML ones."""

    title: str
    label: str  # the ClassLabel feature
    images: tuple[str, ...]  # encoded image features (read as bytes, not decoded)
    cut: int | None  # labels below it train, the rest test; None: the builder's own splits
    class_name: str | None  # a per-example text feature naming the class
    expected: dict[str, tuple[int, int]]


BUILDERS = {
    "caltech_birds2011": _Builder(
        title="CUB-200-2011",
        label="label",
        images=("image", "segmentation_mask"),
        cut=100,
        class_name="label_name",
        expected={"train": (5_864, 100), "test": (5_924, 100)},
    ),
    "cars196": _Builder(
        title="Cars196",
        label="label",
        images=("image",),
        cut=98,
        class_name=None,
        expected={"train": (8_054, 98), "test": (8_131, 98)},
    ),
    "stanford_online_products": _Builder(
        title="Stanford Online Products",
        label="class_id",
        images=("image",),
        cut=None,
        class_name=None,
        expected={"train": (59_551, 11_318), "test": (60_502, 11_316)},
    ),
}


class TfdsSplit:
    """One deep-metric-learning split of a prepared tfds dataset, with random access.

    ``split[i]`` is ``(image, label)``: the image decoded to uint8 (H, W, 3) RGB, the label in
    0..K-1 (sorted order of the builder's labels).

    Attributes:
      labels: int32 (N,), the label of every example.
      class_names: one name per label.
      source: where the split came from (for logs and results).
    """

    def __init__(
        self,
        records: Any,
        indices: np.ndarray,
        labels: np.ndarray,
        class_names: tuple[str, ...],
        source: str,
    ) -> None:
        """Wraps examples ``indices`` of the tfds data source ``records``."""
        self._records = records
        self._indices = indices
        self.labels = labels
        self.class_names = class_names
        self.source = source

    def __len__(self) -> int:
        return len(self._indices)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        """The decoded image and label of example ``i`` (raises DataError if undecodable)."""
        record = self._records[int(self._indices[i])]
        image = decode_bytes(record["image"], f"{i} of {self.source}")
        return image, int(self.labels[i])


def _text(value: object) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _scan(records: Any, spec: _Builder) -> tuple[np.ndarray, dict[int, str]]:
    """Every example's label, and class names from the per-example names if there are any."""
    labels = np.empty(len(records), np.int64)
    names: dict[int, str] = {}
    for start in range(0, len(records), _SCAN_CHUNK):
        keys = list(range(start, min(start + _SCAN_CHUNK, len(records))))
        for key, example in zip(keys, records.__getitems__(keys), strict=True):
            labels[key] = int(example[spec.label])
            if spec.class_name is not None:
                names.setdefault(int(labels[key]), _text(example[spec.class_name]))
    return labels, names


def _split(
    records: Any, indices: np.ndarray, labels: np.ndarray, names: Sequence[str], source: str
) -> TfdsSplit:
    """The examples ``indices`` (with their builder ``labels``) relabelled to 0..K-1."""
    present = np.unique(labels)
    return TfdsSplit(
        records=records,
        indices=indices,
        labels=np.searchsorted(present, labels).astype(np.int32),
        class_names=tuple(names[c] for c in present),
        source=source,
    )


def _cannot_open(tfds: Any, name: str, data_dir: str | None, err: Exception) -> DataError:
    """The DataError for a dataset that ``tfds.data_source`` could not open, with the fix."""
    builder = tfds.builder(name, data_dir=data_dir)
    build = f"tfds build {name} --data_dir={builder.data_dir_root} --file_format=array_record"
    if not builder.is_prepared():
        return DataError(
            f"no prepared {name} in {builder.data_dir_root} (looked for {builder.data_dir}); "
            f"prepare it on a machine with TensorFlow with `{build}` and copy the folder there"
        )
    file_format = builder.info.file_format
    if file_format not in tfds.core.FileFormat.with_random_access():
        return DataError(
            f"{name} is prepared in {builder.data_dir} as {file_format.value}, which has no "
            f"random access; prepare it again with `{build}` (needs TensorFlow) or convert it "
            "with `tfds convert_format`"
        )
    return DataError(
        f"cannot open {name} in {builder.data_dir} for random access ({err}); is the copy "
        f"complete? prepare it again with `{build}` (needs TensorFlow)"
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
        access format), or a partial copy (with ``verify_counts``).
    """
    if name not in BUILDERS:
        raise DataError(f"unknown tfds benchmark {name!r}; known: {', '.join(sorted(BUILDERS))}")
    import tensorflow_datasets as tfds  # slow to import and only needed here

    spec = BUILDERS[name]
    decoders = {feature: tfds.decode.SkipDecoding() for feature in spec.images}
    parts = ["train+test"] if spec.cut is not None else ["train", "test"]
    try:
        sources = tfds.data_source(
            name, split=parts, data_dir=data_dir, download=False, decoders=decoders
        )
    except (NotImplementedError, FileNotFoundError, AssertionError, ValueError) as err:
        raise _cannot_open(tfds, name, data_dir, err) from err
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
