"""Figures for looking at what a metric-learning model learned.

Retrieval grids (queries and their nearest neighbours), 2-D maps of embeddings (UMAP, t-SNE or
PCA), training curves and singular-value spectra read from a run's ``metrics.jsonl``.

Every function takes numpy arrays or metric records, draws with matplotlib's Agg backend
(imported lazily, so importing this module stays cheap and needs no display), writes a PNG
atomically (a temporary file, then ``os.replace``) and returns its path. Figures are saved at
:data:`DPI` = 100 without a tight bounding box, so each has a fixed size in pixels, given in its
docstring (the ``*_size`` helpers compute the sizes that depend on the inputs).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from jdml.fileio import atomic_path, read_jsonl

DPI = 100

# Retrieval grid layout, in pixels.
GRID_CELL_PX = (110, 130)  # one image cell: width, height (image box + label line)
GRID_IMAGE_PX = 96  # the square box an image is fitted into
GRID_GAP_PX = 16  # extra space between the query column and the neighbour columns
GRID_HEADER_PX = 22  # column headings ("query", "1", "2", ...)
GRID_TITLE_PX = 30  # the title band, only when a title is given

EMBEDDING_MAP_PX = (800, 640)  # embedding_map: width, height
EMBEDDING_PANEL_PX = (420, 480)  # embedding_maps: one panel's width, the figure's height
EMBEDDING_LEGEND_PX = 180  # embedding_maps: extra width for the legend (<= 20 classes)
TRAINING_CURVES_PX = (1200, 450)
SPECTRUM_PX = (700, 450)

MAX_LEGEND_CLASSES = 20
TSNE_MAX_POINTS = 5000  # "auto" projection: t-SNE up to this many points, PCA beyond
PROJECTION_METHODS = ("auto", "umap", "tsne", "pca")

_QUERY_COLOUR = "#1f77b4"
_CORRECT_COLOUR = "#2ca02c"
_WRONG_COLOUR = "#d62728"
_CORRECT_TEXT = "#16701a"
_WRONG_TEXT = "#b01a1c"


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def is_fraction_metric(name: str) -> bool:
    """Whether a metric is a fraction in [0, 1], shown in percent: the metric registry's
    ``percent`` flag (:func:`jdml.evaluation.embeddings.is_percent`; unknown names: yes). The
    spectral decay (``rho_spectrum*``) and the class distances (``dists@*``) are shown as they
    are, every other metric (recall@k, map@r, nmi, f1, ...) in percent.

    Args:
      name: a metric name such as ``"recall@1"``.

    Returns:
      True if the metric should be multiplied by 100 for display.
    """
    from jdml.evaluation.embeddings import is_percent  # the registry (imports JAX) on first use

    return is_percent(name)


def _number(value: Any) -> float | None:
    """A finite int/float as float; None for bools, strings ("nan" as written), NaN and inf."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


@contextlib.contextmanager
def _figure(width_px: int, height_px: int, **kwargs: Any) -> Iterator[Any]:
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


def _save(fig: Any, path: str | os.PathLike[str]) -> str:
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


def _shorten(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _class_name(label: Any, class_names: Sequence[str] | Mapping[Any, str] | None) -> str:
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


# ---------------------------------------------------------------------------------------------
# Retrieval grid
# ---------------------------------------------------------------------------------------------


def retrieval_grid_size(
    num_queries: int, num_neighbours: int, *, title: bool = False
) -> tuple[int, int]:
    """The pixel size of a :func:`retrieval_grid` figure.

    Args:
      num_queries: Q, the number of rows.
      num_neighbours: K, the neighbours per query.
      title: whether a title is drawn.

    Returns:
      ``(width, height)`` = ``(110 * (K + 1) + 16, 22 + 130 * Q + (30 if title else 0))``.
    """
    width = GRID_CELL_PX[0] * (num_neighbours + 1) + GRID_GAP_PX
    height = GRID_HEADER_PX + GRID_CELL_PX[1] * num_queries + (GRID_TITLE_PX if title else 0)
    return width, height


def _unit_images(images: Any, name: str) -> np.ndarray:
    """Images as float32 in [0, 1].

    Args:
      images: a uint8 array (0..255) or a float array in [0, 1].
      name: the argument's name, for error messages.

    Returns:
      The images as float32 in [0, 1].

    Raises:
      ValueError: for another dtype, or float values outside [0, 1] or not finite.
    """
    arr = np.asarray(images)
    if arr.dtype == np.uint8:
        return arr.astype(np.float32) / 255.0
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be uint8 (0..255) or float in [0, 1], got dtype {arr.dtype}")
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} has NaN or infinite values")
    if arr.size and (arr.min() < -1e-3 or arr.max() > 1.0 + 1e-3):
        raise ValueError(
            f"{name}: float images must be in [0, 1], got values in "
            f"[{float(arr.min()):.3g}, {float(arr.max()):.3g}] (undo the input normalisation first)"
        )
    return np.clip(arr, 0.0, 1.0).astype(np.float32)


