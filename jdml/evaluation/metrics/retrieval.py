"""Retrieval metrics from the classes of each query's nearest neighbours (recall@k,
precision@1, R-precision, MAP@R, MAP@C, MAP@k) and from the average-precision sums over the
complete ranking (mAP over all neighbours). Each has a per-query form (``*_values``, NaN for a
query it leaves out) whose mean (:func:`~jdml.evaluation.metrics.base.query_mean`) is the
metric, so the evaluator can compute it block by block of queries."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jdml.evaluation.metrics.base import Requirements, query_mean, required

_ROW_BLOCK = 8192


def _neighbour_labels(requirements: Requirements) -> np.ndarray:
    """The (N, K) neighbour classes, with an error if they were not computed."""
    return required(requirements.neighbour_labels, "neighbour labels")


def recall_at_k(requirements: Requirements, k: int) -> float:
    """Recall@k: fraction of queries with at least one same-class sample among the k nearest.

    Definition used in deep metric learning since Song et al., "Deep metric learning via lifted
    structured feature embedding" (CVPR 2016), i.e. hit rate at k with the query excluded.
    Queries whose class has a single sample count as misses.

    Args:
      requirements: shared requirements; ``neighbour_labels`` is (N, K). If K < k (only when
        k >= N) all K = N - 1 other samples are used.
      k: number of neighbours.

    Returns:
      Recall@k in [0, 1].
    """
    return query_mean(recall_values(requirements, k))


def recall_values(requirements: Requirements, k: int) -> np.ndarray:
    """Per query of :func:`recall_at_k`: 1.0 for a hit among the k nearest, else 0.0."""
    neighbours = _neighbour_labels(requirements)[:, :k]
    return np.any(neighbours == requirements.labels[:, None], axis=1).astype(np.float64)


def _average_precision(relevant: np.ndarray) -> np.ndarray:
    """Per-query ``sum_i P@i * rel_i`` over the ranked neighbours.

    Args:
      relevant: (B, K) whether rank i (1-based column i - 1) is relevant (and counted).

    Returns:
      (B,) float64 sums of the precision at the relevant ranks.
    """
    ranks = np.arange(1, relevant.shape[1] + 1)
    precision = np.cumsum(relevant, axis=1) / ranks[None, :]
    return np.sum(precision * relevant, axis=1)


def _blocked_relevance(
    requirements: Requirements,
    depth: np.ndarray,
    reduce: Callable[[np.ndarray], np.ndarray],
) -> np.ndarray:
    """Applies ``reduce`` to the relevance of each query's first ``depth`` neighbours.

    The rows are processed in blocks of ``_ROW_BLOCK`` queries, each only as wide as the
    largest depth in it, so memory stays O(_ROW_BLOCK * K).

    Args:
      requirements: shared requirements with (N, K) neighbour classes.
      depth: (N,) ranks considered per query (clipped to K).
      reduce: maps a (B, W) boolean relevance (False beyond a row's depth) to (B,) values.

    Returns:
      (N,) float64 values.
    """
    neighbours = _neighbour_labels(requirements)
    depth = np.minimum(depth, neighbours.shape[1])
    out = np.empty(len(depth), np.float64)
    for start in range(0, len(depth), _ROW_BLOCK):
        rows = slice(start, start + _ROW_BLOCK)
        width = max(int(depth[rows].max(initial=0)), 1)
        ranks = np.arange(1, width + 1)
        relevant = (neighbours[rows, :width] == requirements.labels[rows, None]) & (
            ranks[None, :] <= depth[rows, None]
        )
        out[rows] = reduce(relevant)
    return out


def _with_positives(requirements: Requirements, values: np.ndarray) -> np.ndarray:
    """Per-query values, NaN for the queries whose class has no other sample.

    Musgrave et al. exclude such "lone" queries: they have no relevant item.
    """
    return np.where(requirements.class_sizes >= 2, values, np.nan)


def precision_at_1(requirements: Requirements) -> float:
    """Precision@1 of Musgrave, Belongie & Lim, "A Metric Learning Reality Check" (ECCV 2020).

    The fraction of queries whose nearest other sample has their class, over the queries with
    at least one other sample of their class (lone queries are excluded, NaN if none is left).
    Equal to recall@1 when no class has a single sample.

    Args:
      requirements: shared requirements with at least one neighbour per query.

    Returns:
      Precision@1 in [0, 1].
    """
    return query_mean(precision_at_1_values(requirements))


def precision_at_1_values(requirements: Requirements) -> np.ndarray:
    """Per query of :func:`precision_at_1` (NaN for a lone query)."""
    first = _neighbour_labels(requirements)[:, 0] == requirements.labels
    return _with_positives(requirements, first.astype(np.float64))


def r_precision(requirements: Requirements) -> float:
    """R-precision of Musgrave, Belongie & Lim, "A Metric Learning Reality Check" (ECCV 2020).

    For a query with R other samples of its class, the fraction of its R nearest neighbours
    that have its class; the mean over the queries with R >= 1 (NaN if there is none).

    Args:
      requirements: shared requirements; needs max(R) neighbours per query.

    Returns:
      R-precision in [0, 1].
    """
    return query_mean(r_precision_values(requirements))


def r_precision_values(requirements: Requirements) -> np.ndarray:
    """Per query of :func:`r_precision` (NaN for a lone query)."""
    others = requirements.class_sizes - 1
    hits = _blocked_relevance(requirements, others, lambda relevant: np.sum(relevant, axis=1))
    return _with_positives(requirements, hits / np.maximum(others, 1))


def map_at_r(requirements: Requirements) -> float:
    """MAP@R (Musgrave, Belongie & Lim, "A Metric Learning Reality Check", ECCV 2020).

    For a query with R other samples of its class, AP@R = (1/R) sum_{i=1..R} P@i * rel_i over its
    R nearest neighbours, where P@i is the precision at rank i and rel_i whether rank i has the
    query's class. MAP@R is the mean of AP@R over the queries with R >= 1: queries whose class
    has a single sample in the evaluated set have no relevant item and are excluded (NaN if no
    query is left).

    Args:
      requirements: shared requirements; needs at least max(R) neighbours per query.

    Returns:
      MAP@R in [0, 1].
    """
    return query_mean(map_at_r_values(requirements))


def map_at_r_values(requirements: Requirements) -> np.ndarray:
    """Per query of :func:`map_at_r`: AP@R (NaN for a lone query)."""
    others = requirements.class_sizes - 1
    sums = _blocked_relevance(requirements, others, _average_precision)
    return _with_positives(requirements, sums / np.maximum(others, 1))


def _relevant_normaliser(requirements: Requirements) -> np.ndarray:
    """The (N,) class-size normaliser (and ``map@c`` depth) of Roth et al.'s mAP variants.

    Leave-one-out: n_c, the query's class size with the query counted. Against a gallery:
    R, the number of gallery items of the query's class (a query with none scores 0).
    """
    sizes = requirements.class_sizes
    return sizes if requirements.leave_one_out else sizes - 1


def map_at_c(requirements: Requirements) -> float:
    """mAP@C, the class-size-cutoff mAP ("mAP_c") of Roth et al., "Revisiting Training
    Strategies and Generalization Performance in Deep Metric Learning" (ICML 2020).

    For a query of class c with n_c samples in the evaluated set, the query included, the first
    n_c neighbours (the query excluded) are ranked and AP = (1/n_c) sum_{i=1..n_c} P@i * rel_i;
    the result is the mean over all queries (each sample weighs the same). Unlike MAP@R, the
    normaliser counts the query itself while at most n_c - 1 neighbours can be relevant, so a
    perfect embedding scores (n_c - 1) / n_c per query, not 1, and a single-sample class scores
    0. If n_c exceeds the N - 1 available neighbours (a single class) the ranks are clipped.
    Against a gallery, n_c is R, the number of the class's gallery items (the first R
    neighbours, AP normalised by R: a perfect embedding scores 1).

    Args:
      requirements: shared requirements; needs max(n_c) neighbours (or N - 1).

    Returns:
      mAP@C in [0, 1).
    """
    return query_mean(map_at_c_values(requirements))


def map_at_c_values(requirements: Requirements) -> np.ndarray:
    """Per query of :func:`map_at_c`."""
    sizes = _relevant_normaliser(requirements)
    sums = _blocked_relevance(requirements, sizes, _average_precision)
    return sums / np.maximum(sizes, 1)


def map_at_k(requirements: Requirements, k: int) -> float:
    """mAP@k with the class-size normaliser, e.g. "mAP_1000" of Roth et al., "Revisiting
    Training Strategies and Generalization Performance in Deep Metric Learning" (ICML 2020).

    For a query of class c with n_c samples (the query included), AP = (1/n_c) sum_{i=1..k'}
    P@i * rel_i over its k' = min(k, N - 1) nearest other samples; the mean over all queries
    (a single-sample class scores 0). With k >= N - 1 this is :func:`mean_average_precision`.
    Against a gallery, n_c is R, the number of the class's gallery items.

    Args:
      requirements: shared requirements; needs min(k, N - 1) neighbours per query.
      k: ranking cutoff.

    Returns:
      mAP@k in [0, 1).
    """
    return query_mean(map_at_k_values(requirements, k))


def map_at_k_values(requirements: Requirements, k: int) -> np.ndarray:
    """Per query of :func:`map_at_k`."""
    depth = np.full(len(requirements.labels), k)
    sums = _blocked_relevance(requirements, depth, _average_precision)
    return sums / np.maximum(_relevant_normaliser(requirements), 1)


def mean_average_precision(requirements: Requirements) -> float:
    """mAP over the complete ranking ("mAP" of Roth et al., "Revisiting Training Strategies
    and Generalization Performance in Deep Metric Learning", ICML 2020, its papers' "mAP").

    For a query of class c with n_c samples (the query included), AP = (1/n_c)
    sum_{i=1..N-1} P@i * rel_i over all N - 1 other samples ranked by distance; the mean over
    all queries (a single-sample class scores 0, and the maximum is (n_c - 1) / n_c). Against
    a gallery, every gallery item is ranked and n_c is R, the number of the class's items.

    Args:
      requirements: shared requirements with the (N,) ``precision_sums``.

    Returns:
      mAP in [0, 1).
    """
    return query_mean(mean_average_precision_values(requirements))


def mean_average_precision_values(requirements: Requirements) -> np.ndarray:
    """Per query of :func:`mean_average_precision`."""
    sums = required(requirements.precision_sums, "the full-ranking precision sums")
    return sums / np.maximum(_relevant_normaliser(requirements), 1)
