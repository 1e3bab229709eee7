"""Retrieval, clustering and embedding-space metrics, computed from shared requirements.

Every test sample is a query against all other test samples (leave-one-out retrieval), or,
for datasets with a query/gallery protocol (In-Shop), every query against the gallery. The
expensive parts are computed once per evaluation and shared by all metrics
(:class:`Requirements`): the classes of each query's nearest neighbours (one kNN pass with the
largest neighbour count any requested metric needs), the average-precision sums over the
complete ranking (only for ``map``), each sample's class size, the k-means cluster assignments
(only for a clustering metric), the singular values of the embedding matrix (only for
``rho_spectrum``) and per-class cosine-distance statistics (only for ``dists``).

Metric names:

* retrieval: ``recall@<k>``, ``precision@1``, ``r_precision``, ``map@r``, ``map@c``,
  ``map@<k>`` (e.g. ``map@1000``) and ``map`` (over all neighbours);
* clustering: ``nmi``, ``f1``;
* embedding space: ``rho_spectrum@<m>`` and ``rho_spectrum_trunc@<m>`` for any integer m
  (``@0`` is a vector), ``dists@intra``, ``dists@inter``, ``dists@intra_over_inter``.

The fixed names live in :data:`METRICS`; :func:`get_metric` also builds the ``<k>`` / ``<m>``
families for any value.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.metrics import normalized_mutual_info_score

from jdml.errors import UnknownMetricError
from jdml.geometry import l2_normalize
from jdml.registry import Registry

RECALL_PATTERN = re.compile(r"recall@([1-9][0-9]*)")
MAP_PATTERN = re.compile(r"map@([1-9][0-9]*)")
RHO_PATTERN = re.compile(r"rho_spectrum(_trunc)?@(-?(?:0|[1-9][0-9]*))")
_ROW_BLOCK = 8192
T = TypeVar("T")


class ClassDistances(NamedTuple):
    """Cosine-distance statistics of the classes (see :func:`class_distances`).

    Attributes:
      intra: mean over classes of the mean pairwise cosine distance within the class.
      inter: mean pairwise cosine distance between the L2-normalised class means.
    """

    intra: float
    inter: float


@dataclasses.dataclass(frozen=True)
class Requirements:
    """Quantities shared by the metrics of one evaluation.

    Attributes:
      labels: (N,) integer class of every sample (the evaluator passes ids 0..C-1).
      class_sizes: (N,) size of each sample's class in the evaluated set, the sample included.
        Against a gallery (``leave_one_out=False``), one more than the number R of gallery
        items of the query's class, so that R = class_sizes - 1 in both protocols.
      neighbour_labels: (N, K) classes of each query's K nearest other samples, nearest first
        (the query itself excluded), or None if no metric needs neighbours.
      cluster_assignments: (N,) k-means cluster of every sample, or None if not needed.
      precision_sums: (N,) ``sum_k P@k * rel_k`` over the complete ranking of the N - 1 other
        samples (:func:`jdml.evaluation.knn.knn_full_ranking`), or None if not needed.
      singular_values: (min(N, D),) singular values of the evaluated embedding matrix,
        descending, or None if not needed.
      dimension: D, the embedding dimension.
      class_distances: :class:`ClassDistances`, or None if not needed.
      leave_one_out: whether each sample is a query against the other samples (True), or the
        queries are ranked against a separate gallery (False, e.g. In-Shop). The class-size
        normaliser of ``map@c`` / ``map@<k>`` / ``map`` is n_c (the query included) in the
        first case and R in the second.
      query_values: {metric name: (N,) per-query values} of the retrieval metrics, as the
        evaluator computes them block by block of queries (:attr:`Metric.per_query`) without
        keeping the neighbour lists; a metric found here is their mean.
    """

    labels: np.ndarray
    class_sizes: np.ndarray
    neighbour_labels: np.ndarray | None = None
    cluster_assignments: np.ndarray | None = None
    precision_sums: np.ndarray | None = None
    singular_values: np.ndarray | None = None
    dimension: int = 0
    class_distances: ClassDistances | None = None
    leave_one_out: bool = True
    query_values: Mapping[str, np.ndarray] | None = None


def _no_neighbours(_: np.ndarray) -> int:
    """Neighbour count of a metric that needs no kNN."""
    return 0


@dataclasses.dataclass(frozen=True)
class Metric:
    """One metric: how to compute it and what it needs.

    Attributes:
      name: the metric's name (the key of its value in results).
      compute: maps the shared :class:`Requirements` to the metric value: a float, or a 1-D
        array for a vector-valued metric.
      num_neighbours: maps the (N,) class sizes to the number of nearest neighbours needed
        (0 if none); the evaluator clips it to N - 1.
      needs_clusters: whether k-means assignments are needed.
      needs_full_ranking: whether the precision sums over the complete ranking are needed.
      needs_spectrum: whether the singular values are needed.
      needs_class_distances: whether the class cosine-distance statistics are needed.
      vector: whether the value is a 1-D array rather than a float.
      percent: whether the value is a fraction in [0, 1], shown in percent in tables.
      per_query: for a retrieval metric, maps requirements over some queries to their (B,)
        values (NaN for a query the metric leaves out); the metric is the mean of the others
        (:func:`query_mean`), so it can be computed block by block of queries.
    """

    name: str
    compute: Callable[[Requirements], float | np.ndarray]
    num_neighbours: Callable[[np.ndarray], int] = _no_neighbours
    needs_clusters: bool = False
    needs_full_ranking: bool = False
    needs_spectrum: bool = False
    needs_class_distances: bool = False
    vector: bool = False
    percent: bool = True
    per_query: Callable[[Requirements], np.ndarray] | None = None

    def value(self, requirements: Requirements) -> float | np.ndarray:
        """The metric from the requirements, or from their per-query values if computed."""
        values = requirements.query_values or {}
        if self.per_query is not None and self.name in values:
            return query_mean(values[self.name])
        return self.compute(requirements)


METRICS: Registry[Metric] = Registry("metric")


def _required(value: T | None, what: str) -> T:
    """``value``, or an error saying that the requirement ``what`` was not computed."""
    if value is None:
        raise ValueError(f"this metric needs {what}, which were not computed")
    return value


# ---------------------------------------------------------------------------------------------
# Retrieval metrics from the k nearest neighbours.


def _neighbour_labels(requirements: Requirements) -> np.ndarray:
    """The (N, K) neighbour classes, with an error if they were not computed."""
    return _required(requirements.neighbour_labels, "neighbour labels")


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


def query_mean(values: np.ndarray) -> float:
    """Mean of per-query values over the queries a metric keeps (not NaN); NaN if none."""
    kept = ~np.isnan(values)
    return float(np.mean(values[kept])) if np.any(kept) else float("nan")


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
    sums = _required(requirements.precision_sums, "the full-ranking precision sums")
    return sums / np.maximum(_relevant_normaliser(requirements), 1)


# ---------------------------------------------------------------------------------------------
# Clustering metrics from the k-means assignments.


def _assignments(requirements: Requirements) -> np.ndarray:
    """The (N,) cluster assignments, with an error if they were not computed."""
    return _required(requirements.cluster_assignments, "cluster assignments")


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
    return float(
        normalized_mutual_info_score(
            requirements.labels, _assignments(requirements), average_method="arithmetic"
        )
    )


def _pairs(counts: np.ndarray) -> float:
    """sum of C(n, 2) = n (n - 1) / 2 over the counts, in float64."""
    counts = counts.astype(np.float64)
    return float(np.sum(counts * (counts - 1.0) / 2.0))


def f1(requirements: Requirements) -> float:
    """Pair-counting F1 of the k-means clustering (the "f1" metric of Roth et al., ICML 2020,
    following Song et al., "Deep metric learning via facility location", CVPR 2017).

    With n_ck the number of samples of class c in cluster k, n_c the class sizes and m_k the
    cluster sizes: TP = sum_{c,k} C(n_ck, 2) (same-class pairs put in the same cluster),
    P = TP / sum_c C(n_c, 2), R = TP / sum_k C(m_k, 2) and F1 = 2 P R / (P + R) (symmetric in
    P and R, so which is called precision does not matter). Computed from the sparse
    contingency counts, O(N log N). F1 = 0 when TP = 0 (this includes the degenerate cases of
    no same-class or no same-cluster pair).

    Args:
      requirements: shared requirements with (N,) ``cluster_assignments``.

    Returns:
      F1 in [0, 1].
    """
    labels = requirements.labels.astype(np.int64)
    clusters = _assignments(requirements).astype(np.int64)
    _, joint = np.unique(labels * (clusters.max() + 1) + clusters, return_counts=True)
    tp = _pairs(joint)
    if tp == 0.0:
        return 0.0
    precision = tp / _pairs(np.bincount(labels))
    recall = tp / _pairs(np.bincount(clusters))
    return float(2.0 * precision * recall / (precision + recall))


# ---------------------------------------------------------------------------------------------
# Spectral decay of the embedding matrix.


@jax.jit
def _singular_values(points: jax.Array) -> jax.Array:
    """Singular values of an (N, D) matrix, descending (LAPACK SVD, no singular vectors)."""
    return jnp.linalg.svd(points, compute_uv=False)


def singular_values(points: jax.Array | np.ndarray) -> np.ndarray:
    """Singular values of the uncentred (N, D) embedding matrix, descending.

    A jitted SVD without singular vectors (memory O(N D + D^2)). It works on the matrix
    itself rather than on the eigenvalues of the D x D Gram matrix, whose float32 rounding
    (relative to the largest eigenvalue) would swamp the small singular values that dominate
    the spectral-decay KL divergence.

    Args:
      points: (N, D) embeddings.

    Returns:
      (min(N, D),) float64 singular values.
    """
    return np.asarray(_singular_values(jnp.asarray(points, jnp.float32)), np.float64)


def rho_spectrum(requirements: Requirements, mode: int, truncated: bool) -> float | np.ndarray:
    """Spectral decay rho of Roth et al., "Revisiting Training Strategies and Generalization
    Performance in Deep Metric Learning" (ICML 2020), metric "rho_spectrum@<mode>".

    With s the singular values of the uncentred embedding matrix (descending), for mode m != 0
    the |m| - 1 largest are dropped; s_hat = s / sum(s) and U is the uniform distribution of
    the same length. m > 0: KL(U || s_hat) = sum U log(U / s_hat) (the paper's rho is m = 1;
    +inf if a singular value is 0); m < 0: KL(s_hat || U); m = 0: the normalised spectrum s_hat
    of all singular values itself (a vector). NaN if |m| - 1 drops every value.

    The reference computes s with torch.svd (all min(N, D) values) on the GPU but with
    sklearn's TruncatedSVD(n_components = D - 1) on the CPU, which (with its oversampling)
    returns the D - 1 largest singular values exactly and drops the smallest. As KL(U || s_hat)
    is dominated by the smallest values, this changes the numbers: ``truncated=False``
    ("rho_spectrum@m") keeps all min(N, D) values, ``truncated=True`` ("rho_spectrum_trunc@m")
    keeps at most D - 1, like the CPU path.

    Args:
      requirements: shared requirements with ``singular_values`` and ``dimension``.
      mode: m, any integer.
      truncated: keep at most D - 1 singular values.

    Returns:
      The KL divergence, or the (len(s),) normalised spectrum for m = 0.
    """
    s = np.asarray(_required(requirements.singular_values, "singular values"), np.float64)
    if truncated:
        s = s[: max(requirements.dimension - 1, 0)]
    if mode != 0:
        s = s[abs(mode) - 1 :]
    if len(s) == 0 or not np.sum(s) > 0:
        return np.full(len(s), np.nan) if mode == 0 else float("nan")
    s_hat = s / np.sum(s)
    if mode == 0:
        return s_hat
    uniform = 1.0 / len(s)
    if mode > 0:
        with np.errstate(divide="ignore"):
            return float(np.sum(uniform * (np.log(uniform) - np.log(s_hat))))
    positive = s_hat > 0
    return float(np.sum(s_hat[positive] * (np.log(s_hat[positive]) - np.log(uniform))))


# ---------------------------------------------------------------------------------------------
# Intra- and inter-class cosine distances.


@functools.partial(jax.jit, static_argnames="num_classes")
def _class_sums(
    points: jax.Array, class_ids: jax.Array, *, num_classes: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Per-class sums behind :func:`class_distances` (segment sums, O(N D + C D) memory).

    Args:
      points: (N, D) embeddings.
      class_ids: (N,) int32 classes in [0, C).
      num_classes: C.

    Returns:
      Per class: |sum of its unit vectors|^2 (C,) and the sum of their squared norms (C,)
      (1 each, 0 for a zero vector); and for the L2-normalised class means M_c:
      |sum_c M_c|^2 and sum_c |M_c|^2 (scalars).
    """
    unit = l2_normalize(points)
    unit_sums = jax.ops.segment_sum(unit, class_ids, num_segments=num_classes)
    unit_sq = jax.ops.segment_sum(jnp.sum(unit * unit, axis=1), class_ids, num_classes)
    # Normalising the class sum is normalising the class mean.
    sums = jax.ops.segment_sum(points, class_ids, num_segments=num_classes)
    means = l2_normalize(sums)
    total = jnp.sum(means, axis=0)
    return (
        jnp.sum(unit_sums * unit_sums, axis=1),
        unit_sq,
        jnp.sum(total * total),
        jnp.sum(means * means),
    )