def _check_grid_inputs(
    queries: np.ndarray,
    neighbours: np.ndarray,
    correct: np.ndarray,
    query_labels: np.ndarray | None,
    neighbour_labels: np.ndarray | None,
) -> None:
    """Validates the shapes of :func:`retrieval_grid`'s arrays.

    Args:
      queries: (Q, H, W, C) images.
      neighbours: (Q, K, H, W, C) images.
      correct: (Q, K) flags.
      query_labels: (Q,) labels or None.
      neighbour_labels: (Q, K) labels or None.

    Raises:
      ValueError: naming the argument and the expected and actual shapes.
    """
    if queries.ndim != 4 or queries.shape[-1] not in (1, 3) or queries.shape[0] == 0:
        raise ValueError(
            "query_images must have shape (Q, H, W, C) with Q >= 1 and C = 1 or 3, "
            f"got {queries.shape}"
        )
    q = queries.shape[0]
    if neighbours.ndim != 5 or neighbours.shape[0] != q or neighbours.shape[1] == 0:
        raise ValueError(
            f"neighbour_images must have shape (Q, K, H, W, C) with Q = {q} (as query_images) "
            f"and K >= 1, got {neighbours.shape}"
        )
    if neighbours.shape[2:] != queries.shape[1:]:
        raise ValueError(
            f"neighbour_images must hold images of the query images' shape (H, W, C) = "
            f"{queries.shape[1:]}, got {neighbours.shape[2:]}"
        )
    k = neighbours.shape[1]
    if correct.shape != (q, k):
        raise ValueError(f"correct must have shape (Q, K) = {(q, k)}, got {correct.shape}")
    if query_labels is not None and query_labels.shape != (q,):
        raise ValueError(f"query_labels must have shape (Q,) = {(q,)}, got {query_labels.shape}")
    if neighbour_labels is not None and neighbour_labels.shape != (q, k):
        raise ValueError(
            f"neighbour_labels must have shape (Q, K) = {(q, k)}, got {neighbour_labels.shape}"
        )


def _draw_cell(
    fig: Any,
    image: np.ndarray,
    left_px: float,
    top_px: float,
    frame: str,
    label: str,
    label_colour: str,
) -> None:
    """Draws one framed image, fitted into the image box, with a label line below it.

    Args:
      fig: the figure.
      image: (H, W, C) float image in [0, 1].
      left_px: the cell's left edge, in pixels from the figure's left.
      top_px: the cell's top edge, in pixels from the figure's top.
      frame: the frame colour.
      label: the text under the image ("" for none).
      label_colour: the text colour.
    """
    fig_w, fig_h = fig.get_size_inches() * DPI
    h, w = image.shape[:2]
    scale = GRID_IMAGE_PX / max(h, w)
    box_w, box_h = w * scale, h * scale
    x0 = left_px + (GRID_CELL_PX[0] - box_w) / 2
    y0 = top_px + 4 + (GRID_IMAGE_PX - box_h) / 2
    ax = fig.add_axes((x0 / fig_w, 1 - (y0 + box_h) / fig_h, box_w / fig_w, box_h / fig_h))
    if image.shape[-1] == 1:
        ax.imshow(image[..., 0], cmap="gray", vmin=0.0, vmax=1.0, aspect="auto")
    else:
        ax.imshow(image, aspect="auto")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_edgecolor(frame)
        spine.set_linewidth(3)
    if label:
        fig.text(
            (left_px + GRID_CELL_PX[0] / 2) / fig_w,
            1 - (top_px + 4 + GRID_IMAGE_PX + 6) / fig_h,
            label,
            ha="center",
            va="top",
            fontsize=8,
            color=label_colour,
        )


