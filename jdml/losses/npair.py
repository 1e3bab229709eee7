"""N-pair loss against every other-class sample (Sohn 2016), and the set helpers of set losses."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.geometry import l2_norms
from jdml.losses.base import (
    Loss,
    LossOutput,
    masked_mean,
    register_loss,
    require_tuples,
    valid_fraction,
)
from jdml.miners.base import Tuples
from jdml.registry import NON_NEGATIVE, Range


def masked_logsumexp(values: jax.Array, mask: jax.Array) -> jax.Array:
    """log sum_j exp(values_j) over the True entries of each row; 0 for an empty row.

    Finite with finite gradients for any mask: masked entries never reach ``exp`` with a large
    argument, and the row maximum is a constant shift (its gradient cancels exactly).

    Args:
      values: (R, C) float.
      mask: (R, C) bool.

    Returns:
      (R,) float.
    """
    row_max = jnp.max(jnp.where(mask, values, -jnp.inf), axis=-1, keepdims=True)
    row_max = jax.lax.stop_gradient(jnp.where(jnp.isfinite(row_max), row_max, 0.0))
    total = jnp.sum(jnp.exp(jnp.where(mask, values - row_max, -jnp.inf)), axis=-1)
    nonempty = jnp.any(mask, axis=-1)
    lse = jnp.log(jnp.where(nonempty, total, 1.0)) + row_max[..., 0]
    return jnp.where(nonempty, lse, 0.0)


def log1p_sum_exp(values: jax.Array, mask: jax.Array) -> jax.Array:
    """log(1 + sum_j exp(values_j)) over the True entries of each row, computed stably.

    Args:
      values: (R, C) float.
      mask: (R, C) bool.

    Returns:
      (R,) float, >= 0 (0 for an empty row).
    """
    zeros = jnp.zeros((*values.shape[:-1], 1), values.dtype)
    ones = jnp.ones((*mask.shape[:-1], 1), bool)
    return masked_logsumexp(
        jnp.concatenate([zeros, values], axis=-1), jnp.concatenate([ones, mask], axis=-1)
    )


def other_label_mask(labels: jax.Array, anchors: jax.Array) -> jax.Array:
    """(B_t, B) bool: True where a batch sample's label differs from the anchor's."""
    return labels[anchors][:, None] != labels[None, :]


def same_label_others_mask(labels: jax.Array, anchors: jax.Array) -> jax.Array:
    """(B_t, B) bool: True for the other samples (by index) sharing the anchor's label."""
    same = labels[anchors][:, None] == labels[None, :]
    return same & (jnp.arange(labels.shape[0])[None, :] != anchors[:, None])


def npair_terms(x: jax.Array, tuples: Tuples) -> jax.Array:
    """Per-anchor exponents x_a.x_n - x_a.x_p against every batch sample n.

    Args:
      x: (B, D) float32 embeddings.
      tuples: anchors and positives, (B_t,) each.

    Returns:
      (B_t, B) float32; the caller masks the negative sets.
    """
    xa, xp = x[tuples.anchors], x[tuples.positives]
    return xa @ x.T - jnp.sum(xa * xp, axis=-1, keepdims=True)


@register_loss
class NPairLoss(Loss):
    """N-pair loss with one positive per anchor and all other-class samples as negatives.

    For every valid anchor a with its mined positive p and N(a) = all batch samples whose label
    differs from a's (taken from ``labels``, not from ``tuples.negatives``):

        l_a  = log(1 + sum_{n in N(a)} exp(x_a.x_n - x_a.x_p))
        loss = mean_a l_a + l2_weight * mean_i |x_i|_2

    computed as a stable log-sum-exp. The regulariser runs over the whole batch and uses the norm
    (not its square); the embeddings are not normalised. The mean is over valid anchors with at
    least one negative, 0 if there is none.

    Sohn's multi-class N-pair loss uses one negative per other class; the Revisiting reference
    (followed here) uses every other-class sample. The reference's division of bninception
    embeddings by 4 is an architecture-specific overflow guard and is not needed with the stable
    log-sum-exp.

    Attributes:
      l2_weight: weight of the mean embedding norm (0.005).

    References:
      Sohn, "Improved Deep Metric Learning with Multi-class N-pair Loss Objective", NeurIPS 2016.
      Roth et al., ICML 2020, reference ``criteria/npair.py``.
    """

    loss_name: ClassVar[str] = "npair"
    allowed_miners: ClassVar[tuple[str, ...] | None] = ("npair",)
    needs_miner: ClassVar[bool] = True
    reference_miner: ClassVar[str] = "npair"
    reference_normalize: ClassVar[bool] = False
    param_lr: ClassVar[str | None] = None
    param_ranges: ClassVar[dict[str, Range]] = {"l2_weight": NON_NEGATIVE}

    _: dataclasses.KW_ONLY
    l2_weight: float = 0.005

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int, defining the negative sets.
          tuples: anchors, one positive each and ``valid``, (B_t,) each (the ``npair`` miner);
            ``tuples.negatives`` is ignored.

        Returns:
          (loss, {"mean_norm", "valid_fraction"}): scalar float32 loss; mean_i |x_i|; the
          fraction of anchors that count.
        """
        tuples = require_tuples(self.loss_name, tuples)
        x = embeddings.astype(jnp.float32)
        negatives = other_label_mask(labels, tuples.anchors)
        per_anchor = log1p_sum_exp(npair_terms(x, tuples), negatives)
        counted = tuples.valid & jnp.any(negatives, axis=-1)
        mean_norm = jnp.mean(l2_norms(x))
        loss = masked_mean(per_anchor, counted) + self.l2_weight * mean_norm
        metrics = {"mean_norm": mean_norm, "valid_fraction": valid_fraction(counted)}
        return loss, metrics
