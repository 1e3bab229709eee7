"""Pillow's bilinear and bicubic resampling as integer taps: what ``Image.resize(..., BILINEAR)``
and ``Image.resize(..., BICUBIC)`` multiply.

Pillow resamples an 8-bit image in two separable passes. For each output index of a pass it
takes a window of input pixels and weights computed in double precision (``precompute_coeffs``
in Pillow's ``Resample.c``: the filter, a triangle of support 1 or Keys' cubic with a = -0.5 and
support 2, widened by the scale when shrinking, so it antialiases), normalises them to sum to
one, and stores them as fixed-point integers with 22 fractional bits, rounded half away from zero
(``normalize_coeffs_8bpc``; the cubic's are negative in places). An output pixel is
``clip8((sum(p * k) + 2^21) >> 22)``, and the first pass is rounded to 8 bits before the second
reads it.

This module computes those integer weights on the host, in float64 exactly as Pillow does, so a
device that applies them with exact integer arithmetic (:mod:`jdml.data.device_views`)
reproduces Pillow's pixels bit for bit. Since Pillow 13 the vertical pass runs first when the
height shrinks more than twice as much as the width (:func:`vertical_first`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import numpy as np
import PIL

#: Fractional bits of Pillow's fixed-point weights (``PRECISION_BITS`` = 32 - 8 - 2).
PRECISION_BITS = 22
_PILLOW = tuple(int(part) for part in PIL.__version__.split(".")[:2])


def _triangle(x: np.ndarray) -> np.ndarray:
    """Pillow's ``bilinear_filter``."""
    return np.maximum(1.0 - np.abs(x), 0.0)


def _cubic(x: np.ndarray) -> np.ndarray:
    """Pillow's ``bicubic_filter`` (Keys' cubic, a = -0.5), in its order of operations."""
    a, x = -0.5, np.abs(x)
    near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


#: The resampling filters by torchvision's names: (support, filter).
FILTERS: dict[str, tuple[float, Callable[[np.ndarray], np.ndarray]]] = {
    "bilinear": (1.0, _triangle),
    "bicubic": (2.0, _cubic),
}


def filter_support(name: str) -> float:
    """The support of filter ``name`` (raises ValueError naming the known ones)."""
    if name not in FILTERS:
        raise ValueError(f"unknown resampling filter {name!r}; known: {', '.join(FILTERS)}")
    return FILTERS[name][0]


def max_taps(in_len: int, out_len: int, filter: str = "bilinear") -> int:
    """Pillow's ``ksize`` for a resample of ``in_len`` pixels to ``out_len``: the most input
    pixels one output pixel reads (``2 * ceil(support) + 1``)."""
    return 2 * math.ceil(filter_support(filter) * max(in_len / out_len, 1.0)) + 1


@functools.lru_cache(maxsize=4096)
def pillow_taps(
    in_len: int, out_len: int, filter: str = "bilinear"
) -> tuple[np.ndarray, np.ndarray]:
    """The integer weights of Pillow's resample of ``in_len`` pixels to ``out_len``.

    Args:
      in_len: input pixels along the axis (a crop's side: torchvision crops, then resizes).
      out_len: output pixels.
      filter: "bilinear" or "bicubic" (:data:`FILTERS`).

    Returns:
      ``first`` int32 (out_len,), the first input pixel each output reads, and ``coef`` int32
      (out_len, max_taps(in_len, out_len, filter)), its weights in units of 2^-22 (zero past
      the window; the bicubic's can be negative). Output ``o`` is ``sum_j coef[o, j] *
      p[first[o] + j]`` before rounding. Read-only (cached).
    """
    if in_len < 1 or out_len < 1:
        raise ValueError(f"cannot resample {in_len} pixels to {out_len}")
    scale = in_len / out_len  # Pillow: (double)(in1 - in0) / outSize, with in0 = 0
    filterscale = max(scale, 1.0)
    support = filter_support(filter) * filterscale
    ksize = math.ceil(support) * 2 + 1
    centre = (np.arange(out_len) + 0.5) * scale
    xmin = np.maximum(np.trunc(centre - support + 0.5), 0).astype(np.int64)
    xmax = np.minimum(np.trunc(centre + support + 0.5), in_len).astype(np.int64) - xmin
    x = np.arange(ksize)
    inside = x[None, :] < xmax[:, None]
    arg = (x[None, :] + xmin[:, None] - centre[:, None] + 0.5) * (1.0 / filterscale)
    weights = np.where(inside, FILTERS[filter][1](arg), 0.0)
    # Pillow sums the weights one after the other in window order: a running sum does too
    # (NumPy's sum is pairwise from 8 terms on).
    total = np.cumsum(weights, axis=1)[:, -1:]
    weights = np.where(total != 0.0, weights / np.where(total != 0.0, total, 1.0), 0.0)
    scaled = weights * (1 << PRECISION_BITS)
    coef = np.trunc(np.where(scaled < 0, scaled - 0.5, scaled + 0.5)).astype(np.int32)
    first, coef = xmin.astype(np.int32), np.where(inside, coef, 0).astype(np.int32)
    first.flags.writeable = coef.flags.writeable = False
    return first, coef


def vertical_first(in_h: int, in_w: int, out_h: int, out_w: int) -> bool:
    """Whether Pillow runs the vertical pass first: since Pillow 13, when the height shrinks
    and by more than twice as many pixels as the width (``ImagingResampleInner``)."""
    if _PILLOW < (13, 0):
        return False
    return (in_h - out_h) > 0 and (in_h - out_h) > (in_w - out_w) * 2


def resample_reference(
    pixels: np.ndarray, out_h: int, out_w: int, filter: str = "bilinear"
) -> np.ndarray:
    """Pillow's resize of a uint8 (H, W, C) array computed from :func:`pillow_taps` in NumPy
    integers: the independent computation the device path and the tests compare with."""

    def one_pass(image: np.ndarray, out_len: int, axis: int) -> np.ndarray:
        if image.shape[axis] == out_len:
            return image
        first, coef = pillow_taps(image.shape[axis], out_len, filter)
        moved = np.moveaxis(image, axis, 0).astype(np.int64)
        index = np.minimum(first[:, None] + np.arange(coef.shape[1]), image.shape[axis] - 1)
        acc = np.einsum("oj,oj...->o...", coef.astype(np.int64), moved[index])
        out = np.clip((acc + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS, 0, 255)
        return np.moveaxis(out.astype(np.uint8), 0, axis)

    height, width = pixels.shape[:2]
    if vertical_first(height, width, out_h, out_w):
        return one_pass(one_pass(pixels, out_h, 0), out_w, 1)
    return one_pass(one_pass(pixels, out_w, 1), out_h, 0)
