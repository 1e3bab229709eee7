"""Angular loss combined with the N-pair loss (Wang et al. 2017)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize, l2_norms
from jdml.losses.base import (
    Loss,
    LossOutput,
    masked_mean,
    register_loss,
    require_tuples,
    valid_fraction,
)
from jdml.losses.npair import log1p_sum_exp, npair_terms, other_label_mask
from jdml.miners.base import Tuples
from jdml.registry import NON_NEGATIVE, Range

# The reference's clamp of the N-pair exponents.
_REFERENCE_CLAMP = 50.0


def angular_terms(x: jax.Array, tuples: Tuples, alpha_degrees: float) -> jax.Array:
    """Per-anchor angular exponents f_apn against every batch sample n.

    On normalised embeddings, with t = tan(alpha):
    f_apn = 4 t^2 (a + p).n - 2 (1 + t^2) a.p.

    Args:
      x: (B, D) float32 embeddings (normalised here).
      tuples: anchors and positives, (B_t,) each.
      alpha_degrees: angular margin alpha in degrees.

    Returns:
      (B_t, B) float32; the caller masks the negative sets.
    """
    tan_sq = math.tan(math.radians(alpha_degrees)) ** 2
    xn = l2_normalize(x)
    xa, xp = xn[tuples.anchors], xn[tuples.positives]
    a_dot_p = jnp.sum(xa * xp, axis=-1, keepdims=True)
    return 4.0 * tan_sq * ((xa + xp) @ xn.T) - 2.0 * (1.0 + tan_sq) * a_dot_p


@register_loss
class AngularLoss(Loss):
    """Angular loss on normalised embeddings plus the N-pair loss on the raw embeddings.

    For every valid anchor a with its mined positive p and N(a) = all batch samples whose label
    differs from a's (from ``labels``, not from ``tuples.negatives``):

        ang_a   = log(1 + sum_{n in N(a)} exp(f_apn))            (normalised a, p, n)
        npair_a = log(1 + sum_{n in N(a)} exp(x_a.x_n - x_a.x_p))  (raw embeddings)
        loss    = mean_a npair_a + angular_weight * mean_a ang_a + l2_weight * mean_i |x_i|_2

    with f_apn = 4 tan^2(alpha) (a + p).n - 2 (1 + tan^2(alpha)) a.p, the means over valid
    anchors with at least one negative (0 if there is none), and stable log-sum-exps.

    The reference clamps the N-pair exponents to [-50, 50] to keep its plain exp finite, which
    also zeroes the gradient of every negative beyond the clamp. Wang et al.'s objective has no
    clamp, and the stable log-sum-exp here does not need one, so by default there is none;
    ``reference_exponent_clamp`` applies it.

    Attributes:
      alpha: angular margin alpha in degrees (45).
      angular_weight: weight lambda of the angular term (2).
      l2_weight: weight of the mean embedding norm (0.005).
      reference_exponent_clamp: clamp the N-pair exponents to [-50, 50] like the reference.

    References:
      Wang, Zhou, Wen, Liu, Lin, "Deep Metric Learning with Angular Loss", ICCV 2017.
      Sohn, "Improved Deep Metric Learning with Multi-class N-pair Loss Objective", NeurIPS 2016.
      Roth et al., ICML 2020, reference ``criteria/angular.py``.
    """

    loss_name: ClassVar[str] = "angular"
    allowed_miners: ClassVar[tuple[str, ...] | None] = ("npair",)
    needs_miner: ClassVar[bool] = True
    reference_miner: ClassVar[str] = "npair"
    reference_normalize: ClassVar[bool] = False
    param_lr: ClassVar[str | None] = None
    param_ranges: ClassVar[dict[str, Range]] = {
        "alpha": Range(0, 90, open_low=True),
        "angular_weight": NON_NEGATIVE,
        "l2_weight": NON_NEGATIVE,
    }

    _: dataclasses.KW_ONLY
    alpha: float = 45.0
    angular_weight: float = 2.0
    l2_weight: float = 0.005
    reference_exponent_clamp: bool = False

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
          (loss, {"angular", "mean_norm", "npair", "valid_fraction"}): scalar float32 loss; the
          unweighted angular and N-pair means; mean_i |x_i|; the fraction of anchors that count.
        """
        tuples = require_tuples(self.loss_name, tuples)
        x = embeddings.astype(jnp.float32)
        negatives = other_label_mask(labels, tuples.anchors)
        counted = tuples.valid & jnp.any(negatives, axis=-1)

        def anchor_mean(values: jax.Array) -> jax.Array:
            return masked_mean(values, counted)

        exponents = npair_terms(x, tuples)
        if self.reference_exponent_clamp:
            exponents = jnp.clip(exponents, -_REFERENCE_CLAMP, _REFERENCE_CLAMP)
        npair = anchor_mean(log1p_sum_exp(exponents, negatives))
        angular = anchor_mean(log1p_sum_exp(angular_terms(x, tuples, self.alpha), negatives))
        mean_norm = jnp.mean(l2_norms(x))
        loss = npair + self.angular_weight * angular + self.l2_weight * mean_norm
        metrics = {
            "angular": angular,
            "mean_norm": mean_norm,
            "npair": npair,
            "valid_fraction": valid_fraction(counted),
        }
        return loss, metrics
