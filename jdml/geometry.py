"""The one L2 normalisation and the named distances of the library.

Losses, miners, samplers, the model's embedding layer, k-means, the kNN search and the metrics
all use these, so that a vector is normalised, and a distance computed, the same way everywhere.

**The normalisation's eps convention:** ``x / max(|x|, eps)`` with ``eps = 1e-12``, the
definition of PyTorch's ``F.normalize`` (which the reference code calls), computed as
``x * rsqrt(max(|x|^2, eps^2))`` so that the value and its gradient are finite at ``x = 0`` (a
zero vector stays zero). Vectors of norm at least ``eps`` are exactly unit-norm up to float
rounding.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

#: The smallest norm a vector is divided by in :func:`l2_normalize`.
NORMALIZE_EPS = 1e-12


def l2_normalize(x: jax.Array, axis: int = -1, *, eps: float = NORMALIZE_EPS) -> jax.Array:
    """``x / max(|x|, eps)`` along ``axis``, with finite gradients at ``x = 0``.

    Args:
      x: float array of any shape.
      axis: the axis along which each vector is normalised.
      eps: lower bound of the norm.

    Returns:
      Array of the shape and dtype of ``x``.
    """
    squared_norm = jnp.sum(jnp.square(x), axis=axis, keepdims=True)
    return x * jax.lax.rsqrt(jnp.maximum(squared_norm, eps * eps))


def squared_norms(x: jax.Array) -> jax.Array:
    """(N, D) -> (N,): ``|x_i|^2``."""
    return jnp.sum(x * x, axis=-1)


def squared_distances(
    x: jax.Array,
    y: jax.Array | None = None,
    *,
    x_sq: jax.Array | None = None,
    y_sq: jax.Array | None = None,
    precision: jax.lax.Precision | None = None,
) -> jax.Array:
    """All squared Euclidean distances by the Gram expansion, clamped at 0.

    ``|x_i|^2 + |y_j|^2 - 2 x_i . y_j``; cheap (one matmul) but not guarded for gradients through
    a square root, so meant for mining, sampling and clustering.

    Args:
      x: (M, D) points.
      y: (N, D) points (default: ``x``).
      x_sq, y_sq: their squared norms (M,) and (N,) if already known.
      precision: of the matmul (``HIGHEST`` where float32 accuracy matters on TPU).

    Returns:
      (M, N) squared distances.
    """
    if x_sq is None:
        x_sq = squared_norms(x)
    if y is None:
        y, y_sq = x, x_sq
    elif y_sq is None:
        y_sq = squared_norms(y)
    dots = x @ y.T if precision is None else jnp.matmul(x, y.T, precision=precision)
    return jnp.maximum(x_sq[:, None] + y_sq[None, :] - 2.0 * dots, 0.0)


def pairwise_distances(x: jax.Array) -> jax.Array:
    """(B, D) -> (B, B) Euclidean distances of float32 ``x`` (Gram expansion, clamped at 0
    before the square root; no gradient guard: for mining).

    References:
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020 (the shared ``pdist`` of its batch miners).
    """
    return jnp.sqrt(squared_distances(x.astype(jnp.float32)))


def squared_distance(a: jax.Array, b: jax.Array) -> jax.Array:
    """Row-wise squared Euclidean distance, (..., D) x (..., D) -> (...); smooth everywhere."""
    return jnp.sum(jnp.square(a - b), axis=-1)


def euclidean_distance(a: jax.Array, b: jax.Array, *, eps: float = 1e-8) -> jax.Array:
    """Row-wise ``sqrt(|a - b|^2 + eps)``: finite gradients at ``a = b`` (duplicates, a = p)."""
    return jnp.sqrt(squared_distance(a, b) + eps)


def guarded_sqrt(sq: jax.Array, floor: float = 0.0) -> jax.Array:
    """``sqrt(sq)`` where ``sq > floor``, else exactly 0 with a zero gradient (rather than the
    NaN gradient of ``sqrt`` at 0): PyTorch's subgradient of a norm at a zero vector."""
    positive = sq > floor
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)


def l2_norms(x: jax.Array) -> jax.Array:
    """Row-wise Euclidean norms ``(..., D) -> (...)``, with a zero gradient at ``x = 0``."""
    return guarded_sqrt(jnp.sum(jnp.square(x), axis=-1))


def norm_distance(a: jax.Array, b: jax.Array) -> jax.Array:
    """Row-wise Euclidean distance ``|a - b|`` without an eps, with gradient 0 at ``a = b``.

    This is ``torch.norm(a - b, p=2, dim=-1)`` of the reference code, including PyTorch's zero
    subgradient at a zero difference.
    """
    return guarded_sqrt(squared_distance(a, b))


def differentiable_distances(x: jax.Array, *, eps: float = 1e-12) -> jax.Array:
    """All Euclidean distances ``(N, D) -> (N, N)`` of float32 ``x`` from explicit differences,
    differentiable everywhere: pairs closer than ``sqrt(eps)`` (the diagonal, duplicates) are
    exactly 0 with a zero gradient."""
    x = x.astype(jnp.float32)
    diff = x[:, None, :] - x[None, :, :]
    return guarded_sqrt(jnp.sum(diff * diff, axis=-1), eps)
