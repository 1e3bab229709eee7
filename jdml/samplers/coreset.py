"""Coreset samplers: batches whose anchors spread over a big batch of memory embeddings.

Greedy coreset (k-center greedy) and D2 coreset pick ``batch_size / n`` anchor images from a
random big batch of memory rows; each anchor is then completed to a group of n images of its
class (``MemorySampler.fill_groups``).
"""

from __future__ import annotations

import abc
import functools

import jax
import jax.numpy as jnp
import numpy as np

from jdml.geometry import squared_distances
from jdml.registry import COUNT, NON_NEGATIVE, Range
from jdml.samplers.base import SAMPLERS
from jdml.samplers.embedded import (
    STEPS_PER_CHUNK,
    STREAM_BIG_BATCH,
    STREAM_FILLERS,
    STREAM_REFERENCE_BUG,
    MemorySampler,
    maybe_project,
    single_threaded_lapack,
)

SOFTENED_PERCENTILE = 97.0
"""Softened greedy coreset: the next point is drawn among those at or above this percentile."""


class _CoresetSampler(MemorySampler):
    """Shared epoch logic of the coreset samplers: big batches, anchor selection, fillers.

    Subclasses implement ``_select_positions`` (positions of the anchors within each big batch).

    Args:
      labels, batch_size, samples_per_class, seed, bigbs, lowproj_dim: see ``MemorySampler``.
        The big batch is ``min(bigbs, N)`` distinct memory rows.
      reference_index_bug: reproduce the reference's indexing: the selected big-batch positions
        are mapped to dataset indices through a second, unrelated draw of ``bigbs`` indices (with
        replacement, one draw per epoch), so the anchors are effectively random images.

    Raises:
      ValueError: see ``MemorySampler``; also when the big batch holds fewer rows than the
        batch_size / n anchors to select.
    """

    reference_index_bug: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        self.big_size = min(self.bigbs, len(self.labels))
        if self.big_size < self.num_groups:
            raise ValueError(
                f"the big batch ({self.big_size} rows) is smaller than the {self.num_groups} "
                f"anchors per batch (batch size {self.batch_size} / samples_per_class "
                f"{self.samples_per_class}); raise bigbs"
            )

    def big_batches(self, epoch: int, steps: int) -> np.ndarray:
        """int64 (steps, big_size) distinct random memory rows per step of an epoch."""
        rng = self.host_rng(epoch, STREAM_BIG_BATCH)
        n = len(self.labels)
        return np.stack([rng.choice(n, self.big_size, replace=False) for _ in range(steps)])

    def anchors(self, epoch: int, memory: jax.Array | np.ndarray, steps: int) -> np.ndarray:
        """int64 (steps, batch_size / n) dataset indices of the selected anchors."""
        memory = self._check_memory(memory)
        big = self.big_batches(epoch, steps)
        with single_threaded_lapack():
            positions = np.asarray(
                self._select_positions(self.step_keys(epoch, steps), memory, jnp.asarray(big))
            )
        if self.reference_index_bug:
            rng = self.host_rng(epoch, STREAM_REFERENCE_BUG)
            unrelated = rng.choice(len(self.labels), self.bigbs, replace=True)
            return unrelated[positions]
        return np.take_along_axis(big, positions.astype(np.int64), axis=1)

    def _epoch_batches(self, epoch: int, memory: jax.Array, steps: int) -> np.ndarray:
        anchors = self.anchors(epoch, memory, steps)
        return self.fill_groups(self.host_rng(epoch, STREAM_FILLERS), anchors)

    @abc.abstractmethod
    def _select_positions(self, keys: jax.Array, memory: jax.Array, big: jax.Array) -> jax.Array:
        """(steps, batch_size / n) anchor positions within each step's big batch ``big``."""