def retrieval_grid(
    query_images: Any,
    neighbour_images: Any,
    correct: Any,
    path: str | os.PathLike[str],
    *,
    query_labels: Any = None,
    neighbour_labels: Any = None,
    class_names: Sequence[str] | Mapping[Any, str] | None = None,
    title: str | None = None,
) -> str:
    """Draws queries and their nearest neighbours, one row per query.

    Each row shows the query (blue frame) and then its K neighbours in rank order, framed green
    when the neighbour has the query's class and red otherwise, with a check or cross mark (and
    the class name when labels are given) under each image.

    The PNG is ``110 * (K + 1) + 16`` pixels wide and ``22 + 130 * Q`` pixels high, plus 30
    pixels with a title (see :func:`retrieval_grid_size`).

    Args:
      query_images: (Q, H, W, C) uint8 or float in [0, 1], C = 1 (grey) or 3 (RGB).
      neighbour_images: (Q, K, H, W, C), same dtype conventions and image shape.
      correct: (Q, K) bools: whether each neighbour has the query's class.
      path: the PNG to write (parent directories are created).
      query_labels: optional (Q,) class labels of the queries.
      neighbour_labels: optional (Q, K) class labels of the neighbours.
      class_names: optional names of the labels (a sequence indexed by label, or a mapping).
      title: optional title above the grid.

    Returns:
      ``path``.

    Raises:
      ValueError: for arrays of the wrong shape or dtype, or float values outside [0, 1].
    """
    queries = np.asarray(query_images)
    neighbours = np.asarray(neighbour_images)
    flags = np.asarray(correct)
    q_labels = None if query_labels is None else np.asarray(query_labels)
    n_labels = None if neighbour_labels is None else np.asarray(neighbour_labels)
    _check_grid_inputs(queries, neighbours, flags, q_labels, n_labels)
    queries = _unit_images(queries, "query_images")
    neighbours = _unit_images(neighbours, "neighbour_images")
    flags = flags.astype(bool)
    q, k = flags.shape
    width, height = retrieval_grid_size(q, k, title=bool(title))
    with _figure(width, height) as fig:
        top0 = GRID_TITLE_PX if title else 0
        if title:
            fig.text(0.5, 1 - (GRID_TITLE_PX / 2) / height, title, ha="center", va="center")
        for col in range(k + 1):
            left = col * GRID_CELL_PX[0] + (GRID_GAP_PX if col else 0)
            fig.text(
                (left + GRID_CELL_PX[0] / 2) / width,
                1 - (top0 + GRID_HEADER_PX / 2) / height,
                "query" if col == 0 else str(col),
                ha="center",
                va="center",
                fontsize=9,
                color="#444444",
            )
        for row in range(q):
            top = top0 + GRID_HEADER_PX + row * GRID_CELL_PX[1]
            label = (
                "" if q_labels is None else _shorten(_class_name(q_labels[row], class_names), 16)
            )
            _draw_cell(fig, queries[row], 0, top, _QUERY_COLOUR, label, "#222222")
            for j in range(k):
                ok = bool(flags[row, j])
                text = "✓" if ok else "✗"
                if n_labels is not None:
                    name = _shorten(_class_name(n_labels[row, j], class_names), 14)
                    text = f"{text} {name}"
                left = (j + 1) * GRID_CELL_PX[0] + GRID_GAP_PX
                frame, colour = (
                    (_CORRECT_COLOUR, _CORRECT_TEXT) if ok else (_WRONG_COLOUR, _WRONG_TEXT)
                )
                _draw_cell(fig, neighbours[row, j], left, top, frame, text, colour)
        return _save(fig, path)


# ---------------------------------------------------------------------------------------------
# 2-D projections and embedding maps
# ---------------------------------------------------------------------------------------------


def _umap_available() -> bool:
    """Whether the ``umap`` package (pip install umap-learn) can be imported."""
    return importlib.util.find_spec("umap") is not None


def _check_embeddings(embeddings: Any, name: str = "embeddings") -> np.ndarray:
    """Embeddings as a finite (N, D) float array.

    Args:
      embeddings: an (N, D) array.
      name: the argument's name, for error messages.

    Returns:
      The embeddings as float32 (float64 input stays float64).

    Raises:
      ValueError: if not 2-D with N >= 1 and D >= 1, or not finite.
    """
    x = np.asarray(embeddings)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must have shape (N, D) with N, D >= 1, got {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32)
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} has NaN or infinite values")
    return x


def _resolve_method(method: str, num_points: int) -> str:
    """The projection method to use for ``num_points`` points.

    Args:
      method: one of :data:`PROJECTION_METHODS`.
      num_points: N.

    Returns:
      "umap", "tsne" or "pca".

    Raises:
      ValueError: for an unknown method, or t-SNE/UMAP with fewer than 4 points.
      ImportError: for "umap" when umap-learn is not installed.
    """
    if method not in PROJECTION_METHODS:
        raise ValueError(f"unknown projection method {method!r}; use one of {PROJECTION_METHODS}")
    if method == "auto":
        if num_points < 4:
            return "pca"
        if _umap_available():
            return "umap"
        return "tsne" if num_points <= TSNE_MAX_POINTS else "pca"
    if method == "umap" and not _umap_available():
        raise ImportError(
            "method='umap' needs the umap package, which is not installed: pip install umap-learn "
            "(or use method='tsne' or 'pca')"
        )
    if method in ("umap", "tsne") and num_points < 4:
        raise ValueError(f"method={method!r} needs at least 4 points, got {num_points}")
    return method


def _pca_2d(x: np.ndarray) -> np.ndarray:
    """The first two principal components, with a deterministic sign.

    Args:
      x: (N, D) embeddings.

    Returns:
      (N, 2) coordinates (a zero column when D = 1 or N = 1).
    """
    centred = x.astype(np.float64) - x.mean(0, dtype=np.float64)
    out = np.zeros((len(x), 2))
    if len(x) < 2:
        return out
    _, vectors = np.linalg.eigh(centred.T @ centred)  # ascending eigenvalues
    components = vectors[:, ::-1][:, :2].T  # (<= 2, D)
    pivots = np.abs(components).argmax(1)
    signs = np.sign(components[np.arange(len(components)), pivots])
    components = components * np.where(signs == 0, 1.0, signs)[:, None]
    out[:, : len(components)] = centred @ components.T
    return out


