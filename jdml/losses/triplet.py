"""Triplet loss on squared Euclidean distances."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from jdml.geometry import squared_distance
from jdml.losses.base import (
    Loss,
    LossOutput,
    gather_triplets,
    masked_fraction,
    masked_mean,
    register_loss,
    require_tuples,
    valid_fraction,
)
from jdml.miners.base import Tuples
from jdml.registry import NON_NEGATIVE, Range


@register_loss
class TripletLoss(Loss):
    """Triplet loss: mean over valid mined triplets of [|a - p|^2 - |a - n|^2 + margin]_+.

    Distances are squared Euclidean, as in the reference. Triplets with ``valid=False`` are left
    out of the mean; with no valid triplet the loss is 0.

    Attributes:
      margin: hinge margin gamma (0.2).

    References:
      Schroff, Kalenichenko, Philbin, "FaceNet: A Unified Embedding for Face Recognition and
      Clustering", CVPR 2015. Roth et al., ICML 2020, reference ``criteria/triplet.py``.
    """

    loss_name: ClassVar[str] = "triplet"
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = True
    reference_miner: ClassVar[str] = "distance"
    param_lr: ClassVar[str | None] = None
    param_ranges: ClassVar[dict[str, Range]] = {"margin": NON_NEGATIVE}

    _: dataclasses.KW_ONLY
    margin: float = 0.2

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int (unused; the tuples already encode the labels).
          tuples: mined triplets, (B_t,) each.

        Returns:
          (loss, {"active_fraction", "valid_fraction"}): scalar float32 loss; the fraction of
          valid triplets with a non-zero hinge; the fraction of valid triplets.
        """
        tuples = require_tuples(self.loss_name, tuples)
        a, p, n = gather_triplets(embeddings, tuples)
        hinge = jax.nn.relu(squared_distance(a, p) - squared_distance(a, n) + self.margin)
        valid = tuples.valid
        metrics = {
            "active_fraction": masked_fraction(hinge > 0, valid),
            "valid_fraction": valid_fraction(valid),
        }
        return masked_mean(hinge, valid), metrics
