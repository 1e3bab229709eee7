"""Bias-free SAME convolution: oneDNN's on CPU where it builds, else XLA's (kernel gradient in
batch pieces on CPU).

On the CPU backend, float32 convolutions with a kernel larger than 1x1 and at least
``ONEDNN_MIN_CHANNELS`` input channels run oneDNN's forward, input-gradient and kernel-gradient
primitives as XLA FFI custom calls (``jdml.native``) when asked (``native``, a run's
:class:`jdml.backends.Backends` ``conv``; XLA's convolution when not). On
the glyph network's layers, forward and backward, they are 1.2-1.8x faster than XLA's
convolutions, and equal to them up to float32 summation order. Under a mesh that splits the
batch over several CPU devices, XLA gathers a custom call's inputs and runs it on the whole
batch on each device: the same values, but no data parallelism for those layers (CPU meshes
are for testing the multi-device code; GPUs and TPUs never take this path).

Where oneDNN is not used, XLA's CPU convolutions are slowest in the backward pass for the
kernel, on wide maps with few channels: on the glyph network's 16x16x32 maps (batch 112), the
kernel gradient of a 3x3 conv took 15 ms against 3.6 ms for the forward pass. The kernel
gradient is a sum over the batch, and summing the gradients of batch pieces gives the same value
(up to float32 summation order): in 8 pieces of 14 images each it took 5.4 ms, and on 8x8x64
maps 4.6-5.1 ms instead of 7.6, while on 4x4 and smaller output maps the pieces were slower
(``bench/bench_train.py --layers`` shows each layer). So there, where the output map has at
least ``PIECES_MIN_POSITIONS`` positions, the kernel gradient is summed over up to
``KERNEL_GRAD_PIECES`` batch pieces; the forward pass and the input gradient stay XLA's
convolution, and other backends keep XLA's kernel gradient too (no measurement there says
otherwise).

A 1x1 kernel is :func:`jdml.nn.pointwise.pointwise_conv`: on the CPU backend a matrix product on
every ``stride``-th pixel, which equals the SAME 1x1 convolution; XLA's convolution elsewhere.

``Conv`` has ``nn.Conv``'s parameter (``kernel`` of shape (k, k, C_in, C_out), the same
initialiser), so a network built with it has the same parameter tree and random init as with
``nn.Conv``, and checkpoints load unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.native import conv as native_conv
from jdml.nn.padding import same_padding
from jdml.nn.pointwise import pointwise_conv
from jdml.platform import platform

# Fewest input channels for which oneDNN's convolution is used. On EfficientNet-Lite0's RGB stem
# (3x3, stride 2, 32 channels, 64 px, batch 112) oneDNN's forward pass and kernel gradient took
# 0.9 + 0.9 ms against XLA's 8.9 + 10.3. The glyph stem (1 channel) keeps XLA's: 0.34 ms
# against oneDNN's 0.53 when measured under glibc's malloc (0.41 + 0.95 against 0.45 + 0.18
# under tcmalloc, jdml/allocator.py).
ONEDNN_MIN_CHANNELS = 3
# Largest number of batch pieces of the kernel gradient on the CPU backend.
KERNEL_GRAD_PIECES = 8
# Smallest output map (height x width) whose kernel gradient is computed in pieces.
PIECES_MIN_POSITIONS = 64


def _xla_conv(x: jax.Array, kernel: jax.Array, stride: int) -> jax.Array:
    """XLA's SAME convolution of NHWC ``x`` with an HWIO ``kernel``."""
    return jax.lax.conv_general_dilated(
        x, kernel, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


def kernel_grad_pieces(batch: int, out_positions: int) -> int:
    """Batch pieces of the kernel gradient: the largest divisor of ``batch`` up to
    ``KERNEL_GRAD_PIECES`` on the CPU backend for output maps of at least
    ``PIECES_MIN_POSITIONS`` positions, else 1."""
    if platform() != "cpu" or out_positions < PIECES_MIN_POSITIONS:
        return 1
    return max(p for p in range(1, KERNEL_GRAD_PIECES + 1) if batch % p == 0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_with_pieces(x: jax.Array, kernel: jax.Array, stride: int, pieces: int) -> jax.Array:
    return _xla_conv(x, kernel, stride)


def _conv_fwd(
    x: jax.Array, kernel: jax.Array, stride: int, pieces: int
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _xla_conv(x, kernel, stride), (x, kernel)


def _conv_bwd(
    stride: int, pieces: int, residuals: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    x, kernel = residuals
    dx = jax.vjp(lambda v: _xla_conv(v, kernel, stride), x)[1](g)[0]
    xs = x.reshape(pieces, -1, *x.shape[1:])
    gs = g.reshape(pieces, -1, *g.shape[1:])
    dk = jnp.zeros_like(kernel)
    for i in range(pieces):  # unrolled: each piece is one XLA kernel-gradient convolution
        dk = dk + jax.vjp(lambda k, i=i: _xla_conv(xs[i], k, stride), kernel)[1](gs[i])[0]
    return dx, dk


_conv_with_pieces.defvjp(_conv_fwd, _conv_bwd)


def _same_padding(x_hw: tuple[int, int], k: tuple[int, int], stride: int) -> native_conv.Padding:
    """The SAME padding ((top, bottom), (left, right)) of a convolution of a ``x_hw`` map with
    a ``k`` kernel."""
    (_, top, bottom), (_, left, right) = (
        same_padding(n, kk, stride) for n, kk in zip(x_hw, k, strict=True)
    )
    return (top, bottom), (left, right)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def onednn_conv(x: jax.Array, kernel: jax.Array, stride: int, groups: int = 1) -> jax.Array:
    """oneDNN's SAME convolution of NHWC float32 ``x`` with an HWIO ``kernel`` of shape (k, k,
    C_in / groups, C_out), as XLA FFI custom calls on the CPU backend (forward pass, input and
    kernel gradients); ``groups`` = C_in = C_out is a depthwise convolution."""
    return _onednn_fwd(x, kernel, stride, groups)[0]


def _onednn_fwd(
    x: jax.Array, kernel: jax.Array, stride: int, groups: int
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    padding = _same_padding(x.shape[1:3], kernel.shape[:2], stride)
    y = native_conv.conv_forward(x, kernel, stride=stride, padding=padding, groups=groups)
    return y, (x, kernel)


def _onednn_bwd(
    stride: int, groups: int, residuals: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    x, kernel = residuals
    k = kernel.shape[:2]
    padding = _same_padding(x.shape[1:3], k, stride)
    dx = native_conv.conv_input_grad(
        g, kernel, x.shape, stride=stride, padding=padding, groups=groups
    )
    if groups > 1 and groups == x.shape[3] == kernel.shape[3]:
        # oneDNN 2.6's own depthwise kernel gradient is its generic kernel for 5x5 kernels and
        # small maps, 10-100x slower than the forward pass
        return dx, native_conv.depthwise_kernel_grad(x, g, k, stride=stride, padding=padding)
    dk = native_conv.conv_kernel_grad(
        x, g, kernel.shape, stride=stride, padding=padding, groups=groups
    )
    return dx, dk


onednn_conv.defvjp(_onednn_fwd, _onednn_bwd)


def conv2d(x: jax.Array, kernel: jax.Array, stride: int = 1, native: bool = False) -> jax.Array:
    """SAME, bias-free 2-D convolution of NHWC ``x`` with an HWIO ``kernel``.

    The values are XLA's convolution's; see the module docstring for how the gradients are
    computed.

    Args:
      x: (B, H, W, C_in) input.
      kernel: (k, k, C_in, C_out) kernel.
      stride: stride in both directions.
      native: oneDNN's kernels where they apply, on the CPU backend only (a run's
        :class:`jdml.backends.Backends` ``conv``); False: XLA's convolution.

    Returns:
      (B, ceil(H / stride), ceil(W / stride), C_out) output.
    """
    if kernel.shape[0] == kernel.shape[1] == 1:
        return pointwise_conv(x, kernel, stride, native)
    if x.shape[-1] >= ONEDNN_MIN_CHANNELS and x.dtype == kernel.dtype == jnp.float32 and native:
        return onednn_conv(x, kernel, stride)
    out_positions = -(-x.shape[1] // stride) * -(-x.shape[2] // stride)
    pieces = kernel_grad_pieces(x.shape[0], out_positions)
    if pieces == 1:
        return _xla_conv(x, kernel, stride)
    return _conv_with_pieces(x, kernel, stride, pieces)


class Conv(nn.Module):
    """A bias-free SAME convolution with ``nn.Conv``'s parameter and initialiser.

    Attributes:
      features: output channels.
      kernel_size: square kernel side.
      strides: stride in both directions.
      dtype: computation dtype (the kernel stays float32).
      kernel_init: the kernel's initialiser (``nn.Conv``'s default).
      native: as :func:`conv2d`.
    """

    features: int
    kernel_size: int = 3
    strides: int = 1
    dtype: jnp.dtype = jnp.float32
    kernel_init: Callable = nn.linear.default_kernel_init
    native: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        k = self.kernel_size
        kernel = self.param("kernel", self.kernel_init, (k, k, x.shape[-1], self.features))
        return conv2d(x.astype(self.dtype), kernel.astype(self.dtype), self.strides, self.native)
