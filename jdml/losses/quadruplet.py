"""Quadruplet loss: a triplet term plus one against a second, third-class negative (Chen et al.)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.losses.base import (
    Loss,
    LossOutput,
    euclidean_distance,
    gather_triplets,
    register_loss,
    require_tuples,
    safe_divide,
)
from jdml.miners.base import Tuples


def _first_cyclic(candidates: jax.Array, start: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per row, the first True column at or after ``start`` in cyclic order.

    Args:
      candidates: (R, C) bool.
      start: (R,) int, the column each row's search begins at.

    Returns:
      ``(index, found)``: int32 (R,) chosen columns (an arbitrary in-range column where a row has
      no candidate) and bool (R,) whether it had one.
    """
    num_cols = candidates.shape[1]
    offset = (jnp.arange(num_cols)[None, :] - start[:, None]) % num_cols
    index = jnp.argmin(jnp.where(candidates, offset, num_cols), axis=1).astype(jnp.int32)
    return index, jnp.any(candidates, axis=1)


def third_class_negatives(labels: jax.Array, tuples: Tuples) -> tuple[jax.Array, jax.Array]:
    """A second negative n4 per triplet whose label differs from both the anchor's and n's.

    The choice is deterministic: the first such sample after n in cyclic batch order. Batches
    come in random class order, so this is an arbitrary third-class sample.

    Args:
      labels: (B,) int.
      tuples: mined triplets, (B_t,) each.

    Returns:
      ``(fourth, found)``: int32 (B_t,) batch indices and bool (B_t,) whether the batch holds a
      third-class sample for that triplet.
    """
    y_a = labels[tuples.anchors][:, None]
    y_n = labels[tuples.negatives][:, None]
    candidates = (labels[None, :] != y_a) & (labels[None, :] != y_n)
    return _first_cyclic(candidates, tuples.negatives + 1)


def reference_fourth_negatives(tuples: Tuples) -> tuple[jax.Array, jax.Array]:
    """The reference's fourth sample: the batch index of a triplet with a different negative.

    The reference draws, per triplet t, a position j uniformly among the triplets whose negative
    index differs from t's and uses sample j of the batch (its miners return one triplet per
    anchor in batch order, so sample j is triplet j's anchor). Losses take no PRNG key, so this
    picks the first such valid j after t in cyclic order and returns ``anchors[j]`` (= j for those
    miners). Nothing keeps n4 out of the anchor's or n's class.

    Args:
      tuples: mined triplets, (B_t,) each.

    Returns:
      ``(fourth, found)``: int32 (B_t,) batch indices and bool (B_t,) whether a position j exists.
    """
    negatives = tuples.negatives
    candidates = (negatives[None, :] != negatives[:, None]) & tuples.valid[None, :]
    positions = jnp.arange(negatives.shape[0], dtype=jnp.int32)
    j, found = _first_cyclic(candidates, positions + 1)
    return tuples.anchors[j], found


@register_loss
class QuadrupletLoss(Loss):
    """Quadruplet loss on non-squared Euclidean distances d = sqrt(|x - y|^2 + 1e-8):

        loss = mean_t [d(a, p) - d(a, n) + alpha_1]_+ + mean_t [d(a, p) - d(n, n4) + alpha_2]_+

    The first mean runs over valid triplets, the second over valid triplets for which a fourth
    sample n4 exists; an empty mean is 0.

    Chen et al. draw n4 from a class different from both the anchor's and n's class. By default
    n4 is such a sample (see ``third_class_negatives``; triplets without one drop out of the
    second mean). The reference instead takes an effectively random batch sample whose class is
    unconstrained (it can even be the anchor's or n itself); ``reference_fourth_negative`` does
    that deterministically (see ``reference_fourth_negatives``). As in the Revisiting study, the
    first negative comes from the configured miner rather than Chen et al.'s own sampling.

    Attributes:
      margin_alpha_1: margin alpha_1 of the triplet term (0.2).
      margin_alpha_2: margin alpha_2 of the anchor-positive vs. negative-n4 term (0.2).
      reference_fourth_negative: choose n4 like the reference (class unconstrained) instead of
        from a third class.

    References:
      Chen, Chen, Zhang, Huang, "Beyond Triplet Loss: a Deep Quadruplet Network for Person
      Re-identification", CVPR 2017. Roth et al., ICML 2020, reference ``criteria/quadruplet.py``.
    """

    loss_name: ClassVar[str] = "quadruplet"
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = True
    param_lr: ClassVar[str | None] = None

    _: dataclasses.KW_ONLY
    margin_alpha_1: float = 0.2
    margin_alpha_2: float = 0.2
    reference_fourth_negative: bool = False

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int (used to pick n4 from a third class).
          tuples: mined triplets, (B_t,) each.

        Returns:
          (loss, {"active_fraction", "quadruplet_fraction", "valid_fraction"}): scalar float32
          loss; the fraction of the two terms of the valid triplets / quadruplets that are
          non-zero; the fraction of valid triplets that found an n4; the fraction of valid
          triplets.
        """
        tuples = require_tuples(self.loss_name, tuples)
        if self.reference_fourth_negative:
            fourth, found = reference_fourth_negatives(tuples)
        else:
            fourth, found = third_class_negatives(labels, tuples)
        a, p, n = gather_triplets(embeddings, tuples)
        n4 = embeddings.astype(jnp.float32)[fourth]
        valid = tuples.valid
        has_fourth = valid & found
        d_ap = euclidean_distance(a, p)
        triplet = jnp.where(
            valid, jax.nn.relu(d_ap - euclidean_distance(a, n) + self.margin_alpha_1), 0.0
        )
        quadruplet = jnp.where(
            has_fourth, jax.nn.relu(d_ap - euclidean_distance(n, n4) + self.margin_alpha_2), 0.0
        )
        num_valid, num_quad = jnp.sum(valid), jnp.sum(has_fourth)
        loss = safe_divide(jnp.sum(triplet), num_valid) + safe_divide(jnp.sum(quadruplet), num_quad)
        num_active = jnp.sum(triplet > 0) + jnp.sum(quadruplet > 0)
        metrics = {
            "active_fraction": safe_divide(num_active.astype(jnp.float32), num_valid + num_quad),
            "quadruplet_fraction": safe_divide(num_quad.astype(jnp.float32), num_valid),
            "valid_fraction": jnp.mean(valid.astype(jnp.float32)),
        }
        return loss, metrics
