"""Histogram loss: overlap of the positive and negative similarity distributions (Ustinova 2016)."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jdml.losses.base import Loss, LossOutput, register_loss, safe_divide
from jdml.miners.base import Tuples
from jdml.registry import Range

# Only grid indices k in [-1, R - 1] can match a bin in the reference binning; the emulation clips
# k into [_K_LOW, R] = [-2, R], whose end entries of the tables below match nothing.
_K_LOW = -2


@functools.cache
def reference_bin_tables(num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Which kernel contributions the reference's float-equality binning keeps.

    The reference computes the lower grid index k = trunc((s + 1) / Delta) of a similarity in
    float32, the float64 value k * Delta - 1, and compares that by exact equality with
    ``np.linspace(-1, 1, R)``: the
    lower-bin contribution (to bin k) survives iff k * Delta - 1 == t_k and the upper-bin
    contribution (to bin k + 1) iff k * Delta - 1 == t_{k+1} - Delta, both within range. Where
    rounding makes them differ, that share of the similarity's unit mass is lost. With
    Delta = 2^-5 (R = 65) every comparison is exact; with R = 11 (the SOP setting) the upper
    contributions of k = 2..7, i.e. of s in [-0.6, 0.6), are dropped.

    Args:
      num_bins: R.

    Returns:
      ``(lower_kept, upper_kept)``: bool (R + 1 - _K_LOW,) tables indexed by k - _K_LOW for
      k in [_K_LOW, R].
    """
    delta = 2 / (num_bins - 1)
    support = np.linspace(-1, 1, num_bins)
    ks = np.arange(_K_LOW, num_bins + 1)
    assigned = ks.astype(int) * delta - 1
    lower = np.zeros(ks.shape, bool)
    upper = np.zeros(ks.shape, bool)
    for i, k in enumerate(ks):
        if 0 <= k < num_bins:
            lower[i] = assigned[i] == support[k]
        if 0 <= k + 1 < num_bins:
            upper[i] = assigned[i] == support[k + 1] - delta
    return lower, upper


