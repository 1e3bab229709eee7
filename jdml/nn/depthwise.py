"""Depthwise 2-D convolution (one kxk filter per channel) that is fast on CPU.

XLA's CPU backend lowers a grouped convolution with ``feature_group_count == channels`` to a
slow generic loop: for EfficientNet-Lite0's layers it is 13-27x slower than PyTorch, forward and
backward, and it dominates the whole network's step time. Two faster forms, with the same values
up to float32 rounding, are used on CPU; GPU/TPU keep the library convolution.

* ``"onednn"`` (the CPU default where the native library builds, float32): oneDNN's depthwise
  forward pass and input gradient as XLA FFI custom calls (:func:`jdml.nn.conv.onednn_conv` with
  ``groups = C``), and the kernel gradient from the native handler
  ``jdml_depthwise_bwd_weights`` (oneDNN 2.6 runs its generic grouped-convolution kernel there
  for 5x5 kernels and small maps, 10-100x slower than its forward pass). Over Lite0's 16
  depthwise layers at 64 px, forward and backward, 3.0x faster than the shifted sum, and the
  whole train step 1.3x (``bench/bench_depthwise.py``).
* ``"shifted"`` (the CPU fallback): a sum of k*k shifted slices of the padded input times
  per-channel weights, an elementwise loop that XLA fuses into one pass. Its backward pass is
  written by hand (``jax.custom_vjp``): the input gradient is the transposed shifted sum (the
  stride-dilated output gradient against the flipped kernel) and the kernel gradient one
  variadic reduction over shifted input times output gradient. JAX's autodiff of the shifted
  sum (``"shifted_autodiff"``) gives the same values but was 2.3x slower in a whole Lite0 train
  step on CPU (64 px, batch 112: 3.4 s against 1.5 s).

``depthwise_conv2d(x, kernel, stride, impl, native)`` runs ``impl`` (default ``"auto"``:
oneDNN's on the CPU backend with ``native``, a run's :class:`jdml.backends.Backends` ``conv``,
else the shifted sum; XLA's grouped convolution on other backends), decided at trace time.
"""

from __future__ import annotations

import functools
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jdml.nn.conv import onednn_conv
from jdml.nn.padding import same_padding
from jdml.platform import platform

Impl = Literal["auto", "xla", "onednn", "shifted", "shifted_autodiff"]


def _windows(xp: jnp.ndarray, kernel_hw, out_hw, stride: int):
    """The k*k strided windows of the padded input, row-major over the kernel taps: window
    (i, j) is xp[:, i + stride*y, j + stride*x, :] for y < out_h, x < out_w."""
    out_h, out_w = out_hw
    for i in range(kernel_hw[0]):
        for j in range(kernel_hw[1]):
            yield lax.slice(
                xp,
                (0, i, j, 0),
                (xp.shape[0], i + stride * (out_h - 1) + 1, j + stride * (out_w - 1) + 1,
                 xp.shape[3]),
                (1, stride, stride, 1),
            )  # fmt: skip


