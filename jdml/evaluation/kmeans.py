"""Jitted k-means (Lloyd's algorithm) for the clustering metrics (NMI, F1), in two flavours.

``init="k-means++"`` (the default) and ``init="random"``:

* Initialisation (default): greedy k-means++ (Arthur & Vassilvitskii, "k-means++: the
  advantages of careful seeding", SODA 2007): the first centre is a uniformly drawn sample;
  every next centre is chosen among ``2 + floor(ln k)`` candidates drawn with probability
  proportional to the squared distance to the closest centre so far, keeping the candidate
  that most reduces the total squared distance. All randomness comes from one ``jax.random``
  key (fixed seed). Memory O(N) per step, never O(k N). Alternatively ``init="random"``: k
  distinct samples drawn uniformly by NumPy on the host (:func:`random_indices`; much faster
  for large k).
* Iterations: a fixed number of Lloyd steps (assign every point to its nearest centroid, move
  every centroid to the mean of its points). A cluster that receives no point keeps its previous
  centroid, so the result is deterministic.
* The data is centred (the mean is subtracted, and added back to the centroids) to reduce the
  rounding error of the Gram expansion ``|x - c|^2 = |x|^2 + |c|^2 - 2 x.c``.

``init="reference"`` (:func:`reference_kmeans`) is the k-means of faiss's ``Clustering`` as
the Revisiting-DML evaluation runs it (``niter=20``, no subsampling, ``nredo=1``, default seed
1234), step for step:

* Initialisation: the centroids are the points ``perm[0..K-1]`` of a Fisher-Yates permutation
  drawn with a Mersenne Twister (MT19937, ``std::mt19937``) seeded with ``seed + 1``: for
  i = 0, 1, ..., swap positions i and ``i + u_i mod (N - i)``, u_i its i-th 32-bit output
  (:func:`reference_permutation`). Computed on the host with NumPy's MT19937, which is seeded
  like ``std::mt19937``. With N == K the centroids are the points in order and no iteration
  runs.
* Each iteration assigns every point to its nearest centroid (ties to the lower index), sets
  every centroid to the float32 sum of its points times ``1 / count`` (jitted; one call runs
  the iterations up to the next empty cluster), then splits clusters to fill the empty ones
  (:func:`split_empty_clusters`, on the host, only in an iteration that leaves a cluster
  empty). The data is not centred, so the arithmetic is that of
  the original coordinates (centring would also change what the split's scaling perturbs).
* The points are finally assigned to the nearest of the final centroids.

In every mode, assignments are computed block by block over the points, so memory is
O(block_size * num_clusters) rather than O(N * num_clusters).

On CPU the assignment runs as a native kernel (``jdml/nn/native/kmeans.cc``;
``$JDML_KMEANS=auto|xla|onednn`` as ``$JDML_CONV`` for the convolutions): the same formula and
tie rule as the XLA ops, with the dot products from oneDNN's sgemm, or, up to 16 centroids on a
CPU with AVX-512, from a register tile of two points against up to 8 centroids (sgemm calls
only a few centroids wide cost more than their arithmetic); so an assignment can differ from
XLA's only where two centroids lie within float32 rounding of each other. The mean of
"k-means++" and "random" is one native call (float64 sums in a fixed order). Up to
``NATIVE_LLOYD_MAX_CLUSTERS`` clusters:

* "k-means++" and "random" run the Lloyd iterations and the final assignment as one native
  call (``jdml_kmeans_lloyd``), which centres each tile of 512 points into a buffer of its
  thread (the centred points are never written out), assigns it and sums it while its rows are
  in cache, and keeps the same threads for every iteration. 20 iterations on 20,000 x 128
  points at 5 clusters took 29 ms with XLA's scatter-add, 17 ms with the first fused version,
  3.2 ms now.
* The reference mode runs its updates up to the next empty cluster as one native call
  (``jdml_kmeans_reference_lloyd``): the points' squared norms, then faiss's float32 sums in
  point order, a range of centroids per thread, as faiss sums them (up to 16 clusters each
  group of clusters' sums in registers, one pass over the points per group), each chunk of
  points summed as soon as some thread has assigned it; when no cluster was left empty, the
  same call ends with the final assignment.
* Host (NumPy) points take these native functions directly, through ctypes on OpenMP's threads,
  as faiss is called (``_direct_lloyd``, ``_direct_reference_updates``): JAX on CPU shares a
  host array only if it is 64-byte aligned, which a NumPy array's memory rarely is, and the
  aligned copy of 20,000 x 512 points took as long as a 5-cluster k-means of them. The result
  is the jitted call's bit for bit, as NumPy arrays.

Above that the points are centred once (``jdml_kmeans_centre``), the iterations' assignments
skip the points whose centroid cannot have changed (``jdml_kmeans_assign_bounded``: Hamerly's
bounds, with a margin for float32 rounding, so each assignment is the one the full pass would
make; see ``kmeans.cc``), and the sums are one native call (``jdml_kmeans_sums``: XLA's
``segment_sum`` bit for bit, in parallel over ranges of clusters). The final assignment, which
also gives the inertia, is a full pass. Host points take the jitted call there (an aligned copy
first). The sharded k-means on a device mesh keeps XLA's ops.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.points import float32_on_device
from jdml.geometry import squared_distances, squared_norms
from jdml.nn import native

DEFAULT_NUM_ITERS = 20
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
# The clustering seed of the reference mode (faiss's default ClusteringParameters.seed), and the
# fixed seed of its empty-cluster split.
REFERENCE_SEED = 1234
# Relative perturbation of the two halves of a split cluster (1/1024).
SPLIT_EPS = 1.0 / 1024.0
# Mersenne-Twister outputs drawn at a time by the split's rejection scan (at least K).
_DRAW_BLOCK = 1 << 16


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


class Shards(NamedTuple):
    """Where the points are when the k-means runs on every device of a mesh axis, inside
    ``jax.shard_map`` (:func:`jdml.evaluation.sharded.sharded_kmeans`); None everywhere else.

    Each device holds an equal, contiguous slice of the points; the last devices' slices end
    with zero rows of padding (global indices >= ``num_points``), which are excluded from every
    sum and never drawn.

    Attributes:
      axis: the mesh axis the points are split over.
      num_points: N, the points of all devices without the padding.
    """

    axis: str
    num_points: int


def _is_point(x: jax.Array, shards: Shards) -> jax.Array:
    """(n,) whether each local row of ``x`` is a point rather than padding."""
    first = jax.lax.axis_index(shards.axis) * x.shape[0]
    return first + jnp.arange(x.shape[0]) < shards.num_points


def _total(value: jax.Array, shards: Shards | None) -> jax.Array:
    """A sum over the points: ``value`` itself on one device, its sum over the devices."""
    return value if shards is None else jax.lax.psum(value, shards.axis)


def _rows(x: jax.Array, indices: jax.Array, shards: Shards | None) -> jax.Array:
    """``x[indices]`` for global point indices: on shards, each device contributes the rows it
    holds and zeros for the others, summed over the devices (exact: one term is not 0)."""
    if shards is None:
        return x[indices]
    local = indices - jax.lax.axis_index(shards.axis) * x.shape[0]
    mine = (local >= 0) & (local < x.shape[0])
    picked = x[jnp.clip(local, 0, x.shape[0] - 1)]
    mine = mine.reshape(mine.shape + (1,) * (picked.ndim - mine.ndim))
    return jax.lax.psum(jnp.where(mine, picked, 0), shards.axis)


def _row(x: jax.Array, index: jax.Array, shards: Shards | None) -> jax.Array:
    """``x[index]`` for one global point index (see :func:`_rows`)."""
    return x[index] if shards is None else _rows(x, index[None], shards)[0]


def native_enabled() -> bool:
    """Whether this process's k-means runs the native assignment (``$JDML_KMEANS``, on CPU)."""
    return native.onednn_enabled(native.KMEANS_ENV)


