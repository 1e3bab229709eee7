"""Duplicate images: exact copies and near-copies, within a class and across classes.

A retrieval benchmark is only as clean as its classes are apart. Two images of *different*
classes that are the same picture make a query's first neighbour wrong whatever the model
learns (its twin is the nearest thing there is); two images of *one* class that are the same
picture make a query's first neighbour right whatever the model learns. Both bias Recall@1.

Two images are near-copies when their root-mean-square pixel distance (0-255 scale, over every
pixel and channel of the arrays as stored) is at most ``threshold``; exact copies (distance 0)
are found by their bytes, so every member of an exact group is found however large it is.
Near-copies come from the :func:`jdml.evaluation.knn.knn` search of every image's ``k`` nearest
(float32 scores, confirmed in float64), and groups are the connected components of the
near-copy pairs, so a group of more than ``k + 1`` alike images is still one group.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict

import numpy as np

#: RMS pixel distances (0-255) at which :func:`cross_class_counts` counts images.
COUNT_THRESHOLDS: tuple[float, ...] = (0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 15.0)

#: :func:`neighbours`' result: (RMS distances (N, k), indices (N, k)).
Near = tuple[np.ndarray, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Group:
    """Images (indices, ascending) that are copies or near-copies of each other, with the
    largest RMS distance of a pair that joined them."""

    members: tuple[int, ...]
    max_rms: float

    def classes(self, labels: np.ndarray) -> list[int]:
        return sorted({int(labels[i]) for i in self.members})


def _flat(images: np.ndarray) -> np.ndarray:
    if images.ndim < 2 or images.shape[0] == 0:
        raise ValueError(f"expected a non-empty stack of images, got shape {images.shape}")
    return np.ascontiguousarray(images.reshape(len(images), -1))


def neighbours(images: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every image's ``k`` nearest other images: (RMS distances (N, k) float64, recomputed
    exactly; indices (N, k))."""
    from jdml.backends import resolve_backends  # here: the data modules load without jax
    from jdml.evaluation.knn import knn

    flat = _flat(images)
    k = min(k, len(flat) - 1)
    if k < 1:
        return np.zeros((len(flat), 0)), np.zeros((len(flat), 0), np.int64)
    points = flat.astype(np.float32)
    selection = resolve_backends().knn  # the environment's (no run config here), once
    _, idx = knn(points, points, k, exclude_self=True, selection=selection)
    idx = np.asarray(idx, np.int64)
    dist = np.empty(idx.shape)
    for s in range(0, len(flat), 64):  # float64 (64, k, D) at a time
        x = flat[s : s + 64].astype(np.float64)
        d = x[:, None, :] - flat[idx[s : s + 64]].astype(np.float64)
        dist[s : s + 64] = np.sqrt(np.mean(d * d, axis=2))
    return dist, idx


def find_groups(
    images: np.ndarray, threshold: float, k: int = 16, near: Near | None = None
) -> list[Group]:
    """Groups of two or more images at RMS distance ``<= threshold`` of each other (chained),
    in the order of their first member; ``near`` is :func:`neighbours`' result if at hand."""
    flat = _flat(images)
    parent = list(range(len(flat)))
    worst: dict[int, float] = defaultdict(float)

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def join(i: int, j: int, d: float) -> None:
        a, b = root(i), root(j)
        if a != b:
            a, b = min(a, b), max(a, b)
            parent[b] = a
            worst[a] = max(worst[a], worst.pop(b, 0.0), d)
        else:
            worst[a] = max(worst[a], d)

    by_bytes: dict[bytes, int] = {}
    for i, row in enumerate(flat):
        first = by_bytes.setdefault(hashlib.sha256(row.tobytes()).digest(), i)
        if first != i:
            join(first, i, 0.0)
    if threshold > 0:
        dist, idx = near if near is not None else neighbours(images, k)
        for i, j in zip(*np.nonzero(dist <= threshold), strict=True):
            join(int(i), int(idx[i, j]), float(dist[i, j]))
    members: dict[int, list[int]] = defaultdict(list)
    for i in range(len(flat)):
        members[root(i)].append(i)
    return [Group(tuple(m), round(worst[r], 3)) for r, m in sorted(members.items()) if len(m) > 1]


def split_groups(groups: list[Group], labels: np.ndarray) -> tuple[list[Group], list[Group]]:
    """(groups spanning several classes, groups inside one class)."""
    cross = [g for g in groups if len(g.classes(labels)) > 1]
    within = [g for g in groups if len(g.classes(labels)) == 1]
    return cross, within


def cross_class_counts(
    images: np.ndarray,
    labels: np.ndarray,
    thresholds: tuple[float, ...] = COUNT_THRESHOLDS,
    k: int = 16,
    near: Near | None = None,
) -> dict[str, int]:
    """How many images have an image of another class within each RMS distance (among their
    ``k`` nearest; exact for classes of at most ``k`` images), as ``{"<= t": count}``."""
    dist, idx = near if near is not None else neighbours(images, k)
    other = labels[idx] != labels[:, None]
    nearest = (
        np.where(other, dist, np.inf).min(axis=1) if dist.size else np.full(len(labels), np.inf)
    )
    return {f"<= {t:g}": int((nearest <= t).sum()) for t in thresholds}


def drop_duplicates(
    labels: np.ndarray, groups: list[Group]
) -> tuple[np.ndarray, list[Group], list[Group]]:
    """Which images a clean set keeps: every image of a group spanning several classes is
    dropped (the picture belongs to none of them more than to the others), and a group inside
    one class keeps only its first image (the later ones are copies, not instances).

    Returns:
      (keep mask (N,) bool, the cross-class groups, the within-class groups).
    """
    keep = np.ones(len(labels), bool)
    cross, within = split_groups(groups, labels)
    for g in cross:
        keep[list(g.members)] = False
    for g in within:
        keep[list(g.members[1:])] = False
    return keep, cross, within
