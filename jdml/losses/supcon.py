"""Supervised contrastive loss: every other sample of the anchor's class is a positive, against
all other samples of the batch (Khosla et al., NeurIPS 2020)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize
from jdml.losses.base import (
    Loss,
    LossOutput,
    masked,
    masked_mean,
    register_loss,
    safe_divide,
    valid_fraction,
)
from jdml.losses.npair import masked_logsumexp
from jdml.miners.base import Tuples, positive_mask
from jdml.registry import POSITIVE, Range


def scaled_similarities(embeddings: jax.Array, temperature: float) -> tuple[jax.Array, jax.Array]:
    """Cosine similarities of every pair over the temperature, and the mask of the other
    samples (the diagonal left out).

    Args:
      embeddings: (B, D) float.
      temperature: tau > 0.

    Returns:
      ((B, B) float32 s_ij / tau, (B, B) bool: j is not i).
    """
    x = l2_normalize(embeddings.astype(jnp.float32), axis=1)
    others = ~jnp.eye(x.shape[0], dtype=jnp.bool_)
    return (x @ x.T) / temperature, others


@register_loss
class SupConLoss(Loss):
    """SupCon, the paper's L_out: with z the L2-normalised embeddings, A(i) every other sample of
    the batch and P(i) the other samples of i's class,

        loss_i = -1/|P(i)| sum_{p in P(i)} log( exp(z_i.z_p / tau)
                                                 / sum_{a in A(i)} exp(z_i.z_a / tau) )

    and the loss is the mean of loss_i over the anchors with at least one positive (the paper's
    batches hold two views of every image, so every anchor has one). The paper's code scales the
    loss by tau / base_tau, 1 at its defaults; that factor is left out. A batch of one class
    keeps this value (each anchor's softmax over the other B - 1 samples), where
    pytorch-metric-learning's SupConLoss gives 0 and no gradient (it computes only when the batch
    holds a negative pair); with any negative in the batch the two agree.

    Attributes:
      temperature: tau (0.1, the paper's).

    References:
      Khosla, Teterwak, Wang, Sarna, Tian, Isola, Maschinot, Liu, Krishnan, "Supervised
      Contrastive Learning", NeurIPS 2020.
    """

    loss_name: ClassVar[str] = "supcon"
    needs_miner: ClassVar[bool] = False
    param_ranges: ClassVar[dict[str, Range]] = {"temperature": POSITIVE}

    _: dataclasses.KW_ONLY
    temperature: float = 0.1

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int.
          tuples: ignored (every pair of the batch takes part).

        Returns:
          (loss, {"valid_fraction"}): scalar float32 loss; the fraction of anchors with a
          positive.
        """
        logits, others = scaled_similarities(embeddings, self.temperature)
        positives = positive_mask(labels)
        log_prob = logits - masked_logsumexp(logits, others)[:, None]
        num_pos = jnp.sum(positives, axis=1)
        per_anchor = -safe_divide(jnp.sum(masked(log_prob, positives), axis=1), num_pos)
        counted = num_pos > 0
        return masked_mean(per_anchor, counted), {"valid_fraction": valid_fraction(counted)}
