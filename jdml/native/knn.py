"""The exact nearest-neighbour search on the CPU backend (``knn.cc``): an XLA FFI custom call
for jitted code and a direct call on host (NumPy) memory.

``knn.cc`` scores tiles of 256 queries against tiles of references (1 MB of scores) with
oneDNN's sgemm and filters each tile against every query's k-th best score so far while the
tile is in cache, so no block of scores goes to memory. The few scores that pass enter a
per-query buffer of 2k + 16 integer keys of (score, index), cut back to the k best by a
branch-free quickselect when full. Where XLA's top-k and the host's selection read every score
of a block again, this costs a compare per score: at 20,000 x 128 it is 1.5-2.5x faster than
faiss-cpu at k = 1 to 1,000 (``bench/bench_eval.py``).

The ranking score is the one of ``jdml.evaluation.knn.xla``: ``2 q.r - |r|^2`` (Euclidean) or
``q.r`` (cosine, unit-norm rows); the k nearest come in (distance, index) order, the own index
dropped with ``exclude_self``, as the XLA path gives them.
"""

from __future__ import annotations

import ctypes
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jdml.native.build import ffi_call, library


def bias(references: jax.Array) -> jax.Array:
    """(N,) the Euclidean score term -|r|^2 of (N, D) ``references`` as :func:`search` computes
    it (``jdml_knn_bias``: the same float32 sums, so that a search gives the same neighbours in
    one block or in several)."""
    call = ffi_call("jdml_knn_bias", jax.ShapeDtypeStruct(references.shape[:1], jnp.float32))
    return call(references)


def search(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    bias: jax.Array | None,
    query_offset: jax.Array | np.ndarray,
    *,
    k: int,
    exclude_self: bool,
    cosine: bool,
) -> tuple[jax.Array, jax.Array]:
    """The k nearest references of every query as one call of ``jdml_knn_search``.

    Its scores are the augmented product's of the XLA path up to float32 rounding: sgemm scales
    the dot products (by 2, exactly) and the bias is added to each rather than summed with them,
    so that sgemm runs on the D columns of the references as they are (at D = 128, a multiple
    of 16, 1.3x faster than on D + 1). A jitted program that is this call alone runs on the
    calling thread (see ``knn.cc``).

    Args:
      queries: (B, D) float32 queries (unit-norm rows for the cosine distance).
      references: (N, D) float32 references.
      bias: (N,) their Euclidean :func:`bias`, or None: computed by the kernel (a search of one
        block, or cosine, where it is 0).
      query_offset: () int32, the index of the first query among the references.
      k: number of neighbours.
      exclude_self: query ``query_offset + i`` is reference ``query_offset + i`` and is left out.
      cosine: the cosine distance, else the Euclidean.

    Returns:
      distances (B, k) float32 ascending and int32 indices, ties by lower index.
    """
    if bias is None:
        bias = jnp.zeros((0,), jnp.float32)
    rows = queries.shape[0]
    call = ffi_call(
        "jdml_knn_search",
        (
            jax.ShapeDtypeStruct((rows, k), jnp.float32),
            jax.ShapeDtypeStruct((rows, k), jnp.int32),
        ),
        vmap_method="sequential",
    )
    distances, indices = call(
        queries,
        references,
        bias,
        query_offset,
        k=np.int64(k),
        exclude_self=np.bool_(exclude_self),
        cosine=np.bool_(cosine),
    )
    return distances, indices


_Int64 = ctypes.c_int64
_Pointer = ctypes.c_void_p


@functools.cache
def _search_host_function() -> ctypes._CFuncPtr:
    """The native library's ``jdml_knn_search_host``, typed (see ``knn.cc``)."""
    function = library().jdml_knn_search_host
    function.argtypes = [_Pointer, _Int64, _Pointer, _Int64, _Int64, _Int64, ctypes.c_int]
    function.argtypes += [ctypes.c_int, _Pointer, _Pointer, ctypes.c_char_p, _Int64]
    function.restype = ctypes.c_int
    return function


def search_host(
    queries: np.ndarray, references: np.ndarray, k: int, exclude_self: bool
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search` of host arrays with the Euclidean distance, called directly on their
    memory (``jdml_knn_search_host``, on OpenMP's threads), as faiss is called: no JAX dispatch
    and no aligned copy. The same kernel and query ranges as one :func:`search` of all the
    queries, so the same results bit for bit. Returns when it is done.

    Args:
      queries: (Q, D) queries (copied if not C-contiguous float32).
      references: (N, D) references, or ``queries`` itself.
      k, exclude_self: as in :func:`search`.

    Returns:
      (Q, k) float32 distances and (Q, k) int32 indices, as NumPy arrays.

    Raises:
      RuntimeError: with the kernel's message, if it fails.
    """
    function = _search_host_function()
    same = queries is references
    queries = np.ascontiguousarray(queries, np.float32)
    references = queries if same else np.ascontiguousarray(references, np.float32)
    (num_queries, width), num_references = queries.shape, references.shape[0]
    distances = np.empty((num_queries, k), np.float32)
    indices = np.empty((num_queries, k), np.int32)
    error = ctypes.create_string_buffer(256)
    failed = function(
        queries.ctypes.data,
        num_queries,
        references.ctypes.data,
        num_references,
        width,
        k,
        int(exclude_self),
        0,  # Euclidean
        distances.ctypes.data,
        indices.ctypes.data,
        error,
        len(error),
    )
    if failed:
        raise RuntimeError(error.value.decode(errors="replace"))
    return distances, indices
