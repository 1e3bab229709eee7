"""What a k-means of the evaluation takes and gives: its modes, its result, the check of its
points."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

DEFAULT_NUM_ITERS = 20


# Every mode of :func:`~jdml.evaluation.kmeans.kmeans`: the two initialisations of the jitted
# Lloyd iterations, and faiss's algorithm.
KMEANS_MODES = ("k-means++", "random", "reference")


class KMeansResult(NamedTuple):
    """Output of :func:`~jdml.evaluation.kmeans.kmeans`.

    Attributes:
      centroids: (num_clusters, D) float32 cluster centres.
      assignments: (N,) int32 index of each point's nearest centroid.
      inertia: () float32 sum of squared distances of the points to their centroids.
    """

    centroids: jax.Array
    assignments: jax.Array
    inertia: jax.Array


def check_points(x: Any, num_clusters: int, init: str | None = None) -> int:
    """The number of points of an (N, D) array, checked for ``num_clusters`` clusters (and
    ``init`` among ``KMEANS_MODES`` when given).

    Raises:
      ValueError: for another shape, ``num_clusters`` outside [1, N], or an unknown ``init``.
    """
    if x.ndim != 2:
        raise ValueError(f"expected (N, D) points, got shape {x.shape}")
    n = x.shape[0]
    if not 1 <= num_clusters <= n:
        raise ValueError(f"num_clusters={num_clusters} must be in [1, {n}]")
    if init is not None and init not in KMEANS_MODES:
        raise ValueError(f"unknown init {init!r}; expected one of {KMEANS_MODES}")
    return n
