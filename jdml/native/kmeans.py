"""k-means' passes over the points on the CPU backend (``kmeans.cc``): XLA FFI custom calls for
jitted code, and direct calls on host (NumPy) memory.

The assignment uses the formula and tie rule of the XLA path (``jdml.evaluation.kmeans.lloyd``:
``|x|^2 + |c|^2 - 2 x.c`` clamped at 0, ties to the lower centroid index) with the dot products
from oneDNN's sgemm, or, up to 16 centroids on a CPU with AVX-512, from a register tile of two
points against up to 8 centroids; so an assignment can differ from XLA's only where two
centroids lie within float32 rounding of each other. Every FFI call maps over a ``vmap`` axis
one element at a time.

The host functions run on OpenMP's threads, as faiss is called: JAX on CPU shares a host array
only if it is 64-byte aligned, which a NumPy array's memory rarely is, and the aligned copy of
20,000 x 512 points took as long as a 5-cluster k-means of them. Their results are the jitted
calls' bit for bit.
"""

from __future__ import annotations

import ctypes
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jdml.geometry import squared_norms
from jdml.native.build import ffi_call, library


def assign(
    points: jax.Array, norms: jax.Array, centroids: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Every point's nearest centroid (ties to the lower index) and its squared distance, as
    one call of ``jdml_kmeans_assign``.

    Args:
      points: (N, D) float32 points.
      norms: (N,) their squared norms.
      centroids: (K, D) float32 centroids.

    Returns:
      (N,) int32 nearest centroids and (N,) float32 squared distances.
    """
    n = points.shape[0]
    call = ffi_call(
        "jdml_kmeans_assign",
        (jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.float32)),
        vmap_method="sequential",
    )
    return call(points, norms, centroids, squared_norms(centroids))


def assign_bounded(
    points: jax.Array,
    norms: jax.Array,
    centroids: jax.Array,
    previous: jax.Array,
    nearest: jax.Array,
    upper: jax.Array,
    lower: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Every point's nearest centroid, as :func:`assign` finds it, skipping the points whose
    centroid cannot have changed since the last assignment (Hamerly's bounds, with a margin for
    float32 rounding; ``jdml_kmeans_assign_bounded``).

    Args:
      points, norms, centroids: as in :func:`assign`.
      previous: (K, D) the centroids the points were last assigned to.
      nearest: (N,) int32 each point's centroid then.
      upper: (N,) float32 an upper bound of each point's distance to its centroid (inf: not
        assigned yet).
      lower: (N,) float32 a lower bound of its distance to every other centroid.

    Returns:
      The new ``nearest``, ``upper`` and ``lower`` for ``centroids``.
    """
    n = points.shape[0]
    call = ffi_call(
        "jdml_kmeans_assign_bounded",
        (
            jax.ShapeDtypeStruct((n,), jnp.int32),
            jax.ShapeDtypeStruct((n,), jnp.float32),
            jax.ShapeDtypeStruct((n,), jnp.float32),
        ),
        vmap_method="sequential",
    )
    nearest, upper, lower = call(
        points, norms, centroids, squared_norms(centroids), previous, nearest, upper, lower
    )
    return nearest, upper, lower


def sums(points: jax.Array, nearest: jax.Array, num_clusters: int) -> tuple[jax.Array, jax.Array]:
    """Each cluster's (K, D) float32 sum of its points and its (K,) float32 count, as
    ``jax.ops.segment_sum`` gives them bit for bit (point order; ``nearest`` out of [0, K)
    counts for no cluster), as one call of ``jdml_kmeans_sums`` (parallel over ranges of
    clusters)."""
    call = ffi_call(
        "jdml_kmeans_sums",
        (
            jax.ShapeDtypeStruct((num_clusters, points.shape[1]), jnp.float32),
            jax.ShapeDtypeStruct((num_clusters,), jnp.float32),
        ),
        vmap_method="sequential",
    )
    return call(points, nearest)


def centre(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(N, D) points minus their (D,) mean, the centred points' (N,) squared norms and the mean,
    as one call of ``jdml_kmeans_centre`` (the mean's sums are float64, added in a fixed
    order)."""
    n, dim = x.shape
    call = ffi_call(
        "jdml_kmeans_centre",
        (
            jax.ShapeDtypeStruct((n, dim), jnp.float32),
            jax.ShapeDtypeStruct((n,), jnp.float32),
            jax.ShapeDtypeStruct((dim,), jnp.float32),
        ),
        vmap_method="sequential",
    )
    return call(x)


def mean(x: jax.Array) -> jax.Array:
    """The (D,) mean of (N, D) points as one call of ``jdml_kmeans_mean`` (float64 sums, added
    in a fixed order whatever the threads), the mean :func:`centre` subtracts."""
    call = ffi_call(
        "jdml_kmeans_mean",
        jax.ShapeDtypeStruct((x.shape[1],), jnp.float32),
        vmap_method="sequential",
    )
    return call(x)


def lloyd(
    x: jax.Array, mean: jax.Array, centroids: jax.Array, num_iters: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``num_iters`` Lloyd steps on the points ``x - mean`` from ``centroids`` (centred), and
    the final assignment, as one call of ``jdml_kmeans_lloyd``.

    Every step assigns each point as :func:`assign` does and moves each centroid to the mean
    of its points (float64 sums, added over fixed pieces of the points in order, so the result
    does not depend on the threads); a cluster without points keeps its centroid. Each tile of
    512 points is centred into a buffer of its thread (as :func:`centre` computes it, never
    written out), assigned and summed while its rows are in cache.

    Args:
      x: (N, D) points, not centred.
      mean: (D,) their mean (:func:`mean`).
      centroids: (K, D) initial centroids, centred.
      num_iters: Lloyd steps.

    Returns:
      The (K, D) centred centroids after the steps, the (N,) assignments and squared
      distances for them, and the () inertia (their float64 sum).
    """
    n = x.shape[0]
    call = ffi_call(
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


def reference_lloyd(
    points: jax.Array, centroids: jax.Array, remaining: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array, jax.Array]:
    """Updates of faiss's k-means as one call of ``jdml_kmeans_reference_lloyd``: the points'
    squared norms, then up to ``remaining`` updates, each the assignment and then each
    centroid's float32 sum of its points in point order (a range of centroids per thread, as
    faiss sums them) times ``1 / count``, stopping after the first that leaves a cluster empty;
    then, if none did, the final assignment and its inertia (float64 sums).

    Returns:
      The (K, D) centroids, (K,) float32 cluster sizes, () int32 updates run, (N,) int32 final
      assignment (K where a cluster was left empty) and () inertia (NaN then).
    """
    n = points.shape[0]
    call = ffi_call(
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


# ---------------------------------------------------------------------------------------------
# Host functions: pointers and sizes, then an error buffer and its size.

_Int64 = ctypes.c_int64


@functools.cache
def _host_function(name: str) -> ctypes._CFuncPtr:
    """The native library's host function ``name`` (``kmeans.cc``); it returns 0, or 1 with a
    message in the error buffer."""
    function = getattr(library(), name)
    function.restype = ctypes.c_int
    return function


def call_host(name: str, *args: int) -> None:
    """Calls the host function ``name`` with ``args`` (pointers as integers, and sizes).

    Raises:
      RuntimeError: with the function's message, if it fails.
    """
    error = ctypes.create_string_buffer(256)
    if _host_function(name)(*(_Int64(a) for a in args), error, _Int64(len(error))):
        raise RuntimeError(error.value.decode(errors="replace"))


def lloyd_host(
    x: np.ndarray, initial: np.ndarray, num_iters: int
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """:func:`mean` and then :func:`lloyd` of host points from the points ``initial`` as
    centroids, called directly on their memory: the jitted calls' result bit for bit.

    Args:
      x: (N, D) C-contiguous float32 points.
      initial: (K,) indices of the initial centroids.
      num_iters: Lloyd steps.

    Returns:
      The (K, D) centroids (not centred), the (N,) int32 assignments and the inertia.
    """
    n, dim = x.shape
    mean = np.empty((dim,), np.float32)
    call_host("jdml_kmeans_mean_host", x.ctypes.data, n, dim, mean.ctypes.data)
    centroids = np.ascontiguousarray(x[initial] - mean)
    nearest = np.empty((n,), np.int32)
    best = np.empty((n,), np.float32)
    inertia = np.empty((1,), np.float32)
    call_host(
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
    return centroids + mean, nearest, inertia[0]


def reference_lloyd_host(
    x: np.ndarray, centroids: np.ndarray, remaining: int
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, np.float32]:
    """:func:`reference_lloyd` of host points, called directly on their memory: the same result
    bit for bit, as NumPy arrays.

    Args:
      x: (N, D) C-contiguous float32 points.
      centroids: (K, D) current centroids (not modified).
      remaining: the most updates to run.
    """
    (n, dim), num_clusters = x.shape, len(centroids)
    centroids = np.array(centroids, np.float32)  # updated in place
    sizes = np.empty((num_clusters,), np.float32)
    steps = np.zeros((1,), np.int64)
    nearest = np.empty((n,), np.int32)
    best = np.empty((n,), np.float32)
    inertia = np.empty((1,), np.float32)
    call_host(
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
