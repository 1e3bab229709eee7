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

The fixed names live in :data:`METRICS` (registered here); :func:`get_metric` also builds the
``<k>`` / ``<m>`` families for any value. The modules: :mod:`~jdml.evaluation.metrics.base`
(requirements, :class:`Metric`, the registry), :mod:`~jdml.evaluation.metrics.retrieval`,
:mod:`~jdml.evaluation.metrics.clustering` and :mod:`~jdml.evaluation.metrics.space` (spectrum
and class distances).
"""

from __future__ import annotations

import re

import numpy as np

from jdml.errors import UnknownMetricError
from jdml.evaluation.metrics.base import (
    METRICS,
    ClassDistances,
    Metric,
    Requirements,
    query_mean,
)
from jdml.evaluation.metrics.clustering import f1, nmi
from jdml.evaluation.metrics.retrieval import (
    map_at_c,
    map_at_c_values,
    map_at_k,
    map_at_k_values,
    map_at_r,
    map_at_r_values,
    mean_average_precision,
    mean_average_precision_values,
    precision_at_1,
    precision_at_1_values,
    r_precision,
    r_precision_values,
    recall_at_k,
    recall_values,
)
from jdml.evaluation.metrics.space import (
    class_distances,
    dists_inter,
    dists_intra,
    dists_intra_over_inter,
    rho_spectrum,
    singular_values,
)

RECALL_PATTERN = re.compile(r"recall@([1-9][0-9]*)")
MAP_PATTERN = re.compile(r"map@([1-9][0-9]*)")
RHO_PATTERN = re.compile(r"rho_spectrum(_trunc)?@(-?(?:0|[1-9][0-9]*))")


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


__all__ = [
    "METRICS",
    "ClassDistances",
    "Metric",
    "Requirements",
    "class_distances",
    "dists_inter",
    "dists_intra",
    "dists_intra_over_inter",
    "f1",
    "get_metric",
    "map_at_c",
    "map_at_c_values",
    "map_at_k",
    "map_at_k_values",
    "map_at_r",
    "map_at_r_values",
    "mean_average_precision",
    "mean_average_precision_values",
    "nmi",
    "precision_at_1",
    "precision_at_1_values",
    "query_mean",
    "r_precision",
    "r_precision_values",
    "recall_at_k",
    "recall_values",
    "rho_spectrum",
    "singular_values",
]