def _native_assign(
    points: jax.Array, norms: jax.Array, centroids: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """:func:`_assign`'s result for (N, D) points and their (N,) squared norms, as one native
    call (``jdml_kmeans_assign``)."""
    native.library()  # registers the targets (compiled once per machine)
    n = points.shape[0]
    call = jax.ffi.ffi_call(
        "jdml_kmeans_assign",
        (jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.float32)),
        vmap_method="sequential",
    )
    return call(points, norms, centroids, squared_norms(centroids))


class Bounds(NamedTuple):
    """What a bounded assignment (:func:`_native_assign_bounded`) keeps between iterations.

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


def _native_assign_bounded(
    points: jax.Array, norms: jax.Array, centroids: jax.Array, bounds: Bounds
) -> Bounds:
    """Every point's nearest centroid, as :func:`_native_assign` finds it, skipping the points
    whose centroid cannot have changed since ``bounds`` (one native call,
    ``jdml_kmeans_assign_bounded``)."""
    native.library()  # registers the targets (compiled once per machine)
    n = points.shape[0]
    call = jax.ffi.ffi_call(
        "jdml_kmeans_assign_bounded",
        (
            jax.ShapeDtypeStruct((n,), jnp.int32),
            jax.ShapeDtypeStruct((n,), jnp.float32),
            jax.ShapeDtypeStruct((n,), jnp.float32),
        ),
        vmap_method="sequential",
    )
    nearest, upper, lower = call(
        points,
        norms,
        centroids,
        squared_norms(centroids),
        bounds.centroids,
        bounds.nearest,
        bounds.upper,
        bounds.lower,
    )
    return Bounds(centroids, nearest, upper, lower)


def _native_sums(
    points: jax.Array, nearest: jax.Array, num_clusters: int
) -> tuple[jax.Array, jax.Array]:
    """Each cluster's (K, D) float32 sum of its points and its (K,) float32 count, as
    ``jax.ops.segment_sum`` gives them bit for bit (point order; ``nearest`` out of [0, K)
    counts for no cluster), as one native call (``jdml_kmeans_sums``, parallel over ranges of
    clusters)."""
    native.library()  # registers the targets (compiled once per machine)
    call = jax.ffi.ffi_call(
        "jdml_kmeans_sums",
        (
            jax.ShapeDtypeStruct((num_clusters, points.shape[1]), jnp.float32),
            jax.ShapeDtypeStruct((num_clusters,), jnp.float32),
        ),
        vmap_method="sequential",
    )
    return call(points, nearest)


def _cluster_sums(
    points: jax.Array, nearest: jax.Array, num_clusters: int, use_native: bool
) -> tuple[jax.Array, jax.Array]:
    """(K, D) float32 sums of each cluster's points in point order and (K,) float32 counts;
    ``nearest`` out of [0, K) (padding rows, NaN points) counts for no cluster. The native
    call and XLA's ``segment_sum`` give the same sums bit for bit."""
    if use_native:
        return _native_sums(points, nearest, num_clusters)
    ones = jnp.ones(nearest.shape, points.dtype)
    return (
        jax.ops.segment_sum(points, nearest, num_segments=num_clusters),
        jax.ops.segment_sum(ones, nearest, num_segments=num_clusters),
    )


