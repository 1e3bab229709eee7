"""Exact, blocked k-nearest-neighbour search on the default JAX device.

Retrieval evaluation ranks every test sample against every other test sample (or every query
against a gallery), exactly: every query is compared to every reference. The package, one job
per module:

* :mod:`~jdml.evaluation.knn.search`: the entry points :func:`knn` and :func:`knn_blocks`, and
  the choice of the back end that selects the k nearest of a block of queries;
* :mod:`~jdml.evaluation.knn.blocks`: how queries and references are cut into blocks and
  chunks (the sizes tests and benchmarks tune), and the checks of a search's arguments;
* :mod:`~jdml.evaluation.knn.xla`: the scores and XLA's exact top-k, the pure-XLA path that
  every backend can run (``selection="xla"``);
* :mod:`~jdml.evaluation.knn.host`: numpy's selection of XLA's scores on the host (CPU);
* :mod:`~jdml.evaluation.knn.onednn`: the native kernel of :mod:`jdml.native.knn` (CPU);
* :mod:`~jdml.evaluation.knn.ranking`: :func:`knn_full_ranking`, the k nearest plus the exact
  rank of every same-class sample, for the mAP over all neighbours.

All back ends give the same neighbours up to the rounding of the scores, in (distance, index)
order. :mod:`jdml.evaluation.sharded` runs the same search over the devices of a mesh.
"""

from jdml.evaluation.knn.blocks import (
    DEFAULT_BLOCK_SIZE,
    DISTANCES,
    NeighbourBlock,
    check_search,
)
from jdml.evaluation.knn.host import largest_k, sortable_key
from jdml.evaluation.knn.ranking import (
    FullRanking,
    RankedBlock,
    full_ranking_blocks,
    knn_full_ranking,
    precision_sums_from_ranks,
)
from jdml.evaluation.knn.search import knn, knn_blocks

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "DISTANCES",
    "FullRanking",
    "NeighbourBlock",
    "RankedBlock",
    "check_search",
    "full_ranking_blocks",
    "knn",
    "knn_blocks",
    "knn_full_ranking",
    "largest_k",
    "precision_sums_from_ranks",
    "sortable_key",
]
