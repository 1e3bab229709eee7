"""Set-based miners (N-pair, lifted structure): anchors whose losses use whole sets.

With static shapes a miner cannot return a ragged set per anchor. These miners therefore
return ordinary ``Tuples`` (one row per sample, one representative positive and negative) and
the losses derive the sets from the labels: ``positive_sets`` and ``negative_sets`` build them
as (B_t, B) masks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdml.miners.base import MINERS, Tuples, negative_mask, sample_positives, sample_rows


def positive_sets(tuples: Tuples, labels: jax.Array) -> jax.Array:
    """Per row, the anchor's positive set: the other samples of its label.

    Args:
      tuples: ``Tuples`` of length B_t indexing a batch of B samples.
      labels: (B,) int.

    Returns:
      (B_t, B) bool, all False on invalid rows.
    """
    anchor_labels = labels[tuples.anchors]
    columns = jnp.arange(labels.shape[0], dtype=tuples.anchors.dtype)
    same = labels[None, :] == anchor_labels[:, None]
    return same & (columns[None, :] != tuples.anchors[:, None]) & tuples.valid[:, None]


def negative_sets(tuples: Tuples, labels: jax.Array) -> jax.Array:
    """Per row, the anchor's negative set: every sample of another label.

    Args:
      tuples: ``Tuples`` of length B_t indexing a batch of B samples.
      labels: (B,) int.

    Returns:
      (B_t, B) bool, all False on invalid rows.
    """
    anchor_labels = labels[tuples.anchors]
    return (labels[None, :] != anchor_labels[:, None]) & tuples.valid[:, None]


def _set_tuples(key: jax.Array, labels: jax.Array) -> Tuples:
    """Every sample as anchor, a uniform positive and a uniform negative, valid if both exist."""
    key_pos, key_neg = jax.random.split(key)
    anchors = jnp.arange(labels.shape[0], dtype=jnp.int32)
    positives, has_positive = sample_positives(key_pos, labels)
    drawn, has_negative = sample_rows(key_neg, negative_mask(labels))
    negatives = jnp.where(has_negative, drawn, anchors)
    return Tuples(anchors, positives, negatives, has_positive & has_negative)


@MINERS.register("npair")
def npair(key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Tuples:
    """N-pair tuples: every anchor with one random positive against all other-label samples.

    Each anchor with at least one other sample of its label gets one positive drawn uniformly
    among them. Its negatives are the whole negative SET, all samples with a different label;
    the N-pair and angular losses take that set from the labels (``negative_sets``), not from
    ``negatives``, which holds one uniformly drawn member only so that the tuples keep the
    common shape (and a triplet loss could still consume them).

    The reference's negative set is "every sample of another label" in the Revisiting code.
    The older DiVA code took "every sample except a and p" instead, which also counts further
    same-label samples as negatives once a class has 3 or more samples in the batch; the two
    agree for SPC-2 batches.

    Args:
      key: PRNG key.
      embeddings: (B, D); only its batch size is used.
      labels: (B,) int.

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)`` and ``valid = has_positive &
      has_negative`` (the reference drops anchors without a positive; without any negative the
      loss has nothing to contrast). Missing members point at the anchor.

    References:
      Sohn, "Improved Deep Metric Learning with Multi-class N-pair Loss Objective", NeurIPS 2016.
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020, reference ``batchminer/npair.py``.
    """
    del embeddings
    return _set_tuples(key, labels)


@MINERS.register("lifted")
def lifted(key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Tuples:
    """Lifted-structure tuples: every anchor with its whole positive and negative sets.

    Each anchor with at least one other sample of its label is used; its positive set is all
    other samples of its label and its negative set all samples of other labels, exactly as in
    the reference. The lifted loss builds both sets from the labels (``positive_sets``,
    ``negative_sets``); ``positives`` and ``negatives`` only hold one uniformly drawn member of
    each, to keep the common ``Tuples`` shape.

    Args:
      key: PRNG key (only the representative members are random).
      embeddings: (B, D); only its batch size is used.
      labels: (B,) int.

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)`` and ``valid = has_positive &
      has_negative``. Missing members point at the anchor.

    References:
      Oh Song, Xiang, Jegelka, Savarese, "Deep Metric Learning via Lifted Structured Feature
      Embedding", CVPR 2016.
      Roth et al., ICML 2020, reference ``batchminer/lifted.py``.
    """
    del embeddings
    return _set_tuples(key, labels)
