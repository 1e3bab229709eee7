"""The full ranking (leave-one-out or query against gallery): the k nearest, and the exact
rank of every same-class reference among all references, for the mAP over all neighbours.

Per query block the distances to all references are computed at once by XLA (O(block_size * N)
memory, the N x N matrix is never formed); the k nearest come from them (on the device, or on
the host where :func:`jdml.evaluation.knn.search.select_on_host` says so), and on the host each
row is sorted once and the rank of every same-class sample found by binary search.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.knn import blocks
from jdml.evaluation.knn.blocks import DEFAULT_BLOCK_SIZE, DISTANCES, dispatched_ahead
from jdml.evaluation.knn.host import nearest_on_host
from jdml.evaluation.knn.search import select_on_host
from jdml.evaluation.knn.xla import augmented_references, scores_to_distances, top_k
from jdml.geometry import l2_normalize


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
      references: (P, D + 1) augmented references (``augmented_references`` with one chunk;
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
    distances = scores_to_distances(queries, scores, distance)
    if exclude_self:
        own = jnp.arange(references.shape[0], dtype=jnp.int32)[None, :] == query_ids[:, None]
        distances = jnp.where(own, jnp.inf, distances)
    # Padding references score -inf, so their distance is +inf already (Euclidean: sqrt of
    # +inf; cosine: 1 - (-inf)).
    if k == 0:
        empty = jnp.zeros((block, 0), jnp.float32)
        return distances, empty, empty.astype(jnp.int32)
    # top_k keeps the lower index among equal values, so this is the (distance, index) order.
    negated, indices = top_k(-distances, k)
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

    The ranking is by (distance, index), like :func:`~jdml.evaluation.knn.knn`: the rank of a
    same-class reference p is ``1 + #{j : d_j < d_p} + #{j : d_j == d_p and j < p}`` over the
    references j (the query itself excluded in leave-one-out). Each row is sorted once;
    ``#{d_j < d_p}`` is a binary search in it, and the index tie-break is counted directly only
    for the (rare) distances that occur more than once in the row.

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
    selection: str = "auto",
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

    Both use the same (distance, index) order as :func:`~jdml.evaluation.knn.knn` (self
    excluded by index), and the k nearest come from the same distances as the ranks, so the
    two are exactly consistent (the k neighbours may differ from
    :func:`~jdml.evaluation.knn.knn`'s by float32 rounding in near-ties only).

    Args:
      embeddings: (Q, D) float32 query embeddings (the references too without
        ``references``), Q >= 1 (Q >= 2 for leave-one-out).
      class_ids: (Q,) integer class of every query.
      k: number of nearest neighbours to return, 0 <= k <= N - 1 (N without ``references``).
      references: (N, D) gallery embeddings, or None for leave-one-out.
      reference_ids: (N,) integer class of every reference (with ``references``).
      distance: "euclidean" or "cosine".
      block_size: queries per block.
      selection: the kNN selection (:func:`jdml.evaluation.knn.search.select_on_host` decides
        whether the k nearest come from the host's copy of the distances).

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
    width = blocks.GROUP_SIZE * math.ceil(n / blocks.GROUP_SIZE)
    augmented = augmented_references(refs, num_chunks=1, chunk=width, distance=distance)[0]
    members = _class_members(reference_ids, class_ids)

    num_queries = x.shape[0]
    block = min(block_size, num_queries)
    num_blocks = math.ceil(num_queries / block)
    padded = jnp.pad(x, ((0, num_blocks * block - num_queries), (0, 0)))

    on_host = select_on_host(
        k, width, selection
    )  # the k nearest from the host's copy of the distances

    def dispatch(b: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        return _full_ranking_block(
            padded[b * block : (b + 1) * block],
            jnp.int32(b * block),
            augmented,
            k=0 if on_host else k,
            distance=distance,
            exclude_self=exclude_self,
        )

    def ranked() -> Iterator[RankedBlock]:
        for b, current in dispatched_ahead(dispatch, num_blocks):
            rows = np.arange(b * block, min((b + 1) * block, num_queries))
            full, top_d, top_i = (np.asarray(a)[: len(rows)] for a in current)
            if on_host:
                top_d, top_i = nearest_on_host(full, k)
            # -0.0 + 0.0 = +0.0: one zero, so that equal distances compare equal everywhere.
            ranks = _positive_ranks(full + 0.0, rows, members, exclude_self)
            del current, full
            yield RankedBlock(b * block, top_d, top_i, precision_sums_from_ranks(*ranks))

    return ranked()


def knn_full_ranking(
    embeddings: jax.Array | np.ndarray,
    class_ids: np.ndarray,
    k: int,
    *,
    references: jax.Array | np.ndarray | None = None,
    reference_ids: np.ndarray | None = None,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
    selection: str = "auto",
) -> FullRanking:
    """:func:`full_ranking_blocks` for all queries at once.

    Args:
      embeddings, class_ids, k, references, reference_ids, distance, block_size, selection:
        as in :func:`full_ranking_blocks`.

    Returns:
      A :class:`FullRanking` with (Q, k) distances and indices and (Q,) precision sums.
    """
    parts = list(
        full_ranking_blocks(
            embeddings,
            class_ids,
            k,
            references=references,
            reference_ids=reference_ids,
            distance=distance,
            block_size=block_size,
            selection=selection,
        )
    )
    return FullRanking(
        np.concatenate([b.distances for b in parts]),
        np.concatenate([b.indices for b in parts]),
        np.concatenate([b.precision_sums for b in parts]),
    )
