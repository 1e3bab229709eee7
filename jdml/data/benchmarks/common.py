"""Shared parts of the benchmark readers: the photo lists, the registries, locating and checking.

A reader finds the dataset folder (``root`` itself or one of its subfolders), parses the index
files into :class:`FileList` splits, and optionally checks the counts against the full dataset
and that every listed image exists. Every problem is a :class:`DataError` naming what was
expected where.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from jdml.data.arrays import compact_labels
from jdml.data.benchmarks.images import decode_image
from jdml.data.transforms import eval_view
from jdml.errors import DataError
from jdml.registry import Registry


@dataclasses.dataclass(frozen=True, kw_only=True)
class Photos:
    """The photos of one split with their class labels, decoded as they are read.

    The split interface of :class:`jdml.data.arrays.ImageSet` on photos of their own sizes; a
    subclass says where photo ``i`` comes from (:meth:`decode`) and how many it lists
    (:meth:`count`), and keeps a selection of them (:meth:`select`): files
    (:class:`FileList`) or the records of a prepared tfds dataset
    (:class:`jdml.data.benchmarks.tfds_sources.TfdsSplit`).

    Attributes:
      labels: int32 (N,), values 0..K-1 in sorted order of the dataset's own class ids.
      class_names: one name per label.
      source: where the split came from (for logs and results).
      resize: the evaluation view's short side.
      crop: the evaluation view's centre square.
      filter: the evaluation view's resize filter ("bilinear" or "bicubic").
    """

    labels: np.ndarray
    class_names: tuple[str, ...]
    source: str = ""
    resize: int = 256
    crop: int = 224
    filter: str = "bilinear"
    #: Whether reading a photo decodes an encoded image (the input pipeline then sizes itself
    #: for decoding: ``jdml.data.pipeline.resolve_pipeline_sizes``).
    decodes: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.labels.shape != (self.count(),) or self.labels.dtype != np.int32:
            raise ValueError(
                f"labels must be int32 with one entry per photo ({self.count()}), "
                f"got {self.labels.dtype} {self.labels.shape}"
            )

    def count(self) -> int:
        """The number of photos listed (the labels must match it)."""
        raise NotImplementedError

    def decode(self, i: int) -> np.ndarray:
        """Photo ``i`` as uint8 (H, W, 3) RGB (raises DataError if it cannot be read)."""
        raise NotImplementedError

    def select(self, chosen: np.ndarray) -> Photos:
        """The photos at the positions ``chosen``, with their labels."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def subset(self, mask_or_index: np.ndarray) -> Photos:
        """The selected photos; labels keep their values (see ``relabel``)."""
        return self.select(np.arange(len(self))[mask_or_index])

    def relabel(self) -> Photos:
        """Maps the labels present onto 0..K-1 in sorted order (class names kept aligned)."""
        labels, names = compact_labels(self.labels, self.class_names)
        return dataclasses.replace(self, labels=labels, class_names=names)

    def load(self, index: np.ndarray) -> list[np.ndarray]:
        """The decoded photos ``index`` as uint8 (H, W, 3) RGB arrays of their own sizes."""
        return [self.decode(int(i)) for i in np.asarray(index).reshape(-1)]

    def eval_images(self, index: np.ndarray) -> np.ndarray:
        """The photos ``index`` as the evaluation sees them: the short side resized to
        ``resize`` (with ``filter``), the centre ``crop`` x ``crop`` square, float32 in [0, 1]."""
        view = functools.partial(eval_view, resize=self.resize, crop=self.crop, filter=self.filter)
        crops = [view(photo) for photo in self.load(index)]
        return np.stack(crops).astype(np.float32) / 255.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class FileList(Photos):
    """The image files of one split with their class labels (images are decoded later).

    Attributes:
      paths: absolute image paths (and the :class:`Photos` attributes).
    """

    paths: tuple[str, ...]

    def count(self) -> int:
        return len(self.paths)

    def decode(self, i: int) -> np.ndarray:
        return decode_image(self.paths[i])

    def select(self, chosen: np.ndarray) -> FileList:
        return dataclasses.replace(
            self, paths=tuple(self.paths[i] for i in chosen), labels=self.labels[chosen]
        )


class Counted(Protocol):
    """A split whose image and class counts can be checked (a FileList or a tfds split)."""

    def __len__(self) -> int: ...

    @property
    def num_classes(self) -> int: ...


class Reader(Protocol):
    """The signature every benchmark reader has (``check_files`` only matters for files)."""

    def __call__(
        self, root: str, *, verify_counts: bool = True, check_files: bool = True
    ) -> Mapping[str, Photos]: ...


