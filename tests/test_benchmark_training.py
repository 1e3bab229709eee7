"""Training and evaluation on a benchmark in its official layout (a CUB fixture tree): photos of
several sizes decoded as batches are drawn, the photo augmentation, the evaluation view, a
validation split held out from the training classes, and the errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from jdml.config import validate
from jdml.data.arrays import QueryGallery
from jdml.data.loading import load_splits
from jdml.errors import ConfigError, DataError
from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.evaluation.splits import evaluate_split
from jdml.fileio import read_jsonl
from jdml.look import LookOptions, look
from jdml.trainer import train_and_evaluate
from jdml.visualize import retrieval_grid_size
from tests import benchmark_trees as trees
from tests.helpers import photo_config

# Class ids 97-100 are CUB training classes, 101-104 test classes.
CLASS_IDS = (97, 98, 99, 100, 101, 102, 103, 104)


@pytest.fixture(scope="module")
def cub(tmp_path_factory):
    return trees.write_cub(tmp_path_factory.mktemp("cub"), class_ids=CLASS_IDS, per_class=4)


cub_config = photo_config


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


@pytest.mark.slow
def test_trains_and_evaluates_on_the_benchmark(cub, tmp_path):
    workdir = tmp_path / "run"
    train_and_evaluate(cub_config(cub), str(workdir))
    records = read_jsonl(str(workdir / "metrics.jsonl"))
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


@pytest.fixture(scope="module")
def inshop(tmp_path_factory):
    return trees.write_inshop(
        tmp_path_factory.mktemp("inshop"), (1, 2, 3, 4), (5, 6, 7), (8,), per_split=2
    )


def test_inshop_test_split_ranks_queries_against_the_gallery(inshop):
    config = cub_config(inshop, **{"data.name": "inshop", "data.val_fraction": 0.5})
    splits = load_splits(config.data)
    test = splits["test"]
    assert isinstance(test, QueryGallery)
    assert (len(test.queries), len(test.gallery), test.num_queries) == (6, 8, 6)
    assert {k: len(v) for k, v in splits.items()} == {"train": 8, "val": 8, "test": 14}
    # Queries first, then the gallery; one label space (item 8 is in the gallery only).
    assert test.labels.tolist() == [0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2, 3, 3]
    mixed = test.eval_images(np.array([7, 0, 13]))
    assert mixed.shape == (3, 16, 16, 3)
    np.testing.assert_array_equal(mixed[0], test.gallery.eval_images(np.array([1]))[0])
    np.testing.assert_array_equal(mixed[1], test.queries.eval_images(np.array([0]))[0])
    with pytest.raises(TypeError, match="evaluated as a whole"):
        test.subset(np.arange(2))


@pytest.mark.slow
def test_trains_and_evaluates_inshop_query_against_gallery(inshop, tmp_path):
    """A training run on In-Shop trains on its train items and records test metrics."""
    workdir = tmp_path / "run"
    config = cub_config(inshop, **{"data.name": "inshop", "train.batch_size": 4})
    train_and_evaluate(config, str(workdir))
    records = read_jsonl(str(workdir / "metrics.jsonl"))
    tests = [r for r in records if r.get("split") == "test" and "recall@1" in r]
    assert tests and all(0.0 <= r["recall@1"] <= 1.0 for r in tests)
    # look: queries from the query images, neighbours from the gallery.
    options = LookOptions(method="pca", queries=2, neighbours=3)
    out = look(str(workdir), out=str(tmp_path / "look"), options=options)
    with Image.open(out["retrieval_grid"]) as grid:
        assert grid.size == retrieval_grid_size(2, 3, title=True)


def test_inshop_evaluation_uses_the_gallery_protocol(inshop):
    """The runner evaluates a query/gallery split as queries against the gallery, which is
    what ``evaluate_embeddings`` with a gallery gives, not leave-one-out over the union."""
    config = cub_config(inshop, **{"data.name": "inshop"})
    test = load_splits(config.data)["test"]
    pixels = test.eval_images(np.arange(len(test))).reshape(len(test), -1)
    names = ["recall@1", "map@r"]
    got = evaluate_split(pixels, test, names).metrics
    n = test.num_queries
    want = evaluate_embeddings(
        pixels[:n], test.labels[:n], names, gallery=pixels[n:], gallery_labels=test.labels[n:]
    )
    assert got == want
    # Item 8 has gallery images only: leave-one-out over the union would count them as queries.
    assert got != evaluate_embeddings(pixels, test.labels, names)
