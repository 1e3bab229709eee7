"""Signal-to-noise-ratio triplet loss (Yuan et al. 2019)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.losses.base import (
    Loss,
    LossOutput,
    fraction_of,
    gather_triplets,
    masked,
    masked_mean,
    register_loss,
    require_tuples,
    safe_divide,
    valid_fraction,
)
from jdml.miners.base import Tuples
from jdml.registry import NON_NEGATIVE, Range

# Floor of the anchor's signal variance: an anchor with all coordinates equal has none.
_SIGNAL_VARIANCE_EPS = 1e-12


def unbiased_variance(x: jax.Array) -> jax.Array:
    """Row-wise unbiased variance over the last axis, (N, D) -> (N,); divides by max(D - 1, 1)."""
    centered = x - jnp.mean(x, axis=-1, keepdims=True)
    return jnp.sum(jnp.square(centered), axis=-1) / max(x.shape[-1] - 1, 1)


@register_loss
class SNRLoss(Loss):
    """SNR triplet loss: a triplet hinge on signal-to-noise distances plus a zero-mean regulariser.

    With Var the unbiased variance over the embedding dimensions and, per triplet,

        d_SNR(a, y) = Var(x_y - x_a) / Var(x_a)
        loss = sum_t [d_SNR(a, p) - d_SNR(a, n) + margin]_+ / #{active terms}
               + reg_lambda * mean_t |sum_d x_{a_t, d}|

    where sums, counts and the mean run over valid triplets, 0 / 0 (no active triplet) is 0 and
    Var(x_a) is floored at 1e-12. The regulariser is Yuan et al.'s constraint that embeddings
    have zero mean, so that the noise and signal are independent.

    The reference sets ``reg_lambda`` to 0 whenever the miner is ``distance`` (the default and
    the paper's SNR runs) and keeps it for every other miner, e.g. ``rho_distance``. By default
    the regulariser is always on, as in Yuan et al.; ``reference_distance_miner_switch``
    reproduces the reference.

    Attributes:
      margin: triplet margin on the SNR distances (0.2).
      reg_lambda: weight of the zero-mean regulariser (0.005).
      reference_distance_miner_switch: drop the regulariser when ``miner_name`` is
        ``"distance"``, like the reference.
      miner_name: the configured miner's registry name, filled in by the method.

    References:
      Yuan, Chen, Wang, Yang, Zhang, Feng, "Signal-to-Noise Ratio: A Robust Distance Metric for
      Deep Metric Learning", CVPR 2019. Roth et al., ICML 2020, reference ``criteria/snr.py``.
    """

    loss_name: ClassVar[str] = "snr"
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = True
    reference_miner: ClassVar[str] = "distance"
    param_lr: ClassVar[str | None] = None
    param_ranges: ClassVar[dict[str, Range]] = {"margin": NON_NEGATIVE, "reg_lambda": NON_NEGATIVE}

    _: dataclasses.KW_ONLY
    margin: float = 0.2
    reg_lambda: float = 0.005
    reference_distance_miner_switch: bool = False
    miner_name: str = ""

    @property
    def effective_reg_lambda(self) -> float:
        """The regulariser weight in use (0 under the reference switch with the distance miner)."""
        if self.reference_distance_miner_switch and self.miner_name == "distance":
            return 0.0
        return self.reg_lambda

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int (unused; the tuples already encode the labels).
          tuples: mined triplets, (B_t,) each.

        Returns:
          (loss, {"active_fraction", "regulariser", "valid_fraction"}): scalar float32 loss;
          the fraction of valid triplets with a non-zero hinge; the unweighted regulariser
          mean_t |sum_d x_a|; the fraction of valid triplets.
        """
        tuples = require_tuples(self.loss_name, tuples)
        a, p, n = gather_triplets(embeddings, tuples)
        signal = jnp.maximum(unbiased_variance(a), _SIGNAL_VARIANCE_EPS)
        pos_snr = unbiased_variance(p - a) / signal
        neg_snr = unbiased_variance(n - a) / signal
        valid = tuples.valid
        hinge = masked(jax.nn.relu(pos_snr - neg_snr + self.margin), valid)
        num_active = jnp.sum(hinge > 0)
        num_valid = jnp.sum(valid)
        regulariser = masked_mean(jnp.abs(jnp.sum(a, axis=-1)), valid)
        loss = safe_divide(jnp.sum(hinge), num_active) + self.effective_reg_lambda * regulariser
        metrics = {
            "active_fraction": fraction_of(num_active, num_valid),
            "regulariser": regulariser,
            "valid_fraction": valid_fraction(valid),
        }
        return loss, metrics