def class_distances(points: jax.Array | np.ndarray, class_ids: np.ndarray) -> ClassDistances:
    """Intra- and inter-class cosine distances ("dists" of Roth et al., ICML 2020).

    The cosine distance is 1 - cos(a, b). For a class of n >= 2 unit vectors u_i with sum S,
    the sum of the n^2 - n off-diagonal distances is n^2 - n - (|S|^2 - sum_i |u_i|^2), so the
    per-class mean needs only segment sums (no per-class distance matrix); likewise the mean
    off-diagonal distance between the C normalised class means M_c is
    1 - (|sum_c M_c|^2 - sum_c |M_c|^2) / (C^2 - C), with no C x C matrix.

    * intra: the mean over classes of the per-class mean. A single-sample class has no pair
      (0/0 in the reference, which then meant to replace it by the largest per-class value but
      indexes with an integer array ``1 - isnan(...)`` and so takes the max of the first two
      classes' values). Here a single-sample class gets the largest per-class mean of the
      classes with >= 2 samples, the reference's intent; NaN if every class is a singleton.
    * inter: the mean off-diagonal cosine distance between the L2-normalised class means
      (NaN for a single class).

    Args:
      points: (N, D) embeddings (the evaluator passes the L2-normalised ones for the cosine
        distance; the intra distances do not depend on it).
      class_ids: (N,) integer classes.

    Returns:
      The :class:`ClassDistances`.
    """
    _, inverse, counts = np.unique(np.asarray(class_ids), return_inverse=True, return_counts=True)
    sum_sq, unit_sq, total_sq, means_sq = (
        np.asarray(v, np.float64)
        for v in _class_sums(
            jnp.asarray(points, jnp.float32),
            jnp.asarray(inverse.reshape(-1), jnp.int32),
            num_classes=len(counts),
        )
    )
    pairs = counts.astype(np.float64) * (counts - 1.0)
    multi = counts >= 2
    if np.any(multi):
        per_class = 1.0 - (sum_sq[multi] - unit_sq[multi]) / pairs[multi]
        intra = float(np.sum(per_class) + np.max(per_class) * np.sum(~multi)) / len(counts)
    else:
        intra = float("nan")
    num = float(len(counts))
    inter = 1.0 - (float(total_sq) - float(means_sq)) / (num * num - num) if num > 1 else np.nan
    return ClassDistances(intra, float(inter))


