"""Metrics of the embedding space: the spectral decay of the embedding matrix (rho) and the
intra- and inter-class cosine distances ("dists"), with the jitted computations behind them."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jdml.evaluation.metrics.base import ClassDistances, Requirements, required
from jdml.geometry import l2_normalize


@jax.jit
def _singular_values(points: jax.Array) -> jax.Array:
    """Singular values of an (N, D) matrix, descending (LAPACK SVD, no singular vectors)."""
    return jnp.linalg.svd(points, compute_uv=False)


def singular_values(points: jax.Array | np.ndarray) -> np.ndarray:
    """Singular values of the uncentred (N, D) embedding matrix, descending.

    A jitted SVD without singular vectors (memory O(N D + D^2)). It works on the matrix
    itself rather than on the eigenvalues of the D x D Gram matrix, whose float32 rounding
    (relative to the largest eigenvalue) would swamp the small singular values that dominate
    the spectral-decay KL divergence.

    Args:
      points: (N, D) embeddings.

    Returns:
      (min(N, D),) float64 singular values.
    """
    return np.asarray(_singular_values(jnp.asarray(points, jnp.float32)), np.float64)


def rho_spectrum(requirements: Requirements, mode: int, truncated: bool) -> float | np.ndarray:
    """Spectral decay rho of Roth et al., "Revisiting Training Strategies and Generalization
    Performance in Deep Metric Learning" (ICML 2020), metric "rho_spectrum@<mode>".

    With s the singular values of the uncentred embedding matrix (descending), for mode m != 0
    the |m| - 1 largest are dropped; s_hat = s / sum(s) and U is the uniform distribution of
    the same length. m > 0: KL(U || s_hat) = sum U log(U / s_hat) (the paper's rho is m = 1;
    +inf if a singular value is 0); m < 0: KL(s_hat || U); m = 0: the normalised spectrum s_hat
    of all singular values itself (a vector). NaN if |m| - 1 drops every value.

    The reference computes s with torch.svd (all min(N, D) values) on the GPU but with
    sklearn's TruncatedSVD(n_components = D - 1) on the CPU, which (with its oversampling)
    returns the D - 1 largest singular values exactly and drops the smallest. As KL(U || s_hat)
    is dominated by the smallest values, this changes the numbers: ``truncated=False``
    ("rho_spectrum@m") keeps all min(N, D) values, ``truncated=True`` ("rho_spectrum_trunc@m")
    keeps at most D - 1, like the CPU path.

    Args:
      requirements: shared requirements with ``singular_values`` and ``dimension``.
      mode: m, any integer.
      truncated: keep at most D - 1 singular values.

    Returns:
      The KL divergence, or the (len(s),) normalised spectrum for m = 0.
    """
    s = np.asarray(required(requirements.singular_values, "singular values"), np.float64)
    if truncated:
        s = s[: max(requirements.dimension - 1, 0)]
    if mode != 0:
        s = s[abs(mode) - 1 :]
    if len(s) == 0 or not np.sum(s) > 0:
        return np.full(len(s), np.nan) if mode == 0 else float("nan")
    s_hat = s / np.sum(s)
    if mode == 0:
        return s_hat
    uniform = 1.0 / len(s)
    if mode > 0:
        with np.errstate(divide="ignore"):
            return float(np.sum(uniform * (np.log(uniform) - np.log(s_hat))))
    positive = s_hat > 0
    return float(np.sum(s_hat[positive] * (np.log(s_hat[positive]) - np.log(uniform))))


@functools.partial(jax.jit, static_argnames="num_classes")
def _class_sums(
    points: jax.Array, class_ids: jax.Array, *, num_classes: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """Per-class sums behind :func:`class_distances` (segment sums, O(N D + C D) memory).

    Args:
      points: (N, D) embeddings.
      class_ids: (N,) int32 classes in [0, C).
      num_classes: C.

    Returns:
      Per class: |sum of its unit vectors|^2 (C,) and the sum of their squared norms (C,)
      (1 each, 0 for a zero vector); and for the L2-normalised class means M_c:
      |sum_c M_c|^2 and sum_c |M_c|^2 (scalars).
    """
    unit = l2_normalize(points)
    unit_sums = jax.ops.segment_sum(unit, class_ids, num_segments=num_classes)
    unit_sq = jax.ops.segment_sum(jnp.sum(unit * unit, axis=1), class_ids, num_classes)
    # Normalising the class sum is normalising the class mean.
    sums = jax.ops.segment_sum(points, class_ids, num_segments=num_classes)
    means = l2_normalize(sums)
    total = jnp.sum(means, axis=0)
    return (
        jnp.sum(unit_sums * unit_sums, axis=1),
        unit_sq,
        jnp.sum(total * total),
        jnp.sum(means * means),
    )


def class_distances(points: jax.Array | np.ndarray, class_ids: np.ndarray) -> ClassDistances:
    """Intra- and inter-class cosine distances ("dists" of Roth et al., ICML 2020).

    The cosine distance is 1 - cos(a, b). For a class of n >= 2 unit vectors u_i with sum S,
    the sum of the n^2 - n off-diagonal distances is n^2 - n - (|S|^2 - sum_i |u_i|^2), so the
    per-class mean needs only segment sums (no per-class distance matrix); likewise the mean
    off-diagonal distance between the C normalised class means M_c is
    1 - (|sum_c M_c|^2 - sum_c |M_c|^2) / (C^2 - C), with no C x C matrix.

    * intra: the mean over classes of the per-class mean. A single-sample class has no pair
      (0/0 in the reference, which then meant to replace it by the largest per-class value but
      indexes with an integer array ``1 - isnan(...)`` and so takes the max of the first two
      classes' values). Here a single-sample class gets the largest per-class mean of the
      classes with >= 2 samples, the reference's intent; NaN if every class is a singleton.
    * inter: the mean off-diagonal cosine distance between the L2-normalised class means
      (NaN for a single class).

    Args:
      points: (N, D) embeddings (the evaluator passes the L2-normalised ones for the cosine
        distance; the intra distances do not depend on it).
      class_ids: (N,) integer classes.

    Returns:
      The :class:`ClassDistances`.
    """
    _, inverse, counts = np.unique(np.asarray(class_ids), return_inverse=True, return_counts=True)
    sum_sq, unit_sq, total_sq, means_sq = (
        np.asarray(v, np.float64)
        for v in _class_sums(
            jnp.asarray(points, jnp.float32),
            jnp.asarray(inverse.reshape(-1), jnp.int32),
            num_classes=len(counts),
        )
    )
    pairs = counts.astype(np.float64) * (counts - 1.0)
    multi = counts >= 2
    if np.any(multi):
        per_class = 1.0 - (sum_sq[multi] - unit_sq[multi]) / pairs[multi]
        intra = float(np.sum(per_class) + np.max(per_class) * np.sum(~multi)) / len(counts)
    else:
        intra = float("nan")
    num = float(len(counts))
    inter = 1.0 - (float(total_sq) - float(means_sq)) / (num * num - num) if num > 1 else np.nan
    return ClassDistances(intra, float(inter))


def _class_distances(requirements: Requirements) -> ClassDistances:
    """The class distance statistics, with an error if they were not computed."""
    return required(requirements.class_distances, "class distances")


def dists_intra(requirements: Requirements) -> float:
    """Mean intra-class cosine distance ("dists@intra"; see :func:`class_distances`)."""
    return _class_distances(requirements).intra


def dists_inter(requirements: Requirements) -> float:
    """Mean cosine distance between class means ("dists@inter"; see :func:`class_distances`)."""
    return _class_distances(requirements).inter


def dists_intra_over_inter(requirements: Requirements) -> float:
    """intra / max(inter, 1e-8) ("dists@intra_over_inter" of Roth et al., ICML 2020)."""
    distances = _class_distances(requirements)
    return distances.intra / max(distances.inter, 1e-8)
