"""Contrastive loss over the positive and negative pairs of mined triplets (Hadsell et al. 2006)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.geometry import euclidean_distance
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


@register_loss
class ContrastiveLoss(Loss):
    """Contrastive loss: every mined triplet (a, p, n) gives one positive and one negative pair.

    With d = sqrt(|x - y|^2 + 1e-8) and means over the valid triplets:

        loss = mean_t [d(a, p) - pos_margin]_+ + mean_t [neg_margin - d(a, n)]_+

    This is the contrastive objective as the Revisiting study trains it: its appendix defines the
    loss on the standard Euclidean distance with margin 1, and its reference implementation uses
    the distance and the hinge unsquared. Since jdml reproduces that study, this is the default.
    Hadsell et al. square both terms, (1/2) D^2 and (1/2) [m - D]_+^2; ``hadsell_squared`` gives
    that form (with the margins above in place of 0 and m).

    The reference measures ``nn.PairwiseDistance``, i.e. |a - b + 1e-6| with the 1e-6 added to every
    coordinate difference: a numerical guard that shifts each distance by up to 1e-6 * sqrt(D) and
    gives the zero distance an arbitrary fixed gradient direction. The project's guard
    sqrt(|a - b|^2 + 1e-8) is used instead (a shift below 1e-4, none in the gradient direction,
    and a zero gradient at a = b), which matters only for coincident points.

    Push triplets (a, a, p') of the rho-regularised miner work unchanged: d(a, a) contributes a
    constant with zero gradient and the same-class p' is pushed beyond ``neg_margin``.

    Attributes:
      pos_margin: distance below which positive pairs are not pulled closer (0).
      neg_margin: distance beyond which negative pairs are not pushed apart (1).
      hadsell_squared: use Hadsell et al.'s squared terms (1/2) [.]_+^2 instead of the Revisiting
        (and reference) unsquared hinge.

    References:
      Hadsell, Chopra, LeCun, "Dimensionality Reduction by Learning an Invariant Mapping",
      CVPR 2006. Roth et al., ICML 2020, reference ``criteria/contrastive.py``.
    """

    loss_name: ClassVar[str] = "contrastive"
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = True
    reference_miner: ClassVar[str] = "distance"
    param_lr: ClassVar[str | None] = None
    param_ranges: ClassVar[dict[str, Range]] = {
        "neg_margin": NON_NEGATIVE,
        "pos_margin": NON_NEGATIVE,
    }

    _: dataclasses.KW_ONLY
    pos_margin: float = 0.0
    neg_margin: float = 1.0
    hadsell_squared: bool = False

    def _penalty(self, hinge: jax.Array) -> jax.Array:
        """The per-pair penalty of a hinge value (B_t,) >= 0: itself, or (1/2) hinge^2."""
        return 0.5 * jnp.square(hinge) if self.hadsell_squared else hinge

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int (unused; the tuples already encode the labels).
          tuples: mined triplets, (B_t,) each.

        Returns:
          (loss, {"active_fraction", "valid_fraction"}): scalar float32 loss; the fraction of the
          2 * #valid pair terms with a non-zero hinge; the fraction of valid triplets.
        """
        tuples = require_tuples(self.loss_name, tuples)
        a, p, n = gather_triplets(embeddings, tuples)
        valid = tuples.valid
        pos = masked(jax.nn.relu(euclidean_distance(a, p) - self.pos_margin), valid)
        neg = masked(jax.nn.relu(self.neg_margin - euclidean_distance(a, n)), valid)
        num_valid = jnp.sum(valid)
        loss = safe_divide(jnp.sum(self._penalty(pos)) + jnp.sum(self._penalty(neg)), num_valid)
        num_active = jnp.sum(pos > 0) + jnp.sum(neg > 0)
        metrics = {
            "active_fraction": fraction_of(num_active, 2 * num_valid),
            "valid_fraction": valid_fraction(valid),
        }
        return loss, metrics
