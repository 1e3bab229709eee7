"""Small fixture trees in the layouts of the benchmark archives, and tiny prepared tfds datasets.

Every writer takes class ids in the real datasets' ranges, so that the readers split a fixture by
the same rule as the full dataset (e.g. CUB classes 99, 100 train and 101, 102 test). Images are
small random JPEGs.
"""

from __future__ import annotations

import io
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from PIL import Image

CUB_FOLDER = "CUB_200_2011"
SOP_FOLDER = "Stanford_Online_Products"
CARS_FOLDER = "cars196"
INSHOP_FOLDER = "In-shop Clothes Retrieval Benchmark"
SOP_SUPER_CLASSES = ("bicycle", "cabinet", "chair", "coffee_maker", "fan", "kettle")


def random_pixels(rng: np.random.Generator, height: int = 12, width: int = 16) -> np.ndarray:
    """Random uint8 RGB pixels (H, W, 3)."""
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def write_jpeg(path: Path, rng: np.random.Generator) -> Path:
    """Writes a small random JPEG (parent folders included) and returns its path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    size = rng.integers(8, 20, 2)
    Image.fromarray(random_pixels(rng, int(size[0]), int(size[1]))).save(path, format="JPEG")
    return path


def cub_class_name(class_id: int) -> str:
    """The fixture's name of CUB class ``class_id`` (the real ones look like 001.Black_...)."""
    return f"{class_id:03d}.Bird_{class_id}"


def write_cub(
    parent: Path, class_ids: Sequence[int] = (99, 100, 101, 102), per_class: int = 3
) -> Path:
    """Writes ``parent/CUB_200_2011`` with ``per_class`` images of each class id.

    Returns:
      The dataset folder.
    """
    rng = np.random.default_rng(0)
    folder = parent / CUB_FOLDER
    folder.mkdir(parents=True)
    images, labels, split = [], [], []
    for class_id in class_ids:
        for k in range(per_class):
            image_id = len(images) + 1
            relative = f"{cub_class_name(class_id)}/Bird_{class_id}_{k:04d}.jpg"
            write_jpeg(folder / "images" / relative, rng)
            images.append(f"{image_id} {relative}")
            labels.append(f"{image_id} {class_id}")
            split.append(f"{image_id} {k % 2}")  # the per-image split, which DML ignores
    (folder / "images.txt").write_text("\n".join(images) + "\n")
    (folder / "image_class_labels.txt").write_text("\n".join(labels) + "\n")
    (folder / "train_test_split.txt").write_text("\n".join(split) + "\n")
    names = [f"{c} {cub_class_name(c)}" for c in range(1, 201)]
    (folder / "classes.txt").write_text("\n".join(names) + "\n")
    return folder


def cars_class_name(class_id: int) -> str:
    """The fixture's name of Cars196 class ``class_id``."""
    return f"Make{class_id} Model Sedan {2000 + class_id % 13}"


def write_cars_mat(
    parent: Path, class_ids: Sequence[int] = (97, 98, 99, 100), per_class: int = 3
) -> Path:
    """Writes ``parent/cars196`` in the all-images layout: ``car_ims/`` and ``cars_annos.mat``.

    The annotations are a 1 x N MATLAB struct array as in the real file (relative_im_path,
    bbox_x1, bbox_y1, bbox_x2, bbox_y2, class, test) and ``class_names`` a 1 x 196 cell array.

    Returns:
      The dataset folder.
    """
    from scipy.io import savemat

    rng = np.random.default_rng(1)
    folder = parent / CARS_FOLDER
    fields = ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")
    rows = []
    for class_id in class_ids:
        for k in range(per_class):
            relative = f"car_ims/{len(rows) + 1:06d}.jpg"
            write_jpeg(folder / relative, rng)
            box = [np.array([[v]], np.uint16) for v in (1, 2, 7, 8)]
            rows.append(
                (relative, *box, np.array([[class_id]], np.uint8), np.array([[k % 2]], np.uint8))
            )
    annotations = np.empty((1, len(rows)), dtype=[(f, object) for f in fields])
    for i, row in enumerate(rows):
        annotations[0, i] = row
    class_names = np.empty((1, 196), dtype=object)
    for c in range(196):
        class_names[0, c] = cars_class_name(c + 1)
    savemat(folder / "cars_annos.mat", {"annotations": annotations, "class_names": class_names})
    return folder


def write_cars_folders(
    parent: Path, num_classes: int = 4, per_class: int = 3, *, images_subfolder: bool = False
) -> Path:
    """Writes ``parent/cars196`` as one folder per class (under ``images/`` if asked).

    Returns:
      The dataset folder (``parent/cars196``).
    """
    rng = np.random.default_rng(2)
    folder = parent / CARS_FOLDER
    classes = folder / "images" if images_subfolder else folder
    for c in range(num_classes):
        for k in range(per_class):
            write_jpeg(classes / cars_class_name(c + 1) / f"{k:05d}.jpg", rng)
    return folder


def write_sop(
    parent: Path,
    train_classes: Sequence[int] = (1, 2, 3),
    test_classes: Sequence[int] = (11_319, 11_320, 11_321),
    per_class: int = 2,
) -> Path:
    """Writes ``parent/Stanford_Online_Products`` with its two index files.

    Returns:
      The dataset folder.
    """
    rng = np.random.default_rng(3)
    folder = parent / SOP_FOLDER
    folder.mkdir(parents=True)
    image_id = 0
    for name, classes in (("Ebay_train.txt", train_classes), ("Ebay_test.txt", test_classes)):
        lines = ["image_id class_id super_class_id path"]
        for class_id in classes:
            super_id = class_id % len(SOP_SUPER_CLASSES) + 1
            for k in range(per_class):
                image_id += 1
                relative = f"{SOP_SUPER_CLASSES[super_id - 1]}_final/{class_id}_{k}.JPG"
                write_jpeg(folder / relative, rng)
                lines.append(f"{image_id} {class_id} {super_id} {relative}")
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder


