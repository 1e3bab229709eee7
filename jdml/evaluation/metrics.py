"""Retrieval and clustering metrics, computed from shared precomputed requirements.

Every test sample is a query against all other test samples (leave-one-out retrieval). The
expensive parts are computed once per evaluation and shared by all metrics
(:class:`Requirements`): the labels of each query's nearest neighbours (one kNN pass with the
largest neighbour count any requested metric needs), each sample's class size, and the k-means
cluster assignments (only when a clustering metric is requested).

Metric names: ``recall@<k>`` for any k >= 1, ``map@r``, ``map@c`` and ``nmi``. The fixed names
live in :data:`METRICS`; :func:`get_metric` also builds ``recall@<k>`` for any k.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import numpy as np
from sklearn.metrics import normalized_mutual_info_score

from jdml.registry import Registry, UnknownNameError

RECALL_PATTERN = re.compile(r"recall@([1-9][0-9]*)")
_ROW_BLOCK = 8192


@dataclasses.dataclass(frozen=True)
class Requirements:
    """Quantities shared by the metrics of one evaluation.

    Attributes:
      labels: (N,) integer class label of every sample.
      class_sizes: (N,) size of each sample's class in the evaluated set, the sample included.
      neighbour_labels: (N, K) labels of each query's K nearest other samples, nearest first
        (the query itself excluded), or None if no metric needs neighbours.
      cluster_assignments: (N,) k-means cluster of every sample, or None if not needed.
    """

    labels: np.ndarray
    class_sizes: np.ndarray
    neighbour_labels: np.ndarray | None = None
    cluster_assignments: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric: how to compute it and what it needs.

    Attributes:
      name: the metric's name (the key of its value in results).
      compute: maps the shared :class:`Requirements` to the metric value (a fraction in [0, 1]).
      num_neighbours: maps the (N,) class sizes to the number of nearest neighbours needed
        (0 if none); the evaluator clips it to N - 1.
      needs_clusters: whether k-means assignments are needed.
    """

    name: str
    compute: Callable[[Requirements], float]
    num_neighbours: Callable[[np.ndarray], int]
    needs_clusters: bool = False


METRICS: Registry[Metric] = Registry("metric")


class UnknownMetricError(UnknownNameError, ValueError):
    """An unknown metric name; both a ``KeyError`` (like registry look-ups) and a ``ValueError``."""


def _neighbour_labels(requirements: Requirements) -> np.ndarray:
    """The (N, K) neighbour labels, with an error if they were not computed."""
    if requirements.neighbour_labels is None:
        raise ValueError("this metric needs neighbour labels, which were not computed")
    return requirements.neighbour_labels


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
    neighbours = _neighbour_labels(requirements)[:, :k]
    hits = np.any(neighbours == requirements.labels[:, None], axis=1)
    return float(np.mean(hits))


def _average_precision(
    neighbour_labels: np.ndarray, labels: np.ndarray, depth: np.ndarray, denominator: np.ndarray
) -> np.ndarray:
    """Per-query ``(1 / denominator) * sum_{i <= depth} P@i * rel_i`` over the ranked neighbours.

    Args:
      neighbour_labels: (B, K) labels of the ranked neighbours, nearest first.
      labels: (B,) query labels.
      depth: (B,) number of ranks considered per query (<= K).
      denominator: (B,) positive normaliser per query.

    Returns:
      (B,) float64 average precisions.
    """
    ranks = np.arange(1, neighbour_labels.shape[1] + 1)
    relevant = (neighbour_labels == labels[:, None]) & (ranks[None, :] <= depth[:, None])
    precision = np.cumsum(relevant, axis=1) / ranks[None, :]
    return np.sum(precision * relevant, axis=1) / denominator


