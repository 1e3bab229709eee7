"""NT-Xent, the normalised temperature-scaled cross entropy of SimCLR: each positive pair against
the anchor's negatives (Chen, Kornblith, Norouzi, Hinton, ICML 2020)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.losses.base import Loss, LossOutput, fraction_of, masked_mean, register_loss
from jdml.losses.npair import masked_logsumexp
from jdml.losses.supcon import scaled_similarities
from jdml.miners.base import Tuples, positive_mask
from jdml.registry import POSITIVE, Range


@register_loss
class NTXentLoss(Loss):
    """NT-Xent over every positive pair (a, p) of the batch, with N(a) the samples of other
    classes and s the cosine similarity:

        loss_ap = -log( exp(s_ap / tau) / (exp(s_ap / tau) + sum_{n in N(a)} exp(s_an / tau)) )

    and the loss is the mean of loss_ap over the positive pairs. With one positive per anchor
    (SimCLR's two views of an image) it is SupCon (``supcon``); with more, each positive is
    contrasted with the negatives alone, not with the anchor's other positives.

    Attributes:
      temperature: tau (0.1, SimCLR's best for L2-normalised embeddings in its Tab. 5).

    References:
      Chen, Kornblith, Norouzi, Hinton, "A Simple Framework for Contrastive Learning of Visual
      Representations", ICML 2020 (the loss of Sohn, "Improved Deep Metric Learning with
      Multi-class N-pair Loss Objective", NeurIPS 2016, with a temperature).
    """

    loss_name: ClassVar[str] = "ntxent"
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
          tuples: ignored (every positive pair of the batch takes part).

        Returns:
          (loss, {"pos_pair_fraction"}): scalar float32 loss; the fraction of the ordered pairs
          of different samples that are positive.
        """
        logits, others = scaled_similarities(embeddings, self.temperature)
        positives = positive_mask(labels)
        negatives = others & ~positives
        # Per pair (a, p): log(exp(s_ap) + sum_n exp(s_an)), the sum over the anchor's
        # negatives computed once per anchor (none: the pair's own term alone).
        negative_sum = masked_logsumexp(logits, negatives)[:, None]
        has_negative = jnp.any(negatives, axis=1, keepdims=True)
        denominator = jnp.where(has_negative, jnp.logaddexp(logits, negative_sum), logits)
        per_pair = denominator - logits
        metrics = {"pos_pair_fraction": fraction_of(jnp.sum(positives), jnp.sum(others))}
        return masked_mean(per_pair, positives), metrics
