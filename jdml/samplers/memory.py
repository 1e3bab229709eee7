"""The embedding memory of the embedding-driven samplers, carried in the train state.

Samplers such as coreset selection or distribution matching (Roth et al., ICML 2020, sec. 4.3)
choose batches from embeddings of the whole training set. As in the reference, the memory is
filled once before training with eval-mode embeddings, every train step overwrites the rows of
its batch with the batch's current embeddings (inside the jitted step, see
``jdml.trainer.make_train_step``), and an epoch's batches are chosen at its start from the
memory as it is then.

The state keeps ``{"memory": (N, D), "table": (steps_per_epoch, B), "table_epoch": ()}`` so that a
run resumed mid-epoch continues with the very batches it had chosen, and one resumed at an epoch
boundary chooses the same ones an uninterrupted run does.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jdml.samplers.base import Sampler

SamplerState = dict[str, jax.Array]


def needs_memory(sampler: Sampler) -> bool:
    return bool(getattr(sampler, "needs_memory", False))


def empty_sampler_state(
    sampler: Sampler, *, num_train: int, dim: int, steps_per_epoch: int
) -> SamplerState:
    """Placeholders of the right shapes ({} for samplers without a memory)."""
    if not needs_memory(sampler):
        return {}
    return {
        "memory": jnp.zeros((num_train, dim), jnp.float32),
        "table": jnp.zeros((steps_per_epoch, sampler.batch_size), jnp.int32),
        "table_epoch": jnp.full((), -1, jnp.int32),
    }


def update_memory(
    sampler_state: SamplerState, indices: jax.Array | None, embeddings: jax.Array
) -> SamplerState:
    """Writes a batch's (detached) embeddings into its rows of the memory (jit-friendly).

    ``indices`` (the batch's training-set rows) are needed only when there is a memory.
    """
    if "memory" not in sampler_state:
        return sampler_state
    if indices is None:
        raise ValueError("the batch has no 'indices', which the sampler's embedding memory needs")
    memory = (
        sampler_state["memory"]
        .at[indices]
        .set(jax.lax.stop_gradient(embeddings).astype(jnp.float32))
    )
    return {**sampler_state, "memory": memory}


@dataclasses.dataclass(frozen=True)
class EpochTable:
    """Adapter giving ``batch(step)`` from a precomputed table of an epoch's batches."""

    table: np.ndarray
    steps_per_epoch: int

    def batch(self, step: int) -> np.ndarray:
        return self.table[step % self.steps_per_epoch]


def epoch_sampler(
    sampler: Sampler, sampler_state: SamplerState, epoch: int, steps_per_epoch: int
) -> tuple[Any, SamplerState]:
    """The object whose ``batch(step)`` gives this epoch's batches, and the updated state.

    Samplers without a memory are returned as they are. Otherwise the epoch's table is chosen
    from the memory, unless the state already holds this epoch's table (a resumed run).
    """
    if not needs_memory(sampler):
        return sampler, sampler_state
    if int(sampler_state["table_epoch"]) != epoch:
        table = sampler.epoch_batches(epoch, sampler_state["memory"], num_batches=steps_per_epoch)
        table = np.asarray(table, np.int32)
        sampler_state = {
            **sampler_state,
            "table": jnp.asarray(table),
            "table_epoch": jnp.asarray(epoch, jnp.int32),
        }
    return EpochTable(np.asarray(sampler_state["table"]), steps_per_epoch), sampler_state
