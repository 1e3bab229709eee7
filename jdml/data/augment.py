"""Host-side batch augmentations (NumPy, vectorised over the batch, seeded per batch).

Each augmentation maps a uint8 batch (B, H, W, C) and a ``np.random.Generator`` to float32 images
in [0, 1]. The generator is created from (seed, step), so a batch's augmentation is a pure function
of the run seed and the position in the sample stream (epoch, index), and a resumed run sees exactly
the pixels an uninterrupted one sees.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from jdml.registry import Registry

Augmentation = Callable[[np.ndarray, np.random.Generator], np.ndarray]
AUGMENTATIONS: Registry[Augmentation] = Registry("augmentation")


@AUGMENTATIONS.register("none")
def no_augment(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Converts to float32 in [0, 1] without changing the pixels."""
    del rng
    return images.astype(np.float32) / 255.0


def random_affine_params(
    rng: np.random.Generator,
    n: int,
    *,
    scale: tuple[float, float] = (0.85, 1.15),
    max_shift: float = 0.1,
    max_rotate_deg: float = 8.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Draws per-image affine maps as (n, 2, 2) matrices and (n, 2) shifts (fractions of size)."""
    s = rng.uniform(*scale, size=n)
    a = np.deg2rad(rng.uniform(-max_rotate_deg, max_rotate_deg, size=n))
    cos, sin = np.cos(a), np.sin(a)
    mats = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2) * s[:, None, None]
    shifts = rng.uniform(-max_shift, max_shift, size=(n, 2))
    return mats, shifts


@functools.lru_cache(maxsize=16)
def _centred_grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Every pixel's (row, col) relative to the image centre, as a (H * W, 2) float64 array, and
    the centre itself. Cached per size: the grid is the same for every image of a run."""
    centre = np.array([(h - 1) / 2.0, (w - 1) / 2.0])
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    grid = np.stack([rows, cols], -1).reshape(-1, 2).astype(np.float64) - centre
    grid.flags.writeable = False
    return grid, centre


def warp_affine(images: np.ndarray, mats: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Applies ``y = A (x - c) + c + t * size`` to each image with bilinear sampling.

    Pixels sampled outside the image take the nearest border value (glyph backgrounds are flat, so
    this extends the background).

    Args:
      images: (B, H, W, C) array.
      mats: (B, 2, 2) forward maps in (row, col) coordinates about the image centre.
      shifts: (B, 2) translations as fractions of (H, W).

    Returns:
      (B, H, W, C) float32 array in the input's value range.
    """
    b, h, w, ch = images.shape
    grid, centre = _centred_grid(h, w)
    inv = np.linalg.inv(mats)  # (B, 2, 2)
    rel = grid[None] - shifts[:, None, :] * np.array([h, w])  # (B, P, 2)
    # The source coordinates inv @ rel + c, written out for the 2 x 2 maps.
    r = inv[:, 0, 0, None] * rel[..., 0] + inv[:, 0, 1, None] * rel[..., 1] + centre[0]
    c = inv[:, 1, 0, None] * rel[..., 0] + inv[:, 1, 1, None] * rel[..., 1] + centre[1]
    r0 = np.clip(np.floor(r), 0, h - 1).astype(np.int64)
    c0 = np.clip(np.floor(c), 0, w - 1).astype(np.int64)
    r1, c1 = np.minimum(r0 + 1, h - 1), np.minimum(c0 + 1, w - 1)
    fr = np.clip(r - r0, 0.0, 1.0)[..., None].astype(np.float32)
    fc = np.clip(c - c0, 0.0, 1.0)[..., None].astype(np.float32)
    # Gathers from the flattened batch: row (i * H + r) * W + c is pixel (r, c) of image i.
    flat = images.reshape(b * h * w, ch)
    first = (np.arange(b) * h)[:, None]
    row0, row1 = (first + r0) * w, (first + r1) * w

    def pixels(index: np.ndarray) -> np.ndarray:
        return np.take(flat, index, axis=0).astype(np.float32)

    gc = 1 - fc
    top = pixels(row0 + c0) * gc + pixels(row0 + c1) * fc
    bot = pixels(row1 + c0) * gc + pixels(row1 + c1) * fc
    return (top * (1 - fr) + bot * fr).reshape(images.shape)


@AUGMENTATIONS.register("affine")
def affine_augment(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random scale (0.85-1.15), shift (up to 10% of the size) and rotation (up to 8 degrees).

    No flips: mirrored glyphs are other characters (b/d, p/q).
    """
    mats, shifts = random_affine_params(rng, images.shape[0])
    return warp_affine(images, mats, shifts) / 255.0


def make_augmentation(cfg: Any) -> Augmentation:
    """The training augmentation of the ``data`` config section: ``AUGMENTATIONS[cfg.augment]``
    with the keywords its registration maps to ``data`` keys bound (``config={keyword: key}``:
    the photo augmentations' crop size, ``red``'s resize)."""
    fn = AUGMENTATIONS.get(cfg.augment)
    keys = AUGMENTATIONS.meta(cfg.augment).get("config", {})
    return functools.partial(fn, **{arg: cfg[key] for arg, key in keys.items()}) if keys else fn
