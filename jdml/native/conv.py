"""oneDNN's convolutions and matrix products on the CPU backend, as XLA FFI custom calls
(``dnnl_conv.cc``, ``depthwise.cc``, ``matmul.cc``).

Plain functions of float32 JAX arrays, traceable inside ``jit``; their derivatives are defined
by their callers (``jdml.nn.conv.onednn_conv``, ``jdml.nn.matmul.product``), which
also decide with :func:`jdml.native.switches.onednn_enabled` whether to call them. Every call
maps over a ``vmap`` axis one element at a time.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jdml.native.build import ffi_call

# (top, bottom), (left, right): the zero padding of a convolution's input, per side.
Padding = tuple[tuple[int, int], tuple[int, int]]


def matmul(a: jax.Array, b: jax.Array, *, trans_a: bool, trans_b: bool) -> jax.Array:
    """``op(a) @ op(b)`` of float32 matrices by oneDNN's sgemm (``jdml_dnnl_matmul``), with
    ``op(m) = m.T`` where ``trans_a`` / ``trans_b`` is set."""
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    call = ffi_call(
        "jdml_dnnl_matmul",
        jax.ShapeDtypeStruct((m, n), jnp.float32),
        vmap_method="sequential",
    )
    return call(a, b, trans_a=trans_a, trans_b=trans_b)


def batched_matmul(a: jax.Array, b: jax.Array, *, trans_a: bool, trans_b: bool) -> jax.Array:
    """``op(a[g]) @ op(b[g])`` for every ``g`` of float32 ``(G, ., .)`` stacks by oneDNN's sgemm
    (``jdml_dnnl_batched_matmul``), with ``op`` as in :func:`matmul`."""
    m = a.shape[2] if trans_a else a.shape[1]
    n = b.shape[1] if trans_b else b.shape[2]
    call = ffi_call(
        "jdml_dnnl_batched_matmul",
        jax.ShapeDtypeStruct((a.shape[0], m, n), jnp.float32),
        vmap_method="sequential",
    )
    return call(a, b, trans_a=trans_a, trans_b=trans_b)


def _conv_call(
    target: str,
    shape: tuple[int, ...],
    a: jax.Array,
    b: jax.Array,
    *,
    stride: int,
    padding: Padding,
    groups: int,
) -> jax.Array:
    """One of the three convolution handlers of ``dnnl_conv.cc`` on operands ``a`` and ``b``,
    giving a float32 array of ``shape``."""
    (top, bottom), (left, right) = padding
    call = ffi_call(target, jax.ShapeDtypeStruct(shape, jnp.float32), vmap_method="sequential")
    i64 = np.int64  # FFI attributes are typed
    return call(
        a, b, stride=i64(stride), pad_top=i64(top), pad_bottom=i64(bottom), pad_left=i64(left),
        pad_right=i64(right), groups=i64(groups),
    )  # fmt: skip


def conv_forward(
    x: jax.Array, kernel: jax.Array, *, stride: int, padding: Padding, groups: int
) -> jax.Array:
    """oneDNN's convolution of NHWC float32 ``x`` (B, H, W, C_in) with an HWIO ``kernel`` (k, k,
    C_in / groups, C_out), zero ``padding`` per side and ``stride``: (B, ceil(H / stride),
    ceil(W / stride), C_out) for SAME ``padding``."""
    b, h, w, _ = x.shape
    (top, bottom), (left, right) = padding
    kh, kw = kernel.shape[:2]
    shape = (
        b,
        (h + top + bottom - kh) // stride + 1,
        (w + left + right - kw) // stride + 1,
        kernel.shape[3],
    )
    return _conv_call(
        "jdml_dnnl_conv_fwd", shape, x, kernel, stride=stride, padding=padding, groups=groups
    )


def conv_input_grad(
    g: jax.Array,
    kernel: jax.Array,
    input_shape: tuple[int, ...],
    *,
    stride: int,
    padding: Padding,
    groups: int,
) -> jax.Array:
    """The gradient (of ``input_shape``) of :func:`conv_forward` with respect to its input,
    given the output's gradient ``g``."""
    return _conv_call(
        "jdml_dnnl_conv_bwd_data",
        tuple(input_shape),
        g,
        kernel,
        stride=stride,
        padding=padding,
        groups=groups,
    )


def conv_kernel_grad(
    x: jax.Array,
    g: jax.Array,
    kernel_shape: tuple[int, ...],
    *,
    stride: int,
    padding: Padding,
    groups: int,
) -> jax.Array:
    """The gradient (of ``kernel_shape``) of :func:`conv_forward` with respect to its kernel,
    given its input ``x`` and the output's gradient ``g``."""
    return _conv_call(
        "jdml_dnnl_conv_bwd_weights",
        tuple(kernel_shape),
        x,
        g,
        stride=stride,
        padding=padding,
        groups=groups,
    )


def depthwise_kernel_grad(
    x: jax.Array, g: jax.Array, kernel_hw: tuple[int, int], *, stride: int, padding: Padding
) -> jax.Array:
    """A depthwise convolution's kernel gradient (kh, kw, 1, C) from the native handler
    ``jdml_depthwise_bwd_weights`` (oneDNN 2.6's own is its generic kernel for 5x5 kernels and
    small maps, 10-100x slower than the forward pass), given its NHWC input ``x`` and the
    output's gradient ``g``."""
    (top, _), (left, _) = padding
    call = ffi_call(
        "jdml_depthwise_bwd_weights",
        jax.ShapeDtypeStruct((*kernel_hw, 1, x.shape[3]), jnp.float32),
        vmap_method="sequential",
    )
    return call(x, g, stride=np.int64(stride), pad_top=np.int64(top), pad_left=np.int64(left))
