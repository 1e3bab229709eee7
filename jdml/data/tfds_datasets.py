"""Prepared tensorflow-datasets builders, read without TensorFlow, and the ``tfds`` source.

``tfds.data_source`` gives random access to a dataset prepared in the ArrayRecord format, and
needs no TensorFlow: it reads the records with ``array_record`` (which grain needs too) and
parses them with tensorflow-datasets' NumPy example parser. Preparing a dataset does need
TensorFlow (the builders read their archives through it): run
``tfds build NAME --data_dir=DIR --file_format=array_record`` on a machine with TensorFlow, then
copy ``DIR`` here. Image features are read as their encoded bytes and decoded with Pillow here.

The dependency: tensorflow-datasets 4.9.10 imports, opens a prepared ArrayRecord dataset and
reads it without TensorFlow (the tests run without TensorFlow installed). Importing it takes
0.3 to 0.4 s in a fresh process (0.2 s and 350 modules after jdml's data modules: absl, etils,
tensorflow-metadata, dm-tree, ...; opening and reading a dataset loads some 200 more), and
installing it adds pyarrow (170 MB) and 15 other packages nothing else here uses. Only these
optional sources need it, so it is the extra ``jdml[tfds]`` (``pip install 'jdml[tfds]'``),
imported on first use (:func:`import_tfds`): never by ``import jdml`` (4 ms) nor by a run that
reads no tfds data. Without it, reading tfds data is a :class:`DataError` naming the extra.

``tfds`` in ``DATASETS`` (``data.name=tfds``) reads any tfds image dataset with class labels
into memory, like the folder source: ``data.tfds_name`` the builder (``mnist``,
``oxford_flowers102``, ...), ``data.path`` the tfds data folder (tfds's default when empty),
``data.tfds_image_key`` and ``data.tfds_label_key`` the features (an ``Image`` and a
``ClassLabel`` or integer scalar), ``data.tfds_splits`` the builder's splits to read (tfds's
split syntax, ``train+test`` or ``train[:50%]``; empty: all of them, joined). The images are
fitted to ``data.image_size`` and ``data.channels`` as the folder source fits its files, and
:func:`jdml.data.splits.split_by_class` cuts the classes into unseen train and test halves.
"""

from __future__ import annotations

import io
import re
import warnings
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any

import numpy as np

from jdml.data.arrays import ImageArrays
from jdml.data.pixels import DECODE_ERRORS
from jdml.data.sources import (
    DATASETS,
    SKIP_HINT,
    _check_channels,
    _check_image_size,
    square_image,
)
from jdml.errors import DataError

INSTALL_HINT = "pip install 'jdml[tfds]'"

# Records read at a time when scanning a data source.
_CHUNK = 1024


def import_tfds() -> ModuleType:
    """tensorflow_datasets, imported on first use (it is slow to import and optional).

    Raises:
      DataError: naming the extra that installs it, if it is not installed.
    """
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:
        raise DataError(
            f"reading tfds datasets needs the package tensorflow-datasets: {INSTALL_HINT}"
        ) from err
    return tfds


def build_command(name: str, data_dir: str) -> str:
    """The command that prepares ``name`` in ``data_dir`` for random access."""
    return f"tfds build {name} --data_dir={data_dir} --file_format=array_record"


def open_builder(tfds: ModuleType, name: str, data_dir: str | None) -> Any:
    """The tfds builder ``name`` reading ``data_dir`` (tfds's default when None).

    Raises:
      DataError: if tfds knows no such dataset and none is prepared there.
    """
    try:
        return tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as err:
        where = data_dir or "the default tfds data_dir"
        raise DataError(
            f"tfds has no dataset {name!r} (not in its catalogue, none prepared in {where}); "
            "check the name, e.g. mnist or oxford_flowers102"
        ) from err


def unprepared(tfds: ModuleType, builder: Any) -> DataError | None:
    """The DataError for a builder that is not prepared for random access, or None if it is."""
    name = builder.name
    build = build_command(name, builder.data_dir_root)
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
    return None


