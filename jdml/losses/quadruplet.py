"""Quadruplet loss: a triplet term plus one against a second, third-class negative (Chen et al.)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.geometry import euclidean_distance, norm_distance
from jdml.losses.base import (
    Loss,
    LossOutput,
    fraction_of,
    gather_triplets,
    masked,
    register_loss,
    require_tuples,
    safe_divide,
    valid_fraction,
)
from jdml.miners.base import Tuples
from jdml.registry import NON_NEGATIVE, Range


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
    """The reference's fourth sample: a batch index j whose triplet has a different negative.

    The reference draws, per triplet t, a position j uniformly among the triplets whose negative
    index differs from t's and uses *sample* j of the batch as n4 (it indexes the batch with j
    itself; its miners return one triplet per batch sample, so j is a batch index). Losses take
    no PRNG key, so this picks the first such valid j after t in cyclic order and returns j, like
    the reference a batch index: for miners with ``anchors = arange(B)`` it is triplet j's
    anchor, for the random miner an unrelated sample. Nothing keeps n4 out of the anchor's or
    n's class, and n4 can be n itself.

    Args:
      tuples: mined triplets, (B_t,) each, with B_t <= B (the reference needs B_t = B).

    Returns:
      ``(fourth, found)``: int32 (B_t,) batch indices and bool (B_t,) whether a position j exists.
    """
    negatives = tuples.negatives
    candidates = (negatives[None, :] != negatives[:, None]) & tuples.valid[None, :]
    positions = jnp.arange(negatives.shape[0], dtype=jnp.int32)
    return _first_cyclic(candidates, positions + 1)


def reference_quadruplet_terms(
    d_ap: jax.Array, negatives: jax.Array, fourth: jax.Array, margin: float
) -> jax.Array:
    """The reference's second term, broadcast over every pair of triplets (t, t').

    The reference gathers n with a (B, 1) index array, (B, 1, D), and n4 with a flat list,
    (B, D), so ``negative - fourth_negative`` broadcasts to (B, B, D) and its hinge is

        q[t, t'] = [d(a_t, p_t) - |n_t - n4_{t'}| + margin]_+.

    Args:
      d_ap: (B_t,) float anchor-positive distances.
      negatives: (B_t, D) float embeddings of the negatives n_t.
      fourth: (B_t, D) float embeddings of the fourth samples n4_{t'}.
      margin: alpha_2.

    Returns:
      (B_t, B_t) float hinge terms q[t, t'].

    References:
      Roth et al., ICML 2020, reference ``criteria/quadruplet.py``.
    """
    d_nn4 = norm_distance(negatives[:, None, :], fourth[None, :, :])
    return jax.nn.relu(d_ap[:, None] - d_nn4 + margin)


@register_loss
class QuadrupletLoss(Loss):
    """Quadruplet loss on non-squared Euclidean distances d = sqrt(|x - y|^2 + 1e-8):

        loss = mean_t [d(a, p) - d(a, n) + alpha_1]_+ + mean_t [d(a, p) - d(n, n4) + alpha_2]_+

    The first mean runs over valid triplets, the second over valid triplets for which a fourth
    sample n4 exists; an empty mean is 0.

    Chen et al. draw n4 from a class different from both the anchor's and n's class. By default
    n4 is such a sample (see ``third_class_negatives``; triplets without one drop out of the
    second mean). As in the Revisiting study, the first negative comes from the configured miner
    rather than Chen et al.'s own sampling.

    ``reference_fourth_negative`` reproduces the Revisiting reference instead, which differs in
    three ways:

    * n4 is an effectively random batch sample, class unconstrained (it can be in the anchor's
      class, or n itself): the reference draws it at random, here it is chosen deterministically
      (see ``reference_fourth_negatives``);
    * the second term is not per triplet. The reference indexes a, p and n with (B, 1) arrays but
      n4 with a flat list, so ``n - n4`` broadcasts to (B, B, D) and the term is the mean over all
      pairs of triplets (t, t') of [d(a_t, p_t) - |n_t - n4_{t'}| + alpha_2]_+ (see
      ``reference_quadruplet_terms``); here over the pairs with t valid and t' valid with an
      n4. The first term is a plain mean over triplets, as by default;
    * distances are ``torch.norm`` without the 1e-8 guard (see ``norm_distance``), which matters
      in the broadcast term where n_t and n4_{t'} are often the same sample.

    Attributes:
      margin_alpha_1: margin alpha_1 of the triplet term (0.2).
      margin_alpha_2: margin alpha_2 of the anchor-positive vs. negative-n4 term (0.2).
      reference_fourth_negative: compute the second term as the reference does (class
        unconstrained n4, broadcast over all pairs of triplets) instead of Chen et al.'s
        per-triplet term with a third-class n4.

    References:
      Chen, Chen, Zhang, Huang, "Beyond Triplet Loss: a Deep Quadruplet Network for Person
      Re-identification", CVPR 2017. Roth et al., ICML 2020, reference ``criteria/quadruplet.py``.
    """

    loss_name: ClassVar[str] = "quadruplet"
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = True
    reference_miner: ClassVar[str] = "distance"
    param_lr: ClassVar[str | None] = None
    param_ranges: ClassVar[dict[str, Range]] = {
        "margin_alpha_1": NON_NEGATIVE,
        "margin_alpha_2": NON_NEGATIVE,
    }

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
          tuples: mined triplets, (B_t,) each; B_t <= B with ``reference_fourth_negative``.

        Returns:
          (loss, {"active_fraction", "quadruplet_fraction", "valid_fraction"}): scalar float32
          loss; the fraction of the terms of both means that are non-zero; the fraction of valid
          triplets that found an n4; the fraction of valid triplets.

        Raises:
          ValueError: with ``reference_fourth_negative`` and more triplets than samples (its
            fourth samples are triplet positions used as batch indices).
        """
        tuples = require_tuples(self.loss_name, tuples)
        if self.reference_fourth_negative:
            return self._reference(embeddings, tuples)
        fourth, found = third_class_negatives(labels, tuples)
        a, p, n = gather_triplets(embeddings, tuples)
        n4 = embeddings.astype(jnp.float32)[fourth]
        valid = tuples.valid
        has_fourth = valid & found
        d_ap = euclidean_distance(a, p)
        triplet = masked(jax.nn.relu(d_ap - euclidean_distance(a, n) + self.margin_alpha_1), valid)
        quadruplet = masked(
            jax.nn.relu(d_ap - euclidean_distance(n, n4) + self.margin_alpha_2), has_fourth
        )
        num_valid, num_quad = jnp.sum(valid), jnp.sum(has_fourth)
        loss = safe_divide(jnp.sum(triplet), num_valid) + safe_divide(jnp.sum(quadruplet), num_quad)
        num_active = jnp.sum(triplet > 0) + jnp.sum(quadruplet > 0)
        metrics = {
            "active_fraction": fraction_of(num_active, num_valid + num_quad),
            "quadruplet_fraction": fraction_of(num_quad, num_valid),
            "valid_fraction": valid_fraction(valid),
        }
        return loss, metrics

    def _reference(self, embeddings: jax.Array, tuples: Tuples) -> LossOutput:
        """The reference's loss: plain triplet mean plus the broadcast second term.

        Args:
          embeddings: (B, D) float.
          tuples: mined triplets, (B_t,) each, B_t <= B.

        Returns:
          (loss, metrics) as ``__call__``; ``active_fraction`` counts the B_t x B_t pair terms.
        """
        num_rows, batch_size = tuples.valid.shape[0], embeddings.shape[0]
        if num_rows > batch_size:
            raise ValueError(
                f"reference_fourth_negative uses triplet positions as batch indices: {num_rows} "
                f"triplets for a batch of {batch_size}"
            )
        fourth, found = reference_fourth_negatives(tuples)
        a, p, n = gather_triplets(embeddings, tuples)
        n4 = embeddings.astype(jnp.float32)[fourth]
        valid = tuples.valid
        has_fourth = valid & found
        d_ap = norm_distance(a, p)
        triplet = masked(jax.nn.relu(d_ap - norm_distance(a, n) + self.margin_alpha_1), valid)
        pairs = valid[:, None] & has_fourth[None, :]
        quadruplet = masked(reference_quadruplet_terms(d_ap, n, n4, self.margin_alpha_2), pairs)
        num_valid, num_pairs = jnp.sum(valid), jnp.sum(pairs)
        loss = safe_divide(jnp.sum(triplet), num_valid) + safe_divide(
            jnp.sum(quadruplet), num_pairs
        )
        num_active = jnp.sum(triplet > 0) + jnp.sum(quadruplet > 0)
        metrics = {
            "active_fraction": fraction_of(num_active, num_valid + num_pairs),
            "quadruplet_fraction": fraction_of(jnp.sum(has_fourth), num_valid),
            "valid_fraction": valid_fraction(valid),
        }
        return loss, metrics