def _tsne_2d(x: np.ndarray, seed: int) -> np.ndarray:
    """t-SNE (PCA initialisation, perplexity min(30, (N - 1) / 3)).

    Args:
      x: (N, D) embeddings, N >= 4.
      seed: the random state.

    Returns:
      (N, 2) coordinates.
    """
    from sklearn.manifold import TSNE

    perplexity = min(30.0, (len(x) - 1) / 3)
    tsne = TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=seed)
    return np.asarray(tsne.fit_transform(x), dtype=np.float64)


def _umap_2d(x: np.ndarray, seed: int) -> np.ndarray:
    """UMAP with default parameters (neighbours clipped to N - 1).

    Args:
      x: (N, D) embeddings, N >= 4.
      seed: the random state.

    Returns:
      (N, 2) coordinates.
    """
    import umap

    reducer = umap.UMAP(n_components=2, n_neighbors=min(15, len(x) - 1), random_state=seed)
    return np.asarray(reducer.fit_transform(x), dtype=np.float64)


def project_2d(embeddings: Any, *, method: str = "auto", seed: int = 0) -> tuple[np.ndarray, str]:
    """Projects embeddings to 2-D for plotting.

    Args:
      embeddings: (N, D) array.
      method: "auto" (UMAP when ``umap`` is importable, else t-SNE for N <= 5000 and PCA beyond;
        PCA for N < 4), or explicitly "umap", "tsne" (sklearn, PCA initialisation, perplexity
        min(30, (N - 1) / 3)) or "pca".
      seed: random state of UMAP / t-SNE.

    Returns:
      ``(coordinates, method)``: an (N, 2) float64 array and the method used.

    Raises:
      ValueError: for a bad shape, non-finite values or an unknown method.
      ImportError: for method="umap" without umap-learn installed.
    """
    x = _check_embeddings(embeddings)
    used = _resolve_method(method, len(x))
    if used == "pca":
        return _pca_2d(x), used
    if used == "tsne":
        return _tsne_2d(x, seed), used
    return _umap_2d(x, seed), used


def _subsample(num_points: int, max_points: int, seed: int) -> np.ndarray:
    """Sorted indices of a deterministic random subset of at most ``max_points`` points.

    Args:
      num_points: N.
      max_points: the cap (>= 1).
      seed: the random seed.

    Returns:
      Indices into the N points.
    """
    if max_points < 1:
        raise ValueError(f"max_points must be >= 1, got {max_points}")
    if num_points <= max_points:
        return np.arange(num_points)
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(num_points, size=max_points, replace=False))


def class_colours(num_classes: int) -> np.ndarray:
    """Distinct RGBA colours for classes.

    tab10 up to 10 classes, tab20 up to 20, beyond that evenly spaced hues taken in a strided
    order, so that classes with neighbouring labels get clearly different colours.

    Args:
      num_classes: the number of classes.

    Returns:
      (num_classes, 4) RGBA array.
    """
    import matplotlib

    if num_classes <= 10:
        return matplotlib.colormaps["tab10"](np.arange(num_classes))
    if num_classes <= 20:
        return matplotlib.colormaps["tab20"](np.arange(num_classes))
    stride = max(1, round(num_classes * 0.382))
    while math.gcd(stride, num_classes) != 1:
        stride += 1
    hues = (np.arange(num_classes) * stride % num_classes) / num_classes
    colours = matplotlib.colormaps["hsv"](hues)
    colours[1::2, :3] *= 0.7  # alternate darker shades for more contrast between neighbours
    return colours


def _check_labels(labels: Any, num_points: int) -> np.ndarray:
    """Labels as a 1-D array of length ``num_points``.

    Args:
      labels: (N,) class labels.
      num_points: N.

    Returns:
      The labels as an array.

    Raises:
      ValueError: if the shape does not match.
    """
    out = np.asarray(labels)
    if out.shape != (num_points,):
        raise ValueError(f"labels must have shape (N,) = ({num_points},), got {out.shape}")
    return out


def _scatter(
    ax: Any, points: np.ndarray, codes: np.ndarray, colours: np.ndarray, seed: int
) -> None:
    """Scatters points coloured by class, in a shuffled drawing order.

    Args:
      ax: the axes.
      points: (n, 2) coordinates.
      codes: (n,) class indices into ``colours``.
      colours: (C, 4) RGBA colours.
      seed: seed of the drawing order (so no class is always drawn on top).
    """
    order = np.random.default_rng(seed).permutation(len(points))
    size = float(np.clip(6000.0 / max(len(points), 1), 3.0, 30.0))
    ax.scatter(
        points[order, 0],
        points[order, 1],
        c=colours[codes[order]],
        s=size,
        alpha=0.75,
        linewidths=0,
    )
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_aspect("equal", adjustable="datalim")