@SAMPLERS.register(
    "greedy_coreset", ranges={"bigbs": COUNT, "lowproj_dim": Range(-1, integer=True)}
)
class GreedyCoresetSampler(_CoresetSampler):
    """Greedy coreset (k-center greedy) batches distilled from a random big batch.

    From ``bigbs`` random memory rows, the squared-distance matrix M is formed; the first anchor
    is a random row, every further anchor the row maximising the minimum of M to the anchors so
    far (``softened``: a random row among those whose minimum is at or above the 97th percentile
    of all minima). Anchors are distinct rows. Each anchor is completed to n images of its class.

    Args:
      labels, batch_size, samples_per_class, seed: see ``MemorySampler``.
      bigbs: big batch size (512 in the reference).
      softened: randomised choice among the farthest 3 % instead of the argmax.
      lowproj_dim: optional random projection dimension (-1: off).
      reference_index_bug: reproduce the reference's index mapping (see ``_CoresetSampler``).

    References:
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020, Sec. 3.2 (GC; reference ``datasampler/greedy_coreset_sampler.py``);
      Agarwal et al., "Geometric approximation via coresets", 2005.
    """

    softened: bool = False

    def _select_positions(self, keys: jax.Array, memory: jax.Array, big: jax.Array) -> jax.Array:
        return _greedy_positions(
            keys,
            memory,
            big,
            num_select=self.num_groups,
            softened=self.softened,
            lowproj_dim=self.lowproj_dim,
        )


@SAMPLERS.register(
    "d2_coreset",
    ranges={"bigbs": COUNT, "d2_lambda": NON_NEGATIVE, "lowproj_dim": Range(-1, integer=True)},
)
class D2CoresetSampler(_CoresetSampler):
    """D2 coreset batches: density-weighted distance sampling from a random big batch.

    A Gaussian (mean, covariance) is fitted to ``bigbs`` random memory rows. The first anchor is
    the row nearest to a sample of that Gaussian; every further anchor is drawn among the rows not
    yet chosen with probability proportional to N(x; mean, cov) * (sum over anchors s of
    M(x, s))^lambda, M the squared distances. Each anchor is completed to n images of its class.
    The density is evaluated in log space with the covariance regularised by 1e-6 of its mean
    eigenvalue, so that duplicate or low-rank rows stay finite.

    Args:
      labels, batch_size, samples_per_class, seed: see ``MemorySampler``.
      bigbs: big batch size (512 in the reference).
      d2_lambda: exponent of the summed distances (1 in the reference).
      lowproj_dim: optional random projection dimension (-1: off).
      reference_index_bug: reproduce the reference's index mapping (see ``_CoresetSampler``).

    References:
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020 (reference ``datasampler/d2_coreset_sampler.py``); Arthur and
      Vassilvitskii, "k-means++: The Advantages of Careful Seeding", SODA 2007 (D2 sampling).
    """

    d2_lambda: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.d2_lambda < 0:
            raise ValueError(f"d2_lambda must be non-negative, got {self.d2_lambda}")
        self.d2_lambda = float(self.d2_lambda)

    def _select_positions(self, keys: jax.Array, memory: jax.Array, big: jax.Array) -> jax.Array:
        return _d2_positions(
            keys,
            memory,
            big,
            num_select=self.num_groups,
            d2_lambda=self.d2_lambda,
            lowproj_dim=self.lowproj_dim,
        )


def _greedy_one(key: jax.Array, x: jax.Array, num_select: int, softened: bool) -> jax.Array:
    """k-center greedy selection of ``num_select`` distinct rows of x: (num_select,) positions."""
    m = squared_distances(x)  # symmetric: rows are read (contiguous) instead of columns
    first_key, soft_key = jax.random.split(key)
    first = jax.random.randint(first_key, (), 0, x.shape[0])
    chosen = jnp.zeros(num_select, jnp.int32).at[0].set(first)
    selected = jnp.zeros(x.shape[0], bool).at[first].set(True)

    def body(k: int, carry: tuple) -> tuple:
        min_dist, selected, chosen = carry
        if softened:
            top = (min_dist >= jnp.percentile(min_dist, SOFTENED_PERCENTILE)) & ~selected
            top = jnp.where(jnp.any(top), top, ~selected)
            pick = jax.random.categorical(
                jax.random.fold_in(soft_key, k), jnp.where(top, 0.0, -jnp.inf)
            )
        else:
            pick = jnp.argmax(jnp.where(selected, -1.0, min_dist))
        return (
            jnp.minimum(min_dist, m[pick]),
            selected.at[pick].set(True),
            chosen.at[k].set(pick.astype(jnp.int32)),
        )

    _, _, chosen = jax.lax.fori_loop(1, num_select, body, (m[first], selected, chosen))
    return chosen


