"""Multi-similarity loss with its built-in pair mining (Wang et al. 2019)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.losses.base import (
    Loss,
    LossOutput,
    fraction_of,
    masked_mean,
    register_loss,
    valid_fraction,
)
from jdml.losses.npair import log1p_sum_exp
from jdml.miners.base import Tuples, negative_mask, positive_mask
from jdml.registry import NON_NEGATIVE, POSITIVE, Range


def mine_pairs(
    similarity: jax.Array, labels: jax.Array, margin: float
) -> tuple[jax.Array, jax.Array]:
    """The multi-similarity pair mining: informative positives and negatives per anchor.

    With P(i) = the other samples of i's label and N(i) = the samples of other labels, keeps
    n in N(i) with s_in + margin > min_{p in P(i)} s_ip and p in P(i) with
    s_ip - margin < max_{n in N(i)} s_in. Anchors with an empty P(i) or N(i) keep nothing.

    Args:
      similarity: (B, B) float similarities (no gradient flows through the selection).
      labels: (B,) int.
      margin: the mining margin epsilon.

    Returns:
      ``(positives, negatives)``: (B, B) bool kept pairs, anchors along the rows.
    """
    s = jax.lax.stop_gradient(similarity)
    positives = positive_mask(labels)
    negatives = negative_mask(labels)
    hardest_pos = jnp.min(jnp.where(positives, s, jnp.inf), axis=-1, keepdims=True)
    hardest_neg = jnp.max(jnp.where(negatives, s, -jnp.inf), axis=-1, keepdims=True)
    kept_neg = negatives & (s + margin > hardest_pos)
    kept_pos = positives & (s - margin < hardest_neg)
    return kept_pos, kept_neg


@register_loss
class MultiSimilarityLoss(Loss):
    """Multi-similarity loss on the batch similarity matrix S = X X^T, mining its own pairs.

    After the pair mining of ``mine_pairs`` (margin epsilon), for every anchor i with kept
    positives P'(i) and kept negatives N'(i):

        l_i  = 1/alpha log(1 + sum_{p in P'(i)} exp(-alpha (s_ip - lambda)))
             + 1/beta  log(1 + sum_{n in N'(i)} exp(beta (s_in - lambda)))
        loss = mean over anchors with non-empty P'(i) and N'(i) of l_i

    with stable log-sum-exps. Anchors whose kept positives or kept negatives are empty are
    skipped, as in the reference; if every anchor is skipped the loss is 0 (the reference
    crashes there, and also on a class with a single sample in the batch).

    Attributes:
      pos_weight: alpha, the scale of the positive similarities (2).
      neg_weight: beta, the scale of the negative similarities (40).
      margin: epsilon, the mining margin (0.1).
      thresh: lambda, the similarity threshold (0.5).

    References:
      Wang, Han, Huang, Dong, Scott, "Multi-Similarity Loss with General Pair Weighting for Deep
      Metric Learning", CVPR 2019. Roth et al., ICML 2020, reference
      ``criteria/multisimilarity.py``.
    """

    loss_name: ClassVar[str] = "multisimilarity"
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = False
    param_lr: ClassVar[str | None] = None
    param_ranges: ClassVar[dict[str, Range]] = {
        "margin": NON_NEGATIVE,
        "neg_weight": POSITIVE,
        "pos_weight": POSITIVE,
        "thresh": Range(-1, 1),
    }

    _: dataclasses.KW_ONLY
    pos_weight: float = 2.0
    neg_weight: float = 40.0
    margin: float = 0.1
    thresh: float = 0.5

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int.
          tuples: ignored (the loss mines its own pairs).

        Returns:
          (loss, {"neg_pair_fraction", "pos_pair_fraction", "valid_fraction"}): scalar float32
          loss; the fractions of negative and positive pairs kept by the mining (over all
          negative / positive pairs); the fraction of anchors that count.
        """
        x = embeddings.astype(jnp.float32)
        similarity = x @ x.T
        kept_pos, kept_neg = mine_pairs(similarity, labels, self.margin)
        pos_term = log1p_sum_exp(-self.pos_weight * (similarity - self.thresh), kept_pos)
        neg_term = log1p_sum_exp(self.neg_weight * (similarity - self.thresh), kept_neg)
        per_anchor = pos_term / self.pos_weight + neg_term / self.neg_weight
        counted = jnp.any(kept_pos, axis=-1) & jnp.any(kept_neg, axis=-1)
        loss = masked_mean(per_anchor, counted)
        num_pos = jnp.sum(positive_mask(labels))
        num_neg = jnp.sum(negative_mask(labels))
        metrics = {
            "neg_pair_fraction": fraction_of(jnp.sum(kept_neg), num_neg),
            "pos_pair_fraction": fraction_of(jnp.sum(kept_pos), num_pos),
            "valid_fraction": valid_fraction(counted),
        }
        return loss, metrics