def _class_distances(requirements: Requirements) -> ClassDistances:
    """The class distance statistics, with an error if they were not computed."""
    return _required(requirements.class_distances, "class distances")


def dists_intra(requirements: Requirements) -> float:
    """Mean intra-class cosine distance ("dists@intra"; see :func:`class_distances`)."""
    return _class_distances(requirements).intra


def dists_inter(requirements: Requirements) -> float:
    """Mean cosine distance between class means ("dists@inter"; see :func:`class_distances`)."""
    return _class_distances(requirements).inter


def dists_intra_over_inter(requirements: Requirements) -> float:
    """intra / max(inter, 1e-8) ("dists@intra_over_inter" of Roth et al., ICML 2020)."""
    distances = _class_distances(requirements)
    return distances.intra / max(distances.inter, 1e-8)


# ---------------------------------------------------------------------------------------------
# Registry.


def _max_class_size(class_sizes: np.ndarray) -> int:
    """Largest class size (0 for an empty set)."""
    return int(class_sizes.max(initial=0))


def _max_others(class_sizes: np.ndarray) -> int:
    """Largest number of other same-class samples, R = n_c - 1 (0 for an empty set)."""
    return max(_max_class_size(class_sizes) - 1, 0)


def _recall_metric(k: int) -> Metric:
    """The :class:`Metric` for ``recall@<k>``."""
    return Metric(
        name=f"recall@{k}",
        compute=lambda requirements: recall_at_k(requirements, k),
        num_neighbours=lambda _: k,
        per_query=lambda requirements: recall_values(requirements, k),
    )