#: Benchmark readers by name, of the files in the official archives' layouts; each returns
#: ``{split name: FileList}``.
BENCHMARKS: Registry[Reader] = Registry("benchmark")
#: The benchmarks read from prepared tensorflow-datasets builders instead (``root`` is the tfds
#: data folder), by the same names and into the same splits (:mod:`.tfds_sources`).
TFDS_BENCHMARKS: Registry[Reader] = Registry("tfds benchmark")
#: ``data.source`` -> the readers of the benchmarks that source holds.
SOURCES: Registry[Registry[Reader]] = Registry("data source")
SOURCES.register("files")(BENCHMARKS)
SOURCES.register("tfds")(TFDS_BENCHMARKS)


def read_benchmark(
    name: str,
    root: str,
    *,
    source: str = "files",
    verify_counts: bool = True,
    check_files: bool = True,
) -> Mapping[str, Photos]:
    """Looks ``name`` up in the readers of ``source`` and reads the dataset under ``root``.

    Args:
      name: a registered benchmark (``cub200``, ``cars196``, ``sop``, ``inshop``).
      root: the folder the dataset archive unpacked to, or its parent; for ``source="tfds"``
        the tfds data folder.
      source: ``files`` (:data:`BENCHMARKS`) or ``tfds`` (:data:`TFDS_BENCHMARKS`).
      verify_counts: check the class and image counts against the full dataset.
      check_files: check that every listed image file exists.

    Returns:
      The splits by name.

    Raises:
      UnknownNameError: for an unregistered source, or a name its source does not hold.
      DataError: when the dataset is missing, malformed, partial or lacks images.
    """
    reader = SOURCES.get(source).get(name)
    return reader(root, verify_counts=verify_counts, check_files=check_files)


# --------------------------------------------------------------------------- locating


def root_folder(root: str, *, title: str, expected: str) -> Path:
    """``root`` as an absolute Path, or a DataError if it is empty or not a folder."""
    if not root:
        raise DataError(f"the {title} reader needs a root folder: {expected}")
    base = Path(root).expanduser().absolute()
    if not base.is_dir():
        raise DataError(
            f"{title} root {base} does not exist or is not a folder; expected {expected}"
        )
    return base


def matching(base: Path, looks_like: Callable[[Path], bool]) -> list[Path]:
    """``[base]`` if it holds the dataset, else its subfolders that do."""
    if looks_like(base):
        return [base]
    return [sub for sub in subfolders(base) if looks_like(sub)]


def one_copy(base: Path, found: list[Path], *, title: str, expected: str) -> Path:
    """The single dataset folder found under ``base``, or a DataError for none or several."""
    if len(found) > 1:
        names = ", ".join(sub.name for sub in found)
        raise DataError(
            f"{base} holds several {title} copies ({names}); pass the one to use as root"
        )
    if not found:
        raise DataError(f"no {title} in {base} or its subfolders; expected {expected}")
    return found[0]


def dataset_folder(
    root: str, looks_like: Callable[[Path], bool], *, title: str, expected: str
) -> Path:
    """The dataset folder: ``root`` itself or the one subfolder of it that holds the dataset.

    Args:
      root: the path the user gave.
      looks_like: whether a folder holds the dataset (e.g. has its main index file).
      title: the dataset's name for messages.
      expected: the expected layout, for messages.

    Returns:
      The absolute dataset folder.

    Raises:
      DataError: if ``root`` does not exist, holds no copy, or holds several.
    """
    base = root_folder(root, title=title, expected=expected)
    return one_copy(base, matching(base, looks_like), title=title, expected=expected)


def subfolders(folder: Path) -> list[Path]:
    """The non-hidden subfolders of ``folder``, sorted by name."""
    return sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))


def require_file(folder: Path, name: str, expected: str) -> Path:
    """``folder/name``, or a DataError naming that missing file and the expected layout."""
    path = folder / name
    if not path.is_file():
        raise DataError(f"{path} is missing; expected {expected}")
    return path


# --------------------------------------------------------------------------- parsing


