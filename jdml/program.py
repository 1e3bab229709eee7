"""The program of a run: its method, state, step and embeddings, placed on the devices.

A plain run is a :class:`Program`: one method (``jdml.methods.Method``) on one network, its
state at step 0 and its step (``jdml.step``), placed by ``jdml.placement`` (one device, or a
mesh whose data axis splits the batch), and its embeddings by name (``jdml.embedder``). A
cohort (``cohort.size > 1``; ``jdml.cohort.program``) is a Program of several members
exchanging what ``cohort.exchange`` names. ``jdml.build`` chooses between them, once, for a
run and for its embeddings alone (inference and export).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jdml import step as plain
from jdml.embedder import Embeddings
from jdml.mesh import DATA
from jdml.methods.ema_queue import push
from jdml.methods.method import Method
from jdml.optim import make_optimizer
from jdml.placement import Placement
from jdml.state import TrainState
from jdml.step import StepFn, jit_step

__all__ = ["Program", "StepFn", "method_optimizer"]


class Program:
    """A plain run: one method, its state, step and embeddings.

    Args:
      config: the full run config.
      method: the method it trains.
      placement: where its arrays live (default: ``parallel.data_devices``).
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        method: Method,
        placement: Placement | None = None,
    ) -> None:
        self.config = config
        self.method = method
        data_devices = int(config.parallel.data_devices)
        self.placement = placement or Placement(config, data_devices)
        self.embeddings: Embeddings = Embeddings(config, method.embedder)

    @property
    def head(self) -> str:
        """The evaluated embedding: the method's main head (a cohort's: member 1's)."""
        return self.embeddings.head

    def members_drawn(self) -> tuple[int, ...]:
        """The cohort members whose views this process draws (a plain run has none)."""
        return ()

    def optimizer(self, steps_per_epoch: int, total_steps: int) -> optax.GradientTransformation:
        """The optimiser of ``config.optim`` over the method's param groups and frozen parts."""
        return method_optimizer(self.method, steps_per_epoch, total_steps)

    # -- state and step -------------------------------------------------------------------------

    def init_state(
        self,
        tx: optax.GradientTransformation,
        seed: int,
        sample: np.ndarray,
        sampler_state: dict | None = None,
    ) -> TrainState:
        """The state at step 0 (``jdml.step.init_state``), placed as the step takes it."""
        state = plain.init_state(self.method, tx, seed, sample, sampler_state)
        return self.placement.place_state(state)

    def step_body(self, tx: optax.GradientTransformation, state: TrainState) -> StepFn:
        """The step ``(state, batch) -> (state, metrics)`` to be jitted (``jdml.step``'s)."""
        return functools.partial(plain.train_step, self.method, tx)

    def make_train_step(
        self, tx: optax.GradientTransformation, state: TrainState, views: Any = None
    ) -> StepFn:
        """The jitted, state-donating step (``jdml.step.jit_step``); ``views``: the run's device
        views, made first. ``state`` (an example of the state) is needed on a mesh only."""
        placement = self.placement
        body = self.step_body(tx, state)
        if not placement.on_mesh:
            return jit_step(body, views)
        # Fixed output shardings: the returned state is placed exactly as the state it replaces
        # (on a one-device member axis the compiler would otherwise pick an equivalent spec and
        # the second call would compile again).
        shardings = placement.state_shardings(state)
        return jit_step(body, views, shardings, placement.place_batch, placement.replicated)

    def key_functions(self, head: str) -> tuple[Callable, Callable]:
        """For filling the DaNCE queue: ``keys(ema, batch_stats, images)`` of the key network
        on host images (``(B, dim)``), and ``push(queue, keys, labels)``, placed as the state."""
        method, placement = self.method, self.placement
        if not placement.on_mesh:
            return jax.jit(lambda e, s, x: method.embed_keys(e, s, x)[head]), push
        keys_fn = jax.jit(
            lambda e, s, x: method.embed_keys(e, s, x)[head], out_shardings=placement.replicated
        )
        push_fn = jax.jit(push, out_shardings=placement.replicated)
        return (
            lambda e, s, x: keys_fn(e, s, placement.replicate(x)),
            lambda q, k, y: push_fn(q, placement.replicate(k), placement.replicate(y)),
        )

    # -- embeddings -----------------------------------------------------------------------------

    def make_embed_fn(self) -> Callable[[Any, Any, Any], dict[str, jax.Array]]:
        """The embeddings (``Embeddings.embed``) jitted, taking host images (the same in every
        process). On a mesh the images are split over the data axis (zero rows pad them to a
        multiple of its size; eval-mode embeddings are per image), so each device embeds its
        share, and the outputs are replicated: every process gets every embedding."""
        placement, embed = self.placement, self.embeddings.embed
        if not placement.on_mesh:
            return jax.jit(embed)
        data = placement.mesh.shape[DATA]
        rows = NamedSharding(placement.mesh, P(DATA))

        def embed_rows(params: Any, batch_stats: Any, images: jax.Array, count: int):
            out = embed(params, batch_stats, images)
            return jax.tree.map(lambda x: x[..., :count, :], out)

        jitted = jax.jit(embed_rows, static_argnums=3, out_shardings=placement.replicated)

        def embed_fn(params: Any, batch_stats: Any, images: Any) -> dict[str, jax.Array]:
            images = np.asarray(images)
            count = len(images)
            if count % data:
                pad = np.zeros((data - count % data, *images.shape[1:]), images.dtype)
                images = np.concatenate([images, pad])
            placed = jax.make_array_from_callback(images.shape, rows, lambda i: images[i])
            return jitted(params, batch_stats, placed, count)

        return embed_fn


def method_optimizer(
    method: Method, steps_per_epoch: int, total_steps: int
) -> optax.GradientTransformation:
    """The optimiser of ``method.config.optim`` over the method's param groups and frozen
    parts (``jdml.optim.make_optimizer``)."""
    return make_optimizer(
        method.config.optim,
        method.param_groups(),
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        frozen=method.frozen_params(),
        layers=method.backbone_layers(),
    )
