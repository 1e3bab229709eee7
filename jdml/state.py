"""The train state: everything a step reads and writes, as one donated pytree."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class TrainState:
    """Carried through the jitted train step (donated) and saved whole in checkpoints.

    Attributes:
      step: int32 scalar, optimiser steps taken (also the data position: batches are a function
        of the step, see ``jdml.data.pipeline``).
      params: ``{"model": ..., "loss": ...}`` trainable parameters.
      batch_stats: BatchNorm running statistics of the model.
      opt_state: optimiser state.
      rng: base PRNG key (uint32 key data); each step uses ``fold_in(rng, step)``.
      nonfinite: int32 scalar, steps whose loss or gradient was not finite and were skipped.
      sampler_state: the embedding memory and epoch table of embedding-driven samplers
        (``jdml.samplers.memory``); ``{}`` for the others.
      method_state: what the method carries besides params, updated inside the step after the
        optimiser update: per DaNCE term its EMA key parameters and key queue; ``{}`` otherwise.
    """

    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: Any
    rng: jax.Array
    nonfinite: jax.Array
    sampler_state: Any
    method_state: Any = flax.struct.field(default_factory=dict)


def zeros_state(sampler_state: dict | None, **fields: Any) -> TrainState:
    """A state at step 0 with ``fields`` (params, batch_stats, opt_state, rng, method_state)."""
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        nonfinite=jnp.zeros((), jnp.int32),
        sampler_state=sampler_state or {},
        **fields,
    )
