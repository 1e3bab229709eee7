"""Gradient reversal layer (Ganin & Lempitsky 2015), as used by the adversarial decorrelation.

The layer is the identity in the forward pass and multiplies the incoming gradient by
``-scale`` in the backward pass. Placed between a feature extractor and an adversary, the
adversary's parameters follow the gradient that minimises the objective while everything before
the layer follows the gradient that maximises it, so a single optimiser step plays the min-max
game. DiVA (Milbich et al., ECCV 2020) and "Sharing Matters" (Milbich et al., TPAMI) apply it to
the embedding heads before their learned correlation mapping psi (reversal without scaling, i.e.
``scale = 1``).

References:
  Ganin & Lempitsky, "Unsupervised Domain Adaptation by Backpropagation", ICML 2015.
  Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric Learning",
  ECCV 2020, reference ``criteria/adversarial_separation.py``.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import jax

PyTree = TypeVar("PyTree", bound=Any)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _reverse(x: PyTree, scale: float) -> PyTree:
    return x


def _reverse_fwd(x: PyTree, scale: float) -> tuple[PyTree, None]:
    return x, None


def _reverse_bwd(scale: float, _residual: None, cotangent: PyTree) -> tuple[PyTree]:
    def flip(g: jax.Array) -> jax.Array:
        # Integer leaves carry float0 cotangents, which have no arithmetic: pass them through.
        if g.dtype == jax.dtypes.float0:
            return g
        return -scale * g

    return (jax.tree_util.tree_map(flip, cotangent),)


_reverse.defvjp(_reverse_fwd, _reverse_bwd)


def gradient_reversal(x: PyTree, scale: float = 1.0) -> PyTree:
    """Identity forward; multiplies the gradient by ``-scale`` backward.

    Args:
      x: an array or a pytree of arrays (any float dtype; returned unchanged).
      scale: non-negative Python number (static: it is converted with ``float`` and baked into
        the trace, so it cannot be a traced value). 1 reverses the gradient, 0 blocks it.

    Returns:
      ``x`` itself (same structure, shapes and dtypes). Under differentiation, the cotangent of
      every leaf is multiplied by ``-scale`` (in the leaf's dtype).

    References:
      Ganin & Lempitsky, ICML 2015 (the gradient reversal layer R with factor lambda).
    """
    return _reverse(x, float(scale))
