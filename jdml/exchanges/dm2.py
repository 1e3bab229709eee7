"""DM2's exchange: relation matrices between the members (``jdml.losses.mutual``).

Member ``l`` adds ``lambda * L^l_DM2``: its relation matrix of the batch against each peer's,
the peers' matrices constants (Park et al., DM2, section 3.2); lambda warms up linearly over
``cohort.warmup_epochs``. Its settings stay in the ``cohort`` section (``mutual_weight``,
``warmup_epochs``, ``relation``), where DM2 runs have always kept them.
"""

from __future__ import annotations

import jax
import ml_collections

from jdml.exchanges.base import EXCHANGES, Exchange, Peers, local_members
from jdml.losses.mutual import mutual_losses, mutual_weight, relation_matrix


@EXCHANGES.register("dm2")
class RelationExchange(Exchange):
    """DM2's mutual term over relation matrices (B x B, whatever each member's embedding size)."""

    metric = "mutual"

    def __init__(self, config: ml_collections.ConfigDict, steps_per_epoch: int = 1) -> None:
        super().__init__(config, steps_per_epoch)
        cohort = config.cohort
        self.mutual_weight = float(cohort.mutual_weight)
        self.warmup_steps = round(cohort.warmup_epochs * steps_per_epoch)
        self.relation = cohort.relation

    @property
    def active(self) -> bool:
        return self.mutual_weight != 0.0

    def weight(self, step: jax.Array) -> jax.Array:
        return mutual_weight(step, self.mutual_weight, self.warmup_steps)

    def losses(self, embeddings: tuple[jax.Array, ...], peers: Peers) -> jax.Array:
        psi = local_members(embeddings, relation_matrix)
        everyone = peers.gather(jax.lax.stop_gradient(psi))
        return mutual_losses(psi, everyone, peers.offset, self.relation)
