"""k-means' assignment pass and cluster sums, by XLA's ops or by the native kernels.

Assignments are computed block by block over the points, so memory is O(block_size *
num_clusters) rather than O(N * num_clusters); :func:`assign` takes the XLA path (the pure-XLA
one, on every backend) unless told to make one native call over every point.

On CPU the assignment runs as a native kernel (:mod:`jdml.native.kmeans`) when asked (``native``:
a run's :class:`jdml.backends.Backends` ``kmeans``, ``backends.kmeans``): the same formula and
tie rule as the XLA ops, with the dot products from oneDNN's sgemm, or, up to 16 centroids on a
CPU with AVX-512, from a register tile of two points against up to 8 centroids (sgemm calls
only a few centroids wide cost more than their arithmetic); so an assignment can differ from
XLA's only where two centroids lie within float32 rounding of each other. Above
``NATIVE_LLOYD_MAX_CLUSTERS`` the iterations' assignments skip the points whose centroid cannot
have changed (:func:`assign_bounded`: Hamerly's bounds, with a margin for float32 rounding, so
each assignment is the one the full pass would make; see ``kmeans.cc``), and the sums are one
native call (``jdml_kmeans_sums``: XLA's ``segment_sum`` bit for bit, in parallel over ranges of
clusters).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jdml.geometry import squared_distances
from jdml.native import kmeans as native_kmeans
from jdml.platform import platform

# Point-centroid distances per assignment block when ``block_size`` is not given
# (``assign_scores``; None: the backend's value below). On CPU 2^21 (8 MB): the block stays in
# cache between the matmul and the minimum. On 20,000 x 128 points (CPU), one assignment pass
# took 5 ms at K = 100 in one block (8 ms in blocks of 4,096), 35 ms at K = 1,000 in blocks of
# 2,048, and 180 ms at K = 5,000 in blocks of 256 (260 ms in 4,096). On an accelerator 2^27
# (512 MB): at SOP's size (60,502 points, 11,316 clusters) 6 blocks of 11,860 points instead of
# 327 of 185; on an H200, 20 Lloyd iterations from random centroids took 0.146 s warm against
# 0.249 s with 2^21 (bench/bench_gpu.py --sections sweep; k-means++ is bound by its seeding).
ASSIGN_SCORES: int | None = None
CPU_ASSIGN_SCORES = 2**21
ACCELERATOR_ASSIGN_SCORES = 2**27
# Fewest points per automatic block.
MIN_BLOCK_ROWS = 64


# Up to this many clusters the native k-means runs the Lloyd iterations as one call
# (``jdml_kmeans_lloyd``: each iteration one pass that assigns and sums); above it, the
# per-piece partial sums grow with K and XLA's scatter-add is as fast.
NATIVE_LLOYD_MAX_CLUSTERS = 64


def direct_enabled(x: Any, native: bool) -> bool:
    """Whether :func:`~jdml.evaluation.kmeans.kmeans` calls the native functions directly on
    ``x``: a host array, on the CPU backend, with the native k-means asked for (``native``, a
    run's :class:`jdml.backends.Backends`' ``kmeans``)."""
    return not isinstance(x, jax.Array) and platform() == "cpu" and native


class Bounds(NamedTuple):
    """What a bounded assignment (:func:`assign_bounded`) keeps between iterations.

    Attributes:
      centroids: (K, D) the centroids the points were last assigned to.
      nearest: (N,) int32 each point's centroid.
      upper: (N,) float32 an upper bound of each point's distance to its centroid.
      lower: (N,) float32 a lower bound of its distance to every other centroid.
    """

    centroids: jax.Array
    nearest: jax.Array
    upper: jax.Array
    lower: jax.Array

    @classmethod
    def unknown(cls, centroids: jax.Array, num_points: int) -> Bounds:
        """No bounds yet: the first assignment assigns every point."""
        return cls(
            centroids,
            jnp.zeros((num_points,), jnp.int32),
            jnp.full((num_points,), jnp.inf, jnp.float32),
            jnp.zeros((num_points,), jnp.float32),
        )


def assign_bounded(
    points: jax.Array, norms: jax.Array, centroids: jax.Array, bounds: Bounds
) -> Bounds:
    """Every point's nearest centroid, as the native :func:`assign` finds it, skipping the
    points whose centroid cannot have changed since ``bounds`` (one native call,
    :func:`jdml.native.kmeans.assign_bounded`)."""
    nearest, upper, lower = native_kmeans.assign_bounded(
        points,
        norms,
        centroids,
        bounds.centroids,
        bounds.nearest,
        bounds.upper,
        bounds.lower,
    )
    return Bounds(centroids, nearest, upper, lower)


def cluster_sums(
    points: jax.Array, nearest: jax.Array, num_clusters: int, use_native: bool
) -> tuple[jax.Array, jax.Array]:
    """(K, D) float32 sums of each cluster's points in point order and (K,) float32 counts;
    ``nearest`` out of [0, K) (padding rows, NaN points) counts for no cluster. The native
    call and XLA's ``segment_sum`` give the same sums bit for bit."""
    if use_native:
        return native_kmeans.sums(points, nearest, num_clusters)
    ones = jnp.ones(nearest.shape, points.dtype)
    return (
        jax.ops.segment_sum(points, nearest, num_segments=num_clusters),
        jax.ops.segment_sum(ones, nearest, num_segments=num_clusters),
    )


