"""Loads the configured dataset and splits it by class (the DML unseen-class protocol)."""

from __future__ import annotations

import ml_collections

from jdml.data.arrays import ImageArrays
from jdml.data.sources import DATASETS
from jdml.data.splits import split_by_class


def load_splits(cfg: ml_collections.ConfigDict) -> dict[str, ImageArrays]:
    """Returns ``{'train', 'test'[, 'val']}`` for the ``data`` config section."""
    loader = DATASETS.get(cfg.name)
    data = loader(
        path=cfg.path,
        image_size=cfg.image_size,
        cache_dir=cfg.cache_dir or None,
        channels=cfg.channels,
    )
    return split_by_class(data, val_fraction=cfg.val_fraction, seed=cfg.split_seed)
