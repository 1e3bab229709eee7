"""``init="reference"``: the k-means of faiss's ``Clustering`` as the Revisiting-DML
evaluation runs it (``niter=20``, no subsampling, ``nredo=1``, default seed 1234), step for
step:

* Initialisation: the centroids are the points ``perm[0..K-1]`` of a Fisher-Yates permutation
  drawn with a Mersenne Twister (MT19937, ``std::mt19937``) seeded with ``seed + 1``: for
  i = 0, 1, ..., swap positions i and ``i + u_i mod (N - i)``, u_i its i-th 32-bit output
  (:func:`~jdml.evaluation.kmeans.draws.reference_permutation`). Computed on the host with
  NumPy's MT19937, which is seeded like ``std::mt19937``. With N == K the centroids are the
  points in order and no iteration runs.
* Each iteration assigns every point to its nearest centroid (ties to the lower index), sets
  every centroid to the float32 sum of its points times ``1 / count`` (jitted; one call runs
  the iterations up to the next empty cluster), then splits clusters to fill the empty ones
  (:func:`~jdml.evaluation.kmeans.draws.split_empty_clusters`, on the host, only in an
  iteration that leaves a cluster empty). The data is not centred, so the arithmetic is that of
  the original coordinates (centring would also change what the split's scaling perturbs).
* The points are finally assigned to the nearest of the final centroids.

With the native kernels (CPU) and up to ``NATIVE_LLOYD_MAX_CLUSTERS`` clusters, the updates up
to the next empty cluster are one native call (:func:`jdml.native.kmeans.reference_lloyd`): the
points' squared norms, then faiss's float32 sums in point order, a range of centroids per
thread, as faiss sums them (up to 16 clusters each group of clusters' sums in registers, one
pass over the points per group), each chunk of points summed as soon as some thread has
assigned it; when no cluster was left empty, the same call ends with the final assignment.
Host (NumPy) points take the native function directly
(:func:`jdml.native.kmeans.reference_lloyd_host`), as faiss is called: the jitted call's result
bit for bit, as NumPy arrays. Above that the updates use the bounded assignment and the native
sums (:mod:`jdml.evaluation.kmeans.assignment`).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.kmeans import assignment
from jdml.evaluation.kmeans.assignment import (
    NATIVE_LLOYD_MAX_CLUSTERS,
    Bounds,
    assign,
    block_rows,
    cluster_sums,
    direct_enabled,
    point_blocks,
)
from jdml.evaluation.kmeans.draws import (
    REFERENCE_SEED,
    reference_permutation,
    split_empty_clusters,
)
from jdml.evaluation.kmeans.result import DEFAULT_NUM_ITERS, KMeansResult, check_points
from jdml.evaluation.points import float32_on_device
from jdml.native import kmeans as native_kmeans


def _reference_update(
    points: jax.Array,
    blocks: jax.Array,
    norms: jax.Array,
    centroids: jax.Array,
    num_points: int,
    use_native: bool,
    bounds: Bounds | None = None,
) -> tuple[jax.Array, jax.Array, Bounds | None]:
    """One Lloyd update of the reference mode, before the empty-cluster split.

    Every point goes to its nearest centroid (ties to the lower index); every centroid becomes
    the float32 sum of its points multiplied by the float32 ``1 / count`` (faiss's
    ``compute_centroids``); an empty cluster's centroid becomes 0 (it is filled by the split).

    Args:
      points: (N, D) points.
      blocks: the same points zero-padded to M * B >= N rows, as (M, B, D) blocks.
      norms: (M, B, 1) squared norms of the blocks' points.
      centroids: (K, D) current centroids.
      num_points: N.
      use_native: the native assignment (CPU).
      bounds: the bounds of the last assignment, for one that skips the points whose centroid
        cannot have changed (:func:`~.assignment.assign_bounded`); None for a full assignment.

    Returns:
      (K, D) float32 new centroids, (K,) float32 cluster sizes, and the bounds of this
      assignment (None without ``bounds``).
    """
    num_clusters = centroids.shape[0]
    if bounds is None:
        assignments = assign(blocks, centroids, norms, use_native)[0][:num_points]
    else:
        bounds = assignment.assign_bounded(
            points, norms.reshape(-1)[:num_points], centroids, bounds
        )
        assignments = bounds.nearest
    # The sums read ``points``, not a slice of the blocks: with one block, XLA fused that slice
    # into the scatter and the update took twice as long.
    sums, counts = cluster_sums(points, assignments, num_clusters, use_native)
    scale = jnp.where(counts > 0, 1.0 / jnp.maximum(counts, 1.0), 0.0)
    return sums * scale[:, None], counts, bounds


@functools.partial(jax.jit, static_argnames=("num_points", "block_size", "use_native"))
def _reference_updates(
    points: jax.Array,
    centroids: jax.Array,
    remaining: jax.Array,
    *,
    num_points: int,
    block_size: int,
    use_native: bool,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Up to ``remaining`` updates of the reference mode in one call, stopping after the first
    that leaves a cluster empty (the host then splits, see :func:`split_empty_clusters`), and
    the final assignment (:func:`_final_assignment`) to the centroids it ends with.

    Args:
      points: (N, D) points.
      centroids: (K, D) current centroids.
      remaining: () int32, the most updates to run (0: only the final assignment).
      num_points: N.
      block_size: points per assignment block.
      use_native: the native assignment (CPU).

    Returns:
      The (K, D) centroids and (K,) float32 cluster sizes of the last update, () int32 the
      number of updates run (sizes all 1 without an update), and the final assignment: (N,)
      int32 nearest centroids and () inertia. These are only valid if no cluster is empty (no
      split follows); the native call then leaves them K and NaN.
    """
    if use_native and centroids.shape[0] <= NATIVE_LLOYD_MAX_CLUSTERS:
        return native_kmeans.reference_lloyd(points, centroids, remaining)
    blocks, norms = point_blocks(points, block_size)

    def more(state: tuple) -> jax.Array:
        _, counts, done, _ = state
        return (done < remaining) & jnp.all(counts > 0)

    def update(state: tuple) -> tuple:
        centroids, _, done, bounds = state
        centroids, counts, bounds = _reference_update(
            points, blocks, norms, centroids, num_points, use_native, bounds
        )
        return centroids, counts, done + 1, bounds

    # Bounds start unknown at each call: an empty-cluster split between calls moves centroids
    # outside these updates.
    bounds = Bounds.unknown(centroids, num_points) if use_native else None
    start = (centroids, jnp.ones((centroids.shape[0],), jnp.float32), jnp.int32(0), bounds)
    centroids, counts, steps, _ = jax.lax.while_loop(more, update, start)
    assignments, sq = assign(blocks, centroids, norms, use_native)
    return centroids, counts, steps, assignments[:num_points], jnp.sum(sq[:num_points])