def open_records(
    name: str, data_dir: str | None, parts: list[str], encoded: Iterable[str]
) -> list[Any]:
    """Opens the splits ``parts`` of the prepared dataset ``name`` for random access.

    Args:
      name: the tfds builder.
      data_dir: the tfds data folder (tfds's default when None).
      parts: tfds split specifications (``train``, ``train+test``, ``train[:10%]``).
      encoded: features returned as stored (image bytes), not decoded.

    Returns:
      One data source per part: ``len()``, ``source[i]`` and ``source.__getitems__(keys)``
      give examples as dicts of feature values.

    Raises:
      DataError: for an unknown or unprepared dataset, a dataset without random access, or a
        copy that cannot be opened, each with the command that prepares it.
    """
    tfds = import_tfds()
    decoders = {feature: tfds.decode.SkipDecoding() for feature in encoded}
    try:
        return tfds.data_source(
            name, split=parts, data_dir=data_dir, download=False, decoders=decoders
        )
    except (NotImplementedError, FileNotFoundError, AssertionError, ValueError) as err:
        builder = open_builder(tfds, name, data_dir)
        problem = unprepared(tfds, builder)
        if problem is not None:
            raise problem from err
        build = build_command(name, builder.data_dir_root)
        raise DataError(
            f"cannot open {name} in {builder.data_dir} for random access ({err}); is the copy "
            f"complete? prepare it again with `{build}` (needs TensorFlow)"
        ) from err


def examples(records: Any) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every example of a data source with its index, read in chunks."""
    for start in range(0, len(records), _CHUNK):
        keys = list(range(start, min(start + _CHUNK, len(records))))
        yield from zip(keys, records.__getitems__(keys), strict=True)


def text(value: object) -> str:
    """A text feature's value (bytes as stored) as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------- data.name=tfds


def describe_features(features: Any) -> str:
    """The top-level features of a builder as ``name (Kind)``, for messages."""
    return ", ".join(f"{key} ({type(feature).__name__})" for key, feature in features.items())


def _is_label(tfds: ModuleType, feature: Any) -> bool:
    """Whether ``feature`` can label the examples: a ClassLabel or an integer scalar."""
    if isinstance(feature, tfds.features.ClassLabel):
        return True
    return (
        isinstance(feature, tfds.features.Tensor)
        and tuple(feature.shape) == ()
        and np.issubdtype(np.dtype(feature.np_dtype), np.integer)
    )


def check_features(tfds: ModuleType, builder: Any, image_key: str, label_key: str) -> None:
    """Checks that ``image_key`` is an image feature and ``label_key`` a label.

    Raises:
      DataError: naming the wrong key and listing the builder's features.
    """
    features = builder.info.features
    found = describe_features(features)
    if image_key not in features or not isinstance(features[image_key], tfds.features.Image):
        raise DataError(
            f"data.tfds_image_key={image_key!r} is not an Image feature of {builder.name} "
            f"(its features: {found}); set --config.data.tfds_image_key to one of its images"
        )
    if label_key not in features or not _is_label(tfds, features[label_key]):
        raise DataError(
            f"data.tfds_label_key={label_key!r} is not a ClassLabel or integer feature of "
            f"{builder.name} (its features: {found}); set --config.data.tfds_label_key to its "
            "class label"
        )


def split_parts(builder: Any, splits: str) -> str:
    """``splits`` checked against the builder's splits; empty: all of them, joined with ``+``.

    Raises:
      DataError: for a split the builder does not have, listing the ones it has.
    """
    have = sorted(builder.info.splits)
    if not splits:
        return "+".join(have)
    names = [re.sub(r"\[.*\]$", "", part).strip() for part in splits.split("+")]
    unknown = [n for n in names if n not in have]
    if unknown:
        raise DataError(
            f"data.tfds_splits={splits!r} names {', '.join(map(repr, unknown))}, which "
            f"{builder.name} does not have; its splits: {', '.join(have)} "
            f"(e.g. --config.data.tfds_splits={'+'.join(have)})"
        )
    return splits


