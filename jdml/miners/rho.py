"""rho-regularised distance-weighted sampling (Roth et al. 2020, sec. 5): "push" triplets."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdml.miners.base import MINERS, Tuples, sample_positives
from jdml.miners.distance import negative_log_weights
from jdml.registry import NON_NEGATIVE, POSITIVE, PROBABILITY

RHO_MIN_DISTANCE = 1e-2
"""The reference clamps squared distances at 1e-4 before the square root, i.e. d >= 0.01."""


def push_mask(tuples: Tuples, labels: jax.Array) -> jax.Array:
    """Which valid rows are push triplets, i.e. have a negative of the anchor's own label.

    For ``rho_distance`` tuples these are exactly the (a, a, p') rows; for any miner that
    respects the "negative has another label" invariant the mask is all False. This is the
    test the reference itself uses to count its push triplets.

    Args:
      tuples: mined ``Tuples`` of length B_t.
      labels: (B,) int labels of the batch the tuples index.

    Returns:
      (B_t,) bool.
    """
    return tuples.valid & (labels[tuples.negatives] == labels[tuples.anchors])


@MINERS.register(
    "rho_distance",
    ranges={"lower_cutoff": NON_NEGATIVE, "upper_cutoff": POSITIVE, "push_prob": PROBABILITY},
)
def rho_distance(
    key: jax.Array,
    embeddings: jax.Array,
    labels: jax.Array,
    *,
    push_prob: float = 0.2,
    lower_cutoff: float = 0.5,
    upper_cutoff: float | None = 1.4,
) -> Tuples:
    """Distance-weighted triplets of which a random fraction are replaced by push triplets.

    Every sample is an anchor. For each anchor an independent Bernoulli(``push_prob``) decides:

    - 1, a push triplet ``(a, a, p')``: the positive slot holds the anchor itself and the
      NEGATIVE slot a uniformly drawn other sample of the anchor's label. A ranking loss then
      pushes same-class samples apart, which raises the spectral decay rho of the embedding
      space (the paper's rho-regularisation). Here d(a, p) = 0, so losses must differentiate
      their distances safely at 0;
    - 0, a standard triplet as in ``distance``: positive uniform among the other samples of
      the label, negative drawn with weights q(d)^-1 from ``negative_log_weights``.

    Push rows deliberately break the invariant that the negative has another label. ``Tuples``
    carries no extra field for them: a loss recognises them as the valid rows whose negative
    shares the anchor's label (``push_mask``), or equivalently whose positive is the anchor.

    Distances follow the reference: squared distances are clamped at 1e-4 before the square
    root and the result at ``lower_cutoff``, so the effective lower clamp is
    max(lower_cutoff, 0.01). With the default cutoff 0.5 the first clamp changes nothing.

    Args:
      key: PRNG key.
      embeddings: (B, D) float, L2-normalised.
      labels: (B,) int.
      push_prob: probability p of a push triplet (0.2 by default; the paper's runs use 0.15 to
        0.4, e.g. 0.35 for CARS196).
      lower_cutoff: distances below this are treated as equal to it (0.5).
      upper_cutoff: negatives at distance >= this are not drawn (1.4, as in ``distance``); None
        draws from all of them, as the reference does.

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)``. An anchor alone of its label in the
      batch is invalid whatever its draw (the reference drops it); a standard row is also
      invalid without a sample of another label, while a push row needs none (so in a
      single-label batch exactly the push rows are valid). Missing members point at the anchor.

    Raises:
      ValueError: if ``push_prob`` is outside [0, 1] or the cutoffs are inconsistent.

    References:
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020, sec. 5, reference ``batchminer/rho_distance.py``.
      Wu, Manmatha, Smola, Krähenbühl, "Sampling Matters in Deep Embedding Learning", ICCV 2017.
    """
    if not 0.0 <= push_prob <= 1.0:
        raise ValueError(f"push_prob must lie in [0, 1], got {push_prob}")
    key_push, key_mate, key_neg = jax.random.split(key, 3)
    anchors = jnp.arange(labels.shape[0], dtype=jnp.int32)
    push = jax.random.bernoulli(key_push, push_prob, anchors.shape)
    mates, has_mate = sample_positives(key_mate, labels)
    log_w = negative_log_weights(
        embeddings,
        labels,
        lower_cutoff=max(lower_cutoff, RHO_MIN_DISTANCE),
        upper_cutoff=upper_cutoff,
    )
    has_negative = jnp.any(jnp.isfinite(log_w), axis=-1)
    drawn = jax.random.categorical(key_neg, log_w, axis=-1).astype(jnp.int32)
    weighted_negatives = jnp.where(has_negative, drawn, anchors)
    positives = jnp.where(push, anchors, mates)
    negatives = jnp.where(push, mates, weighted_negatives)
    return Tuples(anchors, positives, negatives, has_mate & (push | has_negative))
