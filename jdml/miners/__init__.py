"""Batch miners: pure, seeded, fixed-shape functions selecting tuples within a batch.

Importing this package imports every module in it, which registers each miner in ``MINERS``; a
new miner only needs a module here with ``@MINERS.register(name)``.
"""

import importlib
import pkgutil

from jdml.miners.base import MINERS, MinerFn, Tuples, make_miner

get = make_miner  # jdml.miners.get(name, **hparams) -> fn(key, embeddings, labels) -> Tuples

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["MINERS", "MinerFn", "Tuples", "get", "make_miner"]
