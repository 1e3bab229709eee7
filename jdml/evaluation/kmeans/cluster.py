""":func:`kmeans`, the evaluation's k-means (NMI, F1): the mode's defaults and the choice of
its back end (the jitted XLA ops, the native kernels in jitted code, or the native functions
called directly on host points)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.kmeans.assignment import (
    NATIVE_LLOYD_MAX_CLUSTERS,
    block_rows,
    direct_enabled,
)
from jdml.evaluation.kmeans.draws import REFERENCE_SEED
from jdml.evaluation.kmeans.lloyd import jitted_kmeans, random_indices, seed_key
from jdml.evaluation.kmeans.reference import reference_kmeans
from jdml.evaluation.kmeans.result import DEFAULT_NUM_ITERS, KMeansResult, check_points
from jdml.evaluation.points import float32_on_device
from jdml.native import kmeans as native_kmeans


def kmeans(
    x: jax.Array | np.ndarray,
    num_clusters: int,
    *,
    num_iters: int = DEFAULT_NUM_ITERS,
    seed: int | None = None,
    block_size: int | None = None,
    init: str = "k-means++",
    native: bool = False,
) -> KMeansResult:
    """k-means clustering: an initialisation, then ``num_iters`` Lloyd iterations.

    Memory is O(N * D + block_size * K + K * D) (never N x K): assignments are computed
    ``block_size`` points at a time, and the k-means++ seeding holds O(N) per step.

    Args:
      x: (N, D) float32 points.
      num_clusters: K, 1 <= K <= N.
      num_iters: number of Lloyd iterations (fixed, no early stopping).
      seed: seed of the initialisation; None for the mode's default: 0 (a ``jax.random`` key
        for "k-means++", a NumPy generator for "random"), faiss's 1234
        (:data:`REFERENCE_SEED`) for "reference".
      block_size: points per block when computing assignments; None for blocks of about
        :func:`~jdml.evaluation.kmeans.assignment.assign_scores` distances.
      init: "k-means++" (greedy k-means++ seeding, the default), "random" (K distinct points
        drawn uniformly; much faster for large K, as the seeding costs K passes over the data)
        or "reference" (faiss's k-means as the Revisiting-DML evaluation runs it, see
        :func:`reference_kmeans`).
      native: the native assignment on CPU (a run's :class:`jdml.backends.Backends`'
        ``kmeans``); False: XLA's ops.

    Returns:
      A :class:`KMeansResult` with (K, D) centroids, (N,) assignments and the inertia.
    """
    from_host = not isinstance(x, jax.Array)
    if from_host:
        x = np.ascontiguousarray(x, np.float32)
    check_points(x, num_clusters, init)
    if init == "reference":
        return reference_kmeans(
            x,
            num_clusters,
            num_iters=num_iters,
            seed=REFERENCE_SEED if seed is None else seed,
            block_size=block_size,
            native=native,
        )
    seed = 0 if seed is None else seed
    initial = (
        random_indices(x.shape[0], num_clusters, seed)
        if init == "random"
        else np.zeros((num_clusters,), np.int32)
    )
    if init == "random" and num_clusters <= NATIVE_LLOYD_MAX_CLUSTERS and direct_enabled(x, native):
        return KMeansResult(*native_kmeans.lloyd_host(x, initial, num_iters))
    result = jitted_kmeans(
        float32_on_device(x),
        seed_key(seed),
        jnp.asarray(initial),
        num_clusters=num_clusters,
        num_iters=num_iters,
        block_size=block_rows(x.shape[0], num_clusters, block_size),
        init=init,
        use_native=native,
    )
    if from_host:  # NumPy in, NumPy out (and x may share the caller's memory: done with it)
        result = KMeansResult(*(np.asarray(v) for v in result))
    return result
