"""Photo views made on the accelerator, equal to the Pillow views (torchvision's PIL path).

The host draws each view's parameters (:class:`jdml.data.photo_augment.ViewParams`, in
torchvision's order) and turns them into small integer arrays (:func:`view_arrays`); the device
does the pixel work in jitted code (:func:`render`), from uint8 pixels:

* **Crop and resize** follow Pillow's bilinear or bicubic resample exactly. The host computes
  Pillow's fixed-point weights in float64 (:func:`jdml.data.resample.pillow_taps`: the
  antialiasing filter clamped to the crop, as torchvision crops before it resizes); the device
  applies them as two matrix products, each rounded to 8 bits as Pillow's passes are, in
  Pillow's pass order. Each 22-bit weight is split into three parts of at most 8 bits and a
  sign (the bicubic's weights are negative in places; the top part is in [-256, 256]), so every
  product and sum is an integer below 2^24 in magnitude: exact in float32 accumulators, and in
  bfloat16 operands on GPUs and TPUs, whose matrix units then do the work. The result equals
  Pillow's bit for bit.
* **Flip** reverses the order of the horizontal weights (free).
* **Grayscale** is Pillow's integer luma ``(19595 R + 38470 G + 7471 B + 2^15) >> 16``.
* **Brightness, contrast and saturation** are Pillow's ``Image.blend``: ``trunc(d + f * (x -
  d))`` in float32, the product rounded before the add, clipped when ``f > 1``, against black,
  the rounded mean luma, or the photo's own luma. The product is formed from two exact ones
  (:func:`blend`), so a fused multiply-add, which XLA forms on the CPU, cannot skip its
  rounding: exact on every level pair (``python bench/view_fidelity.py --blend``).
* **Hue** goes through Pillow's 8-bit HSV conversions, read from tables Pillow itself filled
  (:func:`hsv_tables`): exact.

A batch's photos arrive as fixed-size uint8 canvases (:class:`Frames`): each photo stored with
its long side along the rows (a landscape photo transposed), so a canvas is (long, short) and a
set of photos at one short side wastes no memory on orientation. Canvases come from the
device-resident photo set or are streamed from the host (:mod:`jdml.data.device_pixels`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from PIL import Image

from jdml.data.photo_augment import ViewParams
from jdml.data.resample import PRECISION_BITS, max_taps, pillow_taps, vertical_first
from jdml.platform import platform

#: The arrays of one view batch (:func:`view_arrays`), each with a leading batch axis.
FIELDS = ("ystart", "ycoef", "xstart", "xcoef", "vfirst", "gray", "ops", "factors")
_CHUNK_BITS = 7  # a 22-bit weight as three parts: bits 14-22, 7-13 and 0-6


@dataclasses.dataclass(frozen=True)
class ViewShape:
    """The static shape of a run's device views (one compilation).

    Attributes:
      size: the output side.
      taps: the most input pixels one output pixel reads (the weights' second axis).
      rows: canvas rows (the longest side of any photo).
      cols: canvas columns (the longest short side of any photo).
      colour: whether views have grayscale and colour jitter (``adv``, ``realistic``).
    """

    size: int
    taps: int
    rows: int
    cols: int
    colour: bool = False


def view_shape(
    size: int,
    rows: int,
    cols: int,
    *,
    resize: int = 0,
    colour: bool = False,
    filter: str = "bilinear",
):
    """The :class:`ViewShape` of ``size`` views of photos on (``rows``, ``cols``) canvases;
    ``resize``: the short side a ``red`` view or the evaluation view first resizes to (the
    weights of the longest resample then fit); ``filter``: the views' resampling filter."""
    longest = max(rows, cols)
    taps = max(max_taps(longest, size, filter), max_taps(longest, resize, filter) if resize else 0)
    return ViewShape(size=size, taps=taps, rows=rows, cols=cols, colour=colour)


@functools.lru_cache(maxsize=4096)
def _padded_taps(
    in_len: int, out_len: int, taps: int, filter: str
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pillow_taps` with the weights padded to ``taps`` columns (cached, read-only)."""
    first, coef = pillow_taps(in_len, out_len, filter)
    if coef.shape[1] > taps:
        raise ValueError(f"a resample of {in_len} to {out_len} reads more than {taps} pixels")
    padded = np.zeros((out_len, taps), np.int32)
    padded[:, : coef.shape[1]] = coef
    padded.flags.writeable = False
    return first, padded


def view_arrays(params: Sequence[ViewParams], shape: ViewShape) -> dict[str, np.ndarray]:
    """The arrays the device needs for one batch of views (the fields of :data:`FIELDS`).

    Args:
      params: each photo's view parameters.
      shape: the run's static view shape.

    Returns:
      ``ystart``/``xstart`` int32 (B, size): the first input row/column of each output row and
      column (photo coordinates; the columns reversed for a flipped view), ``ycoef``/``xcoef``
      int32 (B, size, taps): their weights in units of 2^-22, ``vfirst`` bool (B,): whether
      Pillow runs the vertical pass first, ``gray`` bool (B,), ``ops`` int32 (B, 4): the jitter
      operations in order (-1: none), ``factors`` float32 (B, 4): their factors (hue's as the
      shift of Pillow's 8-bit hue, ``int(f * 255) mod 256``).
    """
    n, s, k = len(params), shape.size, shape.taps
    out = {
        "ystart": np.empty((n, s), np.int32),
        "ycoef": np.empty((n, s, k), np.int32),
        "xstart": np.empty((n, s), np.int32),
        "xcoef": np.empty((n, s, k), np.int32),
        "vfirst": np.empty((n,), bool),
        "gray": np.zeros((n,), bool),
        "ops": np.full((n, 4), -1, np.int32),
        "factors": np.zeros((n, 4), np.float32),
    }
    for i, p in enumerate(params):
        if p.size != s:
            raise ValueError(f"a view of size {p.size} in a batch of size {s}")
        top, left, height, width = p.box
        (wy, wx), (ry, rx) = p.window, p.resized
        first, coef = _padded_taps(height, ry, k, p.filter)
        np.add(first[wy : wy + s], top, out=out["ystart"][i])
        out["ycoef"][i] = coef[wy : wy + s]
        first, coef = _padded_taps(width, rx, k, p.filter)
        cols = slice(wx + s - 1, wx - 1 if wx else None, -1) if p.flip else slice(wx, wx + s)
        np.add(first[cols], left, out=out["xstart"][i])
        out["xcoef"][i] = coef[cols]
        out["vfirst"][i] = vertical_first(height, width, ry, rx)
        if p.gray:
            out["gray"][i] = True
        for j, (op, factor) in enumerate(p.jitter):
            out["ops"][i, j] = op
            out["factors"][i, j] = int(factor * 255) % 256 if op == 3 else factor
    return out


# -- the device side ---------------------------------------------------------------------------


def _dense(start: jax.Array, coef: jax.Array, length: int) -> jax.Array:
    """(size, length) int32 weights from each output's first input and its taps."""
    offset = jnp.arange(length)[None, :] - start[:, None]
    inside = (offset >= 0) & (offset < coef.shape[1])
    picked = jnp.take_along_axis(coef, jnp.clip(offset, 0, coef.shape[1] - 1), axis=1)
    return jnp.where(inside, picked, 0)


def _parts(weights: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """(3, ...) the weights' bits 14-22 (with the sign: floor(w / 2^14), in [-256, 256]), 7-13
    and 0-6, whose weighted sum is the weight: integers exact in ``dtype`` (bfloat16 included)."""
    mask = (1 << _CHUNK_BITS) - 1
    parts = (weights >> 2 * _CHUNK_BITS, (weights >> _CHUNK_BITS) & mask, weights & mask)
    return jnp.stack(parts).astype(dtype)


def _round8(sums: jax.Array) -> jax.Array:
    """Pillow's ``clip8((sum + 2^21) >> 22)`` of the three exact partial sums (3, ...)."""
    s = sums.astype(jnp.int32)
    total = (s[0] << 2 * _CHUNK_BITS) + (s[1] << _CHUNK_BITS) + s[2]
    return jnp.clip((total + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS, 0, 255)


def _matmul_dtype() -> tuple[jnp.dtype, jax.lax.Precision]:
    """bfloat16 operands on accelerators (their matrix units; exact here), float32 at full
    precision on the CPU (which has no fast bfloat16 products)."""
    if platform() == "cpu":
        return jnp.float32, jax.lax.Precision.HIGHEST
    return jnp.bfloat16, jax.lax.Precision.DEFAULT


def _cols_then_rows(pixels: jax.Array, row_w: jax.Array, col_w: jax.Array) -> jax.Array:
    """Pillow's two passes, the canvas columns contracted first: (size, size, 3) int32."""
    dtype, precision = _matmul_dtype()
    einsum = functools.partial(jnp.einsum, precision=precision, preferred_element_type=jnp.float32)
    by_cols = _round8(einsum("ksc,rcz->krsz", _parts(col_w, dtype), pixels)).astype(dtype)
    return _round8(einsum("ksr,rtz->kstz", _parts(row_w, dtype), by_cols))


def _resample(canvas: jax.Array, row_w: jax.Array, col_w: jax.Array, cols_first: jax.Array):
    """Both of Pillow's passes over one (rows, cols, 3) canvas: (size, size, 3) int32.

    ``row_w`` (size, rows) contracts the canvas rows, ``col_w`` (size, cols) its columns; each
    pass is rounded to 8 bits, the columns first where ``cols_first``. A square canvas is
    transposed where the rows come first (the same products, with the weights swapped), so one
    order is computed; otherwise both are, and ``cols_first`` picks one.
    """
    pixels = canvas.astype(_matmul_dtype()[0])
    if canvas.shape[0] == canvas.shape[1]:
        swap = ~cols_first
        pixels = jnp.where(swap, jnp.swapaxes(pixels, 0, 1), pixels)
        row_w, col_w = _pick(swap, (col_w, row_w), (row_w, col_w))
        out = _cols_then_rows(pixels, row_w, col_w)
        return jnp.where(swap, jnp.swapaxes(out, 0, 1), out)
    dtype, precision = _matmul_dtype()
    einsum = functools.partial(jnp.einsum, precision=precision, preferred_element_type=jnp.float32)
    by_rows = _round8(einsum("ksr,rcz->kscz", _parts(row_w, dtype), pixels)).astype(dtype)
    rows_then_cols = _round8(einsum("ktc,scz->kstz", _parts(col_w, dtype), by_rows))
    return jnp.where(cols_first, _cols_then_rows(pixels, row_w, col_w), rows_then_cols)


def luma(pixels: jax.Array) -> jax.Array:
    """Pillow's ``convert("L")`` of int32 (..., 3) RGB: (...,) int32."""
    r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
    return (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16


def _split_factor(factor: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A float32 factor as ``high + low``, exactly: ``high`` its top 12 significand bits,
    ``low`` the other 12, so each times an integer of at most 8 bits is an exact float32."""
    bits = jax.lax.bitcast_convert_type(factor.astype(jnp.float32), jnp.int32)
    high = jax.lax.bitcast_convert_type(bits & jnp.int32(~0xFFF), jnp.float32)
    return high, factor.astype(jnp.float32) - high


def blend(degenerate: jax.Array, pixels: jax.Array, factor: jax.Array) -> jax.Array:
    """Pillow's ``Image.blend(degenerate, image, factor)`` of int32 pixels (0..255), exactly:
    ``d + f * (x - d)`` in float32 with the product rounded before the add, truncated, clipped
    to 0..255 (int32).

    A compiler may fuse ``d + f * diff`` into a multiply-add that skips the product's rounding
    (XLA does on the CPU), which moves a value that lands on an integer one level down. Here the
    product is ``high * diff + low * diff`` (:func:`_split_factor`): both terms are exact, so
    their sum is rounded once, to the float32 product, fused or not; the add of ``d`` then has
    no multiply to fuse with."""
    high, low = _split_factor(factor)
    diff = (pixels - degenerate).astype(jnp.float32)
    product = high * diff + low * diff
    out = degenerate.astype(jnp.float32) + product
    return jnp.clip(jnp.floor(out), 0, 255).astype(jnp.int32)


@functools.lru_cache(maxsize=1)
def hsv_tables() -> tuple[np.ndarray, np.ndarray]:
    """Pillow's 8-bit RGB->HSV and HSV->RGB conversions as tables, filled by Pillow itself:
    (2^24, 2) uint8 hue and saturation of every RGB colour (its value is its maximum), and
    (2^24, 3) uint8 RGB of every HSV triple (index ``(h << 16) | (s << 8) | v``)."""
    every = np.arange(1 << 24, dtype=np.uint32)
    triples = np.stack([every >> 16, (every >> 8) & 255, every & 255], -1).astype(np.uint8)
    image = triples.reshape(4096, 4096, 3)
    hsv = np.asarray(Image.fromarray(image, "RGB").convert("HSV")).reshape(-1, 3)[:, :2]
    rgb = np.asarray(Image.frombytes("HSV", (4096, 4096), image.tobytes()).convert("RGB"))
    return np.ascontiguousarray(hsv), rgb.reshape(-1, 3)


def adjust_hue(pixels: jax.Array, shift: jax.Array, tables: tuple[jax.Array, jax.Array]):
    """Pillow's hue rotation (torchvision's PIL path): the 8-bit hue moved by ``shift``
    (mod 256) in Pillow's HSV, through the tables of :func:`hsv_tables`."""
    to_hsv, to_rgb = tables
    index = (pixels[..., 0] << 16) | (pixels[..., 1] << 8) | pixels[..., 2]
    hs = to_hsv[index].astype(jnp.int32)
    hue = (hs[..., 0] + shift.astype(jnp.int32)) & 255
    value = jnp.max(pixels, axis=-1)
    return to_rgb[(hue << 16) | (hs[..., 1] << 8) | value].astype(jnp.int32)


def _colour(pixels: jax.Array, gray: jax.Array, ops: jax.Array, factors: jax.Array, tables):
    """RandomGrayscale then ColorJitter's operations in their drawn order, on one view."""
    grey3 = lambda x: jnp.repeat(luma(x)[..., None], 3, axis=-1)  # noqa: E731
    pixels = jnp.where(gray, grey3(pixels), pixels)
    count = pixels.shape[0] * pixels.shape[1]
    for j in range(4):
        f = factors[j]
        mean = (2 * jnp.sum(luma(pixels)) + count) // (2 * count)  # int(mean(L) + 0.5)
        candidates = (
            blend(jnp.zeros_like(pixels), pixels, f),
            blend(jnp.full_like(pixels, mean), pixels, f),
            blend(grey3(pixels), pixels, f),
            adjust_hue(pixels, f, tables),
        )
        op = ops[j]
        for index, candidate in enumerate(candidates):
            pixels = jnp.where(op == index, candidate, pixels)
    return pixels


def _pick(flag: jax.Array, when: tuple, otherwise: tuple) -> tuple:
    return tuple(jnp.where(flag, a, b) for a, b in zip(when, otherwise, strict=True))


def render(
    canvases: jax.Array,
    transposed: jax.Array,
    views: dict[str, jax.Array],
    shape: ViewShape,
    tables: tuple[jax.Array, jax.Array] | None = None,
) -> jax.Array:
    """A batch of views on the device: float32 (B, size, size, 3) in [0, 1].

    Args:
      canvases: uint8 (B, rows, cols, 3), each photo with its long side along the rows.
      transposed: bool (B,): whether a canvas holds its photo transposed (a landscape photo).
      views: the arrays of :func:`view_arrays`.
      shape: the static view shape.
      tables: :func:`hsv_tables` on the device (needed when ``shape.colour``).
    """

    def one(canvas, flip_axes, ystart, ycoef, xstart, xcoef, vfirst, gray, ops, factors):
        # The photo's rows lie along the canvas columns of a transposed canvas.
        row_w = _dense(*_pick(flip_axes, (xstart, xcoef), (ystart, ycoef)), shape.rows)
        col_w = _dense(*_pick(flip_axes, (ystart, ycoef), (xstart, xcoef)), shape.cols)
        # Pillow contracts the photo's width first unless ``vfirst``; the width lies along the
        # canvas columns unless the canvas is transposed.
        out = _resample(canvas, row_w, col_w, vfirst == flip_axes)
        out = jnp.where(flip_axes, jnp.swapaxes(out, 0, 1), out)
        if shape.colour:
            out = _colour(out, gray, ops, factors, tables)
        return out

    args = [views[f] for f in FIELDS]
    pixels = jax.vmap(one)(canvases, transposed, *args)
    # ToTensor's x / 255 from a table of correctly rounded quotients: compilers turn a division
    # by a constant into a product with its reciprocal, which differs in the last bit.
    return jnp.asarray(_LEVELS)[pixels]


_LEVELS = np.arange(256, dtype=np.float32) / np.float32(255)