def _legend(
    fig: Any,
    classes: np.ndarray,
    colours: np.ndarray,
    class_names: Sequence[str] | Mapping[Any, str] | None,
) -> None:
    """Adds a class legend outside the axes, on the right (constrained layout).

    Args:
      fig: the figure.
      classes: the distinct class labels.
      colours: their colours.
      class_names: optional names of the labels.
    """
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], marker="o", linestyle="", markersize=6, color=colour) for colour in colours
    ]
    names = [_shorten(_class_name(c, class_names), 22) for c in classes]
    fig.legend(handles, names, loc="outside right upper", fontsize=8, title="class", frameon=False)


def embedding_maps_size(num_heads: int, *, legend: bool) -> tuple[int, int]:
    """The pixel size of an :func:`embedding_maps` figure.

    Args:
      num_heads: the number of panels.
      legend: whether the legend is drawn (at most 20 classes).

    Returns:
      ``(width, height)`` = ``(420 * num_heads + (180 if legend else 0), 480)``.
    """
    width = EMBEDDING_PANEL_PX[0] * num_heads + (EMBEDDING_LEGEND_PX if legend else 0)
    return width, EMBEDDING_PANEL_PX[1]


def embedding_map(
    embeddings: Any,
    labels: Any,
    path: str | os.PathLike[str],
    *,
    method: str = "auto",
    seed: int = 0,
    title: str | None = None,
    max_points: int = 5000,
    class_names: Sequence[str] | Mapping[Any, str] | None = None,
) -> str:
    """A 2-D map of embeddings, coloured by class.

    At most ``max_points`` points (a deterministic random subset) are projected with
    :func:`project_2d` and drawn; the legend is shown for at most 20 classes. The PNG is
    800 x 640 pixels (:data:`EMBEDDING_MAP_PX`).

    Args:
      embeddings: (N, D) array.
      labels: (N,) class labels.
      path: the PNG to write.
      method: projection method, see :func:`project_2d`.
      seed: seed of the subset, the projection and the drawing order.
      title: optional title.
      max_points: the largest number of points drawn.
      class_names: optional names of the labels (a sequence indexed by label, or a mapping).

    Returns:
      ``path``.
    """
    x = _check_embeddings(embeddings)
    y = _check_labels(labels, len(x))
    idx = _subsample(len(x), max_points, seed)
    points, used = project_2d(x[idx], method=method, seed=seed)
    classes, codes = np.unique(y[idx], return_inverse=True)
    colours = class_colours(len(classes))
    with _figure(*EMBEDDING_MAP_PX, layout="constrained") as fig:
        ax = fig.add_subplot()
        _scatter(ax, points, codes, colours, seed)
        legend = len(classes) <= MAX_LEGEND_CLASSES
        note = "" if legend else ", no legend"
        ax.set_title(
            f"{used}, {len(idx)} of {len(x)} points, {len(classes)} classes{note}",
            fontsize=9,
            color="#444444",
        )
        fig.suptitle(title or "Embedding map", fontsize=12)
        if legend:
            _legend(fig, classes, colours, class_names)
        return _save(fig, path)


def embedding_maps(
    embeddings_by_head: Mapping[str, Any],
    labels: Any,
    path: str | os.PathLike[str],
    *,
    method: str = "auto",
    seed: int = 0,
    title: str | None = None,
    max_points: int = 5000,
    class_names: Sequence[str] | Mapping[Any, str] | None = None,
) -> str:
    """2-D maps of several heads' embeddings of the same images, side by side.

    For comparing the heads of DiVA / Sharing Matters or the members of a cohort: every panel
    shows the same subset of points, projected with the same method (resolved once for "auto"),
    coloured by the same class colours. The PNG is ``420 * heads + 180`` x 480 pixels with a
    legend (at most 20 classes) and ``420 * heads`` x 480 without (:func:`embedding_maps_size`).

    Args:
      embeddings_by_head: head name -> (N, D_head) embeddings, the same N images in order.
      labels: (N,) class labels.
      path: the PNG to write.
      method: projection method, see :func:`project_2d`.
      seed: seed of the subset, the projections and the drawing order.
      title: optional overall title.
      max_points: the largest number of points drawn per panel.
      class_names: optional names of the labels (a sequence indexed by label, or a mapping).

    Returns:
      ``path``.

    Raises:
      ValueError: for no heads, or heads with different numbers of points than ``labels``.
    """
    if not embeddings_by_head:
        raise ValueError("embeddings_by_head is empty: give at least one head")
    heads = {
        name: _check_embeddings(e, f"embeddings of {name!r}")
        for name, e in embeddings_by_head.items()
    }
    y = np.asarray(labels)
    for name, x in heads.items():
        if y.shape != (len(x),):
            raise ValueError(
                f"labels must have shape (N,) matching every head; head {name!r} has N = "
                f"{len(x)}, labels have shape {y.shape}"
            )
    n = len(y)
    idx = _subsample(n, max_points, seed)
    used = _resolve_method(method, len(idx))
    classes, codes = np.unique(y[idx], return_inverse=True)
    colours = class_colours(len(classes))
    legend = len(classes) <= MAX_LEGEND_CLASSES
    width, height = embedding_maps_size(len(heads), legend=legend)
    with _figure(width, height, layout="constrained") as fig:
        axes = np.atleast_1d(fig.subplots(1, len(heads)))
        for ax, (name, x) in zip(axes, heads.items(), strict=True):
            points, _ = project_2d(x[idx], method=used, seed=seed)
            _scatter(ax, points, codes, colours, seed)
            ax.set_title(f"{_shorten(name, 40)} (D={x.shape[1]})", fontsize=10)
        details = f"{used}, {len(idx)} of {n} points, {len(classes)} classes"
        fig.suptitle(f"{title} ({details})" if title else details, fontsize=11)
        if legend:
            _legend(fig, classes, colours, class_names)
        return _save(fig, path)


