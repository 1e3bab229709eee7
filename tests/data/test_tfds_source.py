"""The tfds sources reached from the config: ``data.source=tfds`` for the benchmarks, and
``data.name=tfds`` for any prepared tfds image dataset, on tiny datasets prepared here (the real
builders' features and files, fixture examples; no network, no TensorFlow)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jdml.config import validate
from jdml.data.arrays import ImageArrays
from jdml.data.benchmarks import FileList, TfdsSplit, read_benchmark
from jdml.data.loading import load_splits
from jdml.errors import ConfigError, DataError, UnknownNameError
from jdml.fileio import read_jsonl
from jdml.trainer import train_and_evaluate
from tests import benchmark_trees as trees
from tests.helpers import REPO, tiny_config

# Cars196 class ids 93-98 train, 99-102 test; the tfds builder's labels are the ids - 1.
CAR_IDS = tuple(range(93, 103))
CAR_LABELS = {"train": [c - 1 for c in CAR_IDS] * 2, "test": [c - 1 for c in CAR_IDS]}
# The mnist-like fixture: ten digits, four images each; 0-4 train, 5-9 test.
DIGITS = {"train": list(range(10)) * 3, "test": list(range(10))}


@pytest.fixture(scope="module")
def cars_tfds(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A tfds data folder with a tiny cars196, and the examples written to it."""
    data_dir = tmp_path_factory.mktemp("tfds")
    return data_dir, trees.prepare_tfds(data_dir, "cars196", CAR_LABELS)


@pytest.fixture(scope="module")
def digits_tfds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tfds data folder with a tiny mnist."""
    data_dir = tmp_path_factory.mktemp("tfds")
    trees.prepare_tfds(data_dir, "mnist", DIGITS)
    return data_dir


def photo_config(name: str, path: Path, **overrides: object):
    """A tiny config reading the benchmark ``name`` under ``path``."""
    return tiny_config(
        "unused.npz",
        **{
            "data.name": name,
            "data.path": str(path),
            "data.verify_counts": False,
            "data.channels": 3,
            "data.image_size": 16,
            "data.resize": 20,
            "data.augment": "base",
            **overrides,
        },
    )


def digits_config(path: Path, **overrides: object):
    """A tiny config reading the mnist fixture as ``data.name=tfds``."""
    return tiny_config(
        "unused.npz",
        **{"data.name": "tfds", "data.tfds_name": "mnist", "data.path": str(path), **overrides},
    )


def car_names(data_dir: Path) -> list[str]:
    """The cars196 builder's class names (index = label = class id - 1)."""
    import tensorflow_datasets as tfds

    return list(tfds.builder("cars196", data_dir=str(data_dir)).info.features["label"].names)


def _class_ids(split: FileList | TfdsSplit, ids_by_name: dict[str, int]) -> set[int]:
    return {ids_by_name[name] for name in split.class_names}


# ----------------------------------------------------------------------------- data.source=tfds


def test_cars196_from_tfds_has_the_splits_of_the_files(cars_tfds, tmp_path) -> None:
    data_dir, written = cars_tfds
    config = photo_config("cars196", data_dir, **{"data.source": "tfds", "data.val_fraction": 0.5})
    validate(config)
    splits = load_splits(config.data)
    assert all(isinstance(split, TfdsSplit) for split in splits.values())
    assert {k: (len(v), v.num_classes) for k, v in splits.items()} == {
        "train": (9, 3),
        "val": (9, 3),
        "test": (12, 4),
    }
    names = car_names(data_dir)
    tfds_ids = {name: i + 1 for i, name in enumerate(names)}
    assert splits["test"].class_names == tuple(names[98:102])
    assert _class_ids(splits["train"], tfds_ids) | _class_ids(splits["val"], tfds_ids) == set(
        range(93, 99)
    )
    # The file reader on the same classes holds out the same validation classes.
    files_root = trees.write_cars_mat(tmp_path, class_ids=CAR_IDS, per_class=3)
    files = load_splits(photo_config("cars196", files_root, **{"data.val_fraction": 0.5}).data)
    file_ids = {trees.cars_class_name(c): c for c in CAR_IDS}
    for split in ("train", "val", "test"):
        assert _class_ids(files[split], file_ids) == _class_ids(splits[split], tfds_ids)
    # Photos decode to the pixels written (PNG is lossless), at their own sizes, with labels.
    pixels = {}
    for examples in written.values():
        for label, image in examples:
            pixels.setdefault(label + 1, []).append(image)
    test = splits["test"]
    for image, label in zip(test.load(np.arange(len(test))), test.labels, strict=True):
        assert any(np.array_equal(image, p) for p in pixels[tfds_ids[test.class_names[label]]])
    view = test.eval_images(np.arange(3))
    assert view.shape == (3, 16, 16, 3) and view.dtype == np.float32


def test_a_tfds_split_survives_pickling(cars_tfds) -> None:
    # grain's worker processes (data.num_workers) receive the splits pickled.
    splits = read_benchmark("cars196", str(cars_tfds[0]), source="tfds", verify_counts=False)
    train = splits["train"].subset(np.array([4, 0, 2]))
    copy = pickle.loads(pickle.dumps(train))
    assert copy.labels.tolist() == train.labels.tolist()
    for a, b in zip(copy.load(np.arange(3)), train.load(np.arange(3)), strict=True):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- data.name=tfds


