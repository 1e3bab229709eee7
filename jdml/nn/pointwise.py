"""1x1 convolution: a matrix product on the CPU backend, XLA's convolution elsewhere.

A 1x1 convolution over NHWC maps with stride s is the product of the (B*H'*W', C_in) matrix of
the input's every s-th pixel with the (C_in, C_out) kernel (SAME padding adds nothing to a 1x1
kernel). XLA lowers ``lax.conv_general_dilated`` with a 1x1 kernel on CPU to its generic
convolution, whose backward pass (the kernel gradient in particular) is slow; written as a
matmul, forward and both gradients are plain matmuls. On EfficientNet-Lite0's 1x1 layers at
64 px, batch 112, forward + backward took 1.2-4.3x less time this way
(``bench/bench_depthwise.py --sections pointwise``).

GPUs and TPUs keep the convolution (``FORM``): there XLA picks the library kernel for it, and
the matrix form hurts. On an H200 with jax 0.11.2, XLA's Triton GEMM fusion aborted the whole
process while compiling the glyph network (``triton_tiling_propagation.cc: Check failed:
subdim_size_accumulator == dim_size (64 vs. 16)``): it fused the strided slice of an 8x8 map
(64 positions, every other one kept: 16) and the reshape into the product's operand, and its
tiling analysis could not follow the stride. The convolution form is what XLA compiles for
every ResNet-50 layer without trouble.

On the CPU backend, when asked (``native``: a run's :class:`jdml.backends.Backends` ``conv``,
where the native library builds, see ``jdml.native``), float32 products run oneDNN's sgemm
instead of XLA's dot, as the custom call ``jdml_dnnl_matmul`` (forward pass and both
gradients, :mod:`jdml.nn.matmul`), the same values up to float32 summation order: on Lite0's
32 1x1 layers at 64 px, batch 112, forward + backward took 158 ms against 170 for XLA's dot,
and the whole train step gained 4-5% images/s.

``PointwiseConv`` has ``nn.Conv``'s parameter (``kernel`` of shape (1, 1, C_in, C_out), the same
initialiser), so weights converted for ``nn.Conv`` load unchanged and a random init is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.nn.matmul import onednn_matmul
from jdml.platform import platform

Form = Literal["auto", "matmul", "conv"]
FORMS: tuple[Form, ...] = ("auto", "matmul", "conv")


def pointwise_form(form: Form = "auto") -> Form:
    """The form of a 1x1 convolution traced now: ``form``, with "auto" resolved for the default
    backend ("matmul" on CPU, "conv" elsewhere); "matmul" or "conv" force one form."""
    if form not in FORMS:
        raise ValueError(f"unknown pointwise form {form!r}; expected one of {FORMS}")
    if form != "auto":
        return form
    return "matmul" if platform() == "cpu" else "conv"


def pointwise_conv(
    x: jax.Array,
    kernel: jax.Array,
    stride: int = 1,
    native: bool = False,
    form: Form = "auto",
) -> jax.Array:
    """The SAME 1x1 convolution of NHWC ``x`` with ``kernel`` (1, 1, C_in, C_out) and ``stride``:
    ``x[:, ::stride, ::stride] @ kernel`` over the channel axis (see the module docstring for
    the form it takes on each backend: ``form``, "auto" resolved by :func:`pointwise_form`).
    ``native``: oneDNN's matrix product for float32 on CPU (a run's
    :class:`jdml.backends.Backends` ``conv``); False: XLA's dot.

    Returns:
      (B, ceil(H / stride), ceil(W / stride), C_out).
    """
    if pointwise_form(form) == "conv":
        return jax.lax.conv_general_dilated(
            x, kernel, (stride, stride), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
    if stride > 1:
        x = x[:, ::stride, ::stride, :]
    k = kernel.reshape(kernel.shape[-2], kernel.shape[-1])
    rows = x.reshape(-1, x.shape[-1])
    native = native and rows.dtype == k.dtype == jnp.float32
    y = onednn_matmul(rows, k) if native else rows @ k
    return y.reshape(*x.shape[:-1], k.shape[-1])


class PointwiseConv(nn.Module):
    """A bias-free 1x1, stride-1 convolution with ``nn.Conv``'s parameter and initialiser.

    Attributes:
      features: output channels.
      dtype: computation dtype (the kernel stays float32).
      kernel_init: the kernel's initialiser (``nn.Conv``'s default).
      native: as :func:`pointwise_conv`.
    """

    features: int
    dtype: jnp.dtype = jnp.float32
    kernel_init: Callable = nn.linear.default_kernel_init
    native: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param("kernel", self.kernel_init, (1, 1, x.shape[-1], self.features))
        return pointwise_conv(x.astype(self.dtype), kernel.astype(self.dtype), 1, self.native)
