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

The returned distances come from the selected scores: ``sqrt(max(|q|^2 - score, 0))`` (the Gram
expansion, clamped at 0 against rounding; near 0 it carries float32 rounding of the order of
``sqrt(1e-7 |q|^2)``) or ``1 - score``. The k neighbours are sorted by (distance, index): ties
are broken towards the lower reference index, deterministically.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

DISTANCES = ("euclidean", "cosine")
DEFAULT_BLOCK_SIZE = 512
DEFAULT_CHUNK_SIZE = 16384  # with 512-query blocks: 32 MB of float32 scores per block
# Width of the groups of the two-stage top-k (see ``_top_k``); chunks are multiples of it.
GROUP_SIZE = 16
_INDEX_SENTINEL = np.iinfo(np.int32).max


def _normalize(x: jax.Array) -> jax.Array:
    """L2-normalises rows (zero rows stay zero).

    Args:
      x: (N, D) float32 vectors.

    Returns:
      (N, D) unit-norm rows.
    """
    norm = jnp.linalg.norm(x, axis=-1, keepdims=True)
    return x / jnp.maximum(norm, 1e-12)


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


def _augmented_references(
    references: jax.Array, num_chunks: int, chunk: int, distance: str
) -> jax.Array:
    """References laid out as chunks, with the score-bias column appended.

    Args:
      references: (N, D) references (unit-norm rows for the cosine distance).
      num_chunks: M, number of chunks.
      chunk: C, rows per chunk (M * C >= N; the extra rows are padding).
      distance: "euclidean" (rows ``[2 r, -|r|^2]``) or "cosine" (rows ``[r, 0]``).

    Returns:
      (M, C, D + 1) chunks; padding rows are ``[0, ..., 0, -inf]`` so they score ``-inf``.
    """
    num_references = references.shape[0]
    if distance == "euclidean":
        bias = -jnp.sum(references * references, axis=-1, keepdims=True)
        rows = jnp.concatenate([2.0 * references, bias], axis=1)
    else:
        rows = jnp.concatenate([references, jnp.zeros((num_references, 1), jnp.float32)], 1)
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
    position = jnp.arange(k, dtype=jnp.int32)[None, :]
    source = position + (position >= cut[:, None]).astype(jnp.int32)
    return (
        jnp.take_along_axis(values, source, axis=1),
        jnp.take_along_axis(indices, source, axis=1),
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
    num_chunks, chunk, _ = ref_chunks.shape
    block = queries.shape[0]
    query_ids = query_offset + jnp.arange(block, dtype=jnp.int32)
    augmented = jnp.concatenate([queries, jnp.ones((block, 1), jnp.float32)], axis=1)
    wanted = k + int(exclude_self)
    chunk_k = min(wanted, chunk)

    def chunk_top_k(rows: jax.Array, offset: jax.Array) -> tuple[jax.Array, jax.Array]:
        scores = jnp.matmul(augmented, rows.T, precision=jax.lax.Precision.HIGHEST)
        values, local = _top_k(scores, chunk_k)
        return values, local + offset

    if num_chunks == 1:
        values, indices = chunk_top_k(ref_chunks[0], jnp.int32(0))
    else:

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

    if exclude_self:
        values, indices = _drop_own_index(values, indices, query_ids, k)
    distances = _scores_to_distances(queries, values, distance)
    # Rounding can map different scores to one distance: restore the (distance, index) order.
    distances, indices = jax.lax.sort((distances, indices), dimension=1, num_keys=2)
    return distances, indices


def knn(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    k: int,
    *,
    exclude_self: bool,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[jax.Array, jax.Array]:
    """Exact k nearest references of every query, blocked so no Q x N matrix is materialised.

    Brute-force search: every query is compared to every reference, ``block_size`` queries at a
    time and, within a block, ``chunk_size`` references at a time with a running top-k
    (memory O(block_size * chunk_size)).

    Args:
      queries: (Q, D) float32 query embeddings.
      references: (N, D) float32 reference embeddings.
      k: number of neighbours, 1 <= k <= N (N - 1 with ``exclude_self``).
      exclude_self: the queries are the references (query i is reference i) and reference i is
        excluded from the neighbours of query i. The exclusion is by index, so exact duplicates
        of a query (also at distance 0) are still returned as neighbours.
      distance: "euclidean" (L2 distance) or "cosine" (1 - cosine similarity).
      block_size: queries per block (the last block is zero-padded to this size).
      chunk_size: largest number of references scored at once within a block.

    Returns:
      distances (Q, k) float32, ascending per row, and indices (Q, k) int32 into ``references``;
      equal distances are ordered by lower reference index.
    """
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {DISTANCES}")
    queries = jnp.asarray(queries, jnp.float32)
    references = jnp.asarray(references, jnp.float32)
    if queries.ndim != 2 or references.ndim != 2 or queries.shape[1] != references.shape[1]:
        raise ValueError(
            f"expected (Q, D) queries and (N, D) references, got {queries.shape} and "
            f"{references.shape}"
        )
    num_queries, num_references = queries.shape[0], references.shape[0]
    if exclude_self and num_queries != num_references:
        raise ValueError("exclude_self needs the queries to be the references (same length)")
    available = num_references - int(exclude_self)
    if not 1 <= k <= available:
        raise ValueError(f"k={k} must be in [1, {available}] for {num_references} references")
    if block_size < 1 or chunk_size < 1:
        raise ValueError("block_size and chunk_size must be positive")

    if distance == "cosine":
        queries, references = _normalize(queries), _normalize(references)
    num_chunks, chunk = _chunk_layout(num_references, chunk_size)
    ref_chunks = _augmented_references(references, num_chunks, chunk, distance)

    block = min(block_size, num_queries)
    num_blocks = math.ceil(num_queries / block)
    padded_queries = jnp.pad(queries, ((0, num_blocks * block - num_queries), (0, 0)))
    distances, indices = [], []
    for b in range(num_blocks):
        d, i = _knn_block(
            padded_queries[b * block : (b + 1) * block],
            jnp.int32(b * block),
            ref_chunks,
            k=k,
            exclude_self=exclude_self,
            distance=distance,
        )
        distances.append(d)
        indices.append(i)
    return (
        jnp.concatenate(distances)[:num_queries],
        jnp.concatenate(indices)[:num_queries],
    )