def assign(
    blocks: jax.Array,
    centroids: jax.Array,
    norms: jax.Array | None = None,
    use_native: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Nearest centroid of every point, one block of points at a time.

    Args:
      blocks: (M, B, D) points cut into M blocks of B rows.
      centroids: (K, D) centres.
      norms: (M, B, 1) squared norms of the points, computed once for many calls (a pass over
        the points each call costs as much as the distances when K is small); None to compute
        them here.
      use_native: one native call over all the blocks (CPU; see the module docstring).

    Returns:
      assignments (M * B,) int32 (ties go to the lower centroid index) and the squared
      distance to that centroid (M * B,).
    """

    num_clusters = centroids.shape[0]
    positions = jnp.arange(num_clusters, dtype=jnp.int32)[None, :]
    if norms is None:
        norms = jnp.sum(blocks * blocks, axis=-1, keepdims=True)
    if use_native:
        return native_kmeans.assign(
            blocks.reshape(-1, blocks.shape[-1]), norms.reshape(-1), centroids
        )

    def one_block(block: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        points, points_sq = block
        sq = squared_distances(
            points, centroids, x_sq=points_sq[:, 0], precision=jax.lax.Precision.HIGHEST
        )
        # argmin as two plain reductions (the minimum, then the lowest position holding it):
        # XLA's CPU argmin, a reduction over (value, index) pairs, took twice as long.
        closest = jnp.min(sq, axis=1, keepdims=True)
        nearest = jnp.min(jnp.where(sq == closest, positions, num_clusters), axis=1)
        return nearest, closest[:, 0]

    nearest, sq = jax.lax.map(one_block, (blocks, norms))
    return nearest.reshape(-1), sq.reshape(-1)


def assign_scores() -> int:
    """Point-centroid distances per automatic assignment block: ``ASSIGN_SCORES`` if set, else
    the default backend's (``CPU_ASSIGN_SCORES`` or ``ACCELERATOR_ASSIGN_SCORES``)."""
    if ASSIGN_SCORES is not None:
        return ASSIGN_SCORES
    return CPU_ASSIGN_SCORES if platform() == "cpu" else ACCELERATOR_ASSIGN_SCORES


def block_rows(num_points: int, num_clusters: int, block_size: int | None) -> int:
    """Points per assignment block: ``block_size`` if given, else as many as hold
    :func:`assign_scores` distances (at least ``MIN_BLOCK_ROWS``); never more than the
    points."""
    if block_size is None:
        block_size = max(MIN_BLOCK_ROWS, assign_scores() // num_clusters)
    return max(1, min(num_points, block_size))


def point_blocks(points: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    """(N, D) points zero-padded and cut into (M, block_size, D) blocks, and their (M,
    block_size, 1) squared norms."""
    n, dim = points.shape
    num_blocks = math.ceil(n / block_size)
    padded = jnp.pad(points, ((0, num_blocks * block_size - n), (0, 0)))
    blocks = padded.reshape(num_blocks, block_size, dim)
    return blocks, jnp.sum(blocks * blocks, axis=-1, keepdims=True)
