"""CUB-200-2011 in the layout of its official archive.

``CUB_200_2011/images.txt`` (``image_id relative_path``), ``image_class_labels.txt``
(``image_id class_id``), ``classes.txt`` (``class_id name``) and the images under ``images/``.
The deep-metric-learning split is by class id: 1-100 train (5,864 images), 101-200 test (5,924);
the archive's own ``train_test_split.txt`` (a per-image split) is not used.
"""

from __future__ import annotations

from pathlib import Path

from jdml.data.benchmarks.common import (
    BENCHMARKS,
    FileList,
    as_int,
    check_counts,
    check_files_exist,
    dataset_folder,
    relabel,
    require_file,
    table_rows,
)
from jdml.errors import DataError

TITLE = "CUB-200-2011"
FOLDER = "CUB_200_2011"
INDEX_FILES = ("images.txt", "image_class_labels.txt", "classes.txt")
LAYOUT = (
    f"{FOLDER}/ with images.txt, image_class_labels.txt, classes.txt and "
    "images/<class folder>/<image>.jpg (the CUB_200_2011.tgz archive unpacked)"
)
#: Class ids up to this one are training classes, the rest test classes.
LAST_TRAIN_CLASS = 100
EXPECTED = {"train": (5_864, 100), "test": (5_924, 100)}


def _id_table(path: Path, what: str) -> dict[int, str]:
    """An index file of ``id value`` rows as {id: value} (values hold no spaces)."""
    table: dict[int, str] = {}
    for number, (key, value, *_) in table_rows(path, 2):
        key_id = as_int(key, path, number, what)
        if key_id in table:
            raise DataError(f"{path} line {number}: {what} {key_id} is listed twice")
        table[key_id] = value
    return table


def _class_table(path: Path) -> dict[int, int]:
    """``image_class_labels.txt`` as {image id: class id}."""
    table: dict[int, int] = {}
    for number, (key, value, *_) in table_rows(path, 2):
        image_id = as_int(key, path, number, "image id")
        if image_id in table:
            raise DataError(f"{path} line {number}: image id {image_id} is listed twice")
        table[image_id] = as_int(value, path, number, "class id")
    return table


@BENCHMARKS.register("cub200")
def read_cub200(
    root: str, *, verify_counts: bool = True, check_files: bool = True
) -> dict[str, FileList]:
    """Reads CUB-200-2011 into its deep-metric-learning splits (see the module docstring).

    Args:
      root: the ``CUB_200_2011`` folder or its parent.
      verify_counts: check the counts against the full dataset.
      check_files: check that every listed image exists.

    Returns:
      ``{"train": ..., "test": ...}``.

    Raises:
      DataError: for a missing folder or index file, inconsistent index files, a partial copy
        (with ``verify_counts``) or missing images (with ``check_files``).
    """
    folder = dataset_folder(
        root, lambda d: (d / INDEX_FILES[0]).is_file(), title=TITLE, expected=LAYOUT
    )
    images_txt, labels_txt, classes_txt = (
        require_file(folder, name, LAYOUT) for name in INDEX_FILES
    )
    images = _id_table(images_txt, "image id")
    class_of = _class_table(labels_txt)
    names = _id_table(classes_txt, "class id")
    if images.keys() != class_of.keys():
        odd = sorted(images.keys() ^ class_of.keys())
        raise DataError(
            f"{images_txt.name} and {labels_txt.name} in {folder} list different image ids "
            f"(e.g. {odd[:3]}); both should come from the same archive"
        )
    unnamed = sorted(set(class_of.values()) - names.keys())
    if unnamed:
        raise DataError(f"{classes_txt} has no names for class ids {unnamed[:5]}")
    image_root = folder / "images"
    splits = {}
    for split, wanted in (("train", True), ("test", False)):
        ids = [i for i in images if (class_of[i] <= LAST_TRAIN_CLASS) == wanted]
        splits[split] = relabel(
            [str(image_root / images[i]) for i in ids],
            [class_of[i] for i in ids],
            names,
            f"cub200 {folder} ({split})",
        )
    if verify_counts:
        check_counts(splits, EXPECTED, where=str(images_txt), title=TITLE)
    if check_files:
        check_files_exist(splits, expected=f"the images under {image_root}: {LAYOUT}")
    return splits