# ---------------------------------------------------------------------------------------------
# Metric records: training curves and spectra
# ---------------------------------------------------------------------------------------------


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    """Reads a JSON-lines file of records, warning about (and skipping) malformed lines.

    Args:
      path: the file.

    Returns:
      The records (JSON objects) in file order.

    Raises:
      FileNotFoundError: if the file does not exist.
      ValueError: if it holds no valid record.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"metrics file not found: {path}")
    records = read_jsonl(path, warn=True)
    if not records:
        raise ValueError(f"metrics file {path} holds no records (empty or all lines malformed)")
    return records


def load_records(
    metrics_path_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], str]:
    """Metric records from a ``metrics.jsonl`` path or given directly.

    Args:
      metrics_path_or_records: the path of a run's ``metrics.jsonl`` (JSON lines), or an
        iterable of record dicts (non-dicts are skipped with a warning).

    Returns:
      ``(records, source)``: the records in order and a description of where they came from
      (the path, or "records") for titles and messages.

    Raises:
      FileNotFoundError: for a missing file.
      ValueError: for an empty file or no records.
    """
    source = metrics_path_or_records
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        return _read_jsonl(path), path
    records = []
    for i, record in enumerate(source):
        if isinstance(record, Mapping):
            records.append(dict(record))
        else:
            warnings.warn(f"record {i} is not a mapping; skipped", stacklevel=3)
    if not records:
        raise ValueError("no metric records given")
    return records, "records"


def _default_title(source: str) -> str:
    """A short title from a metrics path: its run directory's last two path components."""
    if source == "records":
        return ""
    parts = os.path.normpath(os.path.abspath(os.path.dirname(source))).split(os.sep)
    return "/".join(p for p in parts[-2:] if p)


def _series(records: list[dict[str, Any]], key: str, scale: float = 1.0) -> tuple[list, list]:
    """The (step, value) points of ``key`` in records with a numeric step and value, by step.

    Args:
      records: metric records.
      key: the value's key.
      scale: multiplier of the values.

    Returns:
      ``(steps, values)`` sorted by step.
    """
    points = []
    for r in records:
        step, value = _number(r.get("step")), _number(r.get(key))
        if step is not None and value is not None:
            points.append((step, scale * value))
    points.sort(key=lambda p: p[0])
    return [p[0] for p in points], [p[1] for p in points]


