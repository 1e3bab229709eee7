"""A cohort's program: several members of a method trained together in one jitted step,
exchanging what ``cohort.exchange`` names (``jdml.cohort.exchanges``; DM2's relation matrices).

It is a :class:`jdml.program.Program` whose placement is the members' layout
(``jdml.cohort.layout``: stacked, or listed for a heterogeneous cohort), whose state and step
are the cohort's (``jdml.cohort.step``) and whose embeddings name the members
(``jdml.cohort.embeddings``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.cohort import step as cohort_step
from jdml.cohort.embeddings import CohortEmbeddings, member_loop
from jdml.cohort.exchanges import EXCHANGES
from jdml.cohort.layout import make_layout
from jdml.cohort.members import member_configs, over_members
from jdml.cohort.step import StepPlan
from jdml.mesh import AXIS
from jdml.methods.checks import check_stateless_members
from jdml.methods.ema_queue import push
from jdml.methods.method import Method
from jdml.optim import per_member
from jdml.program import Program, method_optimizer
from jdml.state import TrainState
from jdml.step import StepFn


class CohortProgram(Program):
    """The members of a cohort, their state, step and embeddings.

    Args:
      config: the full run config (its ``cohort`` section).
      methods: the method of each group: one for identical (stacked) members, one per member
        of a heterogeneous cohort (``cohort.members``), each with its own optimiser and the
        state fields ``{member<l>: tree}``.
      steps_per_epoch: for schedules in epochs (the exchange's warm-up; training only).
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        methods: tuple[Method, ...],
        steps_per_epoch: int = 1,
    ) -> None:
        check_stateless_members(config)
        self.heterogeneous = bool(config.cohort.members)
        exchange = EXCHANGES.get(config.cohort.exchange)(config, steps_per_epoch)
        self.exchange = exchange
        self.layout = make_layout(
            config, listed=self.heterogeneous, view_diversity=exchange.view_diversity
        )
        super().__init__(config, methods[0], placement=self.layout)
        self.methods = methods
        self.size, self.names = self.layout.size, self.layout.names
        self.loop = member_loop(config)
        self.plan = StepPlan(
            layout=self.layout,
            methods=methods,
            exchange=exchange,
            loop=self.loop,
            probabilities=exchange.update_probabilities(self.size),
            model_diversity=exchange.model_diversity,
        )
        embedders = tuple(m.embedder for m in methods)
        self.embeddings = CohortEmbeddings(config, self.layout, embedders, self.loop)

    def members_drawn(self) -> tuple[int, ...]:
        """The members whose views this process draws (``Layout.members_drawn``)."""
        return self.layout.members_drawn()

    def optimizer(self, steps_per_epoch: int, total_steps: int) -> optax.GradientTransformation:
        """The method's optimiser, or in a heterogeneous cohort each member's own
        (``jdml.optim.per_member``)."""
        if not self.heterogeneous:
            return super().optimizer(steps_per_epoch, total_steps)
        return per_member(
            {
                name: method_optimizer(method, steps_per_epoch, total_steps)
                for name, method in zip(self.names, self.methods, strict=True)
            }
        )

    def init_state(
        self,
        tx: optax.GradientTransformation,
        seed: int,
        sample: np.ndarray,
        sampler_state: dict | None = None,
    ) -> TrainState:
        """The members' state at step 0 (``jdml.cohort.step.init_state``), placed."""
        return cohort_step.init_state(self.plan, tx, seed, sample, sampler_state)

    def step_body(self, tx: optax.GradientTransformation, state: TrainState) -> StepFn:
        """The cohort's step on its stored state (``jdml.cohort.step.stored_step``)."""
        return cohort_step.stored_step(self.plan, tx, state)

    def key_functions(self, head: str) -> tuple[Callable, Callable]:
        """For filling the members' DaNCE queues: ``keys(ema, batch_stats, images)`` of every
        member's key network (``(L, B, dim)``, replicated) and ``push(queue, keys, labels)``
        into every member's queue, placed as the state (identical members only: a
        heterogeneous cohort has no stateful term)."""
        method, layout = self.method, self.layout
        members = NamedSharding(layout.mesh, P(AXIS))

        def keys(ema: Any, batch_stats: Any, images: jax.Array) -> jax.Array:
            embed = lambda e, s: method.embed_keys(e, s, images)[head]  # noqa: E731
            return over_members(embed, self.loop, ema, batch_stats)

        keys_fn = jax.jit(keys, out_shardings=layout.replicated)
        push_fn = jax.jit(jax.vmap(push, (0, 0, None)), out_shardings=members)

        def embed_keys(ema: Any, batch_stats: Any, images: Any) -> jax.Array:
            return keys_fn(ema, batch_stats, layout.replicate(images))

        def push_keys(queue: Any, new_keys: np.ndarray, labels: np.ndarray) -> Any:
            return push_fn(queue, layout.replicate(new_keys), layout.replicate(labels))

        return embed_keys, push_keys


def build_cohort(
    config: ml_collections.ConfigDict,
    build: Callable[[ml_collections.ConfigDict], Method],
    steps_per_epoch: int = 1,
) -> CohortProgram:
    """The program of a cohort config, ``build`` making each group's method from its config
    (the run's, or each member's of a heterogeneous cohort)."""
    configs = member_configs(config) or (config,)
    return CohortProgram(config, tuple(build(c) for c in configs), steps_per_epoch)
