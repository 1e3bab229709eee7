"""Cars196 (Stanford Cars) in two layouts.

The all-images release
  ``car_ims/`` (``car_ims.tgz`` unpacked) next to ``cars_annos.mat``: a MATLAB struct array
  ``annotations`` with the fields ``relative_im_path`` (``car_ims/000001.jpg``), ``bbox_x1``,
  ``bbox_y1``, ``bbox_x2``, ``bbox_y2``, ``class`` (1..196) and ``test`` (the classification
  split, not used here), and a cell array ``class_names``. The deep-metric-learning split is by
  class id: 1-98 train (8,054 images), 99-196 test (8,131).
One folder per class
  ``<root>/<class folder>/<images>`` or ``<root>/images/<class folder>/<images>``, the classes
  being the folders in sorted order: the first half (``floor(C / 2)``; 98 of 196, the same
  split as above) are for training, the rest for testing. The images in a folder are read in
  sorted order; class names are the folder names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jdml.data.benchmarks.common import (
    BENCHMARKS,
    FileList,
    check_counts,
    check_files_exist,
    matching,
    one_copy,
    relabel,
    root_folder,
    subfolders,
)
from jdml.data.sources import IMAGE_SUFFIXES
from jdml.errors import DataError

TITLE = "Cars196"
ANNOTATIONS = "cars_annos.mat"
FIELDS = ("relative_im_path", "class")
LAYOUT = (
    f"a folder with {ANNOTATIONS} and car_ims/ (car_ims.tgz unpacked next to it), or one "
    "folder per class: <root>/<class folder>/<images> or <root>/images/<class folder>/<images>"
)
#: Class ids up to this one are training classes, the rest test classes.
LAST_TRAIN_CLASS = 98
EXPECTED = {"train": (8_054, 98), "test": (8_131, 98)}


def _has_images(folder: Path) -> bool:
    """Whether ``folder`` directly holds at least one non-hidden image file."""
    return any(
        f.suffix.lower() in IMAGE_SUFFIXES and not f.name.startswith(".")
        for f in folder.iterdir()
        if f.is_file()
    )


def _class_folders(folder: Path) -> list[Path] | None:
    """The class folders if ``folder`` holds one image folder per class (at least two)."""
    classes = subfolders(folder)
    if len(classes) >= 2 and all(_has_images(c) for c in classes):
        return classes
    return None


def _has_annotations(folder: Path) -> bool:
    """Whether ``folder`` holds the all-images release's annotation file."""
    return (folder / ANNOTATIONS).is_file()


def _has_class_folders(folder: Path) -> bool:
    """Whether ``folder`` or its ``images/`` holds one image folder per class."""
    images = folder / "images"
    return bool(_class_folders(folder) or (images.is_dir() and _class_folders(images)))


def _find(root: str) -> Path:
    """The dataset folder under ``root``: the annotation layout first, then the folder one.

    A parent folder may hold other benchmarks whose images are also one folder per class
    (CUB's ``images/``): among several such folders the one named like cars is taken.
    """
    base = root_folder(root, title=TITLE, expected=LAYOUT)
    found = matching(base, _has_annotations)
    if not found:
        found = matching(base, _has_class_folders)
        named = [f for f in found if "car" in f.name.lower()]
        found = named if len(found) > 1 and len(named) == 1 else found
    folder = one_copy(base, found, title=TITLE, expected=LAYOUT)
    if not _has_annotations(folder) and not _class_folders(folder):
        folder = folder / "images"
    return folder


# --------------------------------------------------------------------------- .mat layout


def _cell(value: object) -> object:
    """The single element of a (possibly nested) MATLAB cell or 1x1 matrix."""
    while isinstance(value, np.ndarray):
        if value.size != 1:
            raise ValueError(f"expected one value, got an array of shape {value.shape}")
        value = value.reshape(-1)[0]
    return value