def _native_centre(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(N, D) points minus their (D,) mean, the centred points' (N,) squared norms and the mean,
    as one native call (``jdml_kmeans_centre``; the mean's sums are float64, added in a fixed
    order)."""
    native.library()  # registers the targets (compiled once per machine)
    n, dim = x.shape
    call = jax.ffi.ffi_call(
        "jdml_kmeans_centre",
        (
            jax.ShapeDtypeStruct((n, dim), jnp.float32),
            jax.ShapeDtypeStruct((n,), jnp.float32),
            jax.ShapeDtypeStruct((dim,), jnp.float32),
        ),
        vmap_method="sequential",
    )
    return call(x)


# Up to this many clusters the native k-means runs the Lloyd iterations as one call
# (``jdml_kmeans_lloyd``: each iteration one pass that assigns and sums); above it, the
# per-piece partial sums grow with K and XLA's scatter-add is as fast.
NATIVE_LLOYD_MAX_CLUSTERS = 64


def _native_mean(x: jax.Array) -> jax.Array:
    """The (D,) mean of (N, D) points as one native call (``jdml_kmeans_mean``: float64 sums,
    added in a fixed order whatever the threads), the mean ``_native_centre`` subtracts."""
    native.library()  # registers the targets (compiled once per machine)
    call = jax.ffi.ffi_call(
        "jdml_kmeans_mean",
        jax.ShapeDtypeStruct((x.shape[1],), jnp.float32),
        vmap_method="sequential",
    )
    return call(x)


def _native_lloyd(
    x: jax.Array, mean: jax.Array, centroids: jax.Array, num_iters: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``num_iters`` Lloyd steps on the points ``x - mean`` from ``centroids`` (centred), and
    the final assignment, as one native call (``jdml_kmeans_lloyd``).

    Every step assigns each point as :func:`_assign` does and moves each centroid to the mean
    of its points (float64 sums, added over fixed pieces of the points in order, so the result
    does not depend on the threads); a cluster without points keeps its centroid. The centred
    points are computed a tile at a time, as ``_native_centre`` computes them, never written
    out.

    Args:
      x: (N, D) points, not centred.
      mean: (D,) their mean (:func:`_native_mean`).
      centroids: (K, D) initial centroids, centred.
      num_iters: Lloyd steps.

    Returns:
      The (K, D) centred centroids after the steps, the (N,) assignments and squared
      distances of :func:`_assign` for them, and the () inertia (their float64 sum).
    """
    native.library()  # registers the targets (compiled once per machine)
    n = x.shape[0]
    call = jax.ffi.ffi_call(
        "jdml_kmeans_lloyd",
        (
            jax.ShapeDtypeStruct(centroids.shape, jnp.float32),
            jax.ShapeDtypeStruct((n,), jnp.int32),
            jax.ShapeDtypeStruct((n,), jnp.float32),
            jax.ShapeDtypeStruct((1,), jnp.float32),
        ),
        vmap_method="sequential",
    )
    centroids, assignments, sq, inertia = call(x, mean, centroids, iters=np.int64(num_iters))
    return centroids, assignments, sq, inertia[0]


def _native_reference_updates(
    points: jax.Array, centroids: jax.Array, remaining: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """:func:`_reference_updates` as one native call (``jdml_kmeans_reference_lloyd``): the
    points' squared norms, then up to ``remaining`` updates, each the assignment and then each
    centroid's float32 sum of its points in point order (a range of centroids per thread, as
    faiss sums them) times ``1 / count``, stopping after the first that leaves a cluster empty;
    then, if none did, the final assignment and its inertia (float64 sums)."""
    native.library()  # registers the targets (compiled once per machine)
    n = points.shape[0]
    call = jax.ffi.ffi_call(
        "jdml_kmeans_reference_lloyd",
        (
            jax.ShapeDtypeStruct(centroids.shape, jnp.float32),
            jax.ShapeDtypeStruct((centroids.shape[0],), jnp.float32),
            jax.ShapeDtypeStruct((1,), jnp.int32),
            jax.ShapeDtypeStruct((n,), jnp.int32),
            jax.ShapeDtypeStruct((n,), jnp.float32),
            jax.ShapeDtypeStruct((1,), jnp.float32),
        ),
        vmap_method="sequential",
    )
    centroids, counts, steps, assignments, _, inertia = call(
        points, centroids, jnp.reshape(remaining, (1,)).astype(jnp.int32)
    )
    return centroids, counts, steps[0], assignments, inertia[0]


def _assign(
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
        return _native_assign(blocks.reshape(-1, blocks.shape[-1]), norms.reshape(-1), centroids)

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


def _kmeans_plus_plus(
    x: jax.Array, num_clusters: int, key: jax.Array, shards: Shards | None = None
) -> jax.Array:
    """Greedy k-means++ seeding (Arthur & Vassilvitskii 2007, with local trials).

    Memory is O(trials * N + K * D) whatever K: each step only holds the (trials, N) squared
    distances of its candidates and the (N,) squared distance of every point to its closest
    centre so far. Work is O(K * trials * N * D) (K sequential steps, each one pass over x).

    On ``shards`` (x is this device's slice) every device holds the distances to its own
    points; the (N,) closest distances are gathered for the draws, which then see the same
    weights and keys as on one device, and the candidates' totals are summed over the devices.

    Args:
      x: (N, D) points (this device's rows on ``shards``).
      num_clusters: K, number of centres.
      key: PRNG key.
      shards: the layout of a sharded k-means, or None.

    Returns:
      (K, D) initial centres, all drawn from ``x``.
    """
    n = x.shape[0] if shards is None else shards.num_points
    trials = 2 + int(math.log(num_clusters))
    x_sq = jnp.sum(x * x, axis=-1)

    def to_points(candidates: jax.Array) -> jax.Array:
        """(T,) point indices -> (T, N) squared distances to every point (norms reused)."""
        return squared_distances(
            _rows(x, candidates, shards),
            x,
            x_sq=_rows(x_sq, candidates, shards),
            y_sq=x_sq,
            precision=jax.lax.Precision.HIGHEST,
        )

    def weights(closest: jax.Array) -> jax.Array:
        """The (N,) closest distances of all points, the draws' weights."""
        if shards is None:
            return closest
        return jax.lax.all_gather(closest, shards.axis, tiled=True)[:n]

    def candidate_totals(new_closest: jax.Array) -> jax.Array:
        """(T,) total squared distance of the points with each candidate added."""
        if shards is None:
            return jnp.sum(new_closest, axis=1)
        mask = _is_point(x, shards)[None, :]
        return _total(jnp.sum(jnp.where(mask, new_closest, 0.0), axis=1), shards)

    first_key, key = jax.random.split(key)
    first = jax.random.randint(first_key, (1,), 0, n, dtype=jnp.int32)
    centroids = jnp.zeros((num_clusters, x.shape[1]), x.dtype).at[0].set(_row(x, first[0], shards))
    closest = to_points(first)[0]

    def add_centre(i: int, state: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        centroids, closest = state
        candidates = _sample_proportional(jax.random.fold_in(key, i), weights(closest), trials)
        new_closest = jnp.minimum(closest[None, :], to_points(candidates))
        best = jnp.argmin(candidate_totals(new_closest))
        return centroids.at[i].set(_row(x, candidates[best], shards)), new_closest[best]

    centroids, _ = jax.lax.fori_loop(1, num_clusters, add_centre, (centroids, closest))
    return centroids


@functools.lru_cache(maxsize=64)
def random_indices(num_points: int, num_clusters: int, seed: int) -> np.ndarray:
    """K distinct point indices drawn uniformly, on the host (the "random" initialisation).

    NumPy draws them in a fraction of a millisecond; a ``jax.random.permutation`` of 20,000
    points took 10 ms on CPU (XLA sorts), half of faiss's whole 20-iteration k-means at K = 5.
    The draw is remembered per arguments (read-only): seeding the generator and drawing took
    0.17 ms, 3% of a 5-cluster k-means of 20,000 points.

    Args:
      num_points: N.
      num_clusters: K <= N.
      seed: seed of ``np.random.default_rng``.

    Returns:
      (K,) int32 distinct indices in [0, N).
    """
    rng = np.random.default_rng(seed)
    drawn = rng.choice(num_points, num_clusters, replace=False).astype(np.int32)
    drawn.flags.writeable = False
    return drawn


@functools.lru_cache(maxsize=64)
def _seed_key(seed: int) -> jax.Array:
    """``jax.random.key(seed)``, made once per seed (each is a call on the device)."""
    return jax.random.key(seed)


# Every mode of :func:`kmeans`: the two initialisations of the jitted Lloyd iterations, and
# faiss's algorithm.
KMEANS_MODES = ("k-means++", "random", "reference")


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


def _updated_centroids(
    x: jax.Array,
    assignments: jax.Array,
    centroids: jax.Array,
    shards: Shards | None,
    use_native: bool = False,
) -> jax.Array:
    """Lloyd's update: each centroid becomes the mean of its points (summed over the devices on
    ``shards``); a cluster without points keeps its centroid. Assignments out of range (padding
    rows, NaN points) count for no cluster. ``use_native``: the sums as one native call (one
    device on CPU)."""
    sums, counts = _cluster_sums(x, assignments, centroids.shape[0], use_native)
    sums, counts = _total(sums, shards), _total(counts, shards)
    means = sums / jnp.maximum(counts, 1.0)[:, None]
    return jnp.where((counts > 0)[:, None], means, centroids)


def lloyd_kmeans(
    x: jax.Array,
    key: jax.Array,
    initial: jax.Array,
    *,
    num_clusters: int,
    num_iters: int,
    block_size: int,
    init: str,
    shards: Shards | None = None,
    use_native: bool = False,
) -> KMeansResult:
    """The k-means of :func:`kmeans` ("k-means++" or "random"), traced: the body of the jitted
    one-device k-means, and of the sharded one inside ``jax.shard_map`` with ``shards``.

    On ``shards`` each device assigns its own points; the mean, the per-cluster sums and
    counts and the inertia are summed over the devices (``psum``), so every device holds the
    same centroids; the assignments are this device's (padding rows get K).

    Args:
      x: (N, D) points (this device's rows on ``shards``).
      key: PRNG key of the k-means++ seeding.
      initial: the (K,) indices of the initial centres for "random" (ignored by "k-means++").
      num_clusters, num_iters, init: as in :func:`kmeans`.
      block_size: points per assignment block, at most the (local) points.
      shards: the layout of a sharded k-means, or None on one device.
      use_native: the native assignment (one device on CPU; see the module docstring).

    Returns:
      A :class:`KMeansResult`.
    """
    n = x.shape[0]
    few = use_native and shards is None and num_clusters <= NATIVE_LLOYD_MAX_CLUSTERS
    if few and init == "random":  # the native iterations centre the points a tile at a time
        mean = _native_mean(x)
        centroids = x[initial] - mean
        centroids, assignments, _, inertia = _native_lloyd(x, mean, centroids, num_iters)
        return KMeansResult(centroids + mean, assignments, inertia)
    points = x
    if use_native and shards is None:  # one block: the native assignment takes every point
        x, norms, mean = _native_centre(x)
        blocks, norms = x[None], norms[None, :, None]
    else:
        if shards is None:
            mean = jnp.mean(x, axis=0)
        else:  # padding rows are zeros
            mean = _total(jnp.sum(x, axis=0), shards) / shards.num_points
        x = x - mean
        blocks, norms = _point_blocks(x, block_size)
    is_point = None if shards is None else _is_point(x, shards)

    def without_padding(assignments: jax.Array) -> jax.Array:
        """Padding rows (on shards) assigned to K: out of range, so segment_sum drops them."""
        return assignments if is_point is None else jnp.where(is_point, assignments, num_clusters)

    def lloyd_step(_: int, centroids: jax.Array) -> jax.Array:
        assignments, _ = _assign(blocks, centroids, norms, use_native)
        return _updated_centroids(x, without_padding(assignments[:n]), centroids, shards)

    if init == "random":
        centroids = _rows(x, initial, shards)
    else:
        centroids = _kmeans_plus_plus(x, num_clusters, key, shards)
    if few:
        centroids, assignments, _, inertia = _native_lloyd(points, mean, centroids, num_iters)
        return KMeansResult(centroids + mean, assignments, inertia)
    if use_native and shards is None:

        def bounded_step(_: int, state: tuple[jax.Array, Bounds]) -> tuple[jax.Array, Bounds]:
            centroids, bounds = state
            bounds = _native_assign_bounded(x, norms[0, :, 0], centroids, bounds)
            return _updated_centroids(x, bounds.nearest, centroids, None, True), bounds

        start = (centroids, Bounds.unknown(centroids, n))
        centroids, _ = jax.lax.fori_loop(0, num_iters, bounded_step, start)
        assignments, sq = _assign(blocks, centroids, norms, use_native)
    else:
        centroids = jax.lax.fori_loop(0, num_iters, lloyd_step, centroids)
        assignments, sq = _assign(blocks, centroids, norms, use_native)
    centroids = centroids + mean
    assignments, sq = without_padding(assignments[:n]), sq[:n]
    if is_point is not None:
        sq = jnp.where(is_point, sq, 0.0)
    return KMeansResult(centroids, assignments, _total(jnp.sum(sq), shards))


_kmeans = jax.jit(
    lloyd_kmeans,
    static_argnames=("num_clusters", "num_iters", "block_size", "init", "shards", "use_native"),
)


# ---------------------------------------------------------------------------------------------
# The reference mode: faiss's Clustering (random initialisation, Lloyd, empty-cluster split).


class _MersenneStream:
    """The 32-bit outputs of MT19937 seeded like ``std::mt19937(seed)``, read in order.

    ``np.random.RandomState(seed)`` seeds MT19937 with the same ``init_genrand`` as the C++
    ``std::mt19937(seed)``, and ``randint(0, 2**32, dtype=uint32)`` returns its raw outputs.
    Outputs are drawn in blocks and can be looked at ahead of the read position.
    """

    def __init__(self, seed: int) -> None:
        self._state = np.random.RandomState(seed % 2**32)
        self._outputs = np.empty((0,), np.uint32)
        self._position = 0

    def peek(self, start: int, count: int) -> np.ndarray:
        """The outputs ``start .. start + count - 1`` after the read position, unread.

        Args:
          start: offset from the read position.
          count: number of outputs.

        Returns:
          (count,) uint32.
        """
        end = self._position + start + count
        if end > len(self._outputs):
            fresh = self._state.randint(
                0, 2**32, size=max(end - len(self._outputs), _DRAW_BLOCK), dtype=np.uint32
            )
            self._outputs = np.concatenate([self._outputs[self._position :], fresh])
            end -= self._position
            self._position = 0
        return self._outputs[end - count : end]

    def read(self, count: int) -> np.ndarray:
        """The next ``count`` outputs, consumed.

        Args:
          count: number of outputs.

        Returns:
          (count,) uint32.
        """
        out = self.peek(0, count)
        self._position += count
        return out


def mt19937_outputs(seed: int, count: int) -> np.ndarray:
    """The first ``count`` 32-bit outputs of ``std::mt19937(seed)``.

    Args:
      seed: the generator's seed (taken modulo 2**32, like ``(unsigned int) seed``).
      count: number of outputs.

    Returns:
      (count,) uint32.
    """
    return _MersenneStream(seed).read(count)


def _unit_floats(outputs: np.ndarray) -> np.ndarray:
    """faiss's ``RandomGenerator::rand_float``: an output divided by ``float(mt.max())``.

    The output is rounded to float32 and ``float(2**32 - 1)`` is 2**32, so the division is
    exact: the result is in [0, 1] (1 when the output rounds up to 2**32).

    Args:
      outputs: (M,) uint32 MT19937 outputs.

    Returns:
      (M,) float32.
    """
    return outputs.astype(np.float32) / np.float32(2.0**32)


@functools.lru_cache(maxsize=64)
def reference_permutation(num_points: int, count: int, seed: int) -> np.ndarray:
    """The first ``count`` entries of faiss's ``rand_perm(perm, num_points, seed)``.

    Fisher-Yates over ``0 .. N - 1``: for i = 0 .. N - 2, swap positions i and
    ``i + u_i mod (N - i)``, u_i the i-th output of ``std::mt19937(seed)`` (faiss's
    ``RandomGenerator::rand_int(max)``, ``mt() % max`` up to faiss 1.15.1 at least; later faiss
    sources use a multiply-shift, which draws other points). Step i only touches positions
    >= i, so the first ``count`` entries are final after ``count`` steps.

    Args:
      num_points: N.
      count: how many leading entries to return, 0 <= count <= N.
      seed: seed of the Mersenne Twister.

    Returns:
      (count,) int64 distinct indices in [0, N), read-only: remembered per arguments (with the
      generator's seeding, 0.65 ms per 5-cluster k-means of 20,000 points, a tenth of it).
    """
    steps = min(count, num_points - 1)
    outputs = mt19937_outputs(seed, steps).astype(np.int64)
    targets = np.arange(steps) + outputs % (num_points - np.arange(steps))
    moved: dict[int, int] = {}  # the positions the swaps touched (the others hold themselves)
    for i, j in enumerate(targets.tolist()):
        moved[i], moved[j] = moved.get(j, j), moved.get(i, i)
    perm = np.asarray([moved.get(i, i) for i in range(count)], np.int64)
    perm.flags.writeable = False
    return perm


def _split_probabilities(counts: np.ndarray, surplus: int) -> np.ndarray:
    """faiss's probability of splitting a cluster of (float) size h: ``(h - 1.0) / float(N -
    K)``, evaluated in double precision and rounded to float32.

    Args:
      counts: (M,) float32 cluster sizes.
      surplus: N - K, the number of points minus the number of clusters.

    Returns:
      (M,) float32 (negative for an empty cluster, 0 for a singleton: never chosen).
    """
    denominator = np.float64(np.float32(surplus))
    return ((counts.astype(np.float64) - 1.0) / denominator).astype(np.float32)


class SplitResult(NamedTuple):
    """Output of :func:`split_empty_clusters`.

    Attributes:
      centroids: (K, D) float32 centroids with every empty cluster filled.
      counts: (K,) float32 cluster sizes after the splits (halves of the split clusters).
      sources: (E,) int64 for each of the E empty clusters, in increasing order, the cluster it
        was split from.
    """

    centroids: np.ndarray
    counts: np.ndarray
    sources: np.ndarray


def split_empty_clusters(
    centroids: np.ndarray, counts: np.ndarray, num_points: int, seed: int = REFERENCE_SEED
) -> SplitResult:
    """Fills the empty clusters by splitting others, as faiss's ``split_clusters``.

    A fresh ``std::mt19937(seed)`` per call. For each empty cluster ci in increasing order, the
    candidates cj = 0, 1, 2, ... are scanned cyclically, each drawing r = ``rand_float`` (see
    :func:`_unit_floats`), until r < p_cj (:func:`_split_probabilities`: proportional to the
    cluster's size minus one). Then ci takes cj's centroid, and the two are pushed apart
    symmetrically: in even dimensions ci is multiplied by 1 + eps and cj by 1 - eps, in odd
    dimensions the other way round (eps = :data:`SPLIT_EPS`); ci gets half of cj's size
    (float32), cj keeps the rest. The scan is vectorised over one cycle of K candidates at a time.

    Args:
      centroids: (K, D) float32 centroids (rows of empty clusters are overwritten).
      counts: (K,) cluster sizes (0 = empty); they sum to ``num_points``.
      num_points: N > K, the number of clustered points.
      seed: seed of the Mersenne Twister (faiss always uses 1234).

    Returns:
      :class:`SplitResult` (new arrays; the inputs are not modified).
    """
    num_clusters = len(counts)
    if num_points <= num_clusters:
        raise ValueError(f"splitting needs more points ({num_points}) than clusters")
    centroids = np.array(centroids, np.float32)
    counts = np.array(counts, np.float32)
    surplus = num_points - num_clusters
    probabilities = _split_probabilities(counts, surplus)
    up = np.where(np.arange(centroids.shape[1]) % 2 == 0, 1 + SPLIT_EPS, 1 - SPLIT_EPS)
    up = up.astype(np.float32)
    down = (2.0 - up).astype(np.float32)  # 1 - eps where up is 1 + eps, and vice versa
    stream = _MersenneStream(seed)
    sources = []
    for ci in np.flatnonzero(counts == 0).tolist():
        cycle = 0
        while True:
            draws = _unit_floats(stream.peek(cycle * num_clusters, num_clusters))
            hits = np.flatnonzero(draws < probabilities)
            if len(hits):
                cj = int(hits[0])
                stream.read(cycle * num_clusters + cj + 1)
                break
            cycle += 1
        source = centroids[cj].copy()
        centroids[ci] = source * up
        centroids[cj] = source * down
        counts[ci] = counts[cj] / np.float32(2.0)
        counts[cj] -= counts[ci]
        probabilities[[ci, cj]] = _split_probabilities(counts[[ci, cj]], surplus)
        sources.append(cj)
    return SplitResult(centroids, counts, np.asarray(sources, np.int64))


def assign_scores() -> int:
    """Point-centroid distances per automatic assignment block: ``ASSIGN_SCORES`` if set, else
    the default backend's (``CPU_ASSIGN_SCORES`` or ``ACCELERATOR_ASSIGN_SCORES``)."""
    if ASSIGN_SCORES is not None:
        return ASSIGN_SCORES
    return CPU_ASSIGN_SCORES if jax.default_backend() == "cpu" else ACCELERATOR_ASSIGN_SCORES


def _block_rows(num_points: int, num_clusters: int, block_size: int | None) -> int:
    """Points per assignment block: ``block_size`` if given, else as many as hold
    :func:`assign_scores` distances (at least ``MIN_BLOCK_ROWS``); never more than the
    points."""
    if block_size is None:
        block_size = max(MIN_BLOCK_ROWS, assign_scores() // num_clusters)
    return max(1, min(num_points, block_size))


def _point_blocks(points: jax.Array, block_size: int) -> tuple[jax.Array, jax.Array]:
    """(N, D) points zero-padded and cut into (M, block_size, D) blocks, and their (M,
    block_size, 1) squared norms."""
    n, dim = points.shape
    num_blocks = math.ceil(n / block_size)
    padded = jnp.pad(points, ((0, num_blocks * block_size - n), (0, 0)))
    blocks = padded.reshape(num_blocks, block_size, dim)
    return blocks, jnp.sum(blocks * blocks, axis=-1, keepdims=True)


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
        cannot have changed (:func:`_native_assign_bounded`); None for a full assignment.

    Returns:
      (K, D) float32 new centroids, (K,) float32 cluster sizes, and the bounds of this
      assignment (None without ``bounds``).
    """
    num_clusters = centroids.shape[0]
    if bounds is None:
        assignments = _assign(blocks, centroids, norms, use_native)[0][:num_points]
    else:
        bounds = _native_assign_bounded(points, norms.reshape(-1)[:num_points], centroids, bounds)
        assignments = bounds.nearest
    # The sums read ``points``, not a slice of the blocks: with one block, XLA fused that slice
    # into the scatter and the update took twice as long.
    sums, counts = _cluster_sums(points, assignments, num_clusters, use_native)
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
        return _native_reference_updates(points, centroids, remaining)
    blocks, norms = _point_blocks(points, block_size)

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
    assignments, sq = _assign(blocks, centroids, norms, use_native)
    return centroids, counts, steps, assignments[:num_points], jnp.sum(sq[:num_points])


@functools.partial(jax.jit, static_argnames=("block_size", "use_native"))
def _final_assignment(
    points: jax.Array, centroids: jax.Array, *, block_size: int, use_native: bool
) -> tuple[jax.Array, jax.Array]:
    """(N,) int32 nearest centroid of every point (ties to the lower index) and the inertia."""
    blocks, norms = _point_blocks(points, block_size)
    assignments, sq = _assign(blocks, centroids, norms, use_native)
    return assignments[: points.shape[0]], jnp.sum(sq[: points.shape[0]])


def reference_kmeans(
    x: jax.Array | np.ndarray,
    num_clusters: int,
    *,
    num_iters: int = DEFAULT_NUM_ITERS,
    seed: int = REFERENCE_SEED,
    block_size: int | None = None,
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
        :func:`assign_scores` distances.

    Returns:
      A :class:`KMeansResult` with (K, D) centroids, (N,) assignments and the inertia.
    """
    from_host = not isinstance(x, jax.Array)
    direct = _direct_enabled(x) and num_clusters <= NATIVE_LLOYD_MAX_CLUSTERS
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
            return _direct_reference_updates(points, centroids, remaining)

    else:
        rows = _block_rows(n, num_clusters, block_size)

        def updates(centroids: Any, remaining: int) -> tuple:
            return _reference_updates(
                points,
                jnp.asarray(centroids),
                jnp.int32(remaining),
                num_points=n,
                block_size=rows,
                use_native=native_enabled(),
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


# ---------------------------------------------------------------------------------------------
# k-means of host arrays, the native functions called directly (CPU).

_Int64 = ctypes.c_int64


@functools.cache
def _host_function(name: str) -> ctypes._CFuncPtr:
    """The native library's host function ``name`` (``kmeans.cc``): pointers and sizes, then an
    error buffer and its size; it returns 0, or 1 with a message in the buffer."""
    function = getattr(native.library(), name)
    function.restype = ctypes.c_int
    return function


def _call_host(name: str, *args: int) -> None:
    """Calls the host function ``name`` with ``args`` (pointers as integers, and sizes); a
    failure is a RuntimeError with its message."""
    error = ctypes.create_string_buffer(256)
    if _host_function(name)(*(_Int64(a) for a in args), error, _Int64(len(error))):
        raise RuntimeError(error.value.decode(errors="replace"))


def _direct_enabled(x: Any) -> bool:
    """Whether :func:`kmeans` calls the native functions directly on ``x``: a host array, on the
    CPU backend, with the native k-means enabled."""
    return not isinstance(x, jax.Array) and jax.default_backend() == "cpu" and native_enabled()


def _direct_lloyd(x: np.ndarray, initial: np.ndarray, num_iters: int) -> KMeansResult:
    """The "random" k-means of host points into few clusters (up to
    ``NATIVE_LLOYD_MAX_CLUSTERS``) by the native functions called directly on their memory, as
    faiss is called: no aligned copy of the points (a NumPy array's memory is rarely 64-byte
    aligned, and the copy of 20,000 x 512 points took as long as a 5-cluster k-means of them)
    and no JAX dispatch. The jitted call's functions (``jdml_kmeans_mean``, then
    ``jdml_kmeans_lloyd``), so its result bit for bit, as NumPy arrays.

    Args:
      x: (N, D) C-contiguous float32 points.
      initial: (K,) indices of the initial centroids.
      num_iters: Lloyd steps.
    """
    n, dim = x.shape
    mean = np.empty((dim,), np.float32)
    _call_host("jdml_kmeans_mean_host", x.ctypes.data, n, dim, mean.ctypes.data)
    centroids = np.ascontiguousarray(x[initial] - mean)
    nearest = np.empty((n,), np.int32)
    best = np.empty((n,), np.float32)
    inertia = np.empty((1,), np.float32)
    _call_host(
        "jdml_kmeans_lloyd_host",
        x.ctypes.data,
        n,
        dim,
        mean.ctypes.data,
        centroids.ctypes.data,
        len(initial),
        num_iters,
        nearest.ctypes.data,
        best.ctypes.data,
        inertia.ctypes.data,
    )
    return KMeansResult(centroids + mean, nearest, inertia[0])


def _direct_reference_updates(
    x: np.ndarray, centroids: np.ndarray, remaining: int
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, np.float32]:
    """:func:`_reference_updates` of host points into few clusters (up to
    ``NATIVE_LLOYD_MAX_CLUSTERS``) by the native function called directly on their memory
    (``jdml_kmeans_reference_lloyd``, as :func:`_direct_lloyd` calls its own): the same
    result bit for bit, as NumPy arrays."""
    (n, dim), num_clusters = x.shape, len(centroids)
    centroids = np.array(centroids, np.float32)  # updated in place
    sizes = np.empty((num_clusters,), np.float32)
    steps = np.zeros((1,), np.int64)
    nearest = np.empty((n,), np.int32)
    best = np.empty((n,), np.float32)
    inertia = np.empty((1,), np.float32)
    _call_host(
        "jdml_kmeans_reference_lloyd_host",
        x.ctypes.data,
        n,
        dim,
        centroids.ctypes.data,
        num_clusters,
        remaining,
        sizes.ctypes.data,
        steps.ctypes.data,
        nearest.ctypes.data,
        best.ctypes.data,
        inertia.ctypes.data,
    )
    return centroids, sizes, int(steps[0]), nearest, inertia[0]


def kmeans(
    x: jax.Array | np.ndarray,
    num_clusters: int,
    *,
    num_iters: int = DEFAULT_NUM_ITERS,
    seed: int | None = None,
    block_size: int | None = None,
    init: str = "k-means++",
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
        :func:`assign_scores` distances.
      init: "k-means++" (greedy k-means++ seeding, the default), "random" (K distinct points
        drawn uniformly; much faster for large K, as the seeding costs K passes over the data)
        or "reference" (faiss's k-means as the Revisiting-DML evaluation runs it, see
        :func:`reference_kmeans`).

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
        )
    seed = 0 if seed is None else seed
    initial = (
        random_indices(x.shape[0], num_clusters, seed)
        if init == "random"
        else np.zeros((num_clusters,), np.int32)
    )
    if init == "random" and num_clusters <= NATIVE_LLOYD_MAX_CLUSTERS and _direct_enabled(x):
        return _direct_lloyd(x, initial, num_iters)
    result = _kmeans(
        float32_on_device(x),
        _seed_key(seed),
        jnp.asarray(initial),
        num_clusters=num_clusters,
        num_iters=num_iters,
        block_size=_block_rows(x.shape[0], num_clusters, block_size),
        init=init,
        use_native=native_enabled(),
    )
    if from_host:  # NumPy in, NumPy out (and x may share the caller's memory: done with it)
        result = KMeansResult(*(np.asarray(v) for v in result))
    return result
