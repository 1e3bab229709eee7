"""The k nearest selected on the host (CPU backend): XLA scores a block, numpy selects.

XLA's CPU top_k costs a fixed amount per row that grows with k (1,000 rows of 1,008 scores:
1.6 ms at k = 2, 5.6 ms at k = 17, 17 ms at k = 65; a (512, 20,000) block: 18 ms at k = 20,
217 ms at k = 1,065), and its sort is slower still. numpy's introselect on the values
(``np.partition``) finds each row's k-th largest score at about 1.6 ns per score whatever k,
and only the k entries at or above it are then sorted (:func:`largest_k`). Where that is faster
(large k, or rows too short for the two-stage ``top_k``; see
:func:`jdml.evaluation.knn.search.select_on_host`), each query block (at most
``HOST_BLOCK_BYTES`` of scores) is scored against all references by XLA (the same augmented
matmul) and selected on the host, in pieces over threads, while XLA already computes the next
block's scores. Other backends keep ``lax.top_k``. The neighbours are the XLA path's up to the
rounding of the scores.
"""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.knn.blocks import NeighbourBlock, dispatched_ahead, query_block
from jdml.evaluation.knn.xla import augmented_references, score_block

# Largest (block, N) float32 score matrix of one host-selected block.
HOST_BLOCK_BYTES = 64 * 2**20


# Largest piece of a block (rows x N scores) selected at once by one host thread. numpy's
# selection and sort release the GIL, so the rows of a block are split over threads; pieces of
# at most 4 MB also keep numpy's temporaries under the allocator's mmap threshold, which
# otherwise makes every call page-fault fresh memory.
HOST_PIECE_ELEMENTS = 2**20


@functools.cache
def _host_thread_count() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


@functools.cache
def _host_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The threads of the host selection, one per CPU core."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=_host_thread_count())


