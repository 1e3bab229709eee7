"""Loads the configured dataset and splits it by class (the DML unseen-class protocol)."""

from __future__ import annotations

import dataclasses
import logging

import ml_collections
import numpy as np

from jdml.data.arrays import ImageSet, QueryGallery
from jdml.data.benchmarks import BENCHMARKS, read_benchmark
from jdml.data.sources import DATASETS
from jdml.data.splits import hold_out_validation, split_by_class
from jdml.errors import DataError

log = logging.getLogger("jdml")

_SHOWN_NAMES = 10  # singleton classes named in the warning


def load_splits(cfg: ml_collections.ConfigDict) -> dict[str, ImageSet]:
    """Returns ``{'train', 'test'[, 'val']}`` for the ``data`` config section.

    In-memory sources (``DATASETS``) are cut into classes halves by ``split_by_class``; the
    benchmarks (``BENCHMARKS``: cub200, cars196, sop, inshop) come with their own train and
    test splits, read from ``data.source`` (the archive's files, or a prepared tfds builder
    for cub200, cars196 and sop) as photo lists decoded as batches are drawn; In-Shop's test
    split is its queries ranked against its gallery (a :class:`QueryGallery`).
    """
    splits = _benchmark_splits(cfg) if cfg.name in BENCHMARKS else _array_splits(cfg)
    for name, split in splits.items():
        if name != "train" and not isinstance(split, QueryGallery):
            warn_singleton_classes(name, split)
    return splits


def singleton_classes(split: ImageSet) -> list[str]:
    """The names of the classes with exactly one image in ``split``."""
    counts = np.bincount(split.labels, minlength=split.num_classes)
    return [split.class_names[c] for c in np.flatnonzero(counts == 1)]


def warn_singleton_classes(name: str, split: ImageSet) -> None:
    """Warns about classes of an evaluation split with a single image: in leave-one-out
    retrieval such an image has no relevant item, so it is never retrieved correctly and lowers
    Recall@k and every other retrieval metric (pytorch-metric-learning drops these "lone"
    queries; the Revisiting reference, and jdml, keep them)."""
    lone = singleton_classes(split)
    if not lone:
        return
    shown = ", ".join(repr(c) for c in lone[:_SHOWN_NAMES])
    more = f" and {len(lone) - _SHOWN_NAMES} more" if len(lone) > _SHOWN_NAMES else ""
    log.warning(
        "The %s split has %d class(es) with a single image (%s%s): their images can never be "
        "retrieved correctly and lower Recall@k; add images of these classes or remove them",
        name,
        len(lone),
        shown,
        more,
    )


def loader_options(cfg: ml_collections.ConfigDict) -> dict[str, object]:
    """The options of the loader ``cfg.name`` of its own: its ``data.<name>_<option>`` keys as
    ``{option: value}`` (``data.tfds_name`` -> ``name`` for ``data.name=tfds``)."""
    prefix = f"{cfg.name}_"
    return {key.removeprefix(prefix): cfg[key] for key in cfg if key.startswith(prefix)}


def _array_splits(cfg: ml_collections.ConfigDict) -> dict[str, ImageSet]:
    """The in-memory sources (``DATASETS``), cut into class halves."""
    loader = DATASETS.get(cfg.name)
    data = loader(
        path=cfg.path,
        image_size=cfg.image_size,
        cache_dir=cfg.cache_dir or None,
        channels=cfg.channels,
        skip_unreadable=cfg.skip_unreadable,
        **loader_options(cfg),
    )
    return split_by_class(data, **_validation(cfg))


def _benchmark_splits(cfg: ml_collections.ConfigDict) -> dict[str, ImageSet]:
    if cfg.channels != 3:
        raise DataError(f"{cfg.name} holds colour photos: set data.channels=3")
    splits = read_benchmark(cfg.name, cfg.path, source=cfg.source, verify_counts=cfg.verify_counts)
    sized = {
        name: dataclasses.replace(
            files, resize=cfg.resize, crop=cfg.image_size, filter=cfg.eval_interpolation
        )
        for name, files in splits.items()
    }
    if "query" in sized:  # In-Shop: the test split ranks the queries against the gallery
        query, gallery = sized.pop("query"), sized.pop("gallery")
        source = query.source.replace("(query)", "(query against gallery)")
        sized["test"] = QueryGallery(query, gallery, source=source)
    return hold_out_validation(sized, **_validation(cfg))


def _validation(cfg: ml_collections.ConfigDict) -> dict[str, object]:
    """How the validation classes are chosen: a hold-out of ``data.val_fraction`` or fold
    ``data.val_fold`` of ``data.val_folds``, by ``data.split_seed``."""
    return {
        "val_fraction": cfg.val_fraction,
        "seed": cfg.split_seed,
        "folds": cfg.val_folds,
        "fold": cfg.val_fold,
    }
