"""k-means for the clustering metrics (NMI, F1), in three modes, one job per module:

* :mod:`~jdml.evaluation.kmeans.cluster`: the entry point :func:`kmeans` and the choice of
  its back end;
* :mod:`~jdml.evaluation.kmeans.lloyd`: ``init="k-means++"`` (the default) and
  ``init="random"``, jitted Lloyd iterations (also on a device mesh,
  :mod:`jdml.evaluation.sharded`);
* :mod:`~jdml.evaluation.kmeans.reference`: ``init="reference"``, faiss's ``Clustering`` step
  for step as the Revisiting-DML evaluation runs it, with faiss's random draws and
  empty-cluster split on the host (:mod:`~jdml.evaluation.kmeans.draws`);
* :mod:`~jdml.evaluation.kmeans.assignment`: the assignment pass and the cluster sums that all
  modes share, by XLA's ops (the pure-XLA path, on every backend) or, on CPU, by the native
  kernels of :mod:`jdml.native.kmeans` (``native``: a run's ``backends.kmeans``);
* :mod:`~jdml.evaluation.kmeans.result`: the modes, the result and the check of the points.
"""

from jdml.evaluation.kmeans.cluster import kmeans
from jdml.evaluation.kmeans.draws import (
    REFERENCE_SEED,
    SplitResult,
    mt19937_outputs,
    reference_permutation,
    split_empty_clusters,
)
from jdml.evaluation.kmeans.lloyd import Shards, lloyd_kmeans, random_indices
from jdml.evaluation.kmeans.reference import reference_kmeans
from jdml.evaluation.kmeans.result import (
    DEFAULT_NUM_ITERS,
    KMEANS_MODES,
    KMeansResult,
    check_points,
)

__all__ = [
    "DEFAULT_NUM_ITERS",
    "KMEANS_MODES",
    "REFERENCE_SEED",
    "KMeansResult",
    "Shards",
    "SplitResult",
    "check_points",
    "kmeans",
    "lloyd_kmeans",
    "mt19937_outputs",
    "random_indices",
    "reference_kmeans",
    "reference_permutation",
    "split_empty_clusters",
]
