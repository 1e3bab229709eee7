"""The results table of an evaluation: one row per run or split, one column per metric, each
value in percent or as it is (:func:`is_percent`)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from jdml.evaluation.metrics import get_metric


def is_percent(name: str) -> bool:
    """Whether the metric ``name`` is a fraction shown in percent (unknown names: yes)."""
    try:
        return get_metric(name).percent
    except KeyError:
        return True


def _format_value(value: float, percent: bool = True) -> str:
    """A metric value as a percentage with 2 decimals, or as is with 4 decimals."""
    if math.isnan(value):
        return "nan"
    return f"{100.0 * value:.2f}" if percent else f"{value:.4f}"


def format_table(results: Mapping[str, Mapping[str, float]]) -> str:
    """Fixed-width results table: one row per run/split, one column per metric.

    Fractions (retrieval and clustering metrics) are shown in percent with 2 decimals; the
    other metrics (``rho_spectrum*``, ``dists@*``) as they are, with 4 decimals.

    Args:
      results: {row name: {metric name: value}}; columns are the metric names in order of
        first appearance, and a metric missing from a row is shown as "-".

    Returns:
      The table as a multi-line string (header, rule, one line per row).
    """
    columns = list(dict.fromkeys(name for row in results.values() for name in row))
    percent = {c: is_percent(c) for c in columns}
    header = ["", *columns]
    rows = [
        [str(name), *(_format_value(row[c], percent[c]) if c in row else "-" for c in columns)]
        for name, row in results.items()
    ]
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]

    def render(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([render(header), rule, *(render(row) for row in rows)])
