"""In-Shop Clothes Retrieval (DeepFashion) in the layout of its official release.

``Eval/list_eval_partition.txt``: the first line is the number of images, the second the
header ``image_name item_id evaluation_status``, then one row per image whose status is
``train``, ``query`` or ``gallery``; the image names (``img/<gender>/<category>/<item>/<file>``)
are relative to the dataset folder, so ``img.zip`` is unpacked next to ``Eval/`` (a copy
unpacked inside ``Img/`` is found too). Splits: train 3,997 items / 25,882 images; query
14,218 and gallery 12,612 images of 3,985 items. Query and gallery share one label space (the
sorted items of both), so an item has the same label in each. Class names are the item ids.
"""

from __future__ import annotations

from pathlib import Path

from jdml.data.benchmarks.common import (
    BENCHMARKS,
    USE_ANYWAY,
    FileList,
    as_int,
    check_counts,
    check_files_exist,
    dataset_folder,
    labelled,
    relabel,
    require_file,
    table_rows,
)
from jdml.errors import DataError

TITLE = "In-Shop Clothes Retrieval"
INDEX = "Eval/list_eval_partition.txt"
HEADER = ("image_name", "item_id", "evaluation_status")
SPLITS = ("train", "query", "gallery")
LAYOUT = (
    f"a folder with {INDEX} (image count, header '{' '.join(HEADER)}', then rows) and the "
    "images under img/ (Img/img.zip unpacked)"
)
EXPECTED = {"train": (25_882, 3_997), "query": (14_218, 3_985), "gallery": (12_612, 3_985)}


def _image_base(folder: Path) -> Path:
    """The folder the ``img/...`` names are relative to."""
    if not (folder / "img").is_dir() and (folder / "Img" / "img").is_dir():
        return folder / "Img"  # img.zip unpacked where it lies in the release
    return folder


def _rows(index: Path, verify_counts: bool) -> dict[str, list[tuple[str, str]]]:
    """The rows of the partition file by status: {status: [(image name, item id)]}."""
    rows: dict[str, list[tuple[str, str]]] = {split: [] for split in SPLITS}
    declared = None
    for number, fields in table_rows(index, 1):
        if declared is None:
            declared = as_int(fields[0], index, number, "the image count")
            continue
        if fields[0] == HEADER[0]:
            continue
        if len(fields) < len(HEADER):
            raise DataError(
                f"{index} line {number} has {len(fields)} fields, expected {len(HEADER)} "
                f"({' '.join(HEADER)}); re-extract the file from the dataset archive"
            )
        name, item, status = fields[:3]
        if status not in rows:
            raise DataError(
                f"{index} line {number}: evaluation_status {status!r} is not one of "
                f"{', '.join(SPLITS)}"
            )
        rows[status].append((name, item))
    if declared is None:
        raise DataError(f"{index} is empty; expected {LAYOUT}")
    listed = sum(len(r) for r in rows.values())
    if verify_counts and declared != listed:
        raise DataError(
            f"{index} declares {declared:,} images on its first line but lists {listed:,}: "
            f"is the file truncated? {USE_ANYWAY}"
        )
    return rows


@BENCHMARKS.register("inshop")
def read_inshop(
    root: str, *, verify_counts: bool = True, check_files: bool = True
) -> dict[str, FileList]:
    """Reads In-Shop Clothes Retrieval into its train, query and gallery splits.

    Args:
      root: the dataset folder (holding ``Eval/`` and ``img/``) or its parent.
      verify_counts: check the image count on the index's first line and the split counts
        against the full dataset.
      check_files: check that every listed image exists.

    Returns:
      ``{"train": ..., "query": ..., "gallery": ...}``; query and gallery share their labels
      and class names.

    Raises:
      DataError: for a missing folder or index file, a damaged index, a partial copy (with
        ``verify_counts``) or missing images (with ``check_files``).
    """
    folder = dataset_folder(root, lambda d: (d / INDEX).is_file(), title=TITLE, expected=LAYOUT)
    index = require_file(folder, INDEX, LAYOUT)
    rows = _rows(index, verify_counts)
    base = _image_base(folder)

    def paths(split: str) -> list[str]:
        return [str(base / name) for name, _ in rows[split]]

    def items(split: str) -> list[str]:
        return [item for _, item in rows[split]]

    source = f"inshop {folder}"
    names = {item: item for split in SPLITS for item in items(split)}
    splits = {"train": relabel(paths("train"), items("train"), names, f"{source} (train)")}
    shared = sorted(set(items("query")) | set(items("gallery")))
    for split in ("query", "gallery"):
        splits[split] = labelled(paths(split), items(split), shared, names, f"{source} ({split})")
    if verify_counts:
        check_counts(splits, EXPECTED, where=str(index), title=TITLE, unit="items")
    if check_files:
        check_files_exist(splits, expected=f"the images under {base / 'img'}: {LAYOUT}")
    return splits
