"""1x1 convolution written as a matrix product, which XLA's CPU backend runs much faster.

A 1x1, stride-1 convolution over NHWC maps is the product of the (B*H*W, C_in) matrix of the
input's pixels with the (C_in, C_out) kernel. XLA lowers ``lax.conv_general_dilated`` with a 1x1
kernel on CPU to its generic convolution, whose backward pass (the kernel gradient in
particular) is slow; written as a matmul, forward and both gradients are plain matmuls. On
EfficientNet-Lite0's 1x1 layers at 64 px, batch 112, forward + backward took 1.2-4.3x less time
this way (``bench/bench_depthwise.py --sections pointwise``). GPU and TPU compile both forms to
the same kind of kernel, so one form serves every backend.

``PointwiseConv`` has ``nn.Conv``'s parameter (``kernel`` of shape (1, 1, C_in, C_out), the same
initialiser), so weights converted for ``nn.Conv`` load unchanged and a random init is the same.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp


def pointwise_conv(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x`` (..., C_in) times ``kernel`` (1, 1, C_in, C_out) over the channel axis."""
    k = kernel.reshape(kernel.shape[-2], kernel.shape[-1])
    y = x.reshape(-1, x.shape[-1]) @ k
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
