"""What every figure of :mod:`jdml.visualize` shares: a matplotlib figure of an exact pixel size,
its atomic PNG save, and the display of numbers, metric names and class names.

Figures draw with matplotlib's Agg backend (imported lazily, so importing this module stays
cheap and needs no display), are written atomically (a temporary file, then ``os.replace``) and
are saved at :data:`DPI` = 100 without a tight bounding box, so each has a fixed size in pixels.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jdml.fileio import atomic_path

DPI = 100


def is_fraction_metric(name: str) -> bool:
    """Whether a metric is a fraction in [0, 1], shown in percent: the metric registry's
    ``percent`` flag (:func:`jdml.evaluation.table.is_percent`; unknown names: yes). The
    spectral decay (``rho_spectrum*``) and the class distances (``dists@*``) are shown as they
    are, every other metric (recall@k, map@r, nmi, f1, ...) in percent.

    Args:
      name: a metric name such as ``"recall@1"``.

    Returns:
      True if the metric should be multiplied by 100 for display.
    """
    from jdml.evaluation.table import is_percent  # the registry (imports JAX) on first use

    return is_percent(name)


def finite_number(value: Any) -> float | None:
    """A finite int/float as float; None for bools, strings ("nan" as written), NaN and inf."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@contextlib.contextmanager
def figure(width_px: int, height_px: int, **kwargs: Any) -> Iterator[Any]:
    """A matplotlib figure of exactly ``width_px`` x ``height_px`` pixels, closed on exit.

    Args:
      width_px: width in pixels at :data:`DPI`.
      height_px: height in pixels at :data:`DPI`.
      **kwargs: passed to ``plt.figure`` (e.g. ``layout="constrained"``).

    Yields:
      The figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Agg truncates width * dpi to an int: a hundredth of a pixel more keeps e.g. 57 px from
    # becoming 56.999... -> 56.
    fig = plt.figure(figsize=((width_px + 0.01) / DPI, (height_px + 0.01) / DPI), dpi=DPI, **kwargs)
    try:
        yield fig
    finally:
        plt.close(fig)


def save_png(fig: Any, path: str | os.PathLike[str]) -> str:
    """Saves ``fig`` as a PNG at ``path`` atomically (temporary file, then ``os.replace``).

    Args:
      fig: a matplotlib figure.
      path: the PNG's path; missing parent directories are created.

    Returns:
      ``path`` as a string.
    """
    with atomic_path(path, ".png") as tmp:
        fig.savefig(tmp, dpi=DPI, format="png")
    return os.fspath(path)


def shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def class_name(label: Any, class_names: Sequence[str] | Mapping[Any, str] | None) -> str:
    """The display name of a class label.

    Args:
      label: a class label (usually an integer).
      class_names: a mapping label -> name, or a sequence indexed by integer labels, or None.

    Returns:
      The name, or the label itself as text when no name is known.
    """
    if isinstance(label, np.generic):
        label = label.item()
    if class_names is None:
        return str(label)
    if isinstance(class_names, Mapping):
        return str(class_names.get(label, label))
    if isinstance(label, int) and 0 <= label < len(class_names):
        return str(class_names[label])
    return str(label)