def _host_pieces(num_rows: int, width: int) -> range:
    """First rows of the pieces of a (num_rows, width) block, one thread's work each.

    As many pieces as threads, each at most ``HOST_PIECE_ELEMENTS`` scores.
    """
    rows = math.ceil(num_rows / _host_thread_count())
    return range(0, num_rows, max(1, min(rows, HOST_PIECE_ELEMENTS // width)))


def sortable_key(values: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """int64 keys ordered as the (float32 value, index) pairs, for one integer sort.

    The float's bits are mapped to an int32 of the same order (negative floats have their
    magnitude bits flipped) and put above the non-negative int32 index.

    Args:
      values: float32 array (no NaN).
      indices: non-negative int32 array of the same shape.

    Returns:
      int64 array: key(a) < key(b) iff (value, index) of a < that of b.
    """
    bits = np.ascontiguousarray(values, np.float32).view(np.int32)
    ordered = np.where(bits < 0, bits ^ np.int32(0x7FFFFFFF), bits).astype(np.int64)
    return (ordered << 32) | indices.astype(np.int64)


def from_key(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (float32 values, int32 indices) of :func:`sortable_key`'s keys."""
    ordered = (keys >> 32).astype(np.int32)
    bits = np.where(ordered < 0, ordered ^ np.int32(0x7FFFFFFF), ordered)
    return bits.view(np.float32), (keys & 0xFFFFFFFF).astype(np.int32)


def largest_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact k largest scores of each row, in (score descending, index ascending) order.

    Threshold selection: ``np.partition`` (introselect on the values alone, about twice as fast
    as ``np.argpartition``) finds each row's k-th largest score t; one comparison pass keeps the
    entries >= t (exactly k per row unless t is tied), and only those are sorted, by one integer
    key per entry (:func:`sortable_key` of the negated score and the index). Where t is tied
    across the cut, the row keeps the lowest-indexed equal entries, as ``lax.top_k`` does.

    Args:
      scores: (B, N) C-contiguous float32 scores (no NaN).
      k: 1 <= k <= N.

    Returns:
      (B, k) float32 scores and (B, k) int32 indices, best first.
    """
    rows_count, n = scores.shape
    kth = np.partition(scores, n - k, axis=1)[:, n - k]
    flat = np.flatnonzero(scores >= kth[:, None])
    rows, columns = np.divmod(flat, n)
    # -x + 0.0 maps -0.0 and +0.0 to one zero, as equal as the comparisons above find them.
    keys = sortable_key(-np.ravel(scores)[flat] + np.float32(0), columns.astype(np.int32))
    if len(flat) == rows_count * k:
        keys = keys.reshape(rows_count, k)
        keys.sort(axis=1)
    else:  # ties at some row's threshold: each row's first k candidates in key order
        order = np.lexsort((keys, rows))
        counts = np.bincount(rows, minlength=rows_count)
        starts = np.cumsum(counts) - counts
        keys = keys[order[starts[:, None] + np.arange(k)[None, :]]]
    negated, indices = from_key(keys)
    return -negated, indices


def _host_block_neighbours(
    scores: np.ndarray, q_sq: np.ndarray, first: int, k: int, exclude_self: bool, distance: str
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest of one block from its (B, N) scores: the result of
    :func:`~jdml.evaluation.knn.xla._knn_block`."""
    values, chosen = largest_k(scores, k + int(exclude_self))
    if exclude_self:
        # Drop the query's own index, or else the last of the k + 1, which come in
        # (score desc, index asc) order.
        rows = np.arange(len(chosen))
        own = chosen == (first + rows)[:, None]
        drop = np.where(own.any(axis=1), own.argmax(axis=1), k)
        keep = np.ones(chosen.shape, bool)
        keep[rows, drop] = False
        chosen, values = chosen[keep].reshape(-1, k), values[keep].reshape(-1, k)
    if distance == "euclidean":
        distances = np.sqrt(np.maximum(q_sq[:, None] - values, np.float32(0)))
    else:
        distances = np.float32(1) - values
    # Rounding can map different scores to one distance: re-sort by (distance, index).
    keys = sortable_key(distances + np.float32(0), chosen)  # -0.0 + 0.0 = +0.0: one zero
    keys.sort(axis=1)
    return from_key(keys)


def nearest_on_host(distances: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k smallest of each row of (B, P) distances, ordered by (distance, index)."""
    out_d, out_i = (
        np.empty((len(distances), k), np.float32),
        np.empty((len(distances), k), np.int32),
    )

    pieces = _host_pieces(*distances.shape)

    def select(start: int) -> None:
        piece = slice(start, start + pieces.step)
        negated, out_i[piece] = largest_k(-distances[piece], k)
        out_d[piece] = np.float32(0) - negated  # 0 - x: never -0.0

    list(_host_threads().map(select, pieces))
    return out_d, out_i


def _select_block(
    scores: np.ndarray, q_sq: np.ndarray, first: int, k: int, exclude_self: bool, distance: str
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_host_block_neighbours` of a whole block, in pieces over the host threads."""
    count = len(scores)
    distances = np.empty((count, k), np.float32)
    indices = np.empty((count, k), np.int32)
    pieces = _host_pieces(count, scores.shape[1])

    def select(start: int) -> None:
        piece = slice(start, min(start + pieces.step, count))
        distances[piece], indices[piece] = _host_block_neighbours(
            scores[piece], q_sq[piece], first + start, k, exclude_self, distance
        )

    list(_host_threads().map(select, pieces))
    return distances, indices


def host_blocks(
    queries: jax.Array,
    references: jax.Array,
    k: int,
    exclude_self: bool,
    distance: str,
    block_size: int,
) -> Iterator[NeighbourBlock]:
    """:func:`~jdml.evaluation.knn.knn_blocks` with the selection on the host (see
    :func:`~jdml.evaluation.knn.search.select_on_host`)."""
    num_queries, num_references = queries.shape[0], references.shape[0]
    augmented = augmented_references(
        references, num_chunks=1, chunk=num_references, distance=distance
    )[0]
    block = min(
        query_block(num_queries, num_references, block_size),
        max(1, HOST_BLOCK_BYTES // (4 * num_references)),
    )
    num_blocks = math.ceil(num_queries / block)
    padded = jnp.pad(queries, ((0, num_blocks * block - num_queries), (0, 0)))

    def dispatch(b: int) -> tuple[jax.Array, jax.Array]:
        return score_block(padded[b * block : (b + 1) * block], augmented, distance=distance)

    for b, current in dispatched_ahead(dispatch, num_blocks):
        first = b * block
        count = min(block, num_queries - first)
        scores, q_sq = (np.asarray(a)[:count] for a in current)
        distances, indices = _select_block(scores, q_sq, first, k, exclude_self, distance)
        del current, scores
        yield NeighbourBlock(first, distances, indices)
