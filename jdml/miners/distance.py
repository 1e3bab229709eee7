"""Distance-weighted negative sampling (Wu et al. 2017), one triplet per anchor."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdml.geometry import pairwise_distances
from jdml.miners.base import MINERS, Tuples, negative_mask, sample_positives
from jdml.registry import NON_NEGATIVE, POSITIVE

MAX_DISTANCE = 2.0 - 1e-4
"""Distances are clamped below 2 so that log(1 - d^2/4) stays finite for antipodal points."""


def _check_cutoffs(lower_cutoff: float, upper_cutoff: float | None) -> None:
    if not 0.0 < lower_cutoff < MAX_DISTANCE:
        raise ValueError(f"lower_cutoff must lie in (0, 2), got {lower_cutoff}")
    if upper_cutoff is not None and upper_cutoff <= lower_cutoff:
        raise ValueError(
            f"upper_cutoff {upper_cutoff} must exceed lower_cutoff {lower_cutoff} (or be None)"
        )


def negative_log_weights(
    embeddings: jax.Array,
    labels: jax.Array,
    *,
    lower_cutoff: float = 0.5,
    upper_cutoff: float | None = 1.4,
) -> jax.Array:
    """Unnormalised log sampling weights of every candidate negative for every anchor.

    For unit vectors in R^D the pairwise distance has density q(d) ∝ d^(D-2) (1 - d^2/4)^((D-3)/2);
    sampling negatives with weight q(d)^-1 spreads them evenly over distances. Per row:

    - d is clamped to [lower_cutoff, 2 - 1e-4]; the lower clamp bounds the weight of very close
      (noisy) negatives, the upper one keeps the logarithm finite at d = 2;
    - log w = (2 - D) log d - ((D - 3) / 2) log(1 - d^2 / 4), minus the row maximum over the
      allowed entries (so every row peaks at 0 and cannot underflow);
    - entries of the anchor's own label (the anchor included) are -inf;
    - with ``upper_cutoff`` set, entries with d >= upper_cutoff are -inf as well, as in the paper
      (such negatives incur no margin loss). ``upper_cutoff=None`` reproduces the Revisiting
      reference, which leaves that line commented out so weights grow without bound towards d = 2;
    - fallback: a row left without any allowed entry by the upper cutoff becomes uniform
      (log weight 0) over all samples of other labels; a row without any other-label sample
      stays all -inf.

    Args:
      embeddings: (B, D) float, expected on the unit sphere (the weights assume it).
      labels: (B,) int.
      lower_cutoff: distance clamp from below (0.5 in the paper and the reference).
      upper_cutoff: exclusion threshold (1.4 in the paper), or None for the reference behaviour.

    Returns:
      (B, B) float32 log weights, -inf where a column cannot be drawn.

    References:
      Wu, Manmatha, Smola, Krähenbühl, "Sampling Matters in Deep Embedding Learning", ICCV 2017.
      Roth et al., ICML 2020, reference ``batchminer/distance.py``.
    """
    _check_cutoffs(lower_cutoff, upper_cutoff)
    x = jax.lax.stop_gradient(embeddings).astype(jnp.float32)
    dim = x.shape[-1]
    dist = pairwise_distances(x)
    d = jnp.clip(dist, lower_cutoff, MAX_DISTANCE)
    log_w = (2.0 - dim) * jnp.log(d) - ((dim - 3.0) / 2.0) * jnp.log1p(-0.25 * d * d)

    other = negative_mask(labels)
    allowed = other if upper_cutoff is None else other & (dist < upper_cutoff)
    has_allowed = jnp.any(allowed, axis=-1, keepdims=True)
    log_w = jnp.where(allowed, log_w, -jnp.inf)
    row_max = jnp.where(has_allowed, jnp.max(log_w, axis=-1, keepdims=True), 0.0)
    log_w = jnp.where(allowed, log_w - row_max, -jnp.inf)
    uniform_fallback = jnp.where(other, 0.0, -jnp.inf)
    return jnp.where(has_allowed, log_w, uniform_fallback)


@MINERS.register("distance", ranges={"lower_cutoff": NON_NEGATIVE, "upper_cutoff": POSITIVE})
def distance_weighted(
    key: jax.Array,
    embeddings: jax.Array,
    labels: jax.Array,
    *,
    lower_cutoff: float = 0.5,
    upper_cutoff: float | None = 1.4,
    allow_self_positive: bool = False,
) -> Tuples:
    """Distance-weighted sampling: every sample is an anchor with one positive and one negative.

    The negative is drawn from ``negative_log_weights`` (see there for the cutoffs and the
    fallback); the positive uniformly among the other samples of the anchor's label.

    Args:
      key: PRNG key.
      embeddings: (B, D) float, L2-normalised.
      labels: (B,) int.
      lower_cutoff: distances below this are treated as equal to it (0.5).
      upper_cutoff: negatives at distance >= this are not drawn (1.4, the paper's choice); None
        draws from all of them, as the Revisiting reference does.
      allow_self_positive: for an anchor alone of its label in the batch the positive is the
        anchor itself; False (default) marks that triplet invalid, True keeps it valid as the
        reference does (its (a, a, n) triplet then only pushes the negative away).

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)``. ``valid`` is False where the anchor has
      no positive (unless ``allow_self_positive``) or the batch has no sample of another label;
      such rows point the missing member at the anchor.

    References:
      Wu, Manmatha, Smola, Krähenbühl, "Sampling Matters in Deep Embedding Learning", ICCV 2017.
      Roth et al., ICML 2020, reference ``batchminer/distance.py``.
    """
    key_pos, key_neg = jax.random.split(key)
    anchors = jnp.arange(labels.shape[0], dtype=jnp.int32)
    positives, has_positive = sample_positives(
        key_pos, labels, allow_self_positive=allow_self_positive
    )
    log_w = negative_log_weights(
        embeddings, labels, lower_cutoff=lower_cutoff, upper_cutoff=upper_cutoff
    )
    has_negative = jnp.any(jnp.isfinite(log_w), axis=-1)
    drawn = jax.random.categorical(key_neg, log_w, axis=-1).astype(jnp.int32)
    negatives = jnp.where(has_negative, drawn, anchors)
    return Tuples(anchors, positives, negatives, has_positive & has_negative)