def inshop_item(number: int) -> str:
    """An In-Shop item id (``id_00000042``)."""
    return f"id_{number:08d}"


def write_inshop(
    parent: Path,
    train_items: Sequence[int] = (1, 2, 3),
    eval_items: Sequence[int] = (4, 5, 6),
    gallery_only_items: Sequence[int] = (7,),
    per_split: int = 2,
) -> Path:
    """Writes ``parent/In-shop Clothes Retrieval Benchmark`` with ``Eval/`` and ``img/``.

    Train items get ``2 * per_split`` images, each eval item ``per_split`` query and
    ``per_split`` gallery images, each gallery-only item ``per_split`` gallery images. The
    partition file is column-aligned with runs of spaces, as the real one is.

    Returns:
      The dataset folder.
    """
    rng = np.random.default_rng(4)
    folder = parent / INSHOP_FOLDER
    rows = []

    def add(item: int, status: str, count: int) -> None:
        for _ in range(count):
            view = len(rows) + 1
            relative = f"img/WOMEN/Dresses/{inshop_item(item)}/{view:02d}_1_front.jpg"
            write_jpeg(folder / relative, rng)
            rows.append(f"{relative:<60}{inshop_item(item):<16}{status}")

    for item in train_items:
        add(item, "train", 2 * per_split)
    for item in eval_items:
        add(item, "query", per_split)
        add(item, "gallery", per_split)
    for item in gallery_only_items:
        add(item, "gallery", per_split)
    header = ["image_name item_id evaluation_status"]
    (folder / "Eval").mkdir(parents=True)
    text = "\n".join([str(len(rows)), *header, *rows]) + "\n"
    (folder / "Eval" / "list_eval_partition.txt").write_text(text)
    return folder


# --------------------------------------------------------------------------- tfds


def png_bytes(pixels: np.ndarray) -> bytes:
    """``pixels`` (H, W, 3) or (H, W) uint8 encoded as PNG."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def tfds_example(name: str, label: int, pixels: np.ndarray, key: str) -> dict[str, Any]:
    """One example with the features of the tfds builder ``name`` (images as PNG bytes)."""
    import tensorflow_datasets as tfds

    bbox = tfds.features.BBox(ymin=0.1, xmin=0.2, ymax=0.8, xmax=0.9)
    if name == "caltech_birds2011":
        mask = np.zeros(pixels.shape[:2], np.uint8)
        return {
            "image": png_bytes(pixels),
            "image/filename": f"{key}.jpg",
            "label": label,
            "label_name": f"bird_{label}",
            "bbox": bbox,
            "segmentation_mask": png_bytes(mask),
        }
    if name == "cars196":
        return {"image": png_bytes(pixels), "label": label, "bbox": bbox, "id": key}
    if name == "mnist":  # grayscale, as the real digits (of other sizes than 28 x 28 here)
        return {"image": png_bytes(pixels[..., 0]), "label": label}
    if name == "stanford_online_products":
        return {
            "image": png_bytes(pixels),
            "class_id": label,
            "super_class_id/num": label % 12,
            "super_class_id": label % 12,
        }
    raise ValueError(f"no fixture examples for {name}")


class _NoTraversable:
    """Nothing is an instance of this: stands in for importlib_resources.abc.Traversable."""


def prepare_tfds(
    data_dir: Path, name: str, labels: dict[str, Sequence[int]], seed: int = 0
) -> dict[str, list[tuple[int, np.ndarray]]]:
    """Prepares a tiny ``name`` in ``data_dir`` as ArrayRecord, without TensorFlow.

    The real builder (its features, version and file naming) writes the data; only its
    example generation is replaced by fixture examples, given here as PNG bytes (encoding
    pixel arrays would need TensorFlow).

    Args:
      data_dir: the tfds data folder.
      name: the builder.
      labels: split -> the builder label of each example.
      seed: for the random pixels.

    Returns:
      split -> [(label, pixels)] of the examples written.
    """
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core import dataset_builder

    rng = np.random.default_rng(seed)
    written = {
        split: [(label, random_pixels(rng, 6 + i % 5, 7)) for i, label in enumerate(split_labels)]
        for split, split_labels in labels.items()
    }

    def generate(split: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for i, (label, pixels) in enumerate(written[split]):
            key = f"{split}_{i}"
            yield key, tfds_example(name, label, pixels, key)

    def split_generators(self: object, dl_manager: object) -> dict[str, Iterator]:
        del self, dl_manager
        return {split: generate(split) for split in written}

    builder = tfds.builder(name, data_dir=str(data_dir))
    # tfds 4.9.10 looks the builder's code up with importlib_resources, a package it declares
    # only for Python < 3.9 and so is not installed here; the stand-in answers its one question.
    resources = types.SimpleNamespace(abc=types.SimpleNamespace(Traversable=_NoTraversable))
    with (
        mock.patch.object(type(builder), "_split_generators", split_generators),
        mock.patch.object(dataset_builder, "importlib_resources", resources),
    ):
        builder.download_and_prepare(file_format="array_record")
    return written
