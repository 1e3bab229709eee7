"""The exact kNN search's entry points, :func:`knn` and :func:`knn_blocks`, and the choice of
what selects the k nearest of a block of queries.

The search compares every query to every reference, blocked (:mod:`jdml.evaluation.knn.blocks`)
so that no Q x N matrix is formed. Three back ends select the k nearest of a block, with the same
neighbours up to the rounding of the scores:

* ``"xla"`` (:mod:`jdml.evaluation.knn.xla`): XLA's exact two-stage top-k over chunks of
  references, the pure-XLA path, on every backend;
* ``"host"`` (:mod:`jdml.evaluation.knn.host`): XLA scores a block, numpy selects (CPU, large k
  or few references);
* ``"native"`` (:mod:`jdml.evaluation.knn.onednn`): the native kernel (CPU, where the library
  builds); :func:`knn` of NumPy arrays with the Euclidean distance calls it directly on their
  memory, without JAX, as faiss is called.

The caller passes the selection (a run: its :class:`jdml.backends.Backends`' ``knn``, from
``backends.knn`` or ``$JDML_KNN``, resolved once); the default, ``"auto"``, leaves the native
kernel off: the host selection takes the blocks where it is faster than XLA's top-k
(:func:`select_on_host`), XLA the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jdml.backends import KNN_SELECTIONS
from jdml.evaluation.knn import blocks
from jdml.evaluation.knn.blocks import (
    DEFAULT_BLOCK_SIZE,
    NeighbourBlock,
    check_search,
    resolve_chunk_size,
)
from jdml.evaluation.knn.host import host_blocks
from jdml.evaluation.knn.onednn import direct_search, native_blocks
from jdml.evaluation.knn.xla import xla_blocks
from jdml.evaluation.points import as_float32
from jdml.geometry import l2_normalize
from jdml.platform import platform

# Smallest k (self included) always selected on the host on the CPU backend.
HOST_SELECTION_MIN_K = 64


def _selection(k: int, width: int, selection: str) -> str:
    """How :func:`knn` selects ``k`` of ``width`` references per query: "native", "host" or
    "xla". ``selection`` "auto" is the host or XLA as :func:`select_on_host` says; any other
    value (:data:`jdml.backends.KNN_SELECTIONS`) is that selection."""
    if selection not in KNN_SELECTIONS:
        raise ValueError(f"unknown selection {selection!r}; expected one of {KNN_SELECTIONS}")
    if selection != "auto":
        return selection
    return "host" if select_on_host(k, width, selection) else "xla"


def select_on_host(k: int, width: int, selection: str = "auto") -> bool:
    """Whether :func:`knn` selects ``k`` of ``width`` references per query on the host.

    ``selection`` "auto" (or "native", whose kernel has its own path where it applies): on the
    CPU backend only, from ``HOST_SELECTION_MIN_K`` on, and from k = 2 on wherever the two-stage
    ``top_k`` does not apply (rows narrower than ``k * GROUP_SIZE * 8``). "host" and "xla" force
    one or the other.
    """
    if selection in ("host", "xla"):
        return selection == "host"
    if platform() != "cpu":
        return False
    return k >= HOST_SELECTION_MIN_K or (k >= 2 and k * blocks.GROUP_SIZE * 8 > width)


def knn_blocks(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    k: int,
    *,
    exclude_self: bool,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int | None = None,
    selection: str = "auto",
) -> Iterator[NeighbourBlock]:
    """:func:`knn`, one block of queries at a time, in query order.

    The arguments are checked at once (not at the first block). The next block is dispatched
    before a block is handed out, so the device works while the caller uses it; a caller that
    reduces each block (e.g. to per-query metric values) never holds all (Q, k) neighbours.

    Args:
      queries, references, k, exclude_self, distance, block_size, chunk_size, selection: as
        in :func:`knn`.

    Returns:
      An iterator of :class:`NeighbourBlock`, covering the queries in order.
    """
    chunk_size = resolve_chunk_size(chunk_size)
    # copies: the caller may change its arrays while it holds the iterator
    queries, references = _placed(queries, references, _device_copy)
    return _search_blocks(
        queries, references, k, exclude_self, distance, block_size, chunk_size, selection
    )


def _device_copy(x: jax.Array | np.ndarray, slot: int) -> jax.Array:
    """``x`` as a float32 device array of its own (``slot`` is not used)."""
    del slot
    return jnp.asarray(x, jnp.float32)


def _placed(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    place: Callable[[jax.Array | np.ndarray, int], jax.Array | np.ndarray],
) -> tuple[jax.Array | np.ndarray, jax.Array | np.ndarray]:
    """Queries and references through ``place`` (queries in slot 0, references in slot 1), once
    when they are the same array (leave-one-out: one copy, not two)."""
    same = queries is references
    queries = place(queries, 0)
    return queries, queries if same else place(references, 1)


def _search_blocks(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    k: int,
    exclude_self: bool,
    distance: str,
    block_size: int,
    chunk_size: int,
    selection: str,
) -> Iterator[NeighbourBlock]:
    """:func:`knn_blocks` on float32 queries and references that may be host arrays, which the
    search may read until its last block is computed (JAX shares a host array's memory where it
    can, also in a jitted function's arguments)."""
    same = queries is references
    check_search(queries.shape, references.shape, k, exclude_self, distance, block_size, chunk_size)

    if distance == "cosine":
        queries, references = l2_normalize(queries), l2_normalize(references)
        references = queries if same else references
    _, chunk = blocks.chunk_layout(references.shape[0], chunk_size)
    selection = _selection(k + int(exclude_self), chunk, selection)
    if selection == "native":
        return native_blocks(queries, references, k, exclude_self, distance, block_size)
    queries = jnp.asarray(queries)
    references = queries if same else jnp.asarray(references)
    if selection == "host":
        return host_blocks(queries, references, k, exclude_self, distance, block_size)
    return xla_blocks(queries, references, k, exclude_self, distance, block_size, chunk_size)


def knn(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    k: int,
    *,
    exclude_self: bool,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int | None = None,
    selection: str = "auto",
) -> tuple[jax.Array, jax.Array] | tuple[np.ndarray, np.ndarray]:
    """Exact k nearest references of every query, blocked so no Q x N matrix is materialised.

    Brute-force search: every query is compared to every reference, ``block_size`` queries at a
    time and, within a block, ``chunk_size`` references at a time with a running top-k
    (memory O(block_size * chunk_size)). :func:`knn_blocks` hands out the blocks one by one.

    Args:
      queries: (Q, D) float32 query embeddings.
      references: (N, D) float32 reference embeddings.
      k: number of neighbours, 1 <= k <= N (N - 1 with ``exclude_self``).
      exclude_self: the queries are the references (query i is reference i) and reference i is
        excluded from the neighbours of query i. The exclusion is by index, so exact duplicates
        of a query (also at distance 0) are still returned as neighbours.
      distance: "euclidean" (L2 distance) or "cosine" (1 - cosine similarity).
      block_size: queries per block (the last block is zero-padded to this size); with few
        references, blocks hold more queries, up to
        :func:`~jdml.evaluation.knn.blocks.block_scores` scores.
      chunk_size: largest number of references scored at once within a block (None: the
        backend's, see ``resolve_chunk_size``).
      selection: what selects the k nearest (:data:`jdml.backends.KNN_SELECTIONS`; a run's
        :class:`jdml.backends.Backends` ``knn``); "auto": the host or XLA's top-k by k.

    Returns:
      distances (Q, k) float32, ascending per row, and indices (Q, k) int32 into ``references``;
      equal distances are ordered by lower reference index. NumPy arrays when the queries and
      the references are host arrays, else JAX arrays. On CPU, where the selection runs on the
      host (see ``select_on_host``), ``chunk_size`` is not used; where NumPy arrays are
      searched by the native kernel directly (``direct_search``), neither is ``block_size``.
    """
    # Host arrays may be shared rather than copied (see ``_search_blocks``), so the search is
    # waited for before returning.
    chunk_size = resolve_chunk_size(chunk_size)
    host = [not isinstance(a, jax.Array) for a in (queries, references)]
    if all(host) and distance == "euclidean":
        check_search(
            np.shape(queries),
            np.shape(references),
            k,
            exclude_self,
            distance,
            block_size,
            chunk_size,
        )
        if _selection(k + int(exclude_self), np.shape(references)[0], selection) == "native":
            return direct_search(queries, references, k, exclude_self)
    queries, references = _placed(queries, references, as_float32)
    parts = list(
        _search_blocks(
            queries, references, k, exclude_self, distance, block_size, chunk_size, selection
        )
    )
    if isinstance(parts[0].distances, np.ndarray):
        found = (
            jnp.asarray(np.concatenate([b.distances for b in parts])),
            jnp.asarray(np.concatenate([b.indices for b in parts])),
        )
    elif len(parts) == 1:  # no concatenation to dispatch
        found = parts[0].distances, parts[0].indices
    else:
        found = (
            jnp.concatenate([b.distances for b in parts]),
            jnp.concatenate([b.indices for b in parts]),
        )
    if all(host):
        return np.asarray(found[0]), np.asarray(found[1])
    return jax.block_until_ready(found) if any(host) else found
