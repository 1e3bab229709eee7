"""Leave-one-out retrieval evaluation of embeddings, and a results table.

:func:`evaluate_embeddings` validates the requested metric names, computes each shared
requirement once (a single kNN pass with the largest neighbour count needed, a single k-means
only if a clustering metric is requested) and derives every metric from them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import DEFAULT_BLOCK_SIZE, DISTANCES, knn
from jdml.evaluation.metrics import Metric, Requirements, get_metric


def resolve_metrics(names: Sequence[str]) -> list[Metric]:
    """Resolves metric names up front (duplicates dropped, order kept).

    Args:
      names: metric names, e.g. ``["recall@1", "map@r", "nmi"]``.

    Returns:
      The :class:`Metric` objects.

    Raises:
      UnknownMetricError: (a ``ValueError`` and ``KeyError``) for an unknown name; the message
        lists the known names and the ``recall@<k>`` pattern.
    """
    if isinstance(names, str):
        raise TypeError("metrics must be a sequence of names, not a single string")
    return [get_metric(name) for name in dict.fromkeys(names)]


def check_metric_names(names: Sequence[str]) -> None:
    """Validates metric names without computing anything (e.g. when checking a configuration).

    Args:
      names: metric names.

    Raises:
      UnknownMetricError: (a ``ValueError``) for an unknown name, listing the known names.
    """
    resolve_metrics(names)


def _class_sizes(labels: np.ndarray) -> tuple[np.ndarray, int]:
    """Size of each sample's class (the sample included) and the number of classes.

    Args:
      labels: (N,) labels.

    Returns:
      (N,) int class sizes and the number of distinct labels.
    """
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    return counts[inverse.reshape(-1)], len(counts)


def evaluate_embeddings(
    embeddings: jax.Array | np.ndarray,
    labels: jax.Array | np.ndarray,
    metrics: Sequence[str],
    *,
    distance: str = "euclidean",
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, float]:
    """Evaluates embeddings by leave-one-out retrieval and clustering.

    Every sample is a query against all other samples. One exact kNN search is run with the
    largest neighbour count any requested metric needs (max k of ``recall@k``, the largest class
    size for ``map@r`` / ``map@c``), clipped to N - 1; k-means (as many clusters as distinct
    labels) runs only if ``nmi`` is requested. With the cosine distance k-means clusters the
    L2-normalised embeddings.

    Args:
      embeddings: (N, D) float embeddings, N >= 2.
      labels: (N,) integer class labels.
      metrics: metric names (see :mod:`jdml.evaluation.metrics`).
      distance: "euclidean" or "cosine".
      seed: seed of the k-means initialisation.
      block_size: queries per kNN block.

    Returns:
      {metric name: value in [0, 1]} in the requested order.
    """
    specs = resolve_metrics(metrics)
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {DISTANCES}")
    embeddings = jnp.asarray(embeddings, jnp.float32)  # stays on the default device
    labels = np.asarray(labels).reshape(-1)
    if embeddings.ndim != 2 or embeddings.shape[0] != labels.shape[0]:
        raise ValueError(
            f"expected (N, D) embeddings and (N,) labels, got {embeddings.shape} and {labels.shape}"
        )
    n = embeddings.shape[0]
    if n < 2:
        raise ValueError("retrieval evaluation needs at least 2 samples")
    class_sizes, num_classes = _class_sizes(labels)

    num_neighbours = min(max((m.num_neighbours(class_sizes) for m in specs), default=0), n - 1)
    neighbour_labels = None
    if num_neighbours > 0:
        _, indices = knn(
            embeddings,
            embeddings,
            num_neighbours,
            exclude_self=True,
            distance=distance,
            block_size=block_size,
        )
        neighbour_labels = labels[np.asarray(indices)]

    assignments = None
    if any(m.needs_clusters for m in specs):
        points = embeddings
        if distance == "cosine":
            norms = jnp.linalg.norm(points, axis=1, keepdims=True)
            points = points / jnp.maximum(norms, 1e-12)
        assignments = np.asarray(kmeans(points, num_classes, seed=seed).assignments)

    requirements = Requirements(labels, class_sizes, neighbour_labels, assignments)
    return {m.name: float(m.compute(requirements)) for m in specs}


def _format_value(value: float) -> str:
    """A metric value as a percentage with 2 decimals."""
    return "nan" if math.isnan(value) else f"{100.0 * value:.2f}"


def format_table(results: Mapping[str, Mapping[str, float]]) -> str:
    """Fixed-width results table: one row per run/split, one column per metric, in percent.

    Args:
      results: {row name: {metric name: value in [0, 1]}}; columns are the metric names in
        order of first appearance, and a metric missing from a row is shown as "-".

    Returns:
      The table as a multi-line string (header, rule, one line per row).
    """
    columns = list(dict.fromkeys(name for row in results.values() for name in row))
    header = ["", *columns]
    rows = [
        [str(name), *(_format_value(row[c]) if c in row else "-" for c in columns)]
        for name, row in results.items()
    ]
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def render(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([render(header), rule, *(render(row) for row in rows)])