def class_names(tfds: ModuleType, feature: Any, labels: np.ndarray, where: str) -> tuple[str, ...]:
    """The names of a ClassLabel, or the numbers of an integer label as names.

    Raises:
      DataError: for negative integer labels.
    """
    if isinstance(feature, tfds.features.ClassLabel):
        return tuple(feature.names)
    if len(labels) and labels.min() < 0:
        raise DataError(f"{where} has negative labels; set data.tfds_label_key to a class label")
    return tuple(str(i) for i in range(int(labels.max()) + 1 if len(labels) else 0))


def _decode(data: bytes, size: int, channels: int, name: str) -> np.ndarray:
    """Encoded image bytes fitted to the (size, size, channels) square."""
    try:
        return square_image(io.BytesIO(data), size, channels)
    except DECODE_ERRORS as err:
        raise DataError(
            f"cannot decode the image of {name}: {err}; prepare the dataset again{SKIP_HINT}"
        ) from err


#: The loader's own ``data.*`` keys (its options as ``data.tfds_<option>``, see
#: ``jdml.data.loading.loader_options``): the builder, its image and label features, and the
#: splits read (tfds's split syntax, e.g. "train+test" or "train[:50%]"; "": all of them).
KEYS = {"tfds_name": "", "tfds_image_key": "image", "tfds_label_key": "label", "tfds_splits": ""}


@DATASETS.register("tfds", source="tfds", keys=KEYS)
def load_tfds(
    *,
    path: str = "",
    image_size: int = 32,
    cache_dir: str | None = None,
    channels: int = 1,
    skip_unreadable: bool = False,
    name: str = "",
    image_key: str = "image",
    label_key: str = "label",
    splits: str = "",
) -> ImageArrays:
    """Any prepared tfds image dataset with class labels, in memory (see the module docstring).

    Args:
      path: the tfds data folder (tfds's default when empty).
      name: the builder (``data.tfds_name``).
      image_key: the image feature (``data.tfds_image_key``).
      label_key: the label feature (``data.tfds_label_key``).
      splits: the builder's splits to read (``data.tfds_splits``); empty: all.
      skip_unreadable: skip images that cannot be decoded (with a warning) instead of raising.

    Raises:
      DataError: for a missing name, an unknown or unprepared dataset (with the command that
        prepares it), a wrong feature key (listing the features), an unknown split or an
        undecodable image.
    """
    del cache_dir
    _check_channels(channels)
    _check_image_size(image_size)
    if not name:
        raise DataError(
            "data.name=tfds reads a prepared tfds dataset: name its builder with "
            "--config.data.tfds_name=<builder> (e.g. oxford_flowers102) and its folder with "
            "--config.data.path=<tfds data_dir>"
        )
    tfds = import_tfds()
    data_dir = path or None
    builder = open_builder(tfds, name, data_dir)
    problem = unprepared(tfds, builder)
    if problem is not None:
        raise problem
    check_features(tfds, builder, image_key, label_key)
    parts = split_parts(builder, splits)
    features = builder.info.features
    encoded = [k for k, f in features.items() if isinstance(f, tfds.features.Image)]
    (records,) = open_records(name, data_dir, [parts], encoded)
    where = f"tfds {name} ({parts}) in {data_dir or 'the default tfds data_dir'}"
    images, labels = [], []
    for index, example in examples(records):
        try:
            images.append(_decode(example[image_key], image_size, channels, f"{index} of {where}"))
        except DataError as err:
            if not skip_unreadable:
                raise
            warnings.warn(f"skipping example {index} of {where}: {err.__cause__}", stacklevel=2)
            continue
        labels.append(int(example[label_key]))
    if not images:
        raise DataError(f"{where} holds no readable images")
    label_array = np.asarray(labels, np.int64)
    return ImageArrays(
        images=np.stack(images),
        labels=label_array.astype(np.int32),
        class_names=class_names(tfds, features[label_key], label_array, where),
        source=where,
    )
