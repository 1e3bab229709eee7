"""Jitted k-means (Lloyd's algorithm, k-means++ seeding) for the clustering metrics (NMI, F1).

* Initialisation (default): greedy k-means++ (Arthur & Vassilvitskii, "k-means++: the
  advantages of careful seeding", SODA 2007): the first centre is a uniformly drawn sample;
  every next centre is chosen among ``2 + floor(ln k)`` candidates drawn with probability
  proportional to the squared distance to the closest centre so far, keeping the candidate
  that most reduces the total squared distance. All randomness comes from one ``jax.random``
  key (fixed seed). Memory O(N) per step, never O(k N). Alternatively ``init="random"``: k
  distinct samples drawn uniformly (faiss' initialisation), much faster for large k.
* Iterations: a fixed number of Lloyd steps (assign every point to its nearest centroid, move
  every centroid to the mean of its points). A cluster that receives no point keeps its previous
  centroid, so the result is deterministic.
* Assignments are computed block by block over the points, so memory is
  O(block_size * num_clusters) rather than O(N * num_clusters).

The data is centred (the mean is subtracted, and added back to the centroids) to reduce the
rounding error of the Gram expansion ``|x - c|^2 = |x|^2 + |c|^2 - 2 x.c``.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_NUM_ITERS = 20
DEFAULT_BLOCK_SIZE = 4096


class KMeansResult(NamedTuple):
    """Output of :func:`kmeans`.

    Attributes:
      centroids: (num_clusters, D) float32 cluster centres.
      assignments: (N,) int32 index of each point's nearest centroid.
      inertia: () float32 sum of squared distances of the points to their centroids.
    """

    centroids: jax.Array
    assignments: jax.Array
    inertia: jax.Array


def _squared_distances(x: jax.Array, centroids: jax.Array) -> jax.Array:
    """Squared Euclidean distances by the Gram expansion, clamped at 0.

    Args:
      x: (B, D) points.
      centroids: (K, D) centres.

    Returns:
      (B, K) squared distances.
    """
    x_sq = jnp.sum(x * x, axis=-1, keepdims=True)
    c_sq = jnp.sum(centroids * centroids, axis=-1)
    dots = jnp.matmul(x, centroids.T, precision=jax.lax.Precision.HIGHEST)
    return jnp.maximum(x_sq + c_sq[None, :] - 2.0 * dots, 0.0)


def _assign(blocks: jax.Array, centroids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Nearest centroid of every point, one block of points at a time.

    Args:
      blocks: (M, B, D) points cut into M blocks of B rows.
      centroids: (K, D) centres.

    Returns:
      assignments (M * B,) int32 (ties go to the lower centroid index) and the squared
      distance to that centroid (M * B,).
    """

    def one_block(x: jax.Array) -> tuple[jax.Array, jax.Array]:
        sq = _squared_distances(x, centroids)
        nearest = jnp.argmin(sq, axis=1).astype(jnp.int32)
        return nearest, jnp.take_along_axis(sq, nearest[:, None], axis=1)[:, 0]

    nearest, sq = jax.lax.map(one_block, blocks)
    return nearest.reshape(-1), sq.reshape(-1)


def _sample_proportional(key: jax.Array, weights: jax.Array, num_samples: int) -> jax.Array:
    """Indices drawn with probability proportional to non-negative ``weights``.

    Inverse-CDF sampling (one cumulative sum and a binary search per draw, O(N) memory and
    work, instead of one Gumbel variate per point and draw). If every weight is 0 the indices
    are drawn uniformly.

    Args:
      key: PRNG key.
      weights: (N,) non-negative weights.
      num_samples: number of independent draws.

    Returns:
      (num_samples,) int32 indices.
    """
    n = weights.shape[0]
    uniform_key, fallback_key = jax.random.split(key)
    cdf = jnp.cumsum(weights)
    targets = jax.random.uniform(uniform_key, (num_samples,)) * cdf[-1]
    drawn = jnp.minimum(jnp.searchsorted(cdf, targets, side="right"), n - 1).astype(jnp.int32)
    fallback = jax.random.randint(fallback_key, (num_samples,), 0, n, dtype=jnp.int32)
    return jnp.where(cdf[-1] > 0, drawn, fallback)