def _soft_assign(
    s: jax.Array, num_bins: int, reference_float_binning: bool
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Triangular-kernel split of each similarity between its two neighbouring bins.

    Args:
      s: (P,) float32 similarities.
      num_bins: R.
      reference_float_binning: emulate the reference's binning (see ``HistogramLoss``).

    Returns:
      ``(lower_bin, lower_weight, upper_bin, upper_weight)``, each (P,): int32 bins in [0, R)
      and float32 weights (0 for a dropped contribution); weights are differentiable in s.
    """
    delta = 2.0 / (num_bins - 1)
    if reference_float_binning:
        # The reference's float32 grid index, truncated towards zero, with no clamping of s.
        q = jax.lax.stop_gradient((s + 1.0) / jnp.float32(delta))
        k = jnp.trunc(jnp.clip(q, _K_LOW - 1, num_bins + 1)).astype(jnp.int32)
        k = jnp.clip(k, _K_LOW, num_bins)
        lower_kept, upper_kept = (jnp.asarray(t) for t in reference_bin_tables(num_bins))
        keep_lower, keep_upper = lower_kept[k - _K_LOW], upper_kept[k - _K_LOW]
    else:
        # Similarities outside [-1, 1] (unnormalised embeddings) count in the end bins.
        s = jnp.clip(s, -1.0, 1.0)
        q = jax.lax.stop_gradient((s + 1.0) / delta)
        k = jnp.clip(jnp.floor(q).astype(jnp.int32), 0, num_bins - 2)
        keep_lower = keep_upper = jnp.ones(s.shape, bool)
    support = jnp.linspace(-1.0, 1.0, num_bins, dtype=jnp.float32)
    lower_bin = jnp.clip(k, 0, num_bins - 1)
    upper_bin = jnp.clip(k + 1, 0, num_bins - 1)
    lower_weight = jnp.where(keep_lower, (support[lower_bin] + delta - s) / delta, 0.0)
    upper_weight = jnp.where(keep_upper, (s - support[upper_bin] + delta) / delta, 0.0)
    return lower_bin, lower_weight, upper_bin, upper_weight


def soft_histogram(
    s: jax.Array, mask: jax.Array, num_bins: int, *, reference_float_binning: bool = False
) -> jax.Array:
    """Normalised soft histogram of the masked similarities on the grid linspace(-1, 1, R).

    Args:
      s: (P,) float32 similarities.
      mask: (P,) bool, which similarities belong to this histogram.
      num_bins: R.
      reference_float_binning: emulate the reference's binning.

    Returns:
      (R,) float32 bin masses divided by the number of masked similarities (0s if none).
    """
    lower_bin, lower_w, upper_bin, upper_w = _soft_assign(s, num_bins, reference_float_binning)
    hist = jax.ops.segment_sum(jnp.where(mask, lower_w, 0.0), lower_bin, num_segments=num_bins)
    hist += jax.ops.segment_sum(jnp.where(mask, upper_w, 0.0), upper_bin, num_segments=num_bins)
    return safe_divide(hist, jnp.sum(mask))


@register_loss
class HistogramLoss(Loss):
    """Histogram loss: probability that a random negative pair is more similar than a positive.

    Over the B (B - 1) / 2 pairs i < j with s_ij = x_i.x_j, the positive (same-label) and
    negative similarities are each spread over the grid t_r = linspace(-1, 1, R) with a
    triangular kernel of width Delta = 2 / (R - 1): a similarity with t_k <= s < t_{k+1} adds
    (t_{k+1} - s) / Delta to bin k and (s - t_k) / Delta to bin k + 1. Dividing by the pair
    counts gives h+ and h-, and

        loss = sum_r h-_r * sum_{q <= r} h+_q

    The bins are integer indices with the weights differentiable in s, so the gradient flows
    through the kernel weights as in Ustinova & Lempitsky. Similarities outside [-1, 1] are
    clamped into it (they only occur for unnormalised embeddings). With no positive or no
    negative pair the corresponding histogram is 0, and so is the loss.

    The reference assigns the bins by exact float equality between its computed bin value and
    the grid (see ``reference_bin_tables``). This is exact for R = 65 but, for R = 11 (its SOP
    setting), drops the upper-bin share of every similarity in [-0.6, 0.6), so those
    histograms no longer sum to 1. For unnormalised embeddings, similarities in (1, 1 + Delta)
    lose their upper share, those beyond 1 + Delta are dropped entirely and those in
    (-1 - Delta, -1) get weights outside [0, 1].
    ``reference_float_binning`` reproduces that binning exactly (up to float32 rounding of the
    similarities).

    Attributes:
      num_bins: number R of grid points (65; the reference uses 11 on SOP).
      reference_float_binning: bin like the reference instead of by integer grid index.

    References:
      Ustinova, Lempitsky, "Learning Deep Embeddings with Histogram Loss", NeurIPS 2016.
      Roth et al., ICML 2020, reference ``criteria/histogram.py``.
    """

    loss_name: ClassVar[str] = "histogram"
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = False
    param_lr: ClassVar[str | None] = None
    param_ranges: ClassVar[dict[str, Range]] = {"num_bins": Range(2, integer=True)}

    _: dataclasses.KW_ONLY
    num_bins: int = 65
    reference_float_binning: bool = False

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32), normally
            L2-normalised.
          labels: (B,) int.
          tuples: ignored (the loss uses every pair).

        Returns:
          (loss, {"neg_mass", "pos_mass", "pos_pair_fraction"}): scalar float32 loss; the total
          mass of h- and h+ (1 unless the reference binning dropped some, or the set is empty);
          the fraction of pairs that are positive.

        Raises:
          ValueError: if ``num_bins`` < 2.
        """
        if self.num_bins < 2:
            raise ValueError(f"histogram loss needs num_bins >= 2, got {self.num_bins}")
        x = embeddings.astype(jnp.float32)
        rows, cols = np.triu_indices(x.shape[0], k=1)
        s = (x @ x.T)[rows, cols]
        positive = labels[rows] == labels[cols]
        binning = {"reference_float_binning": self.reference_float_binning}
        h_pos = soft_histogram(s, positive, self.num_bins, **binning)
        h_neg = soft_histogram(s, ~positive, self.num_bins, **binning)
        loss = jnp.sum(h_neg * jnp.cumsum(h_pos))
        metrics = {
            "neg_mass": jnp.sum(h_neg),
            "pos_mass": jnp.sum(h_pos),
            "pos_pair_fraction": jnp.mean(positive.astype(jnp.float32)),
        }
        return loss, metrics