def _shifted_sum(xp: jnp.ndarray, w: jnp.ndarray, out_hw: tuple[int, int], stride: int):
    """sum_ij xp[:, i + stride*y, j + stride*x, :] * w[i, j, :] for y < out_h, x < out_w."""
    k_h, k_w = w.shape[:2]
    total = None
    for n, window in enumerate(_windows(xp, (k_h, k_w), out_hw, stride)):
        term = window * w[n // k_w, n % k_w]
        total = term if total is None else total + term
    return total


def _pads(x_shape, kernel_hw, stride):
    (out_h, lo_h, hi_h), (out_w, lo_w, hi_w) = (
        same_padding(x_shape[1], kernel_hw[0], stride),
        same_padding(x_shape[2], kernel_hw[1], stride),
    )
    return (out_h, out_w), ((0, 0), (lo_h, hi_h), (lo_w, hi_w), (0, 0))


def _forward(x: jnp.ndarray, w: jnp.ndarray, stride: int) -> jnp.ndarray:
    out_hw, pads = _pads(x.shape, w.shape[:2], stride)
    return _shifted_sum(jnp.pad(x, pads), w, out_hw, stride)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _shifted(x: jnp.ndarray, w: jnp.ndarray, stride: int) -> jnp.ndarray:
    return _forward(x, w, stride)


def _shifted_fwd(x, w, stride):
    return _forward(x, w, stride), (x, w)


def _shifted_bwd(stride, residuals, g):
    x, w = residuals
    k_h, k_w = w.shape[:2]
    (out_h, out_w), pads = _pads(x.shape, (k_h, k_w), stride)
    (lo_h, _), (lo_w, _) = pads[1], pads[2]
    h, wd = x.shape[1], x.shape[2]
    # Input gradient: the transposed convolution, i.e. the stride-1 shifted sum of the output
    # gradient (dilated by the stride, padded to H + k - 1) with the flipped kernel. The high
    # padding may be negative (output rows that only saw padding are cut).
    gp = lax.pad(
        g,
        jnp.zeros((), g.dtype),
        (
            (0, 0, 0),
            (k_h - 1 - lo_h, h + lo_h - stride * (out_h - 1) - 1, stride - 1),
            (k_w - 1 - lo_w, wd + lo_w - stride * (out_w - 1) - 1, stride - 1),
            (0, 0, 0),
        ),
    )
    dx = _shifted_sum(gp, w[::-1, ::-1], (h, wd), 1)
    # Kernel gradient: dw[i, j, c] = sum over batch and space of the shifted input times g. One
    # variadic reduction computes all k*k sums in a single pass over x and g (k*k separate
    # reductions each reread both and are several times slower on CPU). It sums over space
    # only, per image, so that each pass stays in cache; the (k*k, B, C) partial sums are then
    # summed over the batch (2-3x faster than one reduction over batch and space at once).
    xp = jnp.pad(x, pads)
    products = tuple(window * g for window in _windows(xp, (k_h, k_w), (out_h, out_w), stride))
    sums = lax.reduce(
        products,
        tuple(jnp.zeros((), g.dtype) for _ in products),
        lambda a, b: tuple(u + v for u, v in zip(a, b, strict=True)),
        (1, 2),
    )
    dw = jnp.sum(jnp.stack(sums), axis=1).reshape(w.shape)
    return dx, dw


_shifted.defvjp(_shifted_fwd, _shifted_bwd)


def _auto(x: jnp.ndarray, kernel: jnp.ndarray, native: bool = False) -> str:
    """The implementation ``"auto"`` stands for (decided when a function is traced): XLA's off
    the CPU backend; on it oneDNN's for float32 with ``native``, else the shifted sum."""
    if platform() != "cpu":
        return "xla"
    if x.dtype == kernel.dtype == jnp.float32 and native:
        return "onednn"
    return "shifted"


def depthwise_conv2d(
    x: jnp.ndarray,
    kernel: jnp.ndarray,
    stride: int = 1,
    impl: Impl | None = None,
    native: bool = False,
) -> jnp.ndarray:
    """Depthwise convolution with TensorFlow "SAME" padding.

    ``y[b, r, s, c] = sum_ij xp[b, stride*r + i, stride*s + j, c] * kernel[i, j, 0, c]`` where
    ``xp`` is ``x`` padded as ``lax.conv_general_dilated(..., "SAME")`` pads (extra pixel after);
    identical to that convolution with ``feature_group_count=C`` (up to float rounding).

    Args:
      x: input (B, H, W, C).
      kernel: filters (kH, kW, 1, C), the HWIO layout of a grouped ``flax.linen.Conv``.
      stride: the same stride on both spatial axes (EfficientNet uses 1 and 2).
      impl: ``"xla"`` (grouped ``lax.conv_general_dilated``), ``"onednn"`` (oneDNN with the
        native kernel gradient; CPU backend, float32), ``"shifted"`` (the shifted sum with a
        hand-written shifted-sum backward), ``"shifted_autodiff"`` (the shifted sum,
        differentiated by JAX) or ``"auto"`` (None: "auto").
      native: for "auto", oneDNN's on CPU (a run's :class:`jdml.backends.Backends` ``conv``);
        False: the shifted sum there.

    Returns:
      (B, ceil(H / stride), ceil(W / stride), C).
    """
    if kernel.ndim != 4 or kernel.shape[2] != 1 or kernel.shape[3] != x.shape[-1]:
        raise ValueError(f"kernel {kernel.shape} is not a depthwise kernel for input {x.shape}")
    impl = "auto" if impl is None else impl
    if impl == "auto":
        impl = _auto(x, kernel, native)
    if impl == "xla":
        return lax.conv_general_dilated(
            x,
            kernel,
            (stride, stride),
            "SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=x.shape[-1],
        )
    if impl == "onednn":
        return onednn_conv(x, kernel, stride, x.shape[-1])
    w = kernel[:, :, 0, :]
    if impl == "shifted":
        return _shifted(x, w, stride)
    if impl == "shifted_autodiff":
        return _forward(x, w, stride)
    raise ValueError(f"unknown depthwise implementation {impl!r}")


class DepthwiseConv(nn.Module):
    """A bias-free depthwise convolution with "SAME" padding (:func:`depthwise_conv2d`).

    Its parameter is ``kernel`` (kH, kW, 1, C) with ``flax.linen.Conv``'s default init, so it
    is a drop-in for ``nn.Conv(C, (k, k), stride, "SAME", feature_group_count=C,
    use_bias=False)`` (same parameter tree, same initial values).

    Attributes:
      kernel_size: k (square).
      stride: spatial stride.
      dtype: computation dtype (the kernel is stored in float32).
      impl: as :func:`depthwise_conv2d` (None: "auto").
      native: as :func:`depthwise_conv2d`.
    """

    kernel_size: int
    stride: int = 1
    dtype: jnp.dtype = jnp.float32
    impl: Impl | None = None
    native: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        channels = x.shape[-1]
        kernel = self.param(
            "kernel",
            nn.initializers.lecun_normal(),
            (self.kernel_size, self.kernel_size, 1, channels),
            jnp.float32,
        )
        return depthwise_conv2d(
            x.astype(self.dtype), kernel.astype(self.dtype), self.stride, self.impl, self.native
        )