def _load_annotations(file: Path) -> tuple[list[str], list[int], dict[int, str]]:
    """``cars_annos.mat`` as (relative paths, class ids, {class id: name})."""
    from scipy.io import loadmat  # scipy is slow to import and only needed here
    from scipy.io.matlab import MatReadError

    try:
        mat = loadmat(file)
    # scipy fails on a damaged file with whatever its parser hits first.
    except (MatReadError, OSError, ValueError, NotImplementedError, TypeError, IndexError) as err:
        raise DataError(
            f"cannot read {file} as a MATLAB file ({err}); re-download {ANNOTATIONS}"
        ) from err
    annotations = mat.get("annotations")
    if annotations is None or annotations.dtype.names is None:
        found = ", ".join(k for k in mat if not k.startswith("__")) or "none"
        raise DataError(
            f"{file} has no struct array 'annotations' (variables found: {found}); "
            f"expected the {ANNOTATIONS} of the all-images release"
        )
    missing = [f for f in FIELDS if f not in annotations.dtype.names]
    if missing:
        raise DataError(
            f"'annotations' in {file} lacks the fields {', '.join(missing)} (fields: "
            f"{', '.join(annotations.dtype.names)}); expected the {ANNOTATIONS} of the "
            "all-images release (cars_train_annos.mat and cars_test_annos.mat are not read)"
        )
    try:
        records = annotations.reshape(-1)
        paths = [str(_cell(r["relative_im_path"])) for r in records]
        classes = [int(_cell(r["class"])) for r in records]
        raw_names = mat.get("class_names")
        cells = [] if raw_names is None else list(np.asarray(raw_names).reshape(-1))
        names = {i + 1: str(_cell(n)) for i, n in enumerate(cells)}
    except (ValueError, TypeError) as err:
        raise DataError(f"{file} has an unexpected structure ({err})") from err
    for c in set(classes) - names.keys():
        names[c] = str(c)  # a file without class_names: the class ids serve as names
    return paths, classes, names


def _read_mat_layout(folder: Path) -> dict[str, FileList]:
    """The splits of the all-images release in ``folder`` (split by class id)."""
    paths, classes, names = _load_annotations(folder / ANNOTATIONS)
    source = f"cars196 {folder}"
    splits = {}
    for split, wanted in (("train", True), ("test", False)):
        keep = [i for i, c in enumerate(classes) if (c <= LAST_TRAIN_CLASS) == wanted]
        splits[split] = relabel(
            [str(folder / paths[i]) for i in keep],
            [classes[i] for i in keep],
            names,
            f"{source} ({split})",
        )
    return splits


# --------------------------------------------------------------------------- folder layout


def _read_folder_layout(folder: Path) -> dict[str, FileList]:
    """The splits of the class folders in ``folder`` (the first half of them train)."""
    classes = _class_folders(folder) or []
    half = len(classes) // 2
    splits = {}
    for split, chosen in (("train", classes[:half]), ("test", classes[half:])):
        paths, ids = [], []
        for index, class_folder in enumerate(chosen):
            files = sorted(
                f.name
                for f in class_folder.iterdir()
                if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES and not f.name.startswith(".")
            )
            paths += [str(class_folder / name) for name in files]
            ids += [index] * len(files)
        names = {i: c.name for i, c in enumerate(chosen)}
        splits[split] = relabel(paths, ids, names, f"cars196 {folder} ({split})")
    return splits


@BENCHMARKS.register("cars196")
def read_cars196(
    root: str, *, verify_counts: bool = True, check_files: bool = True
) -> dict[str, FileList]:
    """Reads Cars196 into its deep-metric-learning splits (see the module docstring).

    Args:
      root: the folder with ``cars_annos.mat`` and ``car_ims/``, the folder of class folders
        (or the one holding it as ``images/``), or the parent of either.
      verify_counts: check the counts against the full dataset.
      check_files: check that every listed image exists.

    Returns:
      ``{"train": ..., "test": ...}``.

    Raises:
      DataError: for a missing folder, an unreadable annotation file, a partial copy (with
        ``verify_counts``) or missing images (with ``check_files``).
    """
    folder = _find(root)
    if _has_annotations(folder):
        splits = _read_mat_layout(folder)
        where = str(folder / ANNOTATIONS)
    else:
        splits = _read_folder_layout(folder)
        where = f"{folder} (one folder per class)"
    if verify_counts:
        check_counts(splits, EXPECTED, where=where, title=TITLE)
    if check_files:
        check_files_exist(splits, expected=f"the images under {folder}: {LAYOUT}")
    return splits
