"""Training and evaluation on a benchmark in its official layout (a CUB fixture tree): photos of
several sizes decoded as batches are drawn, the photo augmentation, the evaluation view, a
validation split held out from the training classes, and the errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from jdml.config import ConfigError, validate
from jdml.data.loading import load_splits
from jdml.data.sources import DataError
from jdml.metric_writer import read_metrics
from jdml.trainer import train_and_evaluate
from tests import benchmark_trees as trees
from tests.helpers import tiny_config

# Class ids 97-100 are CUB training classes, 101-104 test classes.
CLASS_IDS = (97, 98, 99, 100, 101, 102, 103, 104)


@pytest.fixture(scope="module")
def cub(tmp_path_factory):
    return trees.write_cub(tmp_path_factory.mktemp("cub"), class_ids=CLASS_IDS, per_class=4)


def cub_config(root, **overrides):
    return tiny_config(
        "unused.npz",
        **{
            "data.name": "cub200",
            "data.path": str(root),
            "data.verify_counts": False,
            "data.channels": 3,
            "data.image_size": 16,
            "data.resize": 20,
            "data.augment": "base",
            "train.batch_size": 8,
            "train.epochs": 1,
            **overrides,
        },
    )


def test_splits_are_file_lists_with_the_evaluation_view(cub):
    config = cub_config(cub, **{"data.val_fraction": 0.5})
    splits = load_splits(config.data)
    assert {k: (len(v), v.num_classes) for k, v in splits.items()} == {
        "train": (8, 2),
        "val": (8, 2),
        "test": (16, 4),
    }
    assert set(splits["train"].class_names) | set(splits["val"].class_names) == {
        trees.cub_class_name(c) for c in CLASS_IDS[:4]
    }
    photos = splits["test"].load(np.arange(3))
    for photo, path in zip(photos, splits["test"].paths[:3], strict=True):
        with Image.open(path) as image:  # decoded at its own size
            assert photo.shape == (image.height, image.width, 3) and photo.dtype == np.uint8
    view = splits["test"].eval_images(np.arange(3))
    assert view.shape == (3, 16, 16, 3) and view.dtype == np.float32
    assert view.min() >= 0.0 and view.max() <= 1.0


def test_trains_and_evaluates_on_the_benchmark(cub, tmp_path):
    workdir = tmp_path / "run"
    train_and_evaluate(cub_config(cub), str(workdir))
    records = read_metrics(str(workdir / "metrics.jsonl"))
    records = [r for r in records if r.get("split") == "test" and "recall@1" in r]
    assert records and 0.0 <= records[-1]["recall@1"] <= 1.0


def test_a_corrupt_photo_is_named(tmp_path):
    root = trees.write_cub(tmp_path, class_ids=CLASS_IDS, per_class=4)
    bad = next((root / "images").rglob("*.jpg"))
    bad.write_bytes(b"not a jpeg")
    with pytest.raises(DataError, match=bad.name):
        train_and_evaluate(cub_config(root), str(tmp_path / "run"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"data.augment": "affine"}, "choose a photo augmentation"),
        ({"data.channels": 1}, "set data.channels=3"),
        ({"data.resize": 12}, "data.resize=12 is below the crop"),
    ],
)
def test_photo_config_errors(cub, overrides, message):
    with pytest.raises(ConfigError, match=message):
        validate(cub_config(cub, **overrides))


def test_a_partial_copy_is_refused_unless_told(cub):
    with pytest.raises(DataError, match="is the copy partial"):
        load_splits(cub_config(cub, **{"data.verify_counts": True}).data)
