"""Circle loss with class labels: every pair of the batch, each similarity weighted by how far it
is from its optimum (Sun et al., CVPR 2020)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.losses.base import Loss, LossOutput, masked_mean, register_loss, valid_fraction
from jdml.losses.npair import masked_logsumexp
from jdml.losses.supcon import scaled_similarities
from jdml.miners.base import Tuples, negative_mask, positive_mask
from jdml.registry import NON_NEGATIVE, POSITIVE, Range


@register_loss
class CircleLoss(Loss):
    """Circle loss (the paper's eq. 6) for each anchor i, with s the cosine similarities of the
    L2-normalised embeddings, s_p over i's positives and s_n over its negatives:

        loss_i = log(1 + sum_n exp(gamma a_n (s_n - m)) sum_p exp(-gamma a_p (s_p - 1 + m)))
        a_p = [1 + m - s_p]_+,   a_n = [s_n + m]_+

    and the loss is the mean of loss_i over the anchors with a positive and a negative. The
    weights a_p and a_n are constants for the gradient, as in the paper's code.

    Attributes:
      margin: relaxation m (0.4, the paper's for fine-grained retrieval).
      gamma: scale (80, the paper's for fine-grained retrieval).

    References:
      Sun, Cheng, Zhang, Zhang, Zheng, Wang, Wei, "Circle Loss: A Unified Perspective of Pair
      Similarity Optimization", CVPR 2020.
    """

    loss_name: ClassVar[str] = "circle"
    needs_miner: ClassVar[bool] = False
    param_ranges: ClassVar[dict[str, Range]] = {"gamma": POSITIVE, "margin": NON_NEGATIVE}

    _: dataclasses.KW_ONLY
    margin: float = 0.4
    gamma: float = 80.0

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
          positive and a negative.
        """
        s, _ = scaled_similarities(embeddings, 1.0)
        positives = positive_mask(labels)
        negatives = negative_mask(labels)
        m = self.margin
        a_p = jax.lax.stop_gradient(jax.nn.relu(1.0 + m - s))
        a_n = jax.lax.stop_gradient(jax.nn.relu(s + m))
        pos = masked_logsumexp(-self.gamma * a_p * (s - (1.0 - m)), positives)
        neg = masked_logsumexp(self.gamma * a_n * (s - m), negatives)
        counted = jnp.any(positives, axis=1) & jnp.any(negatives, axis=1)
        per_anchor = jax.nn.softplus(pos + neg)
        return masked_mean(per_anchor, counted), {"valid_fraction": valid_fraction(counted)}