def test_any_tfds_dataset_is_split_by_class(digits_tfds) -> None:
    config = digits_config(digits_tfds, **{"data.val_fraction": 0.4})
    validate(config)
    splits = load_splits(config.data)
    assert {k: (len(v), v.num_classes) for k, v in splits.items()} == {
        "train": (12, 3),
        "val": (8, 2),
        "test": (20, 5),
    }
    assert set(splits["train"].class_names) | set(splits["val"].class_names) == set("01234")
    assert splits["test"].class_names == tuple("56789")
    assert isinstance(splits["test"], ImageArrays)
    assert splits["test"].load(np.arange(2)).shape == (2, 16, 16, 1)
    # One split of the builder, in tfds's split syntax.
    only = load_splits(digits_config(digits_tfds, **{"data.tfds_splits": "train"}).data)
    assert {k: len(v) for k, v in only.items()} == {"train": 15, "test": 15}


def test_trains_and_evaluates_on_a_tfds_dataset(digits_tfds, tmp_path) -> None:
    # Two steps and one evaluation of a one-stage network (compiling it takes most of the time).
    config = digits_config(
        digits_tfds,
        **{
            "model.small_resnet.stage_features": (8,),
            "model.small_resnet.stage_blocks": (1,),
            "model.small_resnet.stage_strides": (2,),
            "train.batch_size": 8,
            "train.epochs": 1,
            "train.tensorboard": False,
            "eval.at_start": False,
            "eval.metrics": ("recall@1",),
            "eval.train_metrics": (),
        },
    )
    train_and_evaluate(config, str(tmp_path / "run"))
    records = read_jsonl(str(tmp_path / "run" / "metrics.jsonl"))
    tests = [r for r in records if r.get("split") == "test" and "recall@1" in r]
    assert tests and tests[-1]["step"] == 2 and 0.0 <= tests[-1]["recall@1"] <= 1.0


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"data.source": "hub"},
            "data.source='hub' is not a known data source; choose one of: files, tfds",
        ),
        (
            {"data.name": "inshop", "data.source": "tfds"},
            "data.source=tfds has no reader of data.name=inshop (it reads "
            "data.name=cars196, cub200, sop, tfds); use --config.data.source=files",
        ),
        (
            {"data.name": "folder", "data.source": "tfds"},
            "data.source=tfds has no reader of data.name=folder",
        ),
    ],
)
def test_a_source_that_does_not_hold_the_dataset_is_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as err:
        validate(photo_config("cars196", tmp_path, **overrides))
    assert message in str(err.value)


def test_both_sources_are_accepted_where_they_hold_the_dataset(tmp_path) -> None:
    for name in ("cub200", "cars196", "sop"):
        validate(photo_config(name, tmp_path, **{"data.source": "tfds"}))
    validate(photo_config("inshop", tmp_path))
    validate(digits_config(tmp_path, **{"data.source": "tfds"}))
    validate(digits_config(tmp_path))
    with pytest.raises(UnknownNameError, match="known tfds benchmark names: cars196, cub200, sop"):
        read_benchmark("inshop", str(tmp_path), source="tfds")


def test_a_missing_dataset_prints_the_command_that_prepares_it(tmp_path) -> None:
    config = photo_config("cars196", tmp_path, **{"data.source": "tfds"})
    with pytest.raises(DataError) as err:
        load_splits(config.data)
    build = f"`tfds build cars196 --data_dir={tmp_path} --file_format=array_record`"
    assert f"no prepared cars196 in {tmp_path}" in str(err.value) and build in str(err.value)
    with pytest.raises(DataError) as err:
        load_splits(digits_config(tmp_path).data)
    assert f"`tfds build mnist --data_dir={tmp_path} --file_format=array_record`" in str(err.value)
    with pytest.raises(DataError, match=r"tfds has no dataset 'no_such_set' \(not in its cata"):
        load_splits(digits_config(tmp_path, **{"data.tfds_name": "no_such_set"}).data)
    with pytest.raises(DataError, match=r"name its builder with --config\.data\.tfds_name="):
        load_splits(digits_config(tmp_path, **{"data.tfds_name": ""}).data)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"data.tfds_image_key": "picture"},
            "data.tfds_image_key='picture' is not an Image feature of mnist (its features: "
            "image (Image), label (ClassLabel)); set --config.data.tfds_image_key",
        ),
        (
            {"data.tfds_label_key": "image"},
            "data.tfds_label_key='image' is not a ClassLabel or integer feature of mnist (its "
            "features: image (Image), label (ClassLabel))",
        ),
        (
            {"data.tfds_splits": "train+validation"},
            "data.tfds_splits='train+validation' names 'validation', which mnist does not have; "
            "its splits: test, train",
        ),
    ],
)
def test_a_wrong_feature_or_split_lists_what_the_builder_has(digits_tfds, overrides, message):
    with pytest.raises(DataError) as err:
        load_splits(digits_config(digits_tfds, **overrides).data)
    assert message in str(err.value)


def test_a_missing_tensorflow_datasets_names_the_extra(digits_tfds, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import fails
    with pytest.raises(DataError, match=r"pip install 'jdml\[tfds\]'"):
        load_splits(digits_config(digits_tfds).data)


def test_tensorflow_datasets_is_imported_only_to_read() -> None:
    code = (
        "import sys, jdml, jdml.data.loading, jdml.config; "
        "from configs.revisiting import get_config; "
        "jdml.config.validate(get_config('data=tfds')); "
        "print(sorted(m for m in sys.modules if m.startswith(('tensorflow', 'tensorflow_'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
