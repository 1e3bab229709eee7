"""What the metrics share: the quantities computed once per evaluation
(:class:`Requirements`), the description of a metric (:class:`Metric`) and the registry of
metric names (:data:`METRICS`, filled by :mod:`jdml.evaluation.metrics`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import NamedTuple, TypeVar

import numpy as np

from jdml.registry import Registry

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


def required(value: T | None, what: str) -> T:
    """``value``, or an error saying that the requirement ``what`` was not computed."""
    if value is None:
        raise ValueError(f"this metric needs {what}, which were not computed")
    return value


def query_mean(values: np.ndarray) -> float:
    """Mean of per-query values over the queries a metric keeps (not NaN); NaN if none."""
    kept = ~np.isnan(values)
    return float(np.mean(values[kept])) if np.any(kept) else float("nan")