def table_rows(path: Path, columns: int) -> Iterator[tuple[int, list[str]]]:
    """The whitespace-separated rows of an index file as (line number, fields).

    Args:
      path: the index file.
      columns: the fewest fields a row may have.

    Returns:
      An iterator over the non-blank rows.

    Raises:
      DataError: for an unreadable file or a row with fewer than ``columns`` fields.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read {path}: {err}") from err
    for number, line in enumerate(lines, start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < columns:
            raise DataError(
                f"{path} line {number} has {len(fields)} fields, expected {columns}: {line!r}; "
                "the file looks damaged: re-extract it from the dataset archive"
            )
        yield number, fields


def as_int(text: str, path: Path, number: int, what: str) -> int:
    """``text`` as an int, or a DataError naming the file, line and field."""
    try:
        return int(text)
    except ValueError:
        raise DataError(
            f"{path} line {number}: {what} {text!r} is not an integer; the file looks damaged: "
            "re-extract it from the dataset archive"
        ) from None


def relabel(
    paths: Sequence[str],
    class_ids: Sequence[Hashable],
    names: Mapping[Hashable, object],
    source: str,
) -> FileList:
    """A FileList whose labels are the sorted distinct ``class_ids`` mapped onto 0..K-1.

    Args:
      paths: absolute image paths.
      class_ids: the dataset's own class id of each image (sortable).
      names: class id -> class name.
      source: description for :attr:`FileList.source`.

    Returns:
      The file list.
    """
    classes = sorted(set(class_ids))
    return labelled(paths, class_ids, classes, names, source)


def labelled(
    paths: Sequence[str],
    class_ids: Sequence[Hashable],
    classes: Sequence[Hashable],
    names: Mapping[Hashable, object],
    source: str,
) -> FileList:
    """A FileList labelled by the positions of ``class_ids`` in ``classes``.

    Unlike :func:`relabel` the label space is given, so that several splits can share one.

    Args:
      paths: absolute image paths.
      class_ids: the dataset's own class id of each image, each one of ``classes``.
      classes: the class ids in label order.
      names: class id -> class name.
      source: description for :attr:`FileList.source`.

    Returns:
      The file list.
    """
    index = {c: i for i, c in enumerate(classes)}
    return FileList(
        paths=tuple(paths),
        labels=np.fromiter((index[c] for c in class_ids), np.int32, len(class_ids)),
        class_names=tuple(str(names[c]) for c in classes),
        source=source,
    )


# --------------------------------------------------------------------------- checks


def check_counts(
    splits: Mapping[str, Counted],
    expected: dict[str, tuple[int, int]],
    *,
    where: str | Mapping[str, str],
    title: str,
    unit: str = "classes",
) -> None:
    """Checks each split's image and class counts against the full dataset's.

    Args:
      splits: the splits read.
      expected: split -> (images, classes) of the full dataset.
      where: what listed the images (an index file, a prepared dataset), for the message; a
        mapping gives it per split.
      title: the dataset's name, for the message.
      unit: what a class is called ("classes", "items").

    Raises:
      DataError: naming every split whose counts differ.
    """
    wrong = []
    for split, (images, classes) in expected.items():
        have = splits[split]
        if (len(have), have.num_classes) != (images, classes):
            lister = where if isinstance(where, str) else where[split]
            wrong.append(
                f"{lister} lists {len(have):,} {split} images of {have.num_classes:,} {unit}; "
                f"the full {title} has {images:,} of {classes:,}"
            )
    if wrong:
        raise DataError("; ".join(wrong) + f": is the copy partial? {USE_ANYWAY}")


#: How to use a copy whose counts differ from the full dataset's, as a user types it.
USE_ANYWAY = (
    "set --config.data.verify_counts=False to use it anyway (verify_counts=False from Python)"
)


def check_files_exist(splits: dict[str, FileList], *, expected: str, shown: int = 3) -> None:
    """Checks that every listed image file exists.

    Raises:
      DataError: with the number missing, the first ``shown`` of them and the expected layout.
    """
    paths = [p for files in splits.values() for p in files.paths]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        first = ", ".join(missing[:shown]) + (", ..." if len(missing) > shown else "")
        raise DataError(
            f"{len(missing):,} of the {len(paths):,} listed images are missing ({first}); "
            f"expected {expected}: unpack the image archive there"
        )


#: Threads :func:`find_unreadable` decodes with (Pillow releases the GIL while decoding).
DEFAULT_WORKERS = 8


def _unreadable(path: str) -> bool:
    try:
        decode_image(path)
    except DataError:
        return True
    return False


def find_unreadable(files: FileList, workers: int = DEFAULT_WORKERS) -> list[str]:
    """Tries to decode every file of ``files`` and returns those that fail.

    Args:
      files: the file list to check.
      workers: decoding threads.

    Returns:
      The paths that are missing or cannot be decoded, in list order.
    """
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        failed = list(pool.map(_unreadable, files.paths))
    return [path for path, bad in zip(files.paths, failed, strict=True) if bad]