@functools.partial(jax.jit, static_argnames=("block_size", "use_native"))
def _final_assignment(
    points: jax.Array, centroids: jax.Array, *, block_size: int, use_native: bool
) -> tuple[jax.Array, jax.Array]:
    """(N,) int32 nearest centroid of every point (ties to the lower index) and the inertia."""
    blocks, norms = point_blocks(points, block_size)
    assignments, sq = assign(blocks, centroids, norms, use_native)
    return assignments[: points.shape[0]], jnp.sum(sq[: points.shape[0]])


def reference_kmeans(
    x: jax.Array | np.ndarray,
    num_clusters: int,
    *,
    num_iters: int = DEFAULT_NUM_ITERS,
    seed: int = REFERENCE_SEED,
    block_size: int | None = None,
    native: bool = False,
) -> KMeansResult:
    """k-means as faiss's ``Clustering`` computes it, then each point's nearest centroid.

    Follows ``faiss.Clustering(D, K)`` with ``niter=num_iters``, ``seed``, ``nredo=1`` and no
    subsampling (``max_points_per_centroid`` above N), trained on an exact L2 index, then an
    exact L2 search of the points among the final centroids (the Revisiting-DML evaluation):

    1. N == K: the centroids are the points, in order (no iteration). Otherwise the initial
       centroids are the points ``reference_permutation(N, K, seed + 1)``.
    2. ``num_iters`` times: assign, recompute the means (:func:`_reference_update`, jitted)
       and, if a cluster is empty, :func:`split_empty_clusters` (host).
    3. Final assignment to the nearest centroid.

    Float32 throughout; the distances use the Gram expansion with the original (uncentred)
    coordinates as faiss does, and the sums run over the points in order, so on CPU the
    result equals faiss's (bit for bit in the tests) unless a point lies within rounding of
    halfway between two centroids, where the two BLAS roundings may decide differently.
    Splits make such points more common: the two halves differ by 2/1024 relative, and by
    about 1e-6 after a cluster is split twice in one iteration. Exact ties (e.g. coinciding
    centroids) go to the lower index, as in faiss.

    Args:
      x: (N, D) float32 points.
      num_clusters: K, 1 <= K <= N.
      num_iters: number of iterations (faiss's ``niter``; the reference uses 20).
      seed: faiss's clustering seed (its default 1234); the split always uses 1234, as faiss.
      block_size: points per block when computing assignments; None for blocks of about
        :func:`~jdml.evaluation.kmeans.assignment.assign_scores` distances.
      native: the native assignment on CPU (a run's :class:`jdml.backends.Backends`'
        ``kmeans``); False: XLA's ops.

    Returns:
      A :class:`KMeansResult` with (K, D) centroids, (N,) assignments and the inertia.
    """
    from_host = not isinstance(x, jax.Array)
    direct = direct_enabled(x, native) and num_clusters <= NATIVE_LLOYD_MAX_CLUSTERS
    # not through the host: a copy each way took 1-2 ms at 20,000 x 128
    points = np.ascontiguousarray(x, np.float32) if direct else float32_on_device(x)
    n = check_points(points, num_clusters)
    if n == num_clusters:  # a copy: the points may share the caller's memory or a staging buffer
        centroids = np.array(points) if direct else jnp.copy(points)
    else:
        permutation = reference_permutation(n, num_clusters, seed + 1)
        centroids = points[permutation] if direct else points[jnp.asarray(permutation)]
    if direct:

        def updates(centroids: Any, remaining: int) -> tuple:
            return native_kmeans.reference_lloyd_host(points, centroids, remaining)

    else:
        rows = block_rows(n, num_clusters, block_size)

        def updates(centroids: Any, remaining: int) -> tuple:
            return _reference_updates(
                points,
                jnp.asarray(centroids),
                jnp.int32(remaining),
                num_points=n,
                block_size=rows,
                use_native=native,
            )

    # One call runs every update up to the next empty cluster (splits are made on the host),
    # and after the last update the final assignment; with N == K, only the final assignment.
    done = 0 if n > num_clusters else num_iters
    while True:
        centroids, counts, steps, assignments, inertia = updates(centroids, num_iters - done)
        done += int(steps)
        counts = np.asarray(counts)
        if not np.any(counts == 0):
            break
        centroids = split_empty_clusters(np.asarray(centroids), counts, n).centroids
    result = KMeansResult(centroids, assignments, inertia)
    if from_host:  # NumPy in, NumPy out (and points may share the caller's memory: done with it)
        result = KMeansResult(*(np.asarray(v) for v in result))
    return result