def _map_metric(k: int) -> Metric:
    """The :class:`Metric` for ``map@<k>``."""
    return Metric(
        name=f"map@{k}",
        compute=lambda requirements: map_at_k(requirements, k),
        num_neighbours=lambda _: k,
        per_query=lambda requirements: map_at_k_values(requirements, k),
    )


def _rho_metric(mode: int, truncated: bool) -> Metric:
    """The :class:`Metric` for ``rho_spectrum@<m>`` or ``rho_spectrum_trunc@<m>``."""
    return Metric(
        name=f"rho_spectrum{'_trunc' if truncated else ''}@{mode}",
        compute=lambda requirements: rho_spectrum(requirements, mode, truncated),
        needs_spectrum=True,
        vector=mode == 0,
        percent=False,
    )


for _k in (1, 2, 4, 8, 16, 32):
    METRICS.register(f"recall@{_k}")(_recall_metric(_k))
for _metric in (
    Metric("precision@1", precision_at_1, lambda _: 1, per_query=precision_at_1_values),
    Metric("r_precision", r_precision, _max_others, per_query=r_precision_values),
    Metric("map@r", map_at_r, _max_others, per_query=map_at_r_values),
    Metric("map@c", map_at_c, _max_class_size, per_query=map_at_c_values),
    _map_metric(1000),
    Metric(
        "map",
        mean_average_precision,
        needs_full_ranking=True,
        per_query=mean_average_precision_values,
    ),
):
    METRICS.register(_metric.name)(_metric)
