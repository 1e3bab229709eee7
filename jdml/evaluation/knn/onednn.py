"""The k nearest selected by the native kernel (CPU backend, ``selection="native"``): each block of
queries is one call of :func:`jdml.native.knn.search` from a jitted function, and host (NumPy)
arrays with the Euclidean distance are searched directly on their memory
(:func:`jdml.native.knn.search_host`), as faiss is called. The neighbours are the XLA path's up
to the rounding of the scores, in the same (distance, index) order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.knn.blocks import NeighbourBlock, dispatched_ahead, query_block
from jdml.native import knn as native_knn


@jax.jit
def _native_bias(references: jax.Array) -> jax.Array:
    """(N,) the Euclidean ``score_bias`` -|r|^2 as ``jdml_knn_search`` computes it (the same
    float32 sums, so that a search gives the same neighbours in one block or in several)."""
    return native_knn.bias(references)


@functools.partial(jax.jit, static_argnames=("k", "exclude_self", "distance"))
def _native_knn_block(
    queries: jax.Array | np.ndarray,
    query_offset: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray | None,
    bias: jax.Array | None,
    *,
    k: int,
    exclude_self: bool,
    distance: str,
) -> tuple[jax.Array, jax.Array]:
    """:func:`~jdml.evaluation.knn.xla._knn_block` with the native selection: the whole block in one
    call of the native kernel ``jdml_knn_search`` (the ``wanted`` best scores of each query as the
    XLA path selects them, the own index dropped, distances from the scores, rows in (distance,
    index) order, as :func:`~jdml.evaluation.knn.xla.neighbours_from_scores` does).

    The jitted program is that call alone, so XLA's CPU client runs it on the calling thread
    (see ``knn.cc``).

    Args:
      queries: (B, D) queries (unit-norm rows for the cosine distance).
      query_offset: () int32, the index of the first query among the references.
      references: (N, D) references; None: the queries are the references.
      bias: (N,) their Euclidean bias from :func:`_native_bias`, or None: computed by the
        kernel (a search of one block, or cosine, where it is 0; with many blocks, once for all
        of them is cheaper).
      k, exclude_self, distance: as in :func:`~jdml.evaluation.knn.knn`.

    Returns:
      distances (B, k) float32 ascending and int32 indices, ties by lower index.
    """
    if references is None:
        references = queries
    return native_knn.search(
        queries,
        references,
        bias,
        query_offset,
        k=k,
        exclude_self=exclude_self,
        cosine=distance == "cosine",
    )


def native_blocks(
    queries: jax.Array,
    references: jax.Array,
    k: int,
    exclude_self: bool,
    distance: str,
    block_size: int,
) -> Iterator[NeighbourBlock]:
    """:func:`~jdml.evaluation.knn.knn_blocks` with the native selection (see
    ``jdml.evaluation.knn.search._selection``). The kernel takes any
    number of queries, so blocks are not padded: the last one compiles once more.

    Host (NumPy) queries and references go into the jitted block function as they are: its
    arguments reach the device in one step, where ``jax.device_put`` or ``jnp.asarray`` first
    would be a dispatch of their own (after the process has been idle for a while, as between
    two evaluations, each JAX call costs 0.2-0.5 ms on a 2-core VM: at N = 1,000 these were a
    third of a search). With several blocks the references go to the device once."""
    num_queries, num_references = queries.shape[0], references.shape[0]
    block = query_block(num_queries, num_references, block_size)
    num_blocks = math.ceil(num_queries / block)
    same = queries is references
    bias = None
    if num_blocks > 1:
        references = jnp.asarray(references)
        if distance == "euclidean":
            bias = _native_bias(references)

    def dispatch(b: int) -> tuple[jax.Array, jax.Array]:
        # One block takes the queries as they are (a slice is one more dispatch), and the offset
        # goes in as a NumPy scalar (``jnp.int32`` makes a device array in Python first): at
        # N = 1,000 these were a tenth of the search
        rows = queries if num_blocks == 1 else queries[b * block : (b + 1) * block]
        return _native_knn_block(
            rows,
            np.int32(b * block),
            None if same and num_blocks == 1 else references,
            bias,
            k=k,
            exclude_self=exclude_self,
            distance=distance,
        )

    for b, (d, i) in dispatched_ahead(dispatch, num_blocks):
        yield NeighbourBlock(b * block, d, i)


def direct_search(
    queries: np.ndarray, references: np.ndarray, k: int, exclude_self: bool
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`~jdml.evaluation.knn.knn` of host arrays with the Euclidean distance, by the native
    search called directly on their memory (``jdml_knn_search_host``), as faiss is called: no JAX
    dispatch (0.3-0.6 ms after an idle moment) and no aligned copy of the arrays, together a third
    of a search of 1,000 x 1,000. The same kernel and query ranges as the jitted native block of the
    whole search, so the same results, bit for bit (and bit for bit as several jitted blocks up to
    768 dimensions; from 1,024 on, up to float32 rounding, see ``gemm.h``). The call returns when it
    is done."""
    return native_knn.search_host(queries, references, k, exclude_self)
