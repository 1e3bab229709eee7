"""Miners of the auxiliary DiVA / Sharing Matters heads: intra-class and class-shared triplets.

- ``intra_random``: anchor, positive and negative all from one class (DiVA intra-class head).
- ``random_distance``: distance-weighted sampling w.r.t. randomly permuted labels (DiVA
  class-shared head, ``--diva_sharing random``).
- ``shared_neg_distance`` / ``shared_full_distance``: anchor, "positive" and negative from three
  different classes (DiVA ``standard`` / ``full`` sharing, the older Sharing Matters variants).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jdml.miners.base import MINERS, Tuples, same_label, sample_rows
from jdml.miners.distance import distance_weighted, negative_log_weights
from jdml.registry import NON_NEGATIVE, POSITIVE


def first_occurrences(labels: jax.Array) -> jax.Array:
    """(B,) bool: True at the first sample (by index) of every label, one per present class."""
    earlier_same = jnp.tril(same_label(labels), k=-1)
    return ~jnp.any(earlier_same, axis=-1)


@MINERS.register("intra_random")
def intra_random(
    key: jax.Array, embeddings: jax.Array, labels: jax.Array, *, distinct: bool = False
) -> Tuples:
    """Random intra-class triplets: a, p and n all drawn from one class.

    B times (independently): pick a class uniformly among the classes present in the batch,
    then draw a, p and n uniformly from its samples **with replacement**, so a = p, a = n or
    a = p = n (always, for a singleton class) can occur. That is the reference behaviour; the
    resulting triplets carry zero distances, which losses must differentiate safely.

    With ``distinct=True`` the class is picked uniformly among the classes with at least 3
    samples in the batch and a, p, n are three different samples of it. Batches without such a
    class (e.g. every SPC-2 batch) then give no valid row.

    Note that the anchors are random here, not ``arange(B)``, and that every member shares the
    anchor's label, so the "negative" is of the anchor's class by construction.

    Args:
      key: PRNG key.
      embeddings: (B, D); only its batch size is used.
      labels: (B,) int.
      distinct: draw three distinct samples from classes of size >= 3 (False = reference).

    Returns:
      ``Tuples`` of length B. Without ``distinct`` every row is valid; with it, all rows are
      invalid (indices (i, i, i)) when no class has 3 samples.

    References:
      Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric Learning",
      ECCV 2020, reference ``batchminer/intra_random.py`` (Revisiting code base).
    """
    n = embeddings.shape[0]
    key_class, key_a, key_p, key_n = jax.random.split(key, 4)
    rows = jnp.arange(n, dtype=jnp.int32)
    representatives = first_occurrences(labels)
    if distinct:
        representatives &= jnp.sum(same_label(labels), axis=-1) >= 3
    chosen, _ = sample_rows(key_class, jnp.broadcast_to(representatives, (n, n)))
    members = labels[None, :] == labels[chosen][:, None]
    anchors, _ = sample_rows(key_a, members)
    if distinct:
        not_anchor = rows[None, :] != anchors[:, None]
        positives, _ = sample_rows(key_p, members & not_anchor)
        not_positive = rows[None, :] != positives[:, None]
        negatives, _ = sample_rows(key_n, members & not_anchor & not_positive)
    else:
        positives, _ = sample_rows(key_p, members)
        negatives, _ = sample_rows(key_n, members)
    valid = jnp.broadcast_to(jnp.any(representatives), (n,))
    return Tuples(
        jnp.where(valid, anchors, rows),
        jnp.where(valid, positives, rows),
        jnp.where(valid, negatives, rows),
        valid,
    )


def random_distance_labels(key: jax.Array, labels: jax.Array) -> jax.Array:
    """The randomly permuted labels ``random_distance`` mines with for this key.

    Args:
      key: the PRNG key given to ``random_distance``.
      labels: (B,) int.

    Returns:
      (B,) the labels in a uniformly random order (the same multiset of class sizes).
    """
    key_perm, _ = jax.random.split(key)
    return labels[jax.random.permutation(key_perm, labels.shape[0])]


@MINERS.register("random_distance", ranges={"lower_cutoff": NON_NEGATIVE, "upper_cutoff": POSITIVE})
def random_distance(
    key: jax.Array,
    embeddings: jax.Array,
    labels: jax.Array,
    *,
    lower_cutoff: float = 0.5,
    upper_cutoff: float | None = 1.4,
) -> Tuples:
    """Distance-weighted sampling w.r.t. randomly permuted labels (class-shared triplets).

    The label vector is shuffled with the key (``random_distance_labels``) and ``distance`` is
    run on the shuffled labels. Positives share the anchor's *shuffled* label, so they are
    mostly pairs of different true classes, and negatives are distance-weighted among samples
    of another shuffled label: the shared head learns characteristics common across classes.
    This is deliberate in the reference. A loss given the true labels sees positives of other
    classes and possibly negatives of the anchor's class.

    Args:
      key: PRNG key (it draws both the permutation and the triplets).
      embeddings: (B, D) float, L2-normalised.
      labels: (B,) int, the true labels.
      lower_cutoff: distances below this are treated as equal to it (0.5).
      upper_cutoff: negatives at distance >= this are not drawn (1.4, as in ``distance``); None
        draws from all of them, as the reference does.

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)``; ``valid`` is False where the
      anchor's shuffled label has no other sample (the reference skips it) or no sample has
      another shuffled label.

    References:
      Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric Learning",
      ECCV 2020, reference ``batchminer/random_distance.py`` (Revisiting code base).
      Wu, Manmatha, Smola, Krähenbühl, "Sampling Matters in Deep Embedding Learning", ICCV 2017.
    """
    _, key_mine = jax.random.split(key)
    return distance_weighted(
        key_mine,
        embeddings,
        random_distance_labels(key, labels),
        lower_cutoff=lower_cutoff,
        upper_cutoff=upper_cutoff,
    )


def _restrict_log_weights(log_w: jax.Array, allowed: jax.Array) -> jax.Array:
    """Log weights limited to ``allowed``; a row left empty becomes uniform over ``allowed``."""
    restricted = jnp.where(allowed, log_w, -jnp.inf)
    has_weight = jnp.any(jnp.isfinite(restricted), axis=-1, keepdims=True)
    return jnp.where(has_weight, restricted, jnp.where(allowed, 0.0, -jnp.inf))


def _shared_triplets(
    key: jax.Array,
    embeddings: jax.Array,
    labels: jax.Array,
    *,
    lower_cutoff: float,
    upper_cutoff: float | None,
    weighted_positive: bool,
) -> Tuples:
    """Anchor, distance-weighted negative, then a "positive" of a third label."""
    key_neg, key_pos = jax.random.split(key)
    anchors = jnp.arange(labels.shape[0], dtype=jnp.int32)
    log_w = negative_log_weights(
        embeddings, labels, lower_cutoff=lower_cutoff, upper_cutoff=upper_cutoff
    )
    has_negative = jnp.any(jnp.isfinite(log_w), axis=-1)
    drawn = jax.random.categorical(key_neg, log_w, axis=-1).astype(jnp.int32)
    negatives = jnp.where(has_negative, drawn, anchors)

    third = (labels[None, :] != labels[:, None]) & (labels[None, :] != labels[negatives][:, None])
    if weighted_positive:
        pos_logits = _restrict_log_weights(log_w, third)
    else:
        pos_logits = jnp.where(third, 0.0, -jnp.inf)
    has_positive = jnp.any(third, axis=-1)
    drawn = jax.random.categorical(key_pos, pos_logits, axis=-1).astype(jnp.int32)
    positives = jnp.where(has_positive, drawn, anchors)
    return Tuples(anchors, positives, negatives, has_negative & has_positive)


@MINERS.register(
    "shared_neg_distance", ranges={"lower_cutoff": NON_NEGATIVE, "upper_cutoff": POSITIVE}
)
def shared_neg_distance(
    key: jax.Array,
    embeddings: jax.Array,
    labels: jax.Array,
    *,
    lower_cutoff: float = 0.5,
    upper_cutoff: float | None = 1.4,
) -> Tuples:
    """Class-shared triplets: distance-weighted negative, uniform "positive" of a third class.

    Every sample is an anchor a. The negative n is drawn as in ``distance``, with weights
    q(d)^-1 among samples with y != y_a (``negative_log_weights``, same cutoffs and fallback).
    The "positive" is uniform among the samples whose label differs from both y_a and y_n, so
    the three members come from mutually different classes: the loss pulls together samples of
    different classes, which is what the shared head is meant to capture.

    Args:
      key: PRNG key.
      embeddings: (B, D) float, L2-normalised.
      labels: (B,) int.
      lower_cutoff: distances below this are treated as equal to it (0.5).
      upper_cutoff: negatives at distance >= this are not drawn (1.4, as in ``distance``); None
        draws from all of them, as the reference does.

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)``. ``valid`` is False where no such
      triplet exists, i.e. in batches with fewer than 3 labels (the reference fails there);
      missing members point at the anchor.

    References:
      Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric Learning",
      ECCV 2020 (``--diva_sharing standard``), reference ``batchminer/diva_shared_distance_an.py``
      (Revisiting code history).
      Milbich et al., "Sharing Matters for Generalization in Deep Metric Learning", TPAMI 2020.
    """
    return _shared_triplets(
        key,
        embeddings,
        labels,
        lower_cutoff=lower_cutoff,
        upper_cutoff=upper_cutoff,
        weighted_positive=False,
    )


@MINERS.register(
    "shared_full_distance", ranges={"lower_cutoff": NON_NEGATIVE, "upper_cutoff": POSITIVE}
)
def shared_full_distance(
    key: jax.Array,
    embeddings: jax.Array,
    labels: jax.Array,
    *,
    lower_cutoff: float = 0.5,
    upper_cutoff: float | None = 1.4,
) -> Tuples:
    """Class-shared triplets with a distance-weighted negative *and* "positive".

    As ``shared_neg_distance``, but the positive, among the samples whose label is neither
    y_a nor y_n, is drawn with the same q(d(a, .))^-1 weights as the negative (distances from
    the anchor, same clamp and cutoff). Where the cutoff leaves no such candidate it falls back
    to uniform over them, as ``negative_log_weights`` does for negatives.

    Args:
      key: PRNG key.
      embeddings: (B, D) float, L2-normalised.
      labels: (B,) int.
      lower_cutoff: distances below this are treated as equal to it (0.5).
      upper_cutoff: members at distance >= this are not drawn (1.4, as in ``distance``); None
        draws from all of them, as the reference does.

    Returns:
      ``Tuples`` of length B with ``anchors = arange(B)``; ``valid`` is False in batches with
      fewer than 3 labels; missing members point at the anchor.

    References:
      Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric Learning",
      ECCV 2020 (``--diva_sharing full``), reference ``batchminer/diva_shared_distance_apn.py``
      (Revisiting code history).
      Milbich et al., "Sharing Matters for Generalization in Deep Metric Learning", TPAMI 2020.
    """
    return _shared_triplets(
        key,
        embeddings,
        labels,
        lower_cutoff=lower_cutoff,
        upper_cutoff=upper_cutoff,
        weighted_positive=True,
    )
