"""Loads the configured dataset and splits it by class (the DML unseen-class protocol)."""

from __future__ import annotations

import dataclasses

import ml_collections

from jdml.data.arrays import ImageSet, QueryGallery
from jdml.data.benchmarks import BENCHMARKS, read_benchmark
from jdml.data.sources import DATASETS, DataError
from jdml.data.splits import hold_out_validation, split_by_class


def load_splits(cfg: ml_collections.ConfigDict) -> dict[str, ImageSet]:
    """Returns ``{'train', 'test'[, 'val']}`` for the ``data`` config section.

    In-memory sources (``DATASETS``) are cut into classes halves by ``split_by_class``; the
    benchmarks (``BENCHMARKS``: cub200, cars196, sop, inshop) come with their own train and
    test splits, read as file lists whose photos are decoded as batches are drawn; In-Shop's
    test split is its queries ranked against its gallery (a :class:`QueryGallery`).
    """
    if cfg.name in BENCHMARKS:
        return _benchmark_splits(cfg)
    loader = DATASETS.get(cfg.name)
    data = loader(
        path=cfg.path,
        image_size=cfg.image_size,
        cache_dir=cfg.cache_dir or None,
        channels=cfg.channels,
    )
    return split_by_class(data, val_fraction=cfg.val_fraction, seed=cfg.split_seed)


def _benchmark_splits(cfg: ml_collections.ConfigDict) -> dict[str, ImageSet]:
    if cfg.channels != 3:
        raise DataError(f"{cfg.name} holds colour photos: set data.channels=3")
    splits = read_benchmark(cfg.name, cfg.path, verify_counts=cfg.verify_counts)
    sized = {
        name: dataclasses.replace(files, resize=cfg.resize, crop=cfg.image_size)
        for name, files in splits.items()
    }
    if "query" in sized:  # In-Shop: the test split ranks the queries against the gallery
        query, gallery = sized.pop("query"), sized.pop("gallery")
        source = query.source.replace("(query)", "(query against gallery)")
        sized["test"] = QueryGallery(query, gallery, source=source)
    return hold_out_validation(sized, val_fraction=cfg.val_fraction, seed=cfg.split_seed)
