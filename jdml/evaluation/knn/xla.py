"""The exact top-k of the kNN search in XLA: the pure-XLA path, the same on every backend.

Ranking score (higher = nearer). Euclidean: the Gram expansion
``|q - r|^2 = |q|^2 + |r|^2 - 2 q.r`` without the per-query constant ``|q|^2`` (which does not
change a query's ranking), i.e. ``2 q.r - |r|^2``. Cosine: ``q.r / (|q| |r|)``. Both are one
matrix product of the queries augmented with a column of ones against the references augmented
with a column holding ``-|r|^2`` (Euclidean) or 0 (cosine); padding references get ``-inf`` in
that column, so no elementwise pass over the block x chunk score matrix is needed.

Self-exclusion is by index: the k + 1 best references are selected and the query's own index
is removed from them wherever it is (or the last one if it is not there), so exact duplicates
of a query, also at distance 0, are kept and ranked by index.

The returned distances come from the selected scores: ``sqrt(max(|q|^2 - score, 0))`` (the Gram
expansion, clamped at 0 against rounding; near 0 it carries float32 rounding of the order of
``sqrt(1e-7 |q|^2)``) or ``1 - score``. The k neighbours are sorted by (distance, index): ties
are broken towards the lower reference index, deterministically.

The host selection (:mod:`jdml.evaluation.knn.host`), the full ranking and the sharded search
(:mod:`jdml.evaluation.sharded`) build on these functions.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from jdml.evaluation.knn import blocks
from jdml.evaluation.knn.blocks import NeighbourBlock, dispatched_ahead, query_block

# The ranking score is ``SCORE_SCALE * q.r + score_bias(r)`` (see the module docstring).
SCORE_SCALE = {"euclidean": 2.0, "cosine": 1.0}


def score_bias(references: jax.Array, distance: str) -> jax.Array:
    """(N,) the ranking score's per-reference term: ``-|r|^2`` (Euclidean) or 0 (cosine)."""
    if distance == "euclidean":
        return -jnp.sum(references * references, axis=-1)
    return jnp.zeros(references.shape[:1], jnp.float32)


@functools.partial(jax.jit, static_argnames=("num_chunks", "chunk", "distance"))
def augmented_references(
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
    bias = score_bias(references, distance)[:, None]
    scaled = SCORE_SCALE[distance] * references
    if num_valid is not None:
        row = jnp.arange(num_references, dtype=jnp.int32)[:, None]
        bias = jnp.where(row < num_valid, bias, -jnp.inf)
    rows = jnp.concatenate([scaled, bias], axis=1)
    padding = jnp.zeros((num_chunks * chunk - num_references, rows.shape[1]), jnp.float32)
    padding = padding.at[:, -1].set(-jnp.inf)
    return jnp.concatenate([rows, padding]).reshape(num_chunks, chunk, -1)


def top_k(scores: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
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
    g = blocks.GROUP_SIZE
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


def drop_own_index(
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


def scores_to_distances(queries: jax.Array, scores: jax.Array, distance: str) -> jax.Array:
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


def chunks_top_k(
    augmented: jax.Array, ref_chunks: jax.Array, wanted: int
) -> tuple[jax.Array, jax.Array]:
    """Exact top-``wanted`` references of a query block, with a running top-k over chunks.

    Args:
      augmented: (B, D + 1) queries with a column of ones appended.
      ref_chunks: (M, C, D + 1) augmented reference chunks from ``augmented_references``.
      wanted: number of candidates to keep.

    Returns:
      scores (B, w) descending and int32 indices (B, w) into the M * C references, equal
      scores ordered by lower index; w = min(wanted, C) with one chunk, else ``wanted`` (the
      running top-k starts as ``-inf`` at index ``INDEX_SENTINEL``).
    """
    num_chunks, chunk, _ = ref_chunks.shape
    block = augmented.shape[0]
    chunk_k = min(wanted, chunk)

    def chunk_top_k(rows: jax.Array, offset: jax.Array) -> tuple[jax.Array, jax.Array]:
        scores = jnp.matmul(augmented, rows.T, precision=jax.lax.Precision.HIGHEST)
        values, local = top_k(scores, chunk_k)
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
        jnp.full((block, wanted), blocks.INDEX_SENTINEL, jnp.int32),
    )
    offsets = chunk * jnp.arange(num_chunks, dtype=jnp.int32)
    (values, indices), _ = jax.lax.scan(merge, init, (ref_chunks, offsets))
    return values, indices


def with_ones(queries: jax.Array) -> jax.Array:
    """(B, D) queries with a column of ones appended (the bias column's multiplier)."""
    return jnp.concatenate([queries, jnp.ones((queries.shape[0], 1), jnp.float32)], axis=1)


def neighbours_from_scores(
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
    ``by_distance_then_index``; the native kernel ``jdml_knn_search`` does the same)."""
    if exclude_self:
        values, indices = drop_own_index(values, indices, query_ids, k)
    distances = scores_to_distances(queries, values, distance)
    return by_distance_then_index(distances, indices)


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
      ref_chunks: (M, C, D + 1) augmented reference chunks from ``augmented_references``.
      k: number of neighbours.
      exclude_self: exclude reference i from the neighbours of query i.
      distance: "euclidean" or "cosine".

    Returns:
      distances (B, k) float32 ascending, and indices (B, k) int32 into the reference set;
      equal distances are ordered by lower index.
    """
    block = queries.shape[0]
    query_ids = query_offset + jnp.arange(block, dtype=jnp.int32)
    values, indices = chunks_top_k(with_ones(queries), ref_chunks, k + int(exclude_self))
    return neighbours_from_scores(
        queries, values, indices, query_ids, k=k, exclude_self=exclude_self, distance=distance
    )


def by_distance_then_index(distances: jax.Array, indices: jax.Array) -> tuple[jax.Array, jax.Array]:
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


@functools.partial(jax.jit, static_argnames=("distance",))
def score_block(
    queries: jax.Array, references: jax.Array, *, distance: str
) -> tuple[jax.Array, jax.Array]:
    """Ranking scores of a query block against all (augmented) references, and ``|q|^2``."""
    augmented = jnp.concatenate([queries, jnp.ones((queries.shape[0], 1), jnp.float32)], 1)
    scores = jnp.matmul(augmented, references.T, precision=jax.lax.Precision.HIGHEST)
    return scores, jnp.sum(queries * queries, axis=-1)


def xla_blocks(
    queries: jax.Array,
    references: jax.Array,
    k: int,
    exclude_self: bool,
    distance: str,
    block_size: int,
    chunk_size: int,
) -> Iterator[NeighbourBlock]:
    """:func:`jdml.evaluation.knn.knn_blocks` with XLA's top-k: the references in chunks of at
    most ``chunk_size`` rows with a running top-k, the queries in zero-padded blocks (device
    arrays; unit-norm rows for the cosine distance). The references are laid out at once, the
    blocks dispatched as the iterator is read."""
    num_queries, num_references = queries.shape[0], references.shape[0]
    num_chunks, chunk = blocks.chunk_layout(num_references, chunk_size)
    ref_chunks = augmented_references(
        references, num_chunks=num_chunks, chunk=chunk, distance=distance
    )
    block = query_block(num_queries, chunk, block_size)
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

    def found() -> Iterator[NeighbourBlock]:
        for b, (d, i) in dispatched_ahead(dispatch, num_blocks):
            count = min(block, num_queries - b * block)
            yield NeighbourBlock(b * block, d[:count], i[:count])

    return found()
