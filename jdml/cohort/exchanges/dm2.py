"""DM2: a cohort of L members of any method trained together, exchanging relation matrices,
with model, temporal and view diversity.

Park, Kim, You, Cho, "Diversified Mutual Learning for Deep Metric Learning" (DM2):

* every member is a full model of the base method (the Revisiting baseline, DiVA, ...), trained
  by the one jitted step with the others (``jdml.step``);
* member ``l`` minimises its own loss plus ``lambda * L^l_DM2``: its relation matrix of the
  batch against each peer's, the peers' matrices constants (section 3.2,
  ``jdml.losses.mutual``), so the gradient of the summed cohort loss with respect to member
  ``l``'s params is exactly the gradient of its own objective (Algorithm 1); lambda
  (``exchange.dm2.mutual_weight``) warms up linearly over ``exchange.dm2.warmup_epochs``;
* model diversity: each member's embedding layers get their own random initialisation (the
  backbone starts from the same weights, as a pretrained one would);
* temporal diversity: member ``l`` (1-based) applies its update with probability ``2^-(l-1)``
  (``exchange.dm2.temporal_rate^(l-1)``, 0.5 by default); a skipped member keeps params,
  optimiser state, batch statistics and method state unchanged;
* view diversity: each member sees its own augmentation of the same images.

Member 1 starts as the plain run of the same config and seed (same init, same batches and
augmentations, same randomness); with lambda = 0 and no temporal diversity every member equals
an independent run from its own initialisation.
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import numpy as np

from jdml.cohort.exchanges.base import (
    EXCHANGES,
    Exchange,
    Exchanged,
    MemberOutputs,
    Peers,
    local_members,
)
from jdml.errors import ConfigError
from jdml.losses.mutual import RELATIONS, mutual_losses, mutual_weight, relation_matrix
from jdml.registry import NON_NEGATIVE, Range

RANGES = {
    "mutual_weight": NON_NEGATIVE,
    "warmup_epochs": NON_NEGATIVE,
    "temporal_rate": Range(0, 1, open_low=True),
}


def update_probabilities(size: int, temporal: bool, rate: float = 0.5) -> np.ndarray:
    """Per-member update probability: ``rate^(l-1)`` for l = 1..L with temporal diversity (the
    paper's ``2^-(l-1)`` at the default rate 0.5), else 1."""
    if not temporal:
        return np.ones(size, np.float32)
    return np.power(float(rate), np.arange(size)).astype(np.float32)


@EXCHANGES.register("dm2", ranges=RANGES)
class RelationExchange(Exchange):
    """DM2's mutual term over relation matrices (B x B, whatever each member's embedding size),
    and its three diversities."""

    metric = "mutual"

    @classmethod
    def section(cls) -> dict[str, Any]:
        return {
            "mutual_weight": 20.0,
            "warmup_epochs": 3.0,
            "relation": "distance",  # the paper's plain distances, or "rkd" (normalised, Huber)
            "model_diversity": True,  # own random init of each member's embedding layer
            "temporal_diversity": True,  # member l updates with probability rate^(l-1)
            "temporal_rate": 0.5,  # the paper's 2^-(l-1)
            "view_diversity": True,  # own augmentation of the batch per member
        }

    @classmethod
    def check(cls, section: ml_collections.ConfigDict) -> None:
        if section.relation not in RELATIONS:
            raise ConfigError(
                f"exchange.dm2.relation={section.relation!r}; choose one of "
                f"{', '.join(RELATIONS.names())}"
            )

    def __init__(self, config: ml_collections.ConfigDict, steps_per_epoch: int = 1) -> None:
        super().__init__(config, steps_per_epoch)
        self.settings = config.exchange.dm2
        self.mutual_weight = float(self.settings.mutual_weight)
        self.warmup_steps = round(self.settings.warmup_epochs * steps_per_epoch)
        self.relation = self.settings.relation

    @property
    def model_diversity(self) -> bool:
        return bool(self.settings.model_diversity)

    @property
    def view_diversity(self) -> bool:
        return bool(self.settings.view_diversity)

    def update_probabilities(self, size: int) -> np.ndarray:
        settings = self.settings
        return update_probabilities(
            size, bool(settings.temporal_diversity), float(settings.temporal_rate)
        )

    @property
    def active(self) -> bool:
        return self.mutual_weight != 0.0

    def weight(self, step: jax.Array) -> jax.Array:
        return mutual_weight(step, self.mutual_weight, self.warmup_steps)

    def losses(self, outputs: MemberOutputs, peers: Peers) -> Exchanged:
        psi = local_members(outputs.embeddings, relation_matrix)
        everyone = peers.gather(jax.lax.stop_gradient(psi))
        return Exchanged(mutual_losses(psi, everyone, peers.offset, self.relation))
