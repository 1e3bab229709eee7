"""The deep-metric-learning protocol splits: train and test on disjoint (unseen) classes.

The classes, sorted by label index, are cut in two: the first ``floor(C / 2)`` are for
training, the rest for testing. Optionally a random part of the training classes is held
out as a validation split (also unseen during training), or, for cross-validation, one of ``k``
class-disjoint folds of them (*A Metric Learning Reality Check*, Musgrave et al., ECCV 2020:
each fold's classes are validation once, and a candidate is scored by its mean over the
folds). Every split is relabelled to contiguous labels ``0..K-1`` and keeps its class names.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jdml.data.arrays import ImageSet
from jdml.errors import DataError
from jdml.registry import Registry

MIN_SAMPLES_PER_TRAIN_CLASS = 2
MIN_CLASSES_PER_SPLIT = 2

#: The splits a run loads, by name (``eval.splits``), each with what it holds.
SPLITS: Registry[str] = Registry("split")
SPLITS.register("train")("the training classes (less those held out for validation)")
SPLITS.register("val")("training classes held out for model selection (data.val_fraction > 0)")
SPLITS.register("test")("the unseen classes of the evaluation")


def _check_train_samples(data: ImageSet, classes: np.ndarray) -> None:
    """Every training class needs at least two samples (a positive pair)."""
    counts = np.bincount(data.labels, minlength=data.num_classes)
    for c in classes:
        if counts[c] < MIN_SAMPLES_PER_TRAIN_CLASS:
            noun = "sample" if counts[c] == 1 else "samples"
            raise DataError(
                f"class {data.class_names[c]!r} (label {c}) has {counts[c]} {noun}; metric "
                f"learning needs at least {MIN_SAMPLES_PER_TRAIN_CLASS} per class: remove it "
                "or add images"
            )


def class_folds(train: np.ndarray, folds: int, seed: int) -> list[np.ndarray]:
    """The training classes in ``folds`` class-disjoint folds: shuffled by ``seed``, cut into
    parts whose sizes differ by at most one (the first parts get the extra classes), each
    sorted. Every class is in exactly one fold.

    Raises:
      DataError: a fold would have fewer than :data:`MIN_CLASSES_PER_SPLIT` classes, or the
        classes outside one fewer than that, naming the fix.
    """
    n, least = len(train), MIN_CLASSES_PER_SPLIT
    if folds < 2 or n < folds * least or n - n // folds < least:
        raise DataError(
            f"{n} training class(es) cannot make {folds} validation folds of at least {least} "
            f"classes each: set --config.data.val_folds to at most {max(n // least, 2)} (or 0 "
            "for one hold-out of data.val_fraction), or use a dataset with more classes"
        )
    order = np.random.default_rng(seed).permutation(np.asarray(train))
    return [np.sort(part) for part in np.array_split(order, folds)]


def _held_out(
    train: np.ndarray, val_fraction: float, seed: int, folds: int = 0, fold: int = 0
) -> np.ndarray:
    """The training classes held out for validation: with ``folds`` >= 2, fold ``fold`` of
    :func:`class_folds`; else ``round(fraction * n)``, but at least
    :data:`MIN_CLASSES_PER_SPLIT` (retrieval needs them) and leaving at least as many to train,
    so that any set of 4 or more training classes gets a validation split.

    Raises:
      DataError: fewer than 4 training classes (or too few for the folds), naming the fix.
    """
    if folds:
        if not 0 <= fold < folds:
            raise ValueError(f"fold must be in [0, {folds}), got {fold}")
        return class_folds(train, folds, seed)[fold]
    n, least = len(train), MIN_CLASSES_PER_SPLIT
    if n < 2 * least:
        raise DataError(
            f"only {n} training class(es): a validation split needs {least} of them and "
            f"training keeps {least}; set --config.data.val_fraction=0 to select the checkpoint "
            "on the test split (as the reference does), or use a dataset with more classes"
        )
    count = min(max(least, round(val_fraction * n)), n - least)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(train, size=count, replace=False))


def _take(data: ImageSet, classes: np.ndarray, name: str) -> ImageSet:
    """The samples of ``classes``, relabelled to 0..K-1."""
    if len(classes) < MIN_CLASSES_PER_SPLIT:
        fix = {"train": " or a smaller val_fraction", "val": " or a larger val_fraction"}
        raise DataError(
            f"split {name!r} would have {len(classes)} class(es); retrieval needs at least "
            f"{MIN_CLASSES_PER_SPLIT}: use a dataset with more classes{fix.get(name, '')}"
        )
    part = data.subset(np.isin(data.labels, classes)).relabel()
    return dataclasses.replace(part, source=f"{data.source} [{name}]" if data.source else name)


def class_halves(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The protocol's cut of the classes: of the label indices with samples, in sorted order,
    the first ``floor(C / 2)`` train and the rest test."""
    classes = np.unique(labels)
    n_train = len(classes) // 2
    return classes[:n_train], classes[n_train:]


def split_by_class(
    data: ImageSet, *, val_fraction: float = 0.0, seed: int = 0, folds: int = 0, fold: int = 0
) -> dict[str, ImageSet]:
    """Splits by class: ``{'train', ['val',] 'test'}`` with disjoint classes.

    Args:
      data: the whole dataset; its classes (label indices with samples) in sorted order.
      val_fraction: fraction of the training classes held out as ``'val'`` (0 for none).
      seed: seed of the random choice of the validation classes.
      folds: with 2 or more, the validation split is fold ``fold`` of that many class-disjoint
        folds of the training classes (:func:`class_folds`) and ``val_fraction`` is not read.
      fold: the fold held out, in ``[0, folds)``.

    Raises:
      DataError: a training class has fewer than 2 samples, or a split has fewer than 2
        classes.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    train, test = class_halves(data.labels)
    _check_train_samples(data, train)
    splits = {}
    if val_fraction > 0 or folds:
        val = _held_out(train, val_fraction, seed, folds, fold)
        splits["train"] = _take(data, np.setdiff1d(train, val), "train")
        splits["val"] = _take(data, val, "val")
    else:
        splits["train"] = _take(data, train, "train")
    splits["test"] = _take(data, test, "test")
    return splits


def hold_out_validation(
    splits: dict[str, ImageSet],
    *,
    val_fraction: float = 0.0,
    seed: int = 0,
    folds: int = 0,
    fold: int = 0,
) -> dict[str, ImageSet]:
    """Given train and test splits (a benchmark's own), holds out ``val_fraction`` of the
    training classes (or fold ``fold`` of ``folds``) as ``'val'``, chosen as
    ``split_by_class`` chooses them.

    Raises:
      DataError: a training class has fewer than 2 samples, or a split has fewer than 2
        classes.
    """
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    train = splits["train"]
    classes = np.unique(train.labels)
    _check_train_samples(train, classes)
    if val_fraction == 0 and not folds:
        return dict(splits)
    val = _held_out(classes, val_fraction, seed, folds, fold)
    out = {k: v for k, v in splits.items() if k != "train"}
    return {
        "train": _take(train, np.setdiff1d(classes, val), "train"),
        "val": _take(train, val, "val"),
        **out,
    }
