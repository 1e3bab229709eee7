"""The DML protocol splits: disjoint classes, relabelling, validation classes, errors."""

from __future__ import annotations

import numpy as np
import pytest

from jdml.data.arrays import ImageArrays
from jdml.data.splits import split_by_class
from jdml.errors import DataError


def _data(counts: list[int]) -> ImageArrays:
    """Class ``c`` has ``counts[c]`` samples; every image holds its class index."""
    labels = np.repeat(np.arange(len(counts)), counts).astype(np.int32)
    images = np.broadcast_to(labels[:, None, None, None], (len(labels), 4, 4, 1))
    names = tuple(f"class{c}" for c in range(len(counts)))
    return ImageArrays(images.astype(np.uint8), labels, names, "toy")


def test_first_half_train_second_half_test() -> None:
    data = _data([3] * 10)
    splits = split_by_class(data)
    assert list(splits) == ["train", "test"]
    train, test = splits["train"], splits["test"]
    assert train.class_names == tuple(f"class{c}" for c in range(5))
    assert test.class_names == tuple(f"class{c}" for c in range(5, 10))
    for part in (train, test):
        assert sorted(set(part.labels.tolist())) == list(range(5))  # contiguous 0..K-1
        # every image still belongs to the class its name says
        original = np.array([int(n.removeprefix("class")) for n in part.class_names])
        assert np.array_equal(part.images[:, 0, 0, 0], original[part.labels])
    assert len(train) + len(test) == len(data)
    assert train.source == "toy [train]"


def test_odd_number_of_classes_puts_the_extra_one_in_test() -> None:
    splits = split_by_class(_data([2] * 7))
    assert splits["train"].num_classes == 3 and splits["test"].num_classes == 4


def test_validation_classes_are_held_out_from_train() -> None:
    data = _data([2] * 20)
    splits = split_by_class(data, val_fraction=0.2, seed=3)
    assert list(splits) == ["train", "val", "test"]
    train, val = set(splits["train"].class_names), set(splits["val"].class_names)
    assert len(val) == 2 and len(train) == 8 and not train & val
    assert train | val == {f"class{c}" for c in range(10)}
    again = split_by_class(data, val_fraction=0.2, seed=3)
    assert again["val"].class_names == splits["val"].class_names  # seeded
    others = {split_by_class(data, val_fraction=0.2, seed=s)["val"].class_names for s in range(8)}
    assert len(others) > 1


@pytest.mark.parametrize(
    "classes, fraction, val, train",
    [
        (40, 0.13, 3, 17),  # 20 training classes: 2.6 rounds to 3
        (12, 0.01, 2, 4),  # rounds to 0: the least a split holds, 2
        (10, 0.2, 2, 3),  # 5 training classes (scikit-learn's digits): 1 rounds up to 2
        (8, 0.9, 2, 2),  # 4 training classes: 2 are kept to train whatever the fraction
    ],
)
def test_val_fraction_rounds_and_holds_out_what_retrieval_needs(classes, fraction, val, train):
    splits = split_by_class(_data([2] * classes), val_fraction=fraction)
    assert (splits["val"].num_classes, splits["train"].num_classes) == (val, train)


def test_too_few_training_classes_for_validation_name_the_fix() -> None:
    with pytest.raises(DataError, match=r"only 3 training class\(es\).*val_fraction=0"):
        split_by_class(_data([2] * 6), val_fraction=0.2)
    assert "val" not in split_by_class(_data([2] * 6), val_fraction=0.0)


def test_one_sample_training_class_is_an_error() -> None:
    with pytest.raises(DataError, match=r"class 'class1' \(label 1\) has 1 sample; .*at least 2"):
        split_by_class(_data([3, 1, 3, 3, 3, 3]))
    split_by_class(_data([3, 3, 3, 1, 3, 3]))  # a one-sample test class is allowed


def test_too_few_classes_is_an_error() -> None:
    with pytest.raises(DataError, match=r"split 'train' would have 1 class"):
        split_by_class(_data([2, 2, 2]))


def test_bad_val_fraction() -> None:
    with pytest.raises(ValueError, match="val_fraction"):
        split_by_class(_data([2] * 6), val_fraction=1.0)


def test_glyph_split(glyph_data: ImageArrays) -> None:
    splits = split_by_class(glyph_data, val_fraction=0.1)
    n = glyph_data.num_classes
    sizes = {name: part.num_classes for name, part in splits.items()}
    assert sizes["test"] == n - n // 2 and sizes["train"] + sizes["val"] == n // 2
    assert sum(len(p) for p in splits.values()) == len(glyph_data)
    test_chars = set(splits["test"].class_names)
    assert not test_chars & set(splits["train"].class_names)
    # the interleaved order gives both halves every script
    for chars in (set(splits["train"].class_names), test_chars):
        assert any("a" <= c <= "z" for c in chars)
        assert any("\u0391" <= c <= "\u03c9" for c in chars)
        assert any("\u0400" <= c <= "\u045f" for c in chars)
