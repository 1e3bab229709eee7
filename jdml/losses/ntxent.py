"""NT-Xent, the normalised temperature-scaled cross entropy of SimCLR: each positive pair against
the anchor's negatives (Chen, Kornblith, Norouzi, Hinton, ICML 2020)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.losses.base import Loss, LossOutput, fraction_of, masked, masked_mean, register_loss
from jdml.losses.npair import masked_logsumexp
from jdml.losses.supcon import scaled_similarities
from jdml.miners.base import Tuples, negative_mask, positive_mask
from jdml.registry import POSITIVE, Range


@register_loss
class NTXentLoss(Loss):
    """NT-Xent over every positive pair (a, p) of the batch, with N(a) the samples of other
    classes and s the cosine similarity:

        loss_ap = -log( exp(s_ap / tau) / (exp(s_ap / tau) + sum_{n in N(a)} exp(s_an / tau)) )

    and the loss is the mean of loss_ap over the positive pairs. With one positive per anchor
    (SimCLR's two views of an image) it is SupCon (``supcon``); with more, each positive is
    contrasted with the negatives alone, not with the anchor's other positives.

    With ``slot_pairs``, the batch is read as views: a sample's slot is the number of samples of
    its class before it in the batch (view 0, 1, ... of the class). Each ordered pair of slots
    (i, j) is a SimCLR loss of its own, whose anchors are the slot-i samples, whose positives are
    the slot-j samples of their classes and whose negatives are the other classes' samples in
    slots i and j only:

        N(a, p) = {n : y_n != y_a, slot_n in {slot_a, slot_p}},

    averaged over its anchors; the loss is the sum of these means over the slot pairs. With every
    class n times in the batch (``sampler.name=class_epoch``), it is n(n - 1) times the mean over
    the positive pairs, with fewer negatives per pair. This is the loss of the Hyp-ViT code in its
    sphere mode (``hyp_c=0``), which loops over the slot pairs of a (classes, n) batch.

    Attributes:
      temperature: tau (0.1, SimCLR's best for L2-normalised embeddings in its Tab. 5).
      slot_pairs: the per-slot-pair form above (False: every pair against every negative).

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
    slot_pairs: bool = False

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
        negatives = negative_mask(labels)
        metrics = {"pos_pair_fraction": fraction_of(jnp.sum(positives), jnp.sum(others))}
        if self.slot_pairs:
            return slot_pair_loss(logits, labels, positives, negatives), metrics
        # Per pair (a, p): log(exp(s_ap) + sum_n exp(s_an)), the sum over the anchor's
        # negatives computed once per anchor (none: the pair's own term alone).
        negative_sum = masked_logsumexp(logits, negatives)[:, None]
        has_negative = jnp.any(negatives, axis=1, keepdims=True)
        denominator = jnp.where(has_negative, jnp.logaddexp(logits, negative_sum), logits)
        return masked_mean(denominator - logits, positives), metrics


#: The log of an empty sum in :func:`slot_logsumexp`: finite, so that picking it with a one-hot
#: product is exact (and adds nothing to a ``logaddexp``).
EMPTY = -1e30


def view_slots(labels: jax.Array) -> jax.Array:
    """(B,) int32: how many samples of its class come before each sample in the batch."""
    same = labels[:, None] == labels[None, :]
    return jnp.sum(jnp.tril(same, k=-1), axis=1, dtype=jnp.int32)


def slot_logsumexp(logits: jax.Array, mask: jax.Array, slots: jax.Array) -> jax.Array:
    """log sum_n exp(logits[a, n]) over the masked n of each slot k: (B, B) float32 [k, a],
    :data:`EMPTY` where slot k holds none of a's masked samples.

    Each slot's terms are shifted by their own maximum (``segment_max``, exact in any order), so
    the result is exact whatever the spread of the logits; the sums over a slot are a product
    with the slots' one-hot matrix (B slots at most), deterministic on every backend where a
    scattered sum is not.
    """
    num = logits.shape[0]
    values = jnp.where(mask, logits, -jnp.inf).T  # [n, a]
    shift = jax.ops.segment_max(values, slots, num_segments=num)  # [k, a], -inf where empty
    shift = jax.lax.stop_gradient(jnp.where(jnp.isfinite(shift), shift, 0.0))
    terms = jnp.exp(jnp.where(mask.T, values - shift[slots], -jnp.inf))
    one_hot = (slots[:, None] == jnp.arange(num)[None, :]).astype(terms.dtype)  # [n, k]
    total = jnp.matmul(one_hot.T, terms, precision=jax.lax.Precision.HIGHEST)
    return jnp.where(total > 0, jnp.log(jnp.where(total > 0, total, 1.0)) + shift, EMPTY)


def slot_pair_loss(
    logits: jax.Array, labels: jax.Array, positives: jax.Array, negatives: jax.Array
) -> jax.Array:
    """The ``slot_pairs`` form of :class:`NTXentLoss`: the sum over ordered slot pairs (i, j) of
    the mean over their positive pairs of -log(exp(s_ap) / (exp(s_ap) + sum over N(a, p))).

    Args:
      logits: (B, B) float32 s_ij / tau.
      labels: (B,) int.
      positives: (B, B) bool, the positive pairs (the diagonal left out).
      negatives: (B, B) bool, the pairs of different classes.

    Returns:
      The scalar float32 loss (0 without a positive pair).
    """
    num = logits.shape[0]
    slots = view_slots(labels)
    per_slot = slot_logsumexp(logits, negatives, slots)  # [k, a]
    # Each sample's row of per_slot, picked by a one-hot product (exact: one term per sum), so
    # the backward pass adds up with a product too rather than a colliding scatter.
    one_hot = (slots[:, None] == jnp.arange(num)[None, :]).astype(per_slot.dtype)  # [n, k]
    picked = jnp.matmul(one_hot, per_slot, precision=jax.lax.Precision.HIGHEST)  # [n, a]
    own = jnp.diagonal(picked)[:, None]  # the anchor's own slot: (B, 1)
    partner = picked.T  # [a, p]: the positive's slot
    denominator = jnp.logaddexp(logits, jnp.logaddexp(own, partner))
    per_pair = denominator - logits
    # Each pair weighs 1 / (the positive pairs of its slot pair): a mean per slot pair.
    pair_slot = slots[:, None] * num + slots[None, :]
    pair_count = positives.ravel().astype(jnp.float32)
    counts = jax.ops.segment_sum(pair_count, pair_slot.ravel(), num_segments=num * num)
    weight = masked(1.0 / jnp.maximum(counts[pair_slot], 1.0), positives)
    return jnp.sum(masked(per_pair, positives) * weight)