def _no_data(ax: Any, text: str) -> None:
    """Writes ``text`` in the middle of an empty panel."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666")
    ax.set_xticks([])
    ax.set_yticks([])


def _plot_losses(ax: Any, train: list[dict[str, Any]]) -> None:
    """Panel 1 of :func:`training_curves`: every loss term over steps.

    Args:
      ax: the axes.
      train: the "train" records.
    """
    keys = list(dict.fromkeys(k for r in train for k in r if "loss" in k))
    drawn = []
    for key in keys:
        steps, values = _series(train, key)
        if not steps:
            continue
        main = key == "loss"
        ax.plot(
            steps,
            values,
            label=key,
            color="black" if main else None,
            linewidth=2.0 if main else 1.2,
            zorder=3 if main else 2,
        )
        drawn.extend(values)
    if not drawn:
        _no_data(ax, "no loss values in the train records")
        return
    if min(drawn) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss" + (" (log scale)" if min(drawn) > 0 else ""))
    ax.set_title("Training losses", fontsize=11)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2 if len(keys) > 6 else 1)


def _plot_evals(ax: Any, evals: list[dict[str, Any]], split: str, metrics: Sequence[str]) -> None:
    """Panel 2 of :func:`training_curves`: eval metrics over steps, other embeddings dashed.

    Args:
      ax: the axes.
      evals: the "eval" records of ``split``.
      split: the split's name (for labels).
      metrics: the metrics to plot.
    """
    if not evals:
        _no_data(ax, f"no evaluations on the {split!r} split")
        return
    main = [r for r in evals if "embedding" not in r]
    others: dict[str, list[dict[str, Any]]] = {}
    for r in evals:
        if "embedding" in r:
            others.setdefault(str(r["embedding"]), []).append(r)
    colours = [f"C{i}" for i in range(10)]
    drawn = False
    for i, metric in enumerate(metrics):
        scale = 100.0 if is_fraction_metric(metric) else 1.0
        colour = colours[i % len(colours)]
        steps, values = _series(main, metric, scale)
        if steps:
            ax.plot(steps, values, color=colour, marker="o", markersize=4, label=metric, zorder=3)
            drawn = True
        for name, records in others.items():
            steps, values = _series(records, metric, scale)
            if steps:
                ax.plot(
                    steps,
                    values,
                    color=colour,
                    linestyle="--",
                    linewidth=1.0,
                    marker=".",
                    alpha=0.6,
                    label=f"{metric} [{_shorten(name, 24)}]",
                )
                drawn = True
    if not drawn:
        _no_data(ax, f"none of {list(metrics)} recorded on the {split!r} split")
        return
    percent = all(is_fraction_metric(m) for m in metrics)
    ax.set_xlabel("step")
    ax.set_ylabel("%" if percent else "value (fractions in %)")
    ax.set_title(f"Evaluation on {split!r} (solid: main head, dashed: others)", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(ax.get_lines()) > 8 else 1)


def _epoch_axis(ax: Any, train: list[dict[str, Any]]) -> None:
    """Adds an epoch axis on top, from the step/epoch ratio of the latest train record.

    Args:
      ax: the axes (x in steps).
      train: the "train" records.
    """
    ratio = next(
        (
            epoch / step
            for r in reversed(train)
            if (step := _number(r.get("step"))) and (epoch := _number(r.get("epoch")))
        ),
        None,
    )
    if ratio is None:
        return
    top = ax.secondary_xaxis("top", functions=(lambda s: s * ratio, lambda e: e / ratio))
    top.set_xlabel("epoch", fontsize=8)
    top.tick_params(labelsize=8)


def training_curves(
    metrics_path_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    split: str = "test",
    metrics: Sequence[str] = ("recall@1", "map@r"),
    title: str | None = None,
) -> str:
    """Plots a run's losses and evaluation metrics over training steps.

    Left: every train-record key containing "loss" (``loss``, ``member1/loss``,
    ``mutual/loss``, ...; bookkeeping such as ``img_s`` or ``valid_fraction`` is left out), on
    a log scale when all values are positive. Right: ``metrics`` of the main head on ``split``
    (fractions in percent), with dashed lines for the other embeddings (records naming an
    ``embedding``: other heads, cohort members, combinations). A panel without data says so.
    The PNG is 1200 x 450 pixels (:data:`TRAINING_CURVES_PX`).

    Args:
      metrics_path_or_records: a run's ``metrics.jsonl`` or its records (see
        :func:`load_records`); malformed lines are skipped with a warning.
      path: the PNG to write.
      split: the evaluation split to plot.
      metrics: the evaluation metrics to plot.
      title: optional title (default: the run directory).

    Returns:
      ``path``.

    Raises:
      FileNotFoundError: if the metrics file does not exist.
      ValueError: if it holds no records.
    """
    records, source = load_records(metrics_path_or_records)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval" and r.get("split") == split]
    with _figure(*TRAINING_CURVES_PX, layout="constrained") as fig:
        loss_ax, eval_ax = fig.subplots(1, 2)
        if train:
            _plot_losses(loss_ax, train)
        else:
            _no_data(loss_ax, "no train records")
        _plot_evals(eval_ax, evals, split, metrics)
        drawn = [ax for ax in (loss_ax, eval_ax) if ax.get_lines()]
        if len(drawn) == 2:  # one step range for both panels
            lows, highs = zip(*(ax.get_xlim() for ax in drawn), strict=True)
            for ax in drawn:
                ax.set_xlim(min(lows), max(highs))
        for ax in drawn:
            _epoch_axis(ax, train)
        heading = title if title is not None else _default_title(source)
        if heading:
            fig.suptitle(heading, fontsize=12)
        return _save(fig, path)


def _rho(records: list[dict[str, Any]], split: str, step: float) -> float | None:
    """The ``rho_spectrum@1`` evaluated on ``split`` at ``step``, if recorded."""
    for r in records:
        if (
            r.get("kind") == "eval"
            and r.get("split") == split
            and "embedding" not in r
            and _number(r.get("step")) == step
            and _number(r.get("rho_spectrum@1")) is not None
        ):
            return _number(r["rho_spectrum@1"])
    return None


def _spectrum_values(record: dict[str, Any]) -> np.ndarray | None:
    """A spectrum record's values normalised to sum 1 (non-positive ones as NaN), or None."""
    raw = record.get("spectrum")
    if not isinstance(raw, list) or not raw:
        return None
    values = np.array([_number(v) if _number(v) is not None else np.nan for v in raw])
    total = np.nansum(np.where(values > 0, values, 0.0))
    if not total > 0:
        return None
    return np.where(values > 0, values / total, np.nan)