def _kmeans_plus_plus(x: jax.Array, num_clusters: int, key: jax.Array) -> jax.Array:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007, with local trials).

    Memory is O(trials * N + K * D) whatever K: each step only holds the (trials, N) squared
    distances of its candidates and the (N,) squared distance of every point to its closest
    centre so far. Work is O(K * trials * N * D) (K sequential steps, each one pass over x).

    Args:
      x: (N, D) points.
      num_clusters: K, number of centres.
      key: PRNG key.

    Returns:
      (K, D) initial centres, all drawn from ``x``.
    """
    n = x.shape[0]
    trials = 2 + int(math.log(num_clusters))
    x_sq = jnp.sum(x * x, axis=-1)

    def squared_distances(candidates: jax.Array) -> jax.Array:
        """(T,) point indices -> (T, N) squared distances to every point (norms reused)."""
        c = x[candidates]
        dots = jnp.matmul(c, x.T, precision=jax.lax.Precision.HIGHEST)
        return jnp.maximum(x_sq[candidates][:, None] + x_sq[None, :] - 2.0 * dots, 0.0)

    first_key, key = jax.random.split(key)
    first = jax.random.randint(first_key, (1,), 0, n, dtype=jnp.int32)
    centroids = jnp.zeros((num_clusters, x.shape[1]), x.dtype).at[0].set(x[first[0]])
    closest = squared_distances(first)[0]

    def add_centre(i: int, state: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        centroids, closest = state
        candidates = _sample_proportional(jax.random.fold_in(key, i), closest, trials)
        new_closest = jnp.minimum(closest[None, :], squared_distances(candidates))
        best = jnp.argmin(jnp.sum(new_closest, axis=1))
        return centroids.at[i].set(x[candidates[best]]), new_closest[best]

    centroids, _ = jax.lax.fori_loop(1, num_clusters, add_centre, (centroids, closest))
    return centroids


def _random_init(x: jax.Array, num_clusters: int, key: jax.Array) -> jax.Array:
    """K distinct points drawn uniformly, the initialisation of faiss' k-means.

    Args:
      x: (N, D) points.
      num_clusters: K, number of centres.
      key: PRNG key.

    Returns:
      (K, D) initial centres.
    """
    return x[jax.random.permutation(key, x.shape[0])[:num_clusters]]


INITS = {"k-means++": _kmeans_plus_plus, "random": _random_init}


@functools.partial(jax.jit, static_argnames=("num_clusters", "num_iters", "block_size", "init"))
def _kmeans(
    x: jax.Array,
    key: jax.Array,
    *,
    num_clusters: int,
    num_iters: int,
    block_size: int,
    init: str,
) -> KMeansResult:
    """Jitted body of :func:`kmeans` (same arguments; ``block_size`` already <= N)."""
    n, dim = x.shape
    mean = jnp.mean(x, axis=0)
    x = x - mean
    num_blocks = math.ceil(n / block_size)
    blocks = jnp.pad(x, ((0, num_blocks * block_size - n), (0, 0)))
    blocks = blocks.reshape(num_blocks, block_size, dim)
    ones = jnp.ones((n,), x.dtype)

    def lloyd_step(_: int, centroids: jax.Array) -> jax.Array:
        assignments, _ = _assign(blocks, centroids)
        assignments = assignments[:n]
        sums = jax.ops.segment_sum(x, assignments, num_segments=num_clusters)
        counts = jax.ops.segment_sum(ones, assignments, num_segments=num_clusters)
        means = sums / jnp.maximum(counts, 1.0)[:, None]
        return jnp.where((counts > 0)[:, None], means, centroids)

    centroids = INITS[init](x, num_clusters, key)
    centroids = jax.lax.fori_loop(0, num_iters, lloyd_step, centroids)
    assignments, sq = _assign(blocks, centroids)
    return KMeansResult(centroids + mean, assignments[:n], jnp.sum(sq[:n]))


def kmeans(
    x: jax.Array | np.ndarray,
    num_clusters: int,
    *,
    num_iters: int = DEFAULT_NUM_ITERS,
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    init: str = "k-means++",
) -> KMeansResult:
    """k-means clustering: greedy k-means++ seeding then ``num_iters`` Lloyd iterations.

    Memory is O(N * D + block_size * K + K * D) (never N x K): assignments are computed
    ``block_size`` points at a time, and the seeding holds O(N) per step.

    Args:
      x: (N, D) float32 points.
      num_clusters: K, 1 <= K <= N.
      num_iters: number of Lloyd iterations (fixed, no early stopping).
      seed: seed of the ``jax.random`` key used by the k-means++ seeding.
      block_size: points per block when computing assignments.
      init: "k-means++" (greedy k-means++ seeding, the default) or "random" (K distinct points
        drawn uniformly, like faiss; much faster for large K, as the seeding costs K passes
        over the data).

    Returns:
      A :class:`KMeansResult` with (K, D) centroids, (N,) assignments and the inertia.
    """
    x = jnp.asarray(x, jnp.float32)
    if x.ndim != 2:
        raise ValueError(f"expected (N, D) points, got shape {x.shape}")
    if not 1 <= num_clusters <= x.shape[0]:
        raise ValueError(f"num_clusters={num_clusters} must be in [1, {x.shape[0]}]")
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; expected one of {tuple(INITS)}")
    return _kmeans(
        x,
        jax.random.key(seed),
        num_clusters=num_clusters,
        num_iters=num_iters,
        block_size=min(block_size, x.shape[0]),
        init=init,
    )
