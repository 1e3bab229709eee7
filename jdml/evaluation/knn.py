"""Exact, blocked k-nearest-neighbour search on the default JAX device.

Retrieval evaluation ranks every test sample against every other test sample. For N test
samples the full N x N distance matrix does not fit in memory for large N, so the search is
blocked twice:

* over queries: the queries are cut into blocks of a fixed ``block_size`` rows (the last block
  is zero-padded) and one jitted block function is called per block, so it compiles once for a
  given (block size, reference set shape, k);
* over references: inside a block the references are cut into chunks of at most
  ``chunk_size`` rows; each chunk's top-k is merged into a running top-k, so the memory of a
  block is O(block_size * chunk_size), independent of N.

Ranking score (higher = nearer). Euclidean: the Gram expansion
``|q - r|^2 = |q|^2 + |r|^2 - 2 q.r`` without the per-query constant ``|q|^2`` (which does not
change a query's ranking), i.e. ``2 q.r - |r|^2``. Cosine: ``q.r / (|q| |r|)``. Both are one
matrix product of the queries augmented with a column of ones against the references augmented
with a column holding ``-|r|^2`` (Euclidean) or 0 (cosine); padding references get ``-inf`` in
that column, so no elementwise pass over the block x chunk score matrix is needed.

Self-exclusion is by index: the k + 1 best references are selected and the query's own index
is removed from them wherever it is (or the last one if it is not there), so exact duplicates
of a query, also at distance 0, are kept and ranked by index.

On the CPU backend the k best of a query block are selected by a native kernel
(``jdml/nn/native/knn.cc``, see "Native selection" below) wherever the native library builds
(``$JDML_KNN``): it scores tiles of queries against tiles of references with oneDNN's sgemm and
filters each tile against every query's k-th best score so far while the tile is in cache. Where
the library is missing, from ``HOST_SELECTION_MIN_K`` neighbours on, and for any k >= 2 where
the two-stage top-k does not apply (few references), each query block (at most
``HOST_BLOCK_BYTES`` of scores) is scored against all references by XLA and its k best are
selected on the host with numpy (see "Selection on the host" below). All give the same
neighbours up to the rounding of the scores. :func:`knn` of NumPy arrays with the Euclidean
distance calls the native search directly on their memory, without JAX (``_direct_search``),
as faiss is called.

:func:`knn_full_ranking` (leave-one-out only) additionally ranks each query's complete list of
N - 1 other samples, for the mAP over all neighbours: per query block it computes the distances
to all references at once (O(block_size * N) memory, the N x N matrix is never formed), takes
the k nearest from them, and on the host sorts each row once and finds the rank of every
same-class sample by binary search.

The returned distances come from the selected scores: ``sqrt(max(|q|^2 - score, 0))`` (the Gram
expansion, clamped at 0 against rounding; near 0 it carries float32 rounding of the order of
``sqrt(1e-7 |q|^2)``) or ``1 - score``. The k neighbours are sorted by (distance, index): ties
are broken towards the lower reference index, deterministically.

:mod:`jdml.evaluation.sharded` runs the same search over the devices of a mesh.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import math
import os
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.points import as_float32
from jdml.geometry import l2_normalize
from jdml.nn import native

DISTANCES = ("euclidean", "cosine")
DEFAULT_BLOCK_SIZE = 512
# References scored at once within a query block (``chunk_size=None``: the backend's value). On
# CPU 16,384 (with 512-query blocks: 32 MB of float32 scores per block). On an accelerator
# 131,072: up to that many references are one product and one top-k per block, with no running
# merge over chunks (on an H200 at SOP's size, 60,502 x 128, with 2^28-score blocks: 0.057 s
# warm for recall@1-8 and MAP@R against 0.060 s in chunks of 16,384; bench/bench_gpu.py
# --sections sweep).
DEFAULT_CHUNK_SIZE = 16384
ACCELERATOR_CHUNK_SIZE = 2**17
# Query blocks grow beyond ``block_size`` while a block's scores against one chunk of references
# stay within this many (``block_scores``; None: the backend's value below). On CPU 2^22 (16 MB):
# at N = 1,000 every query is in one block, and the fixed cost of a call is paid once. On an
# accelerator 2^28 (1 GiB): a block's dispatch, top-k and host-side metrics cost about as much
# for 4,436 queries as for 512; on an H200 at SOP's size (60,502 x 128, one chunk) recall@1-8
# and MAP@R took 0.057 s warm against 0.214 s with 2^22 (bench/bench_gpu.py --sections sweep).
BLOCK_SCORES: int | None = None
CPU_BLOCK_SCORES = 2**22
ACCELERATOR_BLOCK_SCORES = 2**28
# Width of the groups of the two-stage top-k (see ``_top_k``); chunks are multiples of it.
GROUP_SIZE = 16
_INDEX_SENTINEL = np.iinfo(np.int32).max


_Block = TypeVar("_Block")


def _dispatched_ahead(
    dispatch: Callable[[int], _Block], num_blocks: int
) -> Iterator[tuple[int, _Block]]:
    """Yields ``(b, dispatch(b))`` for every block ``b`` in order, dispatching block ``b + 1``
    before handing out block ``b``, so that the device computes the next block while the
    caller works on this one (JAX dispatch is asynchronous). At most two blocks are held here:
    the one handed out is dropped before the one after next is dispatched, provided the caller
    also drops its reference at the end of its loop body."""
    pending = dispatch(0)
    for b in range(num_blocks):
        current, pending = pending, None
        if b + 1 < num_blocks:
            pending = dispatch(b + 1)
        yield b, current
        del current


def resolve_chunk_size(chunk_size: int | None) -> int:
    """``chunk_size``, or for None the default backend's (``DEFAULT_CHUNK_SIZE`` on CPU,
    ``ACCELERATOR_CHUNK_SIZE`` elsewhere)."""
    if chunk_size is not None:
        return chunk_size
    return DEFAULT_CHUNK_SIZE if jax.default_backend() == "cpu" else ACCELERATOR_CHUNK_SIZE


def block_scores() -> int:
    """The most scores of a query block against one chunk: ``BLOCK_SCORES`` if set, else the
    default backend's (``CPU_BLOCK_SCORES`` or ``ACCELERATOR_BLOCK_SCORES``)."""
    if BLOCK_SCORES is not None:
        return BLOCK_SCORES
    return CPU_BLOCK_SCORES if jax.default_backend() == "cpu" else ACCELERATOR_BLOCK_SCORES