def spectrum_plot(
    metrics_path_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    split: str = "train",
    title: str | None = None,
) -> str:
    """Plots the normalised singular-value spectrum of the embeddings (semilog-y).

    The latest "spectrum" record of ``split`` (solid) and, for comparison, the first one
    (dashed) when it is from an earlier step; values are divided by their sum, as the
    spectral decay rho of Roth et al. (ICML 2020) uses them, and rho is shown when recorded.
    The PNG is 700 x 450 pixels (:data:`SPECTRUM_PX`).

    Args:
      metrics_path_or_records: a run's ``metrics.jsonl`` or its records.
      path: the PNG to write.
      split: the split whose spectra to plot.
      title: optional title (default: the run directory and split).

    Returns:
      ``path``.

    Raises:
      FileNotFoundError: if the metrics file does not exist.
      ValueError: if it holds no records, or no spectrum record of ``split``.
    """
    records, source = load_records(metrics_path_or_records)
    spectra = [
        (step, r, values)
        for r in records
        if r.get("kind") == "spectrum"
        and r.get("split") == split
        and (step := _number(r.get("step"))) is not None
        and (values := _spectrum_values(r)) is not None
    ]
    if not spectra:
        available = sorted({str(r.get("split")) for r in records if r.get("kind") == "spectrum"})
        raise ValueError(
            f"{source}: no 'spectrum' records for split {split!r} "
            f"(splits with spectra: {available or 'none'}; set eval.train_metrics to a "
            "rho_spectrum metric to record them)"
        )
    first = min(spectra, key=lambda s: s[0])
    latest = max(reversed(spectra), key=lambda s: s[0])  # the last record of the latest step
    shown = [(latest, "-", None)] + ([(first, "--", "#888888")] if first[0] < latest[0] else [])
    with _figure(*SPECTRUM_PX, layout="constrained") as fig:
        ax = fig.add_subplot()
        for (step, record, values), style, colour in shown:
            label = f"step {step:g}"
            epoch = _number(record.get("epoch"))
            if epoch is not None:
                label += f", epoch {epoch:g}"
            rho = _rho(records, split, step)
            if rho is not None:
                label += f" (rho = {rho:.3f})"
            ax.semilogy(np.arange(1, len(values) + 1), values, style, color=colour, label=label)
        ax.set_xlabel("singular value index (descending)")
        ax.set_ylabel("normalised singular value")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        default = _default_title(source)
        heading = title if title is not None else f"{default} spectrum ({split} split)".strip()
        ax.set_title(heading, fontsize=11)
        return _save(fig, path)


#: Pixel size of the plots over several runs (``jdml report``).
REPORT_PX = (770, 500)


def curves_with_bands(
    series: Sequence[tuple[str, np.ndarray, np.ndarray]],
    path: str | os.PathLike[str],
    *,
    xlabel: str,
    ylabel: str,
) -> bool:
    """One line (the mean over runs) and band (their standard deviation) per named series.

    Args:
      series: ``(label, x (T,), values (runs, T))`` each; empty ones are skipped.
      path: the PNG to write (only if something was drawn).
      xlabel, ylabel: the axis labels.

    Returns:
      Whether a curve was drawn (and the PNG written).
    """
    series = [(label, x, v) for label, x, v in series if len(x)]
    if not series:
        return False
    with _figure(*REPORT_PX, layout="constrained") as fig:
        ax = fig.add_subplot()
        for label, x, values in series:
            mean, std = values.mean(0), values.std(0)
            (line,) = ax.plot(x, mean, marker="o", ms=3, label=f"{label} (n={len(values)})")
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        _save(fig, path)
    return True


def spectra_comparison(
    series: Sequence[tuple[str, np.ndarray]], path: str | os.PathLike[str], *, title: str
) -> bool:
    """Normalised singular-value spectra of several experiments on one semilog-y plot.

    Args:
      series: ``(label, spectrum (D,))`` each.
      path: the PNG to write (only if something was drawn).
      title: the plot's title.

    Returns:
      Whether a spectrum was drawn (and the PNG written).
    """
    if not series:
        return False
    with _figure(*REPORT_PX, layout="constrained") as fig:
        ax = fig.add_subplot()
        for label, spectrum in series:
            ax.semilogy(np.arange(1, len(spectrum) + 1), spectrum, label=label)
        ax.set_xlabel("singular value index")
        ax.set_ylabel("normalised singular value (train embeddings)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        _save(fig, path)
    return True