def _d2_one(key: jax.Array, x: jax.Array, num_select: int, d2_lambda: float) -> jax.Array:
    """D2 selection of ``num_select`` distinct rows of x: (num_select,) positions."""
    rows, dim = x.shape
    m = squared_distances(x)
    mean = jnp.mean(x, axis=0)
    centred = x - mean
    evals, evecs = jnp.linalg.eigh(centred.T @ centred / max(rows - 1, 1))
    evals = jnp.maximum(evals, 0.0)
    start_key, draw_key = jax.random.split(key)
    anchor = mean + evecs @ (jnp.sqrt(evals) * jax.random.normal(start_key, (dim,), x.dtype))
    first = jnp.argmin(jnp.sum((x - anchor) ** 2, axis=-1))
    regularised = evals + 1e-6 * jnp.mean(evals) + jnp.finfo(x.dtype).tiny
    log_density = -0.5 * jnp.sum((centred @ evecs) ** 2 / regularised, axis=-1)
    chosen = jnp.zeros(num_select, jnp.int32).at[0].set(first)
    selected = jnp.zeros(rows, bool).at[first].set(True)

    def body(k: int, carry: tuple) -> tuple:
        dist_sum, selected, chosen = carry
        logits = log_density
        if d2_lambda != 0.0:
            logits = logits + d2_lambda * jnp.log(dist_sum)
        valid = ~selected & (logits > -jnp.inf)
        # All remaining rows at distance 0 from the anchors: fall back to a uniform draw.
        logits = jnp.where(jnp.any(valid), jnp.where(valid, logits, -jnp.inf), 0.0)
        logits = jnp.where(selected, -jnp.inf, logits)
        pick = jax.random.categorical(jax.random.fold_in(draw_key, k), logits)
        return (
            dist_sum + m[pick],
            selected.at[pick].set(True),
            chosen.at[k].set(pick.astype(jnp.int32)),
        )

    _, _, chosen = jax.lax.fori_loop(1, num_select, body, (m[first], selected, chosen))
    return chosen


def _map_steps(select_one, keys: jax.Array, memory: jax.Array, big: jax.Array, lowproj_dim: int):
    """Applies a per-big-batch selection to every step, a few steps at a time."""

    def one(args: tuple) -> jax.Array:
        key, idx = args
        proj_key, select_key = jax.random.split(key)
        return select_one(select_key, maybe_project(proj_key, memory[idx], lowproj_dim))

    return jax.lax.map(one, (keys, big), batch_size=STEPS_PER_CHUNK)


@functools.partial(jax.jit, static_argnames=("num_select", "softened", "lowproj_dim"))
def _greedy_positions(
    keys: jax.Array,
    memory: jax.Array,
    big: jax.Array,
    *,
    num_select: int,
    softened: bool,
    lowproj_dim: int,
) -> jax.Array:
    """(steps, num_select) greedy-coreset positions within each step's big batch."""
    select = functools.partial(_greedy_one, num_select=num_select, softened=softened)
    return _map_steps(select, keys, memory, big, lowproj_dim)


@functools.partial(jax.jit, static_argnames=("num_select", "d2_lambda", "lowproj_dim"))
def _d2_positions(
    keys: jax.Array,
    memory: jax.Array,
    big: jax.Array,
    *,
    num_select: int,
    d2_lambda: float,
    lowproj_dim: int,
) -> jax.Array:
    """(steps, num_select) D2-coreset positions within each step's big batch."""
    select = functools.partial(_d2_one, num_select=num_select, d2_lambda=d2_lambda)
    return _map_steps(select, keys, memory, big, lowproj_dim)
