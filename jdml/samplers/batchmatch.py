"""Batch-matching samplers: the candidate batch whose statistics best match a big batch.

Both samplers draw a big SPC-n batch of ``bigbs`` images (class_random's draw: classes and images
uniformly with replacement) and ``ncomps`` candidate batches from it: batch_size / n classes of
the big batch (uniformly, with replacement) and n of each class's big-batch positions without
replacement. The candidate whose embeddings match the big batch best is the step's batch: by the
distance-distribution criterion (DDM) or by the Frechet distance of Gaussian fits (FRD).

The big batches and candidates depend on (seed, epoch) only; the memory only decides which
candidate wins. ``candidate_costs`` exposes all of them.
"""

from __future__ import annotations

import abc
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import eigh_tridiagonal

from jdml.geometry import squared_distances
from jdml.registry import COUNT, NON_NEGATIVE, POSITIVE, Range
from jdml.samplers.base import SAMPLERS
from jdml.samplers.embedded import (
    STEPS_PER_CHUNK,
    STREAM_BIG_BATCH,
    STREAM_CANDIDATES,
    MemorySampler,
    maybe_project,
    single_threaded_lapack,
)


class _BatchMatchSampler(MemorySampler):
    """Shared epoch logic of the matching samplers: big batches, candidates and the argmin.

    Subclasses implement ``_costs`` ((steps, ncomps) costs of the candidates).

    Args:
      labels, batch_size, samples_per_class, seed, lowproj_dim: see ``MemorySampler``.
      bigbs: big batch size; ``bigbs // n`` classes of n images are drawn.
      ncomps: candidate batches per step (10 in the reference).

    Raises:
      ValueError: see ``MemorySampler``; also for ``bigbs`` below n or a non-positive ``ncomps``.
    """

    ncomps: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bigbs < self.samples_per_class:
            raise ValueError(
                f"bigbs ({self.bigbs}) must hold at least one class of samples_per_class "
                f"({self.samples_per_class}) images"
            )
        if self.ncomps < 1:
            raise ValueError(f"ncomps must be positive, got {self.ncomps}")
        self.big_groups = self.bigbs // self.samples_per_class

    def big_batches(self, epoch: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Big SPC-n batches of an epoch.

        Returns:
          int64 (steps, big_groups * n) dataset indices, group by group, and int64
          (steps, big_groups) class index of each group.
        """
        rng = self.host_rng(epoch, STREAM_BIG_BATCH)
        classes = rng.integers(0, self.num_classes, size=(steps, self.big_groups))
        images = self.class_images(rng, classes, self.samples_per_class)
        return images.reshape(steps, -1), classes

    def candidates(self, epoch: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Big batches and candidate batches of an epoch.

        Returns:
          int64 (steps, big_groups * n) big-batch dataset indices and int64
          (steps, ncomps, batch_size) candidate positions within the step's big batch.
        """
        big, classes = self.big_batches(epoch, steps)
        rng = self.host_rng(epoch, STREAM_CANDIDATES)
        cands = np.stack([self._candidate_positions(rng, c) for c in classes])
        return big, cands

    def _candidate_positions(self, rng: np.random.Generator, classes: np.ndarray) -> np.ndarray:
        """(ncomps, batch_size) positions: random big-batch classes, n positions of each."""
        n = self.samples_per_class
        _, group_class = np.unique(classes, return_inverse=True)
        # groups_of[u, :count_u]: the big-batch groups of distinct class u (-1 padded)
        order = np.argsort(group_class, kind="stable")
        counts = np.bincount(group_class)
        slot = np.arange(len(order)) - np.repeat(np.cumsum(counts) - counts, counts)
        groups_of = np.full((len(counts), counts.max()), -1, np.int64)
        groups_of[group_class[order], slot] = order
        picks = groups_of[rng.integers(0, len(counts), size=(self.ncomps, self.num_groups))]
        positions = (picks[..., None] * n + np.arange(n)).reshape(*picks.shape[:2], -1)
        valid = np.repeat(picks >= 0, n, axis=-1)
        keys = np.where(valid, rng.random(positions.shape), 2.0)
        chosen = np.argsort(keys, axis=-1, kind="stable")[..., :n]
        return np.take_along_axis(positions, chosen, axis=-1).reshape(self.ncomps, -1)

    def candidate_costs(
        self, epoch: int, memory: jax.Array | np.ndarray, num_batches: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Big batches, candidates and float32 (steps, ncomps) candidate costs of an epoch."""
        steps = self.steps_per_epoch if num_batches is None else num_batches
        memory = self._check_memory(memory)
        big, cands = self.candidates(epoch, steps)
        with single_threaded_lapack():
            costs = self._costs(self.step_keys(epoch, steps), memory, jnp.asarray(big), cands)
            costs = np.asarray(costs)
        return big, cands, costs

    def _epoch_batches(self, epoch: int, memory: jax.Array, steps: int) -> np.ndarray:
        big, cands, costs = self.candidate_costs(epoch, memory, steps)
        best = cands[np.arange(steps), np.argmin(costs, axis=1)]
        return np.take_along_axis(big, best, axis=1)

    @abc.abstractmethod
    def _costs(
        self, keys: jax.Array, memory: jax.Array, big: jax.Array, cands: np.ndarray
    ) -> jax.Array:
        """(steps, ncomps) costs of the candidate positions ``cands`` in the big batches."""


@SAMPLERS.register(
    "disthist_batchmatch",
    ranges={
        "bigbs": COUNT,
        "hist_bins": COUNT,
        "hist_weight": NON_NEGATIVE,
        "lowproj_dim": Range(-1, integer=True),
        "ncomps": COUNT,
    },
)
class DistHistBatchMatchSampler(_BatchMatchSampler):
    """DDM: the candidate batch that best preserves the big batch's distance distribution.

    The cost of a candidate c against the big batch b is

        ||mu_b - mu_c|| + ||sigma_b - sigma_c|| + hist_weight * (W(h_b, h_c) + W(h_c, h_b))

    with mu, sigma the per-dimension mean and (population) standard deviation of the embeddings
    and h the normalised histogram (``hist_bins`` bins over [min, max] of the big batch's pairwise
    distances; a candidate's distances outside that range are left out) of the Euclidean
    distances between distinct positions. W is the 1-D Wasserstein distance between the two
    histograms as distributions over the bin centres (in distance units); it is symmetric, so the
    sum is 2 W. ``reference_histogram_samples`` instead computes W as the reference does: between
    the two vectors of bin frequencies treated as samples (a unitless, order-free comparison).

    Args:
      labels, batch_size, samples_per_class, seed: see ``MemorySampler``.
      bigbs: big batch size (512 in the reference).
      ncomps: candidate batches per step (10 in the reference).
      hist_bins: histogram bins (50).
      hist_weight: weight of the Wasserstein term (75).
      lowproj_dim: optional random projection dimension (-1: off).
      reference_histogram_samples: reproduce the reference's Wasserstein quirk.

    References:
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020, Sec. 3.2 (DDM; reference
      ``datasampler/disthist_batchmatch_sampler.py``);
      Rubner et al., "The Earth Mover's Distance as a Metric for Image Retrieval", IJCV 2000.
    """

    hist_bins: int = 50
    hist_weight: float = 75.0
    reference_histogram_samples: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hist_bins < 1:
            raise ValueError(f"hist_bins must be positive, got {self.hist_bins}")
        self.hist_weight = float(self.hist_weight)

    def _costs(
        self, keys: jax.Array, memory: jax.Array, big: jax.Array, cands: np.ndarray
    ) -> jax.Array:
        return _ddm_costs(
            keys,
            memory,
            big,
            jnp.asarray(cands),
            bins=self.hist_bins,
            weight=self.hist_weight,
            sample_quirk=self.reference_histogram_samples,
            lowproj_dim=self.lowproj_dim,
        )


@SAMPLERS.register(
    "fid_batchmatch",
    ranges={
        "bigbs": COUNT,
        "fid_eps": POSITIVE,
        "lowproj_dim": Range(-1, integer=True),
        "ncomps": COUNT,
    },
)
class FidBatchMatchSampler(_BatchMatchSampler):
    """FRD: the candidate batch with the smallest Frechet distance to the big batch.

    With mu, S the mean and (unbiased) covariance of the embeddings, the cost of a candidate c
    against the big batch b is

        ||mu_b - mu_c||^2 + tr S_b + tr S_c - 2 tr sqrtm((S_b + eps I)(S_c + eps I)).

    The trace is computed as the sum of the square roots of the eigenvalues of the symmetric
    positive semi-definite A^1/2 (S_c + eps I) A^1/2, A = S_b + eps I (the same eigenvalues as
    the product), with A^1/2 computed once per big batch and negative rounding errors clipped.

    Args:
      labels, batch_size, samples_per_class, seed: see ``MemorySampler``.
      bigbs: big batch size (512 in the reference).
      ncomps: candidate batches per step (10 in the reference).
      fid_eps: diagonal offset of both covariances (1e-8).
      lowproj_dim: optional random projection dimension (-1: off).

    References:
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020, Sec. 3.2 (FRD; reference ``datasampler/fid_batchmatch_sampler.py``);
      Heusel et al., "GANs Trained by a Two Time-Scale Update Rule Converge to a Local Nash
      Equilibrium", NeurIPS 2017.
    """

    fid_eps: float = 1e-8

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fid_eps < 0:
            raise ValueError(f"fid_eps must be non-negative, got {self.fid_eps}")
        self.fid_eps = float(self.fid_eps)

    def _costs(
        self, keys: jax.Array, memory: jax.Array, big: jax.Array, cands: np.ndarray
    ) -> jax.Array:
        return _frd_costs(
            keys, memory, big, jnp.asarray(cands), eps=self.fid_eps, lowproj_dim=self.lowproj_dim
        )


def normalized_histogram(
    values: jax.Array, weights: jax.Array, lo: jax.Array, hi: jax.Array, bins: int
) -> jax.Array:
    """(bins,) weighted histogram of ``values`` over [lo, hi], normalised to sum 1.

    Bins are [lo + k w, lo + (k + 1) w), the last one closed, w = (hi - lo) / bins (as
    ``np.histogram``); values outside [lo, hi] are left out. An empty histogram stays all zero.
    """
    index = jnp.floor((values - lo) * (bins / (hi - lo))).astype(jnp.int32)
    inside = (values >= lo) & (values <= hi)
    counts = (
        jnp.zeros(bins, jnp.float32)
        .at[jnp.clip(index, 0, bins - 1)]
        .add(jnp.where(inside, weights, 0.0))
    )
    return counts / jnp.maximum(jnp.sum(counts), 1e-30)


def binned_wasserstein(h_a: jax.Array, h_b: jax.Array, bin_width: jax.Array) -> jax.Array:
    """1-D Wasserstein-1 distance of two normalised histograms on the same equal-width bins.

    The histograms are distributions over the bin centres; W1 is the integral of the absolute
    difference of their CDFs, which is constant between consecutive centres.
    """
    cdf_gap = jnp.abs(jnp.cumsum(h_a) - jnp.cumsum(h_b))
    return jnp.sum(cdf_gap[:-1]) * bin_width


def sample_wasserstein(u: jax.Array, v: jax.Array) -> jax.Array:
    """Wasserstein-1 distance of two equally sized, equally weighted 1-D samples."""
    return jnp.mean(jnp.abs(jnp.sort(u) - jnp.sort(v)))


def _ddm_one(
    x: jax.Array, cands: jax.Array, bins: int, weight: float, sample_quirk: bool
) -> jax.Array:
    """(ncomps,) DDM costs of the candidate positions ``cands`` against the big batch x."""
    dist = jnp.sqrt(squared_distances(x))
    rows, cols = np.triu_indices(x.shape[0], 1)  # distinct pairs, as static gather indices
    values = dist[rows, cols]
    lo, hi = jnp.min(values), jnp.max(values)
    flat = hi <= lo  # all distances equal: a unit-wide range around them, as np.histogram
    lo, hi = jnp.where(flat, lo - 0.5, lo), jnp.where(flat, hi + 0.5, hi)
    h_big = normalized_histogram(values, jnp.ones_like(values), lo, hi, bins)
    mean, std = jnp.mean(x, axis=0), jnp.std(x, axis=0)
    rows_c, cols_c = np.triu_indices(cands.shape[-1], 1)

    def cost(pos: jax.Array) -> jax.Array:
        sub = x[pos]
        values_c = dist[pos[rows_c], pos[cols_c]]
        h_c = normalized_histogram(values_c, jnp.ones_like(values_c), lo, hi, bins)
        if sample_quirk:
            w = sample_wasserstein(h_big, h_c)
        else:
            w = binned_wasserstein(h_big, h_c, (hi - lo) / bins)
        moments = jnp.linalg.norm(mean - jnp.mean(sub, axis=0)) + jnp.linalg.norm(
            std - jnp.std(sub, axis=0)
        )
        return moments + weight * 2.0 * w

    return jax.vmap(cost)(cands)


def trace_sqrt_psd(m: jax.Array) -> jax.Array:
    """tr sqrtm(m) of a symmetric PSD matrix: the sum of sqrt of its (clipped) eigenvalues.

    Eigenvalues only, via Householder tridiagonalisation and bisection (cheaper on CPU than a
    full eigendecomposition with eigenvectors).
    """
    _, diag, off, _ = jax.lax.linalg.tridiagonal(m)
    evals = eigh_tridiagonal(diag, off, eigvals_only=True)
    return jnp.sum(jnp.sqrt(jnp.maximum(evals, 0.0)))


def _covariance(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Mean and unbiased covariance of the rows of x."""
    mean = jnp.mean(x, axis=0)
    centred = x - mean
    return mean, centred.T @ centred / max(x.shape[0] - 1, 1)


def _frd_one(x: jax.Array, cands: jax.Array, eps: float) -> jax.Array:
    """(ncomps,) Frechet distances of the candidate positions ``cands`` to the big batch x."""
    dim, size = x.shape[-1], cands.shape[-1]
    mean_b, cov_b = _covariance(x)
    a = cov_b + eps * jnp.eye(dim, dtype=x.dtype)
    evals, evecs = jnp.linalg.eigh(a)
    a_half = (evecs * jnp.sqrt(jnp.maximum(evals, 0.0))) @ evecs.T

    def cost(pos: jax.Array) -> jax.Array:
        sub = x[pos]
        mean_c = jnp.mean(sub, axis=0)
        # A^1/2 (S_c + eps I) A^1/2 = Z^T Z + eps A with Z = (sub - mean_c) A^1/2 / sqrt(size - 1).
        z = (sub - mean_c) @ a_half / np.sqrt(max(size - 1, 1))
        tr_sqrt = trace_sqrt_psd(z.T @ z + eps * a)
        tr_c = jnp.sum((sub - mean_c) ** 2) / max(size - 1, 1)
        return jnp.sum((mean_b - mean_c) ** 2) + jnp.trace(cov_b) + tr_c - 2.0 * tr_sqrt

    return jax.vmap(cost)(cands)


def _map_steps(cost_one, keys, memory, big, cands, lowproj_dim: int) -> jax.Array:
    """Applies a per-big-batch cost to every step, a few steps at a time."""

    def one(args: tuple) -> jax.Array:
        key, idx, pos = args
        return cost_one(maybe_project(key, memory[idx], lowproj_dim), pos)

    return jax.lax.map(one, (keys, big, cands), batch_size=STEPS_PER_CHUNK)


@functools.partial(jax.jit, static_argnames=("bins", "weight", "sample_quirk", "lowproj_dim"))
def _ddm_costs(
    keys: jax.Array,
    memory: jax.Array,
    big: jax.Array,
    cands: jax.Array,
    *,
    bins: int,
    weight: float,
    sample_quirk: bool,
    lowproj_dim: int,
) -> jax.Array:
    """(steps, ncomps) DDM costs."""
    cost = functools.partial(_ddm_one, bins=bins, weight=weight, sample_quirk=sample_quirk)
    return _map_steps(cost, keys, memory, big, cands, lowproj_dim)


@functools.partial(jax.jit, static_argnames=("eps", "lowproj_dim"))
def _frd_costs(
    keys: jax.Array,
    memory: jax.Array,
    big: jax.Array,
    cands: jax.Array,
    *,
    eps: float,
    lowproj_dim: int,
) -> jax.Array:
    """(steps, ncomps) FRD costs."""
    return _map_steps(functools.partial(_frd_one, eps=eps), keys, memory, big, cands, lowproj_dim)
