"""Host-side batch augmentations (NumPy, vectorised over the batch).

Each augmentation maps a uint8 batch (B, H, W, C) and a ``np.random.Generator`` to float32 images
in [0, 1]. The pipeline gives every image its own generator, created from (seed, step, row), so a
batch's augmentation is a pure function of the run seed and the position in the sample stream,
and a resumed run sees exactly the pixels an uninterrupted one sees. An augmentation whose
randomness is a few uniform draws per image also has a batched form (:data:`PER_ROW_DRAWS`): the
pipeline draws every image's numbers at once and augments the batch in one call, with the pixels
of one call per image.
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
    a = rng.uniform(-max_rotate_deg, max_rotate_deg, size=n)
    shifts = rng.uniform(-max_shift, max_shift, size=(n, 2))
    return affine_maps(s, a, shifts)


def affine_maps(
    scales: np.ndarray, degrees: np.ndarray, shifts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(n, 2, 2) maps (rotation by ``degrees`` times ``scales``) and the (n, 2) shifts."""
    a = np.deg2rad(degrees)
    cos, sin = np.cos(a), np.sin(a)
    mats = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
    return mats * scales[:, None, None], shifts


@functools.lru_cache(maxsize=16)
def _centred_grid(h: int, w: int) -> tuple[np.ndarray, np.ndarray, tuple[float, float]]:
    """Every pixel's row and column relative to the image centre, as two (H * W,) float64
    arrays, and the centre itself. Cached per size: the grid is the same for every image."""
    centre = ((h - 1) / 2.0, (w - 1) / 2.0)
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    grid_r = rows.reshape(-1).astype(np.float64) - centre[0]
    grid_c = cols.reshape(-1).astype(np.float64) - centre[1]
    grid_r.flags.writeable = grid_c.flags.writeable = False
    return grid_r, grid_c, centre


#: Pixels warped per pass: the (pixels,) float64 temporaries of a pass then stay in the cache.
_WARP_PIXELS = 16384


def warp_affine(images: np.ndarray, mats: np.ndarray, shifts: np.ndarray) -> np.ndarray:
    """Applies ``y = A (x - c) + c + t * size`` to each image with bilinear sampling.

    Pixels sampled outside the image take the nearest border value (glyph backgrounds are flat, so
    this extends the background). Each image's pixels depend on its own map alone: warping a batch
    equals warping its images one at a time, bit for bit.

    Args:
      images: (B, H, W, C) array.
      mats: (B, 2, 2) forward maps in (row, col) coordinates about the image centre.
      shifts: (B, 2) translations as fractions of (H, W).

    Returns:
      (B, H, W, C) float32 array in the input's value range.
    """
    b, h, w, ch = images.shape
    chunk = max(1, _WARP_PIXELS // (h * w))
    if b > chunk:  # cache-sized pieces: several times faster than one pass over a large batch
        parts = [
            warp_affine(images[i : i + chunk], mats[i : i + chunk], shifts[i : i + chunk])
            for i in range(0, b, chunk)
        ]
        return np.concatenate(parts)
    grid_r, grid_c, centre = _centred_grid(h, w)
    inv = np.linalg.inv(mats)  # (B, 2, 2)
    # The source coordinates inv @ (x - c - t * size) + c, written out for the 2 x 2 maps.
    rel_r = grid_r - (shifts[:, 0] * h)[:, None]  # (B, P)
    rel_c = grid_c - (shifts[:, 1] * w)[:, None]
    r = inv[:, 0, 0, None] * rel_r + inv[:, 0, 1, None] * rel_c + centre[0]
    c = inv[:, 1, 0, None] * rel_r + inv[:, 1, 1, None] * rel_c + centre[1]
    # np.clip's bounds without its overhead (the coordinates are finite).
    r0 = np.minimum(np.maximum(np.floor(r), 0), h - 1).astype(np.int64)
    c0 = np.minimum(np.maximum(np.floor(c), 0), w - 1).astype(np.int64)
    fr = np.minimum(np.maximum(r - r0, 0.0), 1.0).astype(np.float32)[..., None]
    fc = np.minimum(np.maximum(c - c0, 0.0), 1.0).astype(np.float32)[..., None]
    # Gathers from the flattened batch: row (i * H + r) * W + c is pixel (r, c) of image i.
    flat = images.reshape(b * h * w, ch).astype(np.float32)
    row0 = (r0 + (np.arange(b) * h)[:, None]) * w
    row1 = row0 + np.where(r0 < h - 1, w, 0)
    c1 = c0 + (c0 < w - 1)

    def pixels(index: np.ndarray) -> np.ndarray:
        return np.take(flat, index, axis=0)

    gc = 1 - fc
    top = pixels(row0 + c0) * gc + pixels(row0 + c1) * fc
    bot = pixels(row1 + c0) * gc + pixels(row1 + c1) * fc
    return (top * (1 - fr) + bot * fr).reshape(images.shape)


#: The affine augmentation's ranges: scale, shift (a fraction of the size), rotation (degrees).
AFFINE_SCALE, AFFINE_SHIFT, AFFINE_DEGREES = (0.85, 1.15), 0.1, 8.0


@AUGMENTATIONS.register("affine")
def affine_augment(images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random scale (0.85-1.15), shift (up to 10% of the size) and rotation (up to 8 degrees).

    No flips: mirrored glyphs are other characters (b/d, p/q).
    """
    mats, shifts = random_affine_params(
        rng,
        images.shape[0],
        scale=AFFINE_SCALE,
        max_shift=AFFINE_SHIFT,
        max_rotate_deg=AFFINE_DEGREES,
    )
    return warp_affine(images, mats, shifts) / 255.0


def _uniform(low: float, high: float, draws: np.ndarray) -> np.ndarray:
    """NumPy's ``rng.uniform(low, high)`` from its ``rng.random()`` draws."""
    return low + (high - low) * draws


def affine_rows(images: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """:func:`affine_augment` of each image with its own generator, from the generators' first
    4 doubles ``draws`` (B, 4): row i equals ``affine_augment(images[i:i + 1], rng_i)``."""
    mats, shifts = affine_maps(
        _uniform(*AFFINE_SCALE, draws[:, 0]),
        _uniform(-AFFINE_DEGREES, AFFINE_DEGREES, draws[:, 1]),
        _uniform(-AFFINE_SHIFT, AFFINE_SHIFT, draws[:, 2:4]),
    )
    return warp_affine(images, mats, shifts) / 255.0


#: Augmentations whose per-image randomness is a few uniform draws: augmentation -> (draws per
#: image, the function of the (B, H, W, C) images and their (B, draws) doubles). The pipeline
#: draws every row's doubles at once (``jdml.data.pipeline.row_uniforms``) and augments the
#: batch in one call, with the values of one call per image.
PER_ROW_DRAWS: dict[Augmentation, tuple[int, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    no_augment: (0, lambda images, draws: no_augment(images, None)),
    affine_augment: (4, affine_rows),
}


def make_augmentation(cfg: Any) -> Augmentation:
    """The training augmentation of the ``data`` config section: ``AUGMENTATIONS[cfg.augment]``
    with the keywords its registration maps to ``data`` keys bound (``config={keyword: key}``:
    the photo augmentations' crop size, ``red``'s resize)."""
    fn = AUGMENTATIONS.get(cfg.augment)
    keys = AUGMENTATIONS.meta(cfg.augment).get("config", {})
    return functools.partial(fn, **{arg: cfg[key] for arg, key in keys.items()}) if keys else fn
