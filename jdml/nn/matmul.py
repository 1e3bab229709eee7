"""Matrix products through oneDNN's sgemm on the CPU backend, with their gradients.

:func:`product` is ``op(a) @ op(b)`` of float32 matrices, or of stacks of them (a leading batch
axis), where ``op`` transposes when asked. Its custom VJP expresses both gradients as products
of the same kind with the transposes as flags, so no transposed copy of an operand is made
(XLA's CPU dot copies the transposed operand of a weight gradient first, and runs the batched
products of attention, fused with the softmax's reductions, at about a third of MKL's rate:
``bench/vit_parts.py``).

Its users: the 1x1 convolutions (:mod:`jdml.nn.pointwise`), and a vision transformer's dense
layers (:func:`native_dot_general`, given to ``nn.Dense``) and attention products
(:func:`jdml.models.vit.attention`), each where a run's :class:`jdml.backends.Backends` chose
oneDNN (``backends.conv``) on CPU. GPUs and TPUs never reach them: there the backends choose
XLA's ops. Values equal XLA's dot up to float32 summation order; bfloat16 operands are
multiplied in float32 (exactly widened) and the result rounded to bfloat16, as XLA's CPU dot
of bfloat16 operands computes it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from jdml.native import conv as native


def _call(a: jax.Array, b: jax.Array, trans_a: bool, trans_b: bool) -> jax.Array:
    """``op(a) @ op(b)`` of float32 matrices (2-d) or stacks (3-d) by the native library."""
    call = native.matmul if a.ndim == 2 else native.batched_matmul
    return call(a, b, trans_a=trans_a, trans_b=trans_b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def product(a: jax.Array, b: jax.Array, trans_a: bool = False, trans_b: bool = False) -> jax.Array:
    """``op(a) @ op(b)`` of float32 matrices, or of ``(G, ., .)`` stacks matrix by matrix, by
    oneDNN's sgemm on the CPU backend (``op(m) = m.T`` where ``trans_a`` / ``trans_b`` is set,
    not both), forward pass and both gradients."""
    return _call(a, b, trans_a, trans_b)


def _product_fwd(
    a: jax.Array, b: jax.Array, trans_a: bool, trans_b: bool
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _call(a, b, trans_a, trans_b), (a, b)


def _product_bwd(
    trans_a: bool, trans_b: bool, residuals: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    a, b = residuals
    if trans_a:  # c = a^T b: a's gradient b g^T, b's a g
        return _call(b, g, False, True), _call(a, g, False, False)
    if trans_b:  # c = a b^T: a's gradient g b, b's g^T a
        return _call(g, b, False, False), _call(g, a, True, False)
    return _call(g, b, False, True), _call(a, g, True, False)  # c = a b


product.defvjp(_product_fwd, _product_bwd)


def onednn_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` of float32 matrices by :func:`product` (a's gradient ``g @ b.T``, b's
    ``a.T @ g``)."""
    return product(a, b, False, False)


def float32_product(
    a: jax.Array, b: jax.Array, trans_a: bool = False, trans_b: bool = False, dtype=None
) -> jax.Array:
    """:func:`product` of operands of any float type: widened to float32, the result given
    ``dtype`` (default: ``a``'s)."""
    out = product(a.astype(jnp.float32), b.astype(jnp.float32), trans_a, trans_b)
    return out.astype(dtype or a.dtype)


def native_dot_general(
    lhs: jax.Array,
    rhs: jax.Array,
    dimension_numbers: tuple[tuple[Sequence[int], Sequence[int]], tuple[Sequence[int], ...]],
    precision=None,
    preferred_element_type=None,
) -> jax.Array:
    """``nn.Dense``'s contraction (``lhs``'s last axis with ``rhs``'s first, no batch axes) by
    :func:`float32_product`; any other contraction by ``jax.lax.dot_general``. Pass it as
    ``nn.Dense(..., dot_general=native_dot_general)``: the parameters and their initialisers
    are ``nn.Dense``'s."""
    (contract_lhs, contract_rhs), (batch_lhs, _) = dimension_numbers
    dense = (
        tuple(contract_lhs) == (lhs.ndim - 1,)
        and tuple(contract_rhs) == (0,)
        and rhs.ndim == 2
        and not batch_lhs
    )
    if not dense:
        return jax.lax.dot_general(
            lhs, rhs, dimension_numbers, precision, preferred_element_type=preferred_element_type
        )
    rows = lhs.reshape(-1, lhs.shape[-1])
    out = float32_product(rows, rhs, dtype=preferred_element_type or lhs.dtype)
    return out.reshape(*lhs.shape[:-1], rhs.shape[1])
