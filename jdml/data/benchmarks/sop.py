"""Stanford Online Products in the layout of its official archive.

``Stanford_Online_Products/Ebay_train.txt`` and ``Ebay_test.txt``, each a header line
``image_id class_id super_class_id path`` and one row per image, the paths relative to the
dataset folder (``bicycle_final/<image>.JPG``). The two files are the deep-metric-learning split
already: train 11,318 classes / 59,551 images, test 11,316 classes / 60,502 images. Class
names are the class ids.
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

TITLE = "Stanford Online Products"
FOLDER = "Stanford_Online_Products"
INDEX_FILES = {"train": "Ebay_train.txt", "test": "Ebay_test.txt"}
HEADER = ("image_id", "class_id", "super_class_id", "path")
LAYOUT = (
    f"{FOLDER}/ with Ebay_train.txt, Ebay_test.txt ({' '.join(HEADER)}) and the "
    "<super class>_final/ image folders (the Stanford_Online_Products.zip archive unpacked)"
)
EXPECTED = {"train": (59_551, 11_318), "test": (60_502, 11_316)}


def _read_split(folder: Path, split: str) -> FileList:
    """One ``Ebay_<split>.txt`` as a FileList."""
    index = require_file(folder, INDEX_FILES[split], LAYOUT)
    paths, classes = [], []
    for number, fields in table_rows(index, len(HEADER)):
        if fields[0] == HEADER[0]:
            continue
        classes.append(as_int(fields[1], index, number, "class_id"))
        paths.append(str(folder / fields[3]))
    return relabel(paths, classes, {c: c for c in classes}, f"sop {folder} ({split})")


@BENCHMARKS.register("sop")
def read_sop(
    root: str, *, verify_counts: bool = True, check_files: bool = True
) -> dict[str, FileList]:
    """Reads Stanford Online Products into its deep-metric-learning splits.

    Args:
      root: the ``Stanford_Online_Products`` folder or its parent.
      verify_counts: check the counts against the full dataset.
      check_files: check that every listed image exists.

    Returns:
      ``{"train": ..., "test": ...}``.

    Raises:
      DataError: for a missing folder or index file, a damaged index, a partial copy (with
        ``verify_counts``) or missing images (with ``check_files``).
    """
    folder = dataset_folder(
        root, lambda d: (d / INDEX_FILES["train"]).is_file(), title=TITLE, expected=LAYOUT
    )
    splits = {split: _read_split(folder, split) for split in INDEX_FILES}
    if verify_counts:
        where = {split: str(folder / name) for split, name in INDEX_FILES.items()}
        check_counts(splits, EXPECTED, where=where, title=TITLE)
    if check_files:
        check_files_exist(splits, expected=f"the images under {folder}: {LAYOUT}")
    return splits
