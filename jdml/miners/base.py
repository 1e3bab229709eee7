"""Shared miner interface: the ``Tuples`` a miner returns, the ``MINERS`` registry, and helpers.

A miner is a pure function ``fn(key, embeddings, labels, **hparams) -> Tuples``. It sees the
embeddings only through ``jax.lax.stop_gradient``, draws its randomness from ``key`` alone and
returns fixed-shape index arrays plus a validity mask, so it runs under ``jit`` (and ``vmap``
over keys) without recompiling as the batch content changes.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jdml.checks import check_batch
from jdml.registry import Registry


class Tuples(NamedTuple):
    """Mined triplets as indices into the batch, one per row.

    Attributes:
      anchors: int32 (B_t,) anchor indices.
      positives: int32 (B_t,) positive indices (same label as the anchor).
      negatives: int32 (B_t,) negative indices (different label from the anchor).
      valid: bool (B_t,) False where no proper triplet exists; losses must drop these rows from
        their sums and counts. Invalid rows still hold in-range indices.
    """

    anchors: jax.Array
    positives: jax.Array
    negatives: jax.Array
    valid: jax.Array


MinerFn = Callable[..., Tuples]
"""``fn(key, embeddings (B, D), labels (B,), **hparams) -> Tuples``."""

MINERS: Registry[MinerFn] = Registry("miner")


def make_miner(name: str, **hparams: Any) -> Callable[[jax.Array, jax.Array, jax.Array], Tuples]:
    """Binds a registered miner's hyperparameters, rejecting unknown ones immediately.

    Args:
      name: registered miner name, e.g. ``"distance"``.
      **hparams: keyword-only hyperparameters of that miner.

    Returns:
      ``fn(key, embeddings, labels) -> Tuples``, which refuses embeddings other than (B, D)
      floating point and labels other than (B,) integer (``jdml.checks.check_batch``).

    Raises:
      UnknownNameError: for an unregistered name (the message lists the known miners).
      TypeError: for a hyperparameter the miner does not take.

    Example: Revisiting's distance-weighted miner (Wu et al. 2017) on two classes of two: each
    sample is an anchor with its class's other sample as the positive and a negative drawn by
    distance:

    >>> import jax, jax.numpy as jnp
    >>> import jdml.miners
    >>> miner = jdml.miners.get("distance", lower_cutoff=0.5, upper_cutoff=1.4)
    >>> embeddings = jnp.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
    >>> labels = jnp.array([0, 0, 1, 1])
    >>> tuples = miner(jax.random.key(0), embeddings, labels)
    >>> tuples.anchors.tolist(), tuples.positives.tolist()
    ([0, 1, 2, 3], [1, 0, 3, 2])
    >>> bool(jnp.all(labels[tuples.negatives] != labels[tuples.anchors]))
    True
    >>> jdml.miners.get("distance", cutoff=1.4)
    Traceback (most recent call last):
    ...
    TypeError: miner 'distance': got an unexpected keyword argument 'cutoff'
    """
    fn = MINERS.get(name)
    try:
        inspect.signature(fn).bind(None, None, None, **hparams)
    except TypeError as e:
        raise TypeError(f"miner {name!r}: {e}") from None

    @functools.wraps(fn)
    def mine(key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Tuples:
        check_batch(f"miner {name!r}", embeddings, labels)  # at trace time (jdml.checks)
        return fn(key, embeddings, labels, **hparams)

    return mine


def same_label(labels: jax.Array) -> jax.Array:
    """(B, B) bool: True where two samples share a label (the diagonal included)."""
    return labels[:, None] == labels[None, :]


def positive_mask(labels: jax.Array) -> jax.Array:
    """(B, B) bool: True for same-label pairs of two different samples (by index)."""
    n = labels.shape[0]
    return same_label(labels) & ~jnp.eye(n, dtype=bool)


def negative_mask(labels: jax.Array) -> jax.Array:
    """(B, B) bool: True for pairs of different labels (never the diagonal)."""
    return ~same_label(labels)


def sample_rows(key: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Draws one column per row uniformly among that row's True entries.

    Args:
      key: PRNG key.
      mask: (R, B) bool candidates.

    Returns:
      ``(index, found)``: int32 (R,) sampled columns and bool (R,) whether the row had any
      candidate. Rows without candidates return an arbitrary in-range index.
    """
    logits = jnp.where(mask, 0.0, -jnp.inf)
    index = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
    return index, jnp.any(mask, axis=-1)


def sample_positives(
    key: jax.Array, labels: jax.Array, *, allow_self_positive: bool = False
) -> tuple[jax.Array, jax.Array]:
    """One uniformly drawn positive (same label, other index) for every sample as anchor.

    Args:
      key: PRNG key.
      labels: (B,) int.
      allow_self_positive: where the anchor's class has no other sample in the batch the
        positive is the anchor itself. If False (default) such rows are reported as not found;
        True reproduces the reference miners, which keep the degenerate (a, a, n) triplet.

    Returns:
      ``(positives, found)``: int32 (B,) indices and bool (B,).
    """
    index, found = sample_rows(key, positive_mask(labels))
    anchors = jnp.arange(labels.shape[0], dtype=jnp.int32)
    positives = jnp.where(found, index, anchors)
    if allow_self_positive:
        found = jnp.ones_like(found)
    return positives, found
