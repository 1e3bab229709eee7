"""2-D maps of embeddings (UMAP, t-SNE or PCA), one panel per head, coloured by class."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jdml.visualize.figure import class_name, figure, save_png, shorten

EMBEDDING_MAP_PX = (800, 640)  # embedding_map: width, height
EMBEDDING_PANEL_PX = (420, 480)  # embedding_maps: one panel's width, the figure's height
EMBEDDING_LEGEND_PX = 180  # embedding_maps: extra width for the legend (<= 20 classes)

MAX_LEGEND_CLASSES = 20
TSNE_MAX_POINTS = 5000  # "auto" projection: t-SNE up to this many points, PCA beyond
PROJECTION_METHODS = ("auto", "umap", "tsne", "pca")


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
    names = [shorten(class_name(c, class_names), 22) for c in classes]
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
    with figure(*EMBEDDING_MAP_PX, layout="constrained") as fig:
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
        return save_png(fig, path)


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
    with figure(width, height, layout="constrained") as fig:
        axes = np.atleast_1d(fig.subplots(1, len(heads)))
        for ax, (name, x) in zip(axes, heads.items(), strict=True):
            points, _ = project_2d(x[idx], method=used, seed=seed)
            _scatter(ax, points, codes, colours, seed)
            ax.set_title(f"{shorten(name, 40)} (D={x.shape[1]})", fontsize=10)
        details = f"{used}, {len(idx)} of {n} points, {len(classes)} classes"
        fig.suptitle(f"{title} ({details})" if title else details, fontsize=11)
        if legend:
            _legend(fig, classes, colours, class_names)
        return save_png(fig, path)
