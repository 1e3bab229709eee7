"""Momentum-contrast state for DiVA's DaNCE: the EMA key network update and the key queue.

Both are jittable and carried in the train state: ``ema_update`` after every optimizer step
(parameters only, never optimizer state), ``push`` after every DaNCE loss evaluation.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp


def ema_update(target_params: Any, online_params: Any, momentum: float | jax.Array) -> Any:
    """Exponential moving average of the key network: mu * target + (1 - mu) * online.

    Applied leaf by leaf over matching pytrees, computed in at least float32 and cast back to
    each target leaf's dtype. Non-float leaves (e.g. integer counters) are copied from
    ``online_params``. Gradients never flow through the update (``stop_gradient``).

    Args:
      target_params: the EMA (key) network's parameters.
      online_params: the trained network's parameters, same tree structure.
      momentum: mu in [0, 1] (0.9 in the DiVA reference, ``--diva_moco_momentum``).

    Returns:
      The new target parameters.

    References:
      Milbich, Roth et al., ECCV 2020, Sec. 3.1 (phi*^{t+1} = mu phi*^t + (1 - mu) phi^t);
      He et al., "Momentum Contrast for Unsupervised Visual Representation Learning", CVPR 2020.
    """

    def _leaf(target: jax.Array, online: jax.Array) -> jax.Array:
        target = jnp.asarray(target)
        online = jax.lax.stop_gradient(jnp.asarray(online))
        if not jnp.issubdtype(target.dtype, jnp.inexact):
            return online.astype(target.dtype)
        compute = jnp.promote_types(target.dtype, jnp.float32)
        mixed = momentum * target.astype(compute) + (1.0 - momentum) * online.astype(compute)
        return jax.lax.stop_gradient(mixed).astype(target.dtype)

    return jax.tree.map(_leaf, target_params, online_params)


@flax.struct.dataclass
class KeyQueue:
    """Fixed-size FIFO ring buffer of past keys (the DaNCE/MoCo memory queue).

    Slots are written in order 0, 1, ..., N - 1, 0, ...; ``pointer`` is the next slot to write
    (the oldest entry once the queue is full) and ``filled`` the number of written slots, which
    saturates at N. Before the queue is full the valid slots are exactly ``0 .. filled - 1``.

    Attributes:
      keys: (N, D) float32 stored keys (zeros in unfilled slots).
      labels: (N,) int32 labels of the stored keys (-1 in unfilled slots).
      pointer: int32 scalar, next slot to overwrite.
      filled: int32 scalar, number of valid slots (<= N).
    """

    keys: jax.Array
    labels: jax.Array
    pointer: jax.Array
    filled: jax.Array

    @classmethod
    def create(cls, size: int, dim: int) -> KeyQueue:
        """An empty queue of ``size`` slots for ``dim``-dimensional keys."""
        if size < 1 or dim < 1:
            raise ValueError(f"size and dim must be positive, got size={size}, dim={dim}")
        return cls(
            keys=jnp.zeros((size, dim), jnp.float32),
            labels=jnp.full((size,), -1, jnp.int32),
            pointer=jnp.zeros((), jnp.int32),
            filled=jnp.zeros((), jnp.int32),
        )

    @property
    def size(self) -> int:
        """N, the number of slots (static)."""
        return self.keys.shape[0]


def push(queue: KeyQueue, keys: jax.Array, labels: jax.Array) -> KeyQueue:
    """Writes a batch of B keys at the pointer, overwriting the oldest entries first.

    Equivalent to the reference's "drop the oldest B entries, append the current keys" once the
    queue is full; before that it appends. Uses static shapes only (a scatter at
    ``(pointer + arange(B)) % N``), so it runs under ``jit``.

    Args:
      queue: the current queue.
      keys: (B, D) float keys (stored as float32, without gradient), B <= N.
      labels: (B,) int labels.

    Returns:
      The updated queue.

    Raises:
      ValueError: if B > N or the key dimension differs from the queue's.
    """
    size, dim = queue.keys.shape
    batch = keys.shape[0]
    if batch > size:
        raise ValueError(f"cannot push {batch} keys into a queue of {size} slots")
    if keys.shape[1:] != (dim,):
        raise ValueError(f"keys of shape {keys.shape} do not fit a queue of dimension {dim}")
    slots = (queue.pointer + jnp.arange(batch, dtype=jnp.int32)) % size
    new_keys = queue.keys.at[slots].set(jax.lax.stop_gradient(keys).astype(jnp.float32))
    new_labels = queue.labels.at[slots].set(labels.astype(jnp.int32))
    return queue.replace(
        keys=new_keys,
        labels=new_labels,
        pointer=((queue.pointer + batch) % size).astype(jnp.int32),
        filled=jnp.minimum(queue.filled + batch, size).astype(jnp.int32),
    )


def valid_mask(queue: KeyQueue) -> jax.Array:
    """(N,) bool: True for the slots that hold a key."""
    return jnp.arange(queue.size, dtype=jnp.int32) < queue.filled


def insertion_order(queue: KeyQueue) -> jax.Array:
    """(N,) int32 slot indices from the oldest key to the newest, then the unfilled slots."""
    start = (queue.pointer - queue.filled) % queue.size
    return (start + jnp.arange(queue.size, dtype=jnp.int32)) % queue.size


def ordered(queue: KeyQueue) -> jax.Array:
    """(N, D) keys in insertion order, oldest first; the last N - filled rows are unfilled."""
    return queue.keys[insertion_order(queue)]
