"""Retrieval grids: sampled queries and their nearest neighbours, correct ones framed green."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jdml.data.arrays import QueryGallery
from jdml.visualize.figure import class_name, figure, save_png, shorten

# Retrieval grid layout, in pixels.
GRID_CELL_PX = (110, 130)  # one image cell: width, height (image box + label line)
GRID_IMAGE_PX = 96  # the square box an image is fitted into
GRID_GAP_PX = 16  # extra space between the query column and the neighbour columns
GRID_HEADER_PX = 22  # column headings ("query", "1", "2", ...)
GRID_TITLE_PX = 30  # the title band, only when a title is given
GRID_FRAME_PX = 4  # the frame line's width, centred on the image box's edge

_QUERY_COLOUR = "#1f77b4"
_CORRECT_COLOUR = "#2ca02c"
_WRONG_COLOUR = "#d62728"
_CORRECT_TEXT = "#16701a"
_WRONG_TEXT = "#b01a1c"


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


def _rgb(colour: str) -> np.ndarray:
    """A ``#rrggbb`` colour as three floats in [0, 1]."""
    return np.array([int(colour[i : i + 2], 16) for i in (1, 3, 5)], np.float32) / 255.0


def _fitted(image: np.ndarray, box_w: int, box_h: int) -> np.ndarray:
    """(box_h, box_w, 3) float pixels of a [0, 1] image: grey repeated over RGB, enlarged by
    repeating pixels (at 3x or more, as matplotlib shows small images) or resampled."""
    from PIL import Image

    pixels = np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image
    scale = box_w / image.shape[1]
    resample = Image.Resampling.NEAREST if scale >= 3 else Image.Resampling.BILINEAR
    picture = Image.fromarray(np.round(pixels * 255).astype(np.uint8))
    return np.asarray(picture.resize((box_w, box_h), resample), np.float32) / 255.0


def _draw_cell(
    fig: Any,
    canvas: np.ndarray,
    image: np.ndarray,
    left_px: float,
    top_px: float,
    frame: str,
    label: str,
    label_colour: str,
) -> None:
    """Paints one framed image, fitted into the image box, into ``canvas`` (the figure's pixels,
    shown once for the whole grid: one Axes per cell made a grid take seconds), and writes its
    label line below it.

    Args:
      fig: the figure.
      canvas: (height, width, 3) float pixels of the figure, top row first.
      image: (H, W, C) float image in [0, 1].
      left_px: the cell's left edge, in pixels from the figure's left.
      top_px: the cell's top edge, in pixels from the figure's top.
      frame: the frame colour.
      label: the text under the image ("" for none).
      label_colour: the text colour.
    """
    fig_w, fig_h = canvas.shape[1], canvas.shape[0]
    h, w = image.shape[:2]
    scale = GRID_IMAGE_PX / max(h, w)
    box_w, box_h = max(1, round(w * scale)), max(1, round(h * scale))
    x0 = round(left_px + (GRID_CELL_PX[0] - box_w) / 2)
    y0 = round(top_px + 4 + (GRID_IMAGE_PX - box_h) / 2)
    canvas[y0 : y0 + box_h, x0 : x0 + box_w] = _fitted(image, box_w, box_h)
    half, colour = GRID_FRAME_PX // 2, _rgb(frame)
    x1, y1 = x0 + box_w, y0 + box_h
    canvas[y0 - half : y0 + half, x0 - half : x1 + half] = colour
    canvas[y1 - half : y1 + half, x0 - half : x1 + half] = colour
    canvas[y0 - half : y1 + half, x0 - half : x0 + half] = colour
    canvas[y0 - half : y1 + half, x1 - half : x1 + half] = colour
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
    canvas = np.ones((height, width, 3), np.float32)
    with figure(width, height) as fig:
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
            label = "" if q_labels is None else shorten(class_name(q_labels[row], class_names), 16)
            _draw_cell(fig, canvas, queries[row], 0, top, _QUERY_COLOUR, label, "#222222")
            for j in range(k):
                ok = bool(flags[row, j])
                text = "✓" if ok else "✗"
                if n_labels is not None:
                    name = shorten(class_name(n_labels[row, j], class_names), 14)
                    text = f"{text} {name}"
                left = (j + 1) * GRID_CELL_PX[0] + GRID_GAP_PX
                frame, colour = (
                    (_CORRECT_COLOUR, _CORRECT_TEXT) if ok else (_WRONG_COLOUR, _WRONG_TEXT)
                )
                _draw_cell(fig, canvas, neighbours[row, j], left, top, frame, text, colour)
        fig.figimage(canvas, 0, 0, origin="upper", zorder=0)
        return save_png(fig, path)


def _neighbours(
    embeddings: np.ndarray, queries: np.ndarray, references: np.ndarray, k: int, distance: str
) -> np.ndarray:
    """(Q, k) indices of each query's k nearest ``references`` (the query itself excluded)."""
    from jdml.evaluation.knn import knn  # JAX on first use: drawing a grid needs none

    _, found = knn(
        embeddings[queries], embeddings[references], k + 1, exclude_self=False, distance=distance
    )
    found = references[np.asarray(found)]
    rows = [row[row != q][:k] for row, q in zip(found, queries, strict=True)]
    return np.stack(rows)


def split_retrieval_grid(
    data: Any,
    embeddings: np.ndarray,
    path: str,
    *,
    distance: str,
    queries: int = 6,
    neighbours: int = 6,
    seed: int = 0,
    title: str | None = None,
) -> str:
    """The retrieval grid of a split's ``embeddings`` (one row per item of ``data``, an
    :class:`~jdml.data.arrays.ImageSet` or :class:`~jdml.data.arrays.QueryGallery`): ``queries``
    items drawn with ``seed`` (the same ones at every call) and their ``neighbours`` nearest
    among the other items (the gallery for a query/gallery split) by ``distance``, written to
    the PNG ``path``."""
    if isinstance(data, QueryGallery):
        pool, references = np.arange(data.num_queries), np.arange(data.num_queries, len(data))
    else:
        pool = references = np.arange(len(data))
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(pool, min(queries, len(pool)), replace=False))
    k = min(neighbours, len(references) - 1)
    found = _neighbours(np.asarray(embeddings), chosen, references, k, distance)
    labels = np.asarray(data.labels)
    query_images = data.eval_images(chosen)
    neighbour_images = data.eval_images(found.reshape(-1))
    return retrieval_grid(
        query_images,
        neighbour_images.reshape(*found.shape, *query_images.shape[1:]),
        labels[found] == labels[chosen][:, None],
        path,
        query_labels=labels[chosen],
        neighbour_labels=labels[found],
        class_names=list(data.class_names),
        title=title,
    )
