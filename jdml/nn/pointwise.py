"""1x1 convolution written as a matrix product, which XLA's CPU backend runs much faster.

A 1x1, stride-1 convolution over NHWC maps is the product of the (B*H*W, C_in) matrix of the
input's pixels with the (C_in, C_out) kernel. XLA lowers ``lax.conv_general_dilated`` with a 1x1
kernel on CPU to its generic convolution, whose backward pass (the kernel gradient in
particular) is slow; written as a matmul, forward and both gradients are plain matmuls. On
EfficientNet-Lite0's 1x1 layers at 64 px, batch 112, forward + backward took 1.2-4.3x less time
this way (``bench/bench_depthwise.py --sections pointwise``). GPU and TPU compile both forms to
the same kind of kernel, so one form serves every backend.

On the CPU backend, where the native library builds (``jdml.nn.native``; ``$JDML_CONV=xla``
turns it off), float32 products run oneDNN's sgemm instead of XLA's dot, as the custom call
``jdml_dnnl_matmul`` (forward pass and both gradients), the same values up to float32
summation order: on Lite0's 32 1x1 layers at 64 px, batch 112, forward + backward took 158 ms
against 170 for XLA's dot, and the whole train step gained 4-5% images/s.

``PointwiseConv`` has ``nn.Conv``'s parameter (``kernel`` of shape (1, 1, C_in, C_out), the same
initialiser), so weights converted for ``nn.Conv`` load unchanged and a random init is the same.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.nn import native


def _matmul_call(a: jax.Array, b: jax.Array, trans_a: bool, trans_b: bool) -> jax.Array:
    """``op(a) @ op(b)`` of float32 matrices by the native ``jdml_dnnl_matmul``."""
    native.library()  # registers the target (compiled once per machine)
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    call = jax.ffi.ffi_call(
        "jdml_dnnl_matmul", jax.ShapeDtypeStruct((m, n), jnp.float32), vmap_method="sequential"
    )
    return call(a, b, trans_a=trans_a, trans_b=trans_b)


@jax.custom_vjp
def onednn_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` of float32 matrices through oneDNN's sgemm on the CPU backend, forward pass and
    both gradients (``a``'s: ``g @ b.T``; ``b``'s: ``a.T @ g``)."""
    return _matmul_call(a, b, False, False)


def _matmul_fwd(a: jax.Array, b: jax.Array) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _matmul_call(a, b, False, False), (a, b)


def _matmul_bwd(
    residuals: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    a, b = residuals
    return _matmul_call(g, b, False, True), _matmul_call(a, g, True, False)


onednn_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def pointwise_conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x`` (..., C_in) times ``kernel`` (1, 1, C_in, C_out) over the channel axis."""
    k = kernel.reshape(kernel.shape[-2], kernel.shape[-1])
    rows = x.reshape(-1, x.shape[-1])
    if rows.dtype == k.dtype == jnp.float32 and native.onednn_enabled():
        y = onednn_matmul(rows, k)
    else:
        y = rows @ k
    return y.reshape(*x.shape[:-1], k.shape[-1])


class PointwiseConv(nn.Module):
    """A bias-free 1x1, stride-1 convolution with ``nn.Conv``'s parameter and initialiser.

    Attributes:
      features: output channels.
      dtype: computation dtype (the kernel stays float32).
      kernel_init: the kernel's initialiser (``nn.Conv``'s default).
    """

    features: int
    dtype: jnp.dtype = jnp.float32
    kernel_init: Callable = nn.linear.default_kernel_init

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (1, 1, x.shape[-1], self.features))
        return pointwise_conv(x.astype(self.dtype), kernel.astype(self.dtype))
