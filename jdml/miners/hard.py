"""Hardness-based miners: semihard negatives and the "softhard" hard positives/negatives."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdml.geometry import pairwise_distances
from jdml.miners.base import (
    MINERS,
    Tuples,
    negative_mask,
    positive_mask,
    sample_positives,
    sample_rows,
)
from jdml.registry import NON_NEGATIVE


def prefer(preferred: jax.Array, fallback: jax.Array) -> jax.Array:
    """Per row, the preferred candidates if there are any, else the fallback candidates.

    Args:
      preferred: (R, B) bool.
      fallback: (R, B) bool.

    Returns:
      (R, B) bool.
    """
    return jnp.where(jnp.any(preferred, axis=-1, keepdims=True), preferred, fallback)


@MINERS.register("semihard", ranges={"margin": NON_NEGATIVE})
def semihard(
    key: jax.Array, embeddings: jax.Array, labels: jax.Array, *, margin: float = 0.2
) -> Tuples:
    """Semihard negatives: one per anchor, just beyond its positive but inside the margin.

    Every sample is an anchor. Its positive is drawn uniformly among the other samples of its
    label; its negative uniformly among the semihard ones, the other-label samples n with

        d(a, p) < d(a, n) < d(a, p) + margin

    in plain (non-squared) Euclidean distance. Where no negative is semihard, the negative is
    drawn uniformly among all other-label samples, as the reference does.

    Args:
      key: PRNG key.
      embeddings: (B, D) float.
      labels: (B,) int.
      margin: width of the semihard band; the reference takes the loss margin (0.2).

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)``. ``valid`` is False where the anchor is
      alone of its label (the reference fails there) or the batch has no other label; missing
      members point at the anchor.

    References:
      Schroff, Kalenichenko, Philbin, "FaceNet: A Unified Embedding for Face Recognition and
      Clustering", CVPR 2015.
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020, reference ``batchminer/semihard.py``.
    """
    key_pos, key_neg = jax.random.split(key)
    anchors = jnp.arange(labels.shape[0], dtype=jnp.int32)
    dist = pairwise_distances(jax.lax.stop_gradient(embeddings))
    positives, has_positive = sample_positives(key_pos, labels)
    d_ap = dist[anchors, positives][:, None]
    negative = negative_mask(labels)
    band = negative & (dist > d_ap) & (dist < d_ap + margin)
    drawn, has_negative = sample_rows(key_neg, prefer(band, negative))
    negatives = jnp.where(has_negative, drawn, anchors)
    return Tuples(anchors, positives, negatives, has_positive & has_negative)


@MINERS.register("softhard")
def softhard(key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Tuples:
    """Hard positives and hard negatives, each drawn uniformly, with a fallback to any.

    For anchor a with positives P (same label, other index) and negatives N (other label):

    - hard negatives: n in N with d(a, n) < max_{p in P} d(a, p);
    - hard positives: p in P with d(a, p) > min_{n in N} d(a, n);
    - the positive is uniform over the hard positives, or over P if there are none; the
      negative likewise over the hard negatives, or over N.

    This is the miner the DiVA code calls "semihard" (renamed "softhard" in the Revisiting code).

    Args:
      key: PRNG key.
      embeddings: (B, D) float.
      labels: (B,) int.

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)``. ``valid`` is False where the anchor has
      no positive (the reference skips it) or no negative; missing members point at the anchor.

    References:
      Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric Learning",
      ECCV 2020, reference ``batchminer/semihard.py``.
      Roth et al., ICML 2020, reference ``batchminer/softhard.py``.
    """
    key_pos, key_neg = jax.random.split(key)
    anchors = jnp.arange(labels.shape[0], dtype=jnp.int32)
    dist = pairwise_distances(jax.lax.stop_gradient(embeddings))
    positive = positive_mask(labels)
    negative = negative_mask(labels)
    farthest_positive = jnp.max(jnp.where(positive, dist, -jnp.inf), axis=-1, keepdims=True)
    closest_negative = jnp.min(jnp.where(negative, dist, jnp.inf), axis=-1, keepdims=True)
    hard_negative = negative & (dist < farthest_positive)
    hard_positive = positive & (dist > closest_negative)
    drawn_pos, has_positive = sample_rows(key_pos, prefer(hard_positive, positive))
    drawn_neg, has_negative = sample_rows(key_neg, prefer(hard_negative, negative))
    positives = jnp.where(has_positive, drawn_pos, anchors)
    negatives = jnp.where(has_negative, drawn_neg, anchors)
    return Tuples(anchors, positives, negatives, has_positive & has_negative)
