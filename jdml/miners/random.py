"""Uniformly random triplets over all valid triplets of the batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdml.miners.base import MINERS, Tuples, negative_mask, positive_mask, sample_rows


@MINERS.register("random")
def random_triplets(key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Tuples:
    """Draws B triplets i.i.d. and uniformly from all valid (a, p, n) of the batch.

    Valid means y_a = y_p, a != p (by index) and y_n != y_a. Rather than enumerating the B^3
    candidates, each triplet is drawn in three steps: the anchor a with probability proportional
    to #pos(a) * #neg(a), then p uniformly among a's positives and n uniformly among a's
    negatives. A given triplet then has probability
    #pos(a) #neg(a) / T * 1 / #pos(a) * 1 / #neg(a) = 1 / T with T = sum_a #pos(a) #neg(a), the
    same uniform distribution at O(B^2) cost.

    The reference samples B triplets *without* replacement from the enumeration (and fails when
    fewer than B exist); here they are drawn with replacement to keep shapes static. With SPC-2
    batches of 112 there are 112 * 110 = 12,320 valid triplets, so repeats are rare (about 0.5 per
    batch on average).

    Args:
      key: PRNG key.
      embeddings: (B, D); only its batch size is used.
      labels: (B,) int.

    Returns:
      ``Tuples`` of length B. If the batch holds no valid triplet at all (a single label, or no
      label with two samples) every row has ``valid=False`` and indices (i, i, i).

    References:
      Roth et al., ICML 2020, reference ``batchminer/random.py``.
    """
    n = embeddings.shape[0]
    key_a, key_p, key_n = jax.random.split(key, 3)
    pos = positive_mask(labels)
    neg = negative_mask(labels)
    num_triplets = jnp.sum(pos, axis=-1) * jnp.sum(neg, axis=-1)
    has_any = jnp.any(num_triplets > 0)
    anchor_logits = jnp.where(num_triplets > 0, jnp.log(num_triplets.astype(jnp.float32)), -jnp.inf)
    drawn = jax.random.categorical(key_a, anchor_logits, shape=(n,)).astype(jnp.int32)
    positives, _ = sample_rows(key_p, pos[drawn])
    negatives, _ = sample_rows(key_n, neg[drawn])
    rows = jnp.arange(n, dtype=jnp.int32)
    anchors = jnp.where(has_any, drawn, rows)
    valid = jnp.broadcast_to(has_any, (n,))
    return Tuples(
        anchors,
        jnp.where(has_any, positives, rows),
        jnp.where(has_any, negatives, rows),
        valid,
    )