def _query_block(num_queries: int, width: int, block_size: int) -> int:
    """Queries per block: ``block_size``, or more while a block has at most
    :func:`block_scores` scores against ``width`` references, and never more than the
    queries."""
    return max(1, min(num_queries, max(block_size, block_scores() // width)))


def _chunk_layout(num_references: int, chunk_size: int) -> tuple[int, int]:
    """Splits N references into equal chunks of at most ``chunk_size`` rows.

    Args:
      num_references: number of reference rows N.
      chunk_size: largest allowed chunk.

    Returns:
      (number of chunks M, rows per chunk C) with M * C >= N. C is rounded up to a multiple of
      ``GROUP_SIZE`` (when that stays within ``chunk_size``), so padding is small.
    """
    num_chunks = max(1, math.ceil(num_references / chunk_size))
    rows = math.ceil(num_references / num_chunks)
    rounded = GROUP_SIZE * math.ceil(rows / GROUP_SIZE)
    return num_chunks, rounded if rounded <= chunk_size else rows


# The ranking score is ``SCORE_SCALE * q.r + _score_bias(r)`` (see the module docstring).
SCORE_SCALE = {"euclidean": 2.0, "cosine": 1.0}


def _score_bias(references: jax.Array, distance: str) -> jax.Array:
    """(N,) the ranking score's per-reference term: ``-|r|^2`` (Euclidean) or 0 (cosine)."""
    if distance == "euclidean":
        return -jnp.sum(references * references, axis=-1)
    return jnp.zeros(references.shape[:1], jnp.float32)


@functools.partial(jax.jit, static_argnames=("num_chunks", "chunk", "distance"))
def _augmented_references(
    references: jax.Array,
    num_chunks: int,
    chunk: int,
    distance: str,
    num_valid: jax.Array | None = None,
) -> jax.Array:
    """References laid out as chunks, with the score-bias column appended.

    Args:
      references: (N, D) references (unit-norm rows for the cosine distance).
      num_chunks: M, number of chunks.
      chunk: C, rows per chunk (M * C >= N; the extra rows are padding).
      distance: "euclidean" (rows ``[2 r, -|r|^2]``) or "cosine" (rows ``[r, 0]``).
      num_valid: () int32: the rows from this one on are padding too (a device's shard of
        the sharded search, ``jdml.evaluation.sharded``); None: all N rows are references.

    Returns:
      (M, C, D + 1) chunks; padding rows are ``[0, ..., 0, -inf]`` (with ``num_valid``: ``[.,
      -inf]``) so they score ``-inf``.
    """
    num_references = references.shape[0]
    bias = _score_bias(references, distance)[:, None]
    scaled = SCORE_SCALE[distance] * references
    if num_valid is not None:
        row = jnp.arange(num_references, dtype=jnp.int32)[:, None]
        bias = jnp.where(row < num_valid, bias, -jnp.inf)
    rows = jnp.concatenate([scaled, bias], axis=1)
    padding = jnp.zeros((num_chunks * chunk - num_references, rows.shape[1]), jnp.float32)
    padding = padding.at[:, -1].set(-jnp.inf)
    return jnp.concatenate([rows, padding]).reshape(num_chunks, chunk, -1)


def _top_k(scores: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Exact top-k along the last axis, ties towards the lower index (like ``lax.top_k``).

    When k is small against the row (``k * GROUP_SIZE * 8 <= C``, where it is about twice as
    fast on CPU as one ``lax.top_k`` over the whole row) a two-stage search is used: the row is
    split into groups of ``GROUP_SIZE`` consecutive entries, the k groups with the largest
    maxima are kept (every element of the exact top-k lies in one of them: the groups ranked
    before an element's group each hold a distinct element ranked before it), and the top-k of
    those k * GROUP_SIZE candidates is taken. The kept groups are put back in position order so
    that ties still favour lower indices.

    Args:
      scores: (B, C) scores.
      k: number of entries, k <= C.

    Returns:
      values (B, k) descending and indices (B, k) int32 into the last axis.
    """
    block, width = scores.shape
    g = GROUP_SIZE
    if width % g or k * g * 8 > width:
        values, indices = jax.lax.top_k(scores, k)
        return values, indices.astype(jnp.int32)
    grouped = scores.reshape(block, width // g, g)
    _, groups = jax.lax.top_k(jnp.max(grouped, axis=-1), k)
    groups = jnp.sort(groups.astype(jnp.int32), axis=1)
    candidates = jnp.take_along_axis(grouped, groups[:, :, None], axis=1).reshape(block, k * g)
    values, position = jax.lax.top_k(candidates, k)
    indices = jnp.take_along_axis(groups, position // g, axis=1) * g + position % g
    return values, indices.astype(jnp.int32)


def _drop_own_index(
    values: jax.Array, indices: jax.Array, query_ids: jax.Array, k: int
) -> tuple[jax.Array, jax.Array]:
    """Removes each query's own index from its k + 1 best candidates.

    If query i's own index is among its k + 1 best references it is removed; otherwise the
    (k + 1)-th is. Either way the result is the exact top-k over the references other than i,
    whatever position (or distance) the query itself has.

    Args:
      values: (B, k + 1) candidate scores, best first.
      indices: (B, k + 1) candidate indices.
      query_ids: (B,) global index of each query.
      k: number of neighbours to keep.

    Returns:
      (B, k) scores and (B, k) indices with the own index excluded, order preserved.
    """
    is_self = indices == query_ids[:, None]
    cut = jnp.where(jnp.any(is_self, axis=1), jnp.argmax(is_self, axis=1), k)
    # Positions from the cut on take their right neighbour: two shifted slices and a select,
    # not a gather (XLA's CPU gather costs tens of ns per element).
    shift = jnp.arange(k, dtype=jnp.int32)[None, :] >= cut[:, None]
    return (
        jnp.where(shift, values[:, 1 : k + 1], values[:, :k]),
        jnp.where(shift, indices[:, 1 : k + 1], indices[:, :k]),
    )


def _scores_to_distances(queries: jax.Array, scores: jax.Array, distance: str) -> jax.Array:
    """Distances from ranking scores.

    Args:
      queries: (B, D) query block (unit-norm rows for the cosine distance).
      scores: (B, k) ranking scores ``2 q.r - |r|^2`` (Euclidean) or ``q.r`` (cosine).
      distance: "euclidean" or "cosine".

    Returns:
      (B, k) distances: ``sqrt(max(|q|^2 - score, 0))``, the Gram expansion of ``|q - r|``
      clamped at 0 against rounding, or ``1 - score``.
    """
    if distance == "euclidean":
        q_sq = jnp.sum(queries * queries, axis=-1, keepdims=True)
        return jnp.sqrt(jnp.maximum(q_sq - scores, 0.0))
    return 1.0 - scores


def _chunks_top_k(
    augmented: jax.Array, ref_chunks: jax.Array, wanted: int
) -> tuple[jax.Array, jax.Array]:
    """Exact top-``wanted`` references of a query block, with a running top-k over chunks.

    Args:
      augmented: (B, D + 1) queries with a column of ones appended.
      ref_chunks: (M, C, D + 1) augmented reference chunks from ``_augmented_references``.
      wanted: number of candidates to keep.

    Returns:
      scores (B, w) descending and int32 indices (B, w) into the M * C references, equal
      scores ordered by lower index; w = min(wanted, C) with one chunk, else ``wanted`` (the
      running top-k starts as ``-inf`` at index ``_INDEX_SENTINEL``).
    """
    num_chunks, chunk, _ = ref_chunks.shape
    block = augmented.shape[0]
    chunk_k = min(wanted, chunk)

    def chunk_top_k(rows: jax.Array, offset: jax.Array) -> tuple[jax.Array, jax.Array]:
        scores = jnp.matmul(augmented, rows.T, precision=jax.lax.Precision.HIGHEST)
        values, local = _top_k(scores, chunk_k)
        return values, local + offset

    if num_chunks == 1:
        return chunk_top_k(ref_chunks[0], jnp.int32(0))

    def merge(
        carry: tuple[jax.Array, jax.Array], chunk_inputs: tuple[jax.Array, jax.Array]
    ) -> tuple[tuple[jax.Array, jax.Array], None]:
        best_values, best_indices = carry
        values, indices = chunk_top_k(*chunk_inputs)
        # The running top-k comes first: on equal scores top_k keeps the earlier position,
        # which is the lower reference index because chunks are visited in index order.
        all_values = jnp.concatenate([best_values, values], axis=1)
        all_indices = jnp.concatenate([best_indices, indices], axis=1)
        best_values, position = jax.lax.top_k(all_values, wanted)
        best_indices = jnp.take_along_axis(all_indices, position, axis=1)
        return (best_values, best_indices), None

    init = (
        jnp.full((block, wanted), -jnp.inf, jnp.float32),
        jnp.full((block, wanted), _INDEX_SENTINEL, jnp.int32),
    )
    offsets = chunk * jnp.arange(num_chunks, dtype=jnp.int32)
    (values, indices), _ = jax.lax.scan(merge, init, (ref_chunks, offsets))
    return values, indices


def _with_ones(queries: jax.Array) -> jax.Array:
    """(B, D) queries with a column of ones appended (the bias column's multiplier)."""
    return jnp.concatenate([queries, jnp.ones((queries.shape[0], 1), jnp.float32)], axis=1)


def _neighbours_from_scores(
    queries: jax.Array,
    values: jax.Array,
    indices: jax.Array,
    query_ids: jax.Array,
    *,
    k: int,
    exclude_self: bool,
    distance: str,
) -> tuple[jax.Array, jax.Array]:
    """The k nearest from the k (+ 1 with ``exclude_self``) best scores of a query block:
    the own index dropped, scores turned into distances, rows in (distance, index) order (see
    ``_by_distance_then_index``; the native kernel ``jdml_knn_search`` does the same)."""
    if exclude_self:
        values, indices = _drop_own_index(values, indices, query_ids, k)
    distances = _scores_to_distances(queries, values, distance)
    return _by_distance_then_index(distances, indices)


@functools.partial(jax.jit, static_argnames=("k", "exclude_self", "distance"))
def _knn_block(
    queries: jax.Array,
    query_offset: jax.Array,
    ref_chunks: jax.Array,
    *,
    k: int,
    exclude_self: bool,
    distance: str,
) -> tuple[jax.Array, jax.Array]:
    """Exact top-k nearest references of one query block, with a running top-k over chunks.

    Args:
      queries: (B, D) query block (zero-padded at the end of the query set; unit-norm rows for
        the cosine distance).
      query_offset: () int32 global index of the block's first query.
      ref_chunks: (M, C, D + 1) augmented reference chunks from ``_augmented_references``.
      k: number of neighbours.
      exclude_self: exclude reference i from the neighbours of query i.
      distance: "euclidean" or "cosine".

    Returns:
      distances (B, k) float32 ascending, and indices (B, k) int32 into the reference set;
      equal distances are ordered by lower index.
    """
    block = queries.shape[0]
    query_ids = query_offset + jnp.arange(block, dtype=jnp.int32)
    values, indices = _chunks_top_k(_with_ones(queries), ref_chunks, k + int(exclude_self))
    return _neighbours_from_scores(
        queries, values, indices, query_ids, k=k, exclude_self=exclude_self, distance=distance
    )


def _by_distance_then_index(
    distances: jax.Array, indices: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Rows in (distance, index) order, given rows already in ascending distance order.

    Rounding can map different scores to one distance, and the (score, index) order of the
    top-k then need not be the (distance, index) order. The sort (slow on CPU: 70 ns per entry
    of a (512, 1,000) block, where at k = 1,000 a fifth of the rows need it) runs only if some
    row has two equal distances out of index order. (The native kernel ``jdml_knn_search``
    orders its rows by an insertion sort instead, one pass over such rows.)
    """
    if distances.shape[1] < 2:
        return distances, indices
    out_of_order = jnp.any(
        (distances[:, 1:] == distances[:, :-1]) & (indices[:, 1:] < indices[:, :-1])
    )
    return jax.lax.cond(
        out_of_order,
        lambda d, i: tuple(jax.lax.sort((d, i), dimension=1, num_keys=2)),
        lambda d, i: (d, i),
        distances,
        indices,
    )


# ---------------------------------------------------------------------------------------------
# Selection on the host (CPU backend).
#
# XLA's CPU top_k costs a fixed amount per row that grows with k (1,000 rows of 1,008 scores:
# 1.6 ms at k = 2, 5.6 ms at k = 17, 17 ms at k = 65; a (512, 20,000) block: 18 ms at k = 20,
# 217 ms at k = 1,065), and its sort is slower still. numpy's introselect on the values
# (``np.partition``) finds each row's k-th largest score at about 1.6 ns per score whatever k,
# and only the k entries at or above it are then sorted (``largest_k``). Where that is faster
# (large k, or rows too short for the two-stage ``_top_k``), the block's scores are computed by
# XLA (the same augmented matmul) and selected on the host, in pieces over threads, while XLA
# already computes the next block's scores. Other backends keep ``lax.top_k``.

# Where the k nearest are selected: "auto" (see ``_selection``), "native", "host" or "xla".
SELECTION = "auto"
SELECTIONS = ("auto", "native", "host", "xla")
# Smallest k (self included) always selected on the host on the CPU backend.
HOST_SELECTION_MIN_K = 64
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


def _selection(k: int, width: int) -> str:
    """How :func:`knn` selects ``k`` of ``width`` references per query: "native", "host" or
    "xla".

    ``SELECTION`` "auto": on the CPU backend the native kernel where ``$JDML_KNN`` allows it
    and the library builds (:func:`jdml.nn.native.onednn_enabled`), else as
    ``_select_on_host`` says; other backends "xla". Any other value forces that selection
    (tests, benchmarks).
    """
    if SELECTION not in SELECTIONS:
        raise ValueError(f"unknown selection {SELECTION!r}; expected one of {SELECTIONS}")
    if SELECTION != "auto":
        return SELECTION
    if jax.default_backend() == "cpu" and native.onednn_enabled(native.KNN_ENV):
        return "native"
    return "host" if _select_on_host(k, width) else "xla"


def _select_on_host(k: int, width: int) -> bool:
    """Whether :func:`knn` selects ``k`` of ``width`` references per query on the host.

    ``SELECTION`` "auto": on the CPU backend only, from ``HOST_SELECTION_MIN_K`` on, and from
    k = 2 on wherever the two-stage ``_top_k`` does not apply (rows narrower than
    ``k * GROUP_SIZE * 8``). "host" and "xla" force one or the other (tests, benchmarks).
    """
    if SELECTION != "auto":
        return SELECTION == "host"
    if jax.default_backend() != "cpu":
        return False
    return k >= HOST_SELECTION_MIN_K or (k >= 2 and k * GROUP_SIZE * 8 > width)


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


def _from_key(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    negated, indices = _from_key(keys)
    return -negated, indices


@functools.partial(jax.jit, static_argnames=("distance",))
def _block_scores(
    queries: jax.Array, references: jax.Array, *, distance: str
) -> tuple[jax.Array, jax.Array]:
    """Ranking scores of a query block against all (augmented) references, and ``|q|^2``."""
    augmented = jnp.concatenate([queries, jnp.ones((queries.shape[0], 1), jnp.float32)], 1)
    scores = jnp.matmul(augmented, references.T, precision=jax.lax.Precision.HIGHEST)
    return scores, jnp.sum(queries * queries, axis=-1)


def _host_block_neighbours(
    scores: np.ndarray, q_sq: np.ndarray, first: int, k: int, exclude_self: bool, distance: str
) -> tuple[np.ndarray, np.ndarray]:
    """The k nearest of one block from its (B, N) scores: :func:`_knn_block`'s result."""
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
    return _from_key(keys)


def _nearest_on_host(distances: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
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


class NeighbourBlock(NamedTuple):
    """The k nearest references of consecutive queries (see :func:`knn_blocks`).

    Attributes:
      first: index of the block's first query.
      distances: (B, k) float32 distances, ascending per row (a numpy array where the host
        selected them, else a JAX array).
      indices: (B, k) int32 reference indices; equal distances ordered by lower index.
    """

    first: int
    distances: jax.Array | np.ndarray
    indices: jax.Array | np.ndarray


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


def _host_blocks(
    queries: jax.Array,
    references: jax.Array,
    k: int,
    exclude_self: bool,
    distance: str,
    block_size: int,
) -> Iterator[NeighbourBlock]:
    """:func:`knn_blocks` with the selection on the host (see ``_select_on_host``)."""
    num_queries, num_references = queries.shape[0], references.shape[0]
    augmented = _augmented_references(
        references, num_chunks=1, chunk=num_references, distance=distance
    )[0]
    block = min(
        _query_block(num_queries, num_references, block_size),
        max(1, HOST_BLOCK_BYTES // (4 * num_references)),
    )
    num_blocks = math.ceil(num_queries / block)
    padded = jnp.pad(queries, ((0, num_blocks * block - num_queries), (0, 0)))

    def dispatch(b: int) -> tuple[jax.Array, jax.Array]:
        return _block_scores(padded[b * block : (b + 1) * block], augmented, distance=distance)

    for b, current in _dispatched_ahead(dispatch, num_blocks):
        first = b * block
        count = min(block, num_queries - first)
        scores, q_sq = (np.asarray(a)[:count] for a in current)
        distances, indices = _select_block(scores, q_sq, first, k, exclude_self, distance)
        del current, scores
        yield NeighbourBlock(first, distances, indices)


# ---------------------------------------------------------------------------------------------
# Native selection (CPU backend): ``jdml/nn/native/knn.cc`` scores tiles of 256 queries against
# tiles of references (1 MB of scores) with oneDNN's sgemm and filters each tile against every
# query's k-th best score so far while the tile is in cache, so no block of scores goes to
# memory. The few scores that pass enter a per-query buffer of 2k + 16 integer keys of (score,
# index), cut back to the k best by a branch-free quickselect when full. Where XLA's top-k and
# the host's selection read every score of a block again, this costs a compare per score: at
# 20,000 x 128 it is 1.5-2.5x faster than faiss-cpu at k = 1 to 1,000 (``bench/bench_eval.py``).


@jax.jit
def _native_bias(references: jax.Array) -> jax.Array:
    """(N,) the Euclidean ``_score_bias`` -|r|^2 as ``jdml_knn_search`` computes it (the same
    float32 sums, so that a search gives the same neighbours in one block or in several)."""
    native.library()  # registers the targets (compiled once per machine)
    call = jax.ffi.ffi_call(
        "jdml_knn_bias", jax.ShapeDtypeStruct(references.shape[:1], jnp.float32)
    )
    return call(references)


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
    """:func:`_knn_block` with the native selection: the whole block in one call of the native
    kernel ``jdml_knn_search`` (the ``wanted`` best scores of each query as the XLA path
    selects them, the own index dropped, distances from the scores, rows in (distance, index)
    order, as :func:`_neighbours_from_scores` does).

    The jitted program is that call alone, so XLA's CPU client runs it on the calling thread
    (see ``knn.cc``). Its scores are the augmented product's up to float32 rounding: sgemm
    scales the dot products (by 2, exactly) and the bias is added to each rather than summed
    with them, so that sgemm runs on the D columns of the references as they are (at D = 128,
    a multiple of 16, 1.3x faster than on D + 1).

    Args:
      queries: (B, D) queries (unit-norm rows for the cosine distance).
      query_offset: () int32, the index of the first query among the references.
      references: (N, D) references; None: the queries are the references.
      bias: (N,) their Euclidean bias from :func:`_native_bias`, or None: computed by the
        kernel (a search of one block, or cosine, where it is 0; with many blocks, once for all
        of them is cheaper).
      k, exclude_self, distance: as in :func:`knn`.

    Returns:
      distances (B, k) float32 ascending and int32 indices, ties by lower index.
    """
    native.library()  # registers the targets (compiled once per machine)
    if references is None:
        references = queries
    if bias is None:
        bias = jnp.zeros((0,), jnp.float32)
    rows = queries.shape[0]
    call = jax.ffi.ffi_call(
        "jdml_knn_search",
        (
            jax.ShapeDtypeStruct((rows, k), jnp.float32),
            jax.ShapeDtypeStruct((rows, k), jnp.int32),
        ),
        vmap_method="sequential",
    )
    return tuple(
        call(
            queries,
            references,
            bias,
            query_offset,
            k=np.int64(k),
            exclude_self=np.bool_(exclude_self),
            cosine=np.bool_(distance == "cosine"),
        )
    )


def _native_blocks(
    queries: jax.Array,
    references: jax.Array,
    k: int,
    exclude_self: bool,
    distance: str,
    block_size: int,
) -> Iterator[NeighbourBlock]:
    """:func:`knn_blocks` with the native selection (see ``_selection``). The kernel takes any
    number of queries, so blocks are not padded: the last one compiles once more.

    Host (NumPy) queries and references go into the jitted block function as they are: its
    arguments reach the device in one step, where ``jax.device_put`` or ``jnp.asarray`` first
    would be a dispatch of their own (after the process has been idle for a while, as between
    two evaluations, each JAX call costs 0.2-0.5 ms on a 2-core VM: at N = 1,000 these were a
    third of a search). With several blocks the references go to the device once."""
    num_queries, num_references = queries.shape[0], references.shape[0]
    block = _query_block(num_queries, num_references, block_size)
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

    for b, (d, i) in _dispatched_ahead(dispatch, num_blocks):
        yield NeighbourBlock(b * block, d, i)


def check_search(
    queries_shape: tuple[int, ...],
    references_shape: tuple[int, ...],
    k: int,
    exclude_self: bool,
    distance: str,
    block_size: int,
    chunk_size: int,
) -> None:
    """Raises ``ValueError`` unless the arguments of :func:`knn` (given the shapes of the
    queries and references) describe a search."""
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {DISTANCES}")
    if (
        len(queries_shape) != 2
        or len(references_shape) != 2
        or queries_shape[1] != references_shape[1]
    ):
        raise ValueError(
            f"expected (Q, D) queries and (N, D) references, got {queries_shape} and "
            f"{references_shape}"
        )
    num_references = references_shape[0]
    if exclude_self and queries_shape[0] != num_references:
        raise ValueError("exclude_self needs the queries to be the references (same length)")
    available = num_references - int(exclude_self)
    if not 1 <= k <= available:
        raise ValueError(f"k={k} must be in [1, {available}] for {num_references} references")
    if block_size < 1 or chunk_size < 1:
        raise ValueError("block_size and chunk_size must be positive")


def knn_blocks(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    k: int,
    *,
    exclude_self: bool,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int | None = None,
) -> Iterator[NeighbourBlock]:
    """:func:`knn`, one block of queries at a time, in query order.

    The arguments are checked at once (not at the first block). The next block is dispatched
    before a block is handed out, so the device works while the caller uses it; a caller that
    reduces each block (e.g. to per-query metric values) never holds all (Q, k) neighbours.

    Args:
      queries, references, k, exclude_self, distance, block_size, chunk_size: as in
        :func:`knn`.

    Returns:
      An iterator of :class:`NeighbourBlock`, covering the queries in order.
    """
    chunk_size = resolve_chunk_size(chunk_size)
    # copies: the caller may change its arrays while it holds the iterator
    queries, references = _placed(queries, references, _device_copy)
    return _search_blocks(queries, references, k, exclude_self, distance, block_size, chunk_size)


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
) -> Iterator[NeighbourBlock]:
    """:func:`knn_blocks` on float32 queries and references that may be host arrays, which the
    search may read until its last block is computed (JAX shares a host array's memory where it
    can, also in a jitted function's arguments)."""
    same = queries is references
    check_search(queries.shape, references.shape, k, exclude_self, distance, block_size, chunk_size)
    num_queries, num_references = queries.shape[0], references.shape[0]

    if distance == "cosine":
        queries, references = l2_normalize(queries), l2_normalize(references)
        references = queries if same else references
    num_chunks, chunk = _chunk_layout(num_references, chunk_size)
    selection = _selection(k + int(exclude_self), chunk)
    if selection == "native":
        return _native_blocks(queries, references, k, exclude_self, distance, block_size)
    queries = jnp.asarray(queries)
    references = queries if same else jnp.asarray(references)
    if selection == "host":
        return _host_blocks(queries, references, k, exclude_self, distance, block_size)
    ref_chunks = _augmented_references(
        references, num_chunks=num_chunks, chunk=chunk, distance=distance
    )
    block = _query_block(num_queries, chunk, block_size)
    num_blocks = math.ceil(num_queries / block)
    padded_queries = jnp.pad(queries, ((0, num_blocks * block - num_queries), (0, 0)))

    def dispatch(b: int) -> tuple[jax.Array, jax.Array]:
        return _knn_block(
            padded_queries[b * block : (b + 1) * block],
            jnp.int32(b * block),
            ref_chunks,
            k=k,
            exclude_self=exclude_self,
            distance=distance,
        )

    def blocks() -> Iterator[NeighbourBlock]:
        for b, (d, i) in _dispatched_ahead(dispatch, num_blocks):
            count = min(block, num_queries - b * block)
            yield NeighbourBlock(b * block, d[:count], i[:count])

    return blocks()


_Int64 = ctypes.c_int64
_Pointer = ctypes.c_void_p


@functools.cache
def _direct_function() -> ctypes._CFuncPtr:
    """The native library's ``jdml_knn_search_host``, typed (see ``knn.cc``)."""
    function = native.library().jdml_knn_search_host
    function.argtypes = [_Pointer, _Int64, _Pointer, _Int64, _Int64, _Int64, ctypes.c_int]
    function.argtypes += [ctypes.c_int, _Pointer, _Pointer, ctypes.c_char_p, _Int64]
    function.restype = ctypes.c_int
    return function


def _direct_search(
    queries: np.ndarray, references: np.ndarray, k: int, exclude_self: bool
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`knn` of host arrays with the Euclidean distance, by the native search called
    directly on their memory (``jdml_knn_search_host``), as faiss is called: no JAX dispatch
    (0.3-0.6 ms after an idle moment) and no aligned copy of the arrays, together a third of a
    search of 1,000 x 1,000. The same kernel and query ranges as the jitted native block of
    the whole search, so the same results, bit for bit (and bit for bit as several jitted
    blocks up to 768 dimensions; from 1,024 on, up to float32 rounding, see ``gemm.h``). The
    call returns when it is done."""
    function = _direct_function()
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


def knn(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    k: int,
    *,
    exclude_self: bool,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int | None = None,
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
        references, blocks hold more queries, up to :func:`block_scores` scores.
      chunk_size: largest number of references scored at once within a block (None: the
        backend's, see ``resolve_chunk_size``).

    Returns:
      distances (Q, k) float32, ascending per row, and indices (Q, k) int32 into ``references``;
      equal distances are ordered by lower reference index. NumPy arrays when the queries and
      the references are host arrays, else JAX arrays. On CPU, where the selection runs on the
      host (see ``_select_on_host``), ``chunk_size`` is not used; where NumPy arrays are
      searched by the native kernel directly (``_direct_search``), neither is ``block_size``.
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
        if _selection(k + int(exclude_self), np.shape(references)[0]) == "native":
            return _direct_search(queries, references, k, exclude_self)
    queries, references = _placed(queries, references, as_float32)
    blocks = list(
        _search_blocks(queries, references, k, exclude_self, distance, block_size, chunk_size)
    )
    if isinstance(blocks[0].distances, np.ndarray):
        found = (
            jnp.asarray(np.concatenate([b.distances for b in blocks])),
            jnp.asarray(np.concatenate([b.indices for b in blocks])),
        )
    elif len(blocks) == 1:  # no concatenation to dispatch
        found = blocks[0].distances, blocks[0].indices
    else:
        found = (
            jnp.concatenate([b.distances for b in blocks]),
            jnp.concatenate([b.indices for b in blocks]),
        )
    if all(host):
        return np.asarray(found[0]), np.asarray(found[1])
    return jax.block_until_ready(found) if any(host) else found


# ---------------------------------------------------------------------------------------------
# Full ranking: the exact rank of every same-class sample among all N - 1 other samples.


class FullRanking(NamedTuple):
    """Output of :func:`knn_full_ranking`.

    Attributes:
      distances: (N, k) float32 distances of each sample's k nearest other samples, ascending.
      indices: (N, k) int32 indices of those neighbours; ties ordered by lower index.
      precision_sums: (N,) float64 ``sum_{k=1..N-1} P@k * rel_k`` over the complete ranking of
        the N - 1 other samples, where rel_k says whether rank k holds a sample of the query's
        class and P@k is the precision at rank k (0 for a class with a single sample).
    """

    distances: np.ndarray
    indices: np.ndarray
    precision_sums: np.ndarray


class RankedBlock(NamedTuple):
    """One block of queries of :func:`full_ranking_blocks`.

    Attributes:
      first: index of the block's first query.
      distances, indices: (B, k) as in :class:`FullRanking`.
      precision_sums: (B,) as in :class:`FullRanking`.
    """

    first: int
    distances: np.ndarray
    indices: np.ndarray
    precision_sums: np.ndarray


@functools.partial(jax.jit, static_argnames=("k", "distance", "exclude_self"))
def _full_ranking_block(
    queries: jax.Array,
    query_offset: jax.Array,
    references: jax.Array,
    *,
    k: int,
    distance: str,
    exclude_self: bool = True,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Distances of one query block to every reference, and its k nearest references.

    Args:
      queries: (B, D) query block (zero-padded at the end; unit-norm rows for cosine).
      query_offset: () int32 global index of the block's first query.
      references: (P, D + 1) augmented references (``_augmented_references`` with one chunk;
        padding rows score ``-inf``).
      k: number of nearest neighbours to return (0 for none).
      distance: "euclidean" or "cosine".
      exclude_self: the queries are the references; query i's own index is set to ``+inf``.

    Returns:
      The (B, P) distances with the query's own index (with ``exclude_self``) and the padding
      set to ``+inf``, and the
      (B, k) distances and int32 indices of the k nearest, ordered by (distance, index).
    """
    block = queries.shape[0]
    query_ids = query_offset + jnp.arange(block, dtype=jnp.int32)
    augmented = jnp.concatenate([queries, jnp.ones((block, 1), jnp.float32)], axis=1)
    scores = jnp.matmul(augmented, references.T, precision=jax.lax.Precision.HIGHEST)
    distances = _scores_to_distances(queries, scores, distance)
    if exclude_self:
        own = jnp.arange(references.shape[0], dtype=jnp.int32)[None, :] == query_ids[:, None]
        distances = jnp.where(own, jnp.inf, distances)
    # Padding references score -inf, so their distance is +inf already (Euclidean: sqrt of
    # +inf; cosine: 1 - (-inf)).
    if k == 0:
        empty = jnp.zeros((block, 0), jnp.float32)
        return distances, empty, empty.astype(jnp.int32)
    # top_k keeps the lower index among equal values, so this is the (distance, index) order.
    negated, indices = _top_k(-distances, k)
    return distances, -negated, indices


def _class_members(
    reference_ids: np.ndarray, query_ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The references grouped by class (a CSR layout), and each query's run in it.

    Args:
      reference_ids: (N,) integer class of every reference.
      query_ids: (Q,) integer class of every query (the same array for leave-one-out).

    Returns:
      ``order`` (N,) reference indices sorted by class, and per query the start (Q,) and the
      length (Q,) of its class's run in ``order`` (length 0 for a class with no reference).
    """
    classes, counts = np.unique(reference_ids, return_counts=True)
    order = np.argsort(reference_ids, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    position = np.minimum(np.searchsorted(classes, query_ids), len(classes) - 1)
    present = classes[position] == query_ids
    return order, np.where(present, starts[position], 0), np.where(present, counts[position], 0)


def _positive_ranks(
    distances: np.ndarray,
    rows: np.ndarray,
    members: tuple[np.ndarray, ...],
    exclude_self: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Rank of every same-class reference of each query in a block, among all references.

    The ranking is by (distance, index), like :func:`knn`: the rank of a same-class reference
    p is ``1 + #{j : d_j < d_p} + #{j : d_j == d_p and j < p}`` over the references j (the
    query itself excluded in leave-one-out). Each row is sorted once; ``#{d_j < d_p}`` is a
    binary search in it, and the index tie-break is counted directly only for the (rare)
    distances that occur more than once in the row.

    Args:
      distances: (B, P) distances of the block's queries to all references, the query itself
        (leave-one-out) and the padding at ``+inf``.
      rows: (B,) global indices of the block's queries.
      members: the output of :func:`_class_members`.
      exclude_self: the queries are the references, and query i is not its own positive.

    Returns:
      (B, S) int64 ranks, ascending per row, and the (B, S) mask of valid entries (a query
      has as many entries as same-class references, itself excluded; the rest is padding with
      rank ``P + 1``).
    """
    order, starts, counts = members
    width = int(counts[rows].max(initial=0))
    slots = np.arange(width)[None, :]
    valid = slots < counts[rows][:, None]
    positives = order[np.where(valid, starts[rows][:, None] + slots, 0)] if width else slots
    if exclude_self:
        valid &= positives != rows[:, None]
    positive_distances = np.take_along_axis(distances, positives, axis=1)
    ranked = np.sort(distances, axis=1)
    before = np.empty(positives.shape, np.int64)
    for r in range(len(rows)):
        before[r] = np.searchsorted(ranked[r], positive_distances[r], side="left")
    # The row holds d_p itself at position ``before``; a tie exists if the next value equals it.
    following = np.take_along_axis(ranked, np.minimum(before + 1, ranked.shape[1] - 1), axis=1)
    for r, s in zip(*np.nonzero(valid & (following == positive_distances)), strict=True):
        row = distances[r]
        tied = np.flatnonzero(row == positive_distances[r, s])
        before[r, s] += np.count_nonzero(tied < positives[r, s])
    ranks = np.where(valid, before + 1, distances.shape[1] + 1)
    order_in_row = np.argsort(ranks, axis=1, kind="stable")
    return np.take_along_axis(ranks, order_in_row, 1), np.take_along_axis(valid, order_in_row, 1)


def precision_sums_from_ranks(ranks: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """``sum_k P@k * rel_k`` of each query from the sorted ranks of its relevant samples.

    The i-th relevant sample (1-based) at rank r_i contributes P@r_i = i / r_i.

    Args:
      ranks: (B, S) ascending ranks of the relevant samples.
      valid: (B, S) mask of the real entries (a prefix of each row).

    Returns:
      (B,) float64 sums.
    """
    position = np.arange(1, ranks.shape[1] + 1, dtype=np.float64)[None, :]
    return np.sum(np.where(valid, position / ranks, 0.0), axis=1)


def full_ranking_blocks(
    embeddings: jax.Array | np.ndarray,
    class_ids: np.ndarray,
    k: int,
    *,
    references: jax.Array | np.ndarray | None = None,
    reference_ids: np.ndarray | None = None,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> Iterator[RankedBlock]:
    """kNN plus the average-precision sums over the complete ranking of the references.

    Without ``references`` (leave-one-out) every sample is a query against the N - 1 others;
    with them (query against gallery, e.g. In-Shop) every query is ranked against all N
    references. Per block of ``block_size`` queries, the distances to all N references are
    computed once (a (block_size, N) matrix, so memory is O(block_size * N), never Q x N);
    from them, on the default JAX device, the k nearest references, and on the host the rank
    of every same-class reference (:func:`_positive_ranks`: one sort per row and a binary
    search per same-class reference, i.e. O(N log N) per query, whatever the class sizes),
    which gives the sum of P@k * rel_k over the whole ranking (the numerator of the mAP over
    all neighbours, "mAP" in Roth et al., "Revisiting Training Strategies and Generalization
    Performance in Deep Metric Learning", ICML 2020). The next block is dispatched before the
    host works on the current one.

    Both use the same (distance, index) order as :func:`knn` (self excluded by index), and the
    k nearest come from the same distances as the ranks, so the two are exactly consistent
    (the k neighbours may differ from :func:`knn`'s by float32 rounding in near-ties only).

    Args:
      embeddings: (Q, D) float32 query embeddings (the references too without
        ``references``), Q >= 1 (Q >= 2 for leave-one-out).
      class_ids: (Q,) integer class of every query.
      k: number of nearest neighbours to return, 0 <= k <= N - 1 (N without ``references``).
      references: (N, D) gallery embeddings, or None for leave-one-out.
      reference_ids: (N,) integer class of every reference (with ``references``).
      distance: "euclidean" or "cosine".
      block_size: queries per block.

    Returns:
      An iterator of :class:`RankedBlock`, covering the queries in order (the arguments are
      checked at once).
    """
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {DISTANCES}")
    x = jnp.asarray(embeddings, jnp.float32)
    class_ids = np.asarray(class_ids).reshape(-1)
    if x.ndim != 2 or x.shape[0] != class_ids.shape[0]:
        raise ValueError(f"expected (N, D) embeddings and (N,) classes, got {x.shape}")
    exclude_self = references is None
    if exclude_self:
        refs, reference_ids = x, class_ids
    else:
        if reference_ids is None:
            raise ValueError("references need their reference_ids")
        refs = jnp.asarray(references, jnp.float32)
        reference_ids = np.asarray(reference_ids).reshape(-1)
        if refs.ndim != 2 or refs.shape[1] != x.shape[1] or len(reference_ids) != len(refs):
            raise ValueError(
                f"expected (N, {x.shape[1]}) references and (N,) reference_ids, got "
                f"{refs.shape} and {reference_ids.shape}"
            )
    n = refs.shape[0]
    available = n - int(exclude_self)
    if not 0 <= k <= available or available < 1:
        raise ValueError(f"k={k} must be in [0, {available}] for {n} references")
    if block_size < 1:
        raise ValueError("block_size must be positive")
    if distance == "cosine":
        x, refs = l2_normalize(x), l2_normalize(refs)
    width = GROUP_SIZE * math.ceil(n / GROUP_SIZE)
    augmented = _augmented_references(refs, num_chunks=1, chunk=width, distance=distance)[0]
    members = _class_members(reference_ids, class_ids)

    num_queries = x.shape[0]
    block = min(block_size, num_queries)
    num_blocks = math.ceil(num_queries / block)
    padded = jnp.pad(x, ((0, num_blocks * block - num_queries), (0, 0)))

    on_host = _select_on_host(k, width)  # the k nearest from the host's copy of the distances

    def dispatch(b: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        return _full_ranking_block(
            padded[b * block : (b + 1) * block],
            jnp.int32(b * block),
            augmented,
            k=0 if on_host else k,
            distance=distance,
            exclude_self=exclude_self,
        )

    def blocks() -> Iterator[RankedBlock]:
        for b, current in _dispatched_ahead(dispatch, num_blocks):
            rows = np.arange(b * block, min((b + 1) * block, num_queries))
            full, top_d, top_i = (np.asarray(a)[: len(rows)] for a in current)
            if on_host:
                top_d, top_i = _nearest_on_host(full, k)
            # -0.0 + 0.0 = +0.0: one zero, so that equal distances compare equal everywhere.
            ranks = _positive_ranks(full + 0.0, rows, members, exclude_self)
            del current, full
            yield RankedBlock(b * block, top_d, top_i, precision_sums_from_ranks(*ranks))

    return blocks()


def knn_full_ranking(
    embeddings: jax.Array | np.ndarray,
    class_ids: np.ndarray,
    k: int,
    *,
    references: jax.Array | np.ndarray | None = None,
    reference_ids: np.ndarray | None = None,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> FullRanking:
    """:func:`full_ranking_blocks` for all queries at once.

    Args:
      embeddings, class_ids, k, references, reference_ids, distance, block_size: as in
        :func:`full_ranking_blocks`.

    Returns:
      A :class:`FullRanking` with (Q, k) distances and indices and (Q,) precision sums.
    """
    blocks = list(
        full_ranking_blocks(
            embeddings,
            class_ids,
            k,
            references=references,
            reference_ids=reference_ids,
            distance=distance,
            block_size=block_size,
        )
    )
    return FullRanking(
        np.concatenate([b.distances for b in blocks]),
        np.concatenate([b.indices for b in blocks]),
        np.concatenate([b.precision_sums for b in blocks]),
    )