def _blocked_average_precision(
    requirements: Requirements, depth: np.ndarray, denominator: np.ndarray
) -> np.ndarray:
    """:func:`_average_precision` for all queries, computed over blocks of rows.

    Args:
      requirements: shared requirements with (N, K) neighbour labels.
      depth: (N,) ranks considered per query (clipped to K).
      denominator: (N,) positive normaliser per query.

    Returns:
      (N,) average precisions.
    """
    neighbours = _neighbour_labels(requirements)
    depth = np.minimum(depth, neighbours.shape[1])
    out = np.empty(len(depth), np.float64)
    for start in range(0, len(depth), _ROW_BLOCK):
        rows = slice(start, start + _ROW_BLOCK)
        width = max(int(depth[rows].max(initial=0)), 1)
        out[rows] = _average_precision(
            neighbours[rows, :width], requirements.labels[rows], depth[rows], denominator[rows]
        )
    return out


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
    others = requirements.class_sizes - 1
    kept = others >= 1
    if not np.any(kept):
        return float("nan")
    ap = _blocked_average_precision(requirements, others, np.maximum(others, 1))
    return float(np.mean(ap[kept]))


def map_at_c(requirements: Requirements) -> float:
    """mAP@C, the class-size-cutoff mAP ("mAP_c") of Roth et al., "Revisiting Training
    Strategies and Generalization Performance in Deep Metric Learning" (ICML 2020).

    For a query of class c with n_c samples in the evaluated set, the query included, the first
    n_c neighbours (the query excluded) are ranked and AP = (1/n_c) sum_{i=1..n_c} P@i * rel_i;
    the result is the mean over all queries (each sample weighs the same). Unlike MAP@R, the
    normaliser counts the query itself while at most n_c - 1 neighbours can be relevant, so a
    perfect embedding scores (n_c - 1) / n_c per query, not 1, and a single-sample class scores
    0. If n_c exceeds the N - 1 available neighbours (a single class) the ranks are clipped.

    Args:
      requirements: shared requirements; needs max(n_c) neighbours (or N - 1).

    Returns:
      mAP@C in [0, 1).
    """
    sizes = requirements.class_sizes
    return float(np.mean(_blocked_average_precision(requirements, sizes, sizes)))


def nmi(requirements: Requirements) -> float:
    """Normalised mutual information between the labels and the k-means clusters.

    Clustering quality as in Song et al. (CVPR 2016): k-means with as many clusters as there
    are classes in the evaluated set, then NMI(labels, clusters) = I / mean(H(labels),
    H(clusters)) (arithmetic normalisation).

    Args:
      requirements: shared requirements with (N,) ``cluster_assignments``.

    Returns:
      NMI in [0, 1].
    """
    if requirements.cluster_assignments is None:
        raise ValueError("nmi needs cluster assignments, which were not computed")
    return float(
        normalized_mutual_info_score(
            requirements.labels, requirements.cluster_assignments, average_method="arithmetic"
        )
    )


def _max_class_size(class_sizes: np.ndarray) -> int:
    """Largest class size (0 for an empty set)."""
    return int(class_sizes.max(initial=0))


def _recall_metric(k: int) -> Metric:
    """The :class:`Metric` for ``recall@<k>``."""
    return Metric(
        name=f"recall@{k}",
        compute=lambda requirements: recall_at_k(requirements, k),
        num_neighbours=lambda _: k,
    )


for _k in (1, 2, 4, 8, 16, 32):
    METRICS.register(f"recall@{_k}")(_recall_metric(_k))
METRICS.register("map@r")(
    Metric("map@r", map_at_r, num_neighbours=lambda sizes: max(_max_class_size(sizes) - 1, 0))
)
METRICS.register("map@c")(Metric("map@c", map_at_c, num_neighbours=_max_class_size))
METRICS.register("nmi")(Metric("nmi", nmi, num_neighbours=lambda _: 0, needs_clusters=True))


def get_metric(name: str) -> Metric:
    """Looks up a metric by name; ``recall@<k>`` works for any integer k >= 1.

    Args:
      name: metric name.

    Returns:
      The :class:`Metric`.

    Raises:
      UnknownMetricError: for an unknown name; the message lists the known names and the
        ``recall@<k>`` pattern.
    """
    if name in METRICS:
        return METRICS.get(name)
    match = RECALL_PATTERN.fullmatch(name)
    if match:
        return _recall_metric(int(match.group(1)))
    raise UnknownMetricError(
        f"unknown metric {name!r}; known metric names: {', '.join(METRICS.names())}, "
        "and recall@<k> for any integer k >= 1"
    )
