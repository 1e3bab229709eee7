"""Batch miners: pure, seeded, fixed-shape functions selecting triplets within a batch.

Importing this package registers every miner in ``MINERS``.
"""

from jdml.miners import distance, random
from jdml.miners.base import MINERS, MinerFn, Tuples, make_miner

__all__ = ["MINERS", "MinerFn", "Tuples", "distance", "make_miner", "random"]