METRICS.register("nmi")(Metric("nmi", nmi, needs_clusters=True))
METRICS.register("f1")(Metric("f1", f1, needs_clusters=True))
for _m in (0, 1, 2, 10, -1):
    for _truncated in (False, True):
        _metric = _rho_metric(_m, _truncated)
        METRICS.register(_metric.name)(_metric)
for _name, _fn in (
    ("dists@intra", dists_intra),
    ("dists@inter", dists_inter),
    ("dists@intra_over_inter", dists_intra_over_inter),
):
    METRICS.register(_name)(Metric(_name, _fn, needs_class_distances=True, percent=False))


def get_metric(name: str) -> Metric:
    """Looks up a metric by name; ``recall@<k>``, ``map@<k>`` (k >= 1), ``rho_spectrum@<m>``
    and ``rho_spectrum_trunc@<m>`` (any integer m) work for any value.

    Args:
      name: metric name.

    Returns:
      The :class:`Metric`.

    Raises:
      UnknownMetricError: for an unknown name; the message lists the known names and the
        patterns.
    """
    if name in METRICS:
        return METRICS.get(name)
    if match := RECALL_PATTERN.fullmatch(name):
        return _recall_metric(int(match.group(1)))
    if match := MAP_PATTERN.fullmatch(name):
        return _map_metric(int(match.group(1)))
    if match := RHO_PATTERN.fullmatch(name):
        return _rho_metric(int(match.group(2)), truncated=match.group(1) is not None)
    raise UnknownMetricError(
        f"unknown metric {name!r}; known metric names: {', '.join(METRICS.names())}, "
        "and recall@<k>, map@<k> for any integer k >= 1, rho_spectrum@<m> and "
        "rho_spectrum_trunc@<m> for any integer m"
    )
