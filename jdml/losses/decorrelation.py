"""Adversarial decorrelation of embedding heads (DiVA, ECCV 2020; "Sharing Matters", TPAMI).

For a directed head pair (source s, target t), a small MLP psi learns to map the source
embedding onto the target embedding so that their elementwise product is large, while a gradient
reversal layer makes the heads learn the opposite, i.e. to become unpredictable from each other:

    s~ = n(R(f_s)),   t~ = n(R(f_t))                 (n = L2 normalisation, R = gradient reversal)
    c(s, t) = mean_b mean_d ( t~_bd * n(psi(s~))_bd )^2
    L = sum_pairs -w_pair * c(s, t)

This is the mean over dimensions of the squared *elementwise* product ((1/D) |t~ ⊙ psi^|^2 per
sample), not a squared cosine. psi's parameters receive the gradient of L (minimising L
maximises the correlation); the heads receive, through R, the negated gradient (they minimise
the correlation).

The module is not a metric-learning ``Loss`` (it takes a dict of heads, not embeddings and
labels) and is deliberately not registered in ``LOSSES``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jdml.geometry import l2_normalize
from jdml.losses.base import LossOutput, symmetric_uniform
from jdml.nn.gradient_reversal import gradient_reversal

# PyTorch's nn.Linear default initialisation (the reference's psi): weights and biases are
# drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)); variance scale 1/3 gives that uniform bound.
_TORCH_LINEAR_KERNEL_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def _torch_linear(features: int, fan_in: int, name: str) -> nn.Dense:
    """A float32 Dense layer initialised like PyTorch's nn.Linear(fan_in, features)."""
    return nn.Dense(
        features,
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        kernel_init=_TORCH_LINEAR_KERNEL_INIT,
        bias_init=symmetric_uniform(1.0 / math.sqrt(fan_in)),
        name=name,
    )


class DecorrelationMLP(nn.Module):
    """The correlation mapping psi: Dense(hidden) -> ReLU -> Dense(out_dim).

    The reference uses 128 -> 512 -> 128 (``--diva_decorrnet_dim 512``; the Sharing Matters
    regressor has the same shape). Initialised like PyTorch's ``nn.Linear``.

    Attributes:
      hidden: width of the hidden layer (512).
      out_dim: output dimension, that of the target head (128).

    Params:
      dense_0: kernel (D_in, hidden), bias (hidden,); dense_1: kernel (hidden, out_dim), bias
      (out_dim,). All float32.

    References:
      Milbich, Roth et al., ECCV 2020, reference ``criteria/adversarial_separation.py``.
    """

    _: dataclasses.KW_ONLY
    hidden: int = 512
    out_dim: int = 128

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Maps (B, D_in) float to (B, out_dim) float32."""
        x = x.astype(jnp.float32)
        x = _torch_linear(self.hidden, x.shape[-1], "dense_0")(x)
        x = nn.relu(x)
        return _torch_linear(self.out_dim, self.hidden, "dense_1")(x)


def elementwise_correlation(target: jax.Array, mapped: jax.Array) -> jax.Array:
    """c = mean_b mean_d (target_bd * n(mapped)_bd)^2, the quantity psi maximises.

    Args:
      target: (B, D) float, the (prepared) target head t~.
      mapped: (B, D) float, psi(s~) before normalisation.

    Returns:
      Scalar float32 (0 <= c <= 1/D for unit-norm targets).
    """
    product = target.astype(jnp.float32) * l2_normalize(mapped.astype(jnp.float32))
    return jnp.mean(jnp.square(product))


def pair_metric_name(source: str, target: str) -> str:
    """Metric name of one direction's correlation value, ``decorrelation/<source>-<target>``."""
    return f"decorrelation/{source}-{target}"


class Decorrelation(nn.Module):
    """Adversarial decorrelation over directed (source, target) head pairs, one psi per pair.

    L = sum_pairs -w_pair * mean_b mean_d ( t~_bd * n(psi_pair(s~))_bd )^2, with

      - ``renormalize=True`` (DiVA): s~ = n(R(f_s)), t~ = n(R(f_t));
      - ``renormalize=False`` (Sharing Matters): s~ = R(f_s), t~ = R(f_t) (its heads are already
        unit-norm);
      - ``detach_target=True`` (Sharing Matters ``--adv_detach_target``): no gradient reaches the
        target head (only psi and the source head learn from the pair).

    R is the gradient reversal layer with factor ``grl_scale``; n is an L2 normalisation
    x / max(|x|, 1e-12), finite (with finite gradients) at x = 0. Computed in float32.

    The returned loss is the one to *add* to the total and minimise with one optimiser over all
    parameters: psi then maximises the correlation, the heads (through R) minimise it.

    Attributes:
      pairs: directed (source head, target head) names; psi maps source -> target. DiVA with 4
        heads: (selfsimilarity, discriminative), (shared, discriminative), (intra,
        discriminative). Sharing Matters (``--adv_dir res_class``): (shared, class).
      weights: one weight w per pair (DiVA ``--diva_rho_decorrelation``, e.g. 1500 on CUB;
        Sharing Matters gamma ``--disw``, e.g. 500).
      hidden: psi's hidden width (512).
      renormalize: L2-normalise the heads after the reversal (True, DiVA).
      detach_target: stop the gradient into the target heads (False).
      grl_scale: gradient reversal factor (1.0, plain reversal as in both references).

    Params:
      ``psi_<source>_<target>``: a ``DecorrelationMLP`` (hidden -> target dim) per pair.

    References:
      Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric Learning",
      ECCV 2020, Eq. 7 and reference ``criteria/adversarial_separation.py``.
      Milbich et al., "Sharing Matters for Generalization in Deep Metric Learning", TPAMI,
      Eqs. 2-3 and reference ``AdvLoss`` (timomilbich/dml_shared_features).
      Ganin & Lempitsky, ICML 2015 (gradient reversal).
    """

    _: dataclasses.KW_ONLY
    pairs: tuple[tuple[str, str], ...]
    weights: tuple[float, ...]
    hidden: int = 512
    renormalize: bool = True
    detach_target: bool = False
    grl_scale: float = 1.0

    def __post_init__(self) -> None:
        pairs = tuple((str(s), str(t)) for s, t in self.pairs)
        if not pairs:
            raise ValueError("Decorrelation needs at least one (source, target) pair")
        if len(self.weights) != len(pairs):
            raise ValueError(
                f"Decorrelation needs one weight per pair: {len(pairs)} pairs, "
                f"{len(self.weights)} weights"
            )
        for source, target in pairs:
            if source == target:
                raise ValueError(
                    f"Decorrelation pair ({source!r}, {target!r}) maps a head to itself"
                )
        if len(set(pairs)) != len(pairs):
            raise ValueError(f"Decorrelation pairs contain duplicates: {pairs}")
        if self.grl_scale < 0:
            raise ValueError(f"grl_scale must be >= 0, got {self.grl_scale}")
        super().__post_init__()

    def _prepare(self, x: jax.Array, *, detach: bool) -> jax.Array:
        """R(x) (or stop_gradient(x) when detached), then n(.) if ``renormalize``; float32."""
        x = x.astype(jnp.float32)
        x = jax.lax.stop_gradient(x) if detach else gradient_reversal(x, self.grl_scale)
        return l2_normalize(x) if self.renormalize else x

    @nn.compact
    def __call__(self, heads: Mapping[str, jax.Array]) -> LossOutput:
        """Computes the decorrelation loss.

        Args:
          heads: head name -> (B, D_head) float embeddings (same B for all heads; any float
            dtype). Heads not named in ``pairs`` are ignored.

        Returns:
          (loss, metrics): the scalar float32 L above; metrics hold, per pair, the unweighted
          correlation c under ``decorrelation/<source>-<target>`` and L itself under
          ``decorrelation/total``.

        Raises:
          KeyError: if a pair names a head missing from ``heads``.
        """
        missing = sorted({n for pair in self.pairs for n in pair} - set(heads))
        if missing:
            raise KeyError(f"Decorrelation: heads {missing} missing; got {sorted(heads)}")
        total = jnp.zeros((), jnp.float32)
        metrics: dict[str, jax.Array] = {}
        for (source, target), weight in zip(self.pairs, self.weights, strict=True):
            s = self._prepare(heads[source], detach=False)
            t = self._prepare(heads[target], detach=self.detach_target)
            psi = DecorrelationMLP(
                hidden=self.hidden, out_dim=t.shape[-1], name=f"psi_{source}_{target}"
            )
            correlation = elementwise_correlation(t, psi(s))
            total = total - float(weight) * correlation
            metrics[pair_metric_name(source, target)] = correlation
        metrics["decorrelation/total"] = total
        return total, metrics


def measured_correlation(a: jax.Array | np.ndarray, b: jax.Array | np.ndarray) -> float:
    """Model-free similarity of two heads' embeddings: linear CKA (Kornblith et al. 2019).

    With column-centred A (N, D_a) and B (N, D_b) (the embeddings of the same N samples):

        CKA(A, B) = |A^T B|_F^2 / (|A^T A|_F * |B^T B|_F)

    (the RV coefficient of Robert & Escoufier 1976). It lies in [0, 1]; it is 1 when B is an
    orthogonal transform and isotropic rescaling of A (e.g. identical heads), and close to 0
    (up to a finite-sample bias of order D / N) when the heads are linearly unrelated. It is
    invariant to rotations of either head, so it measures shared information rather than
    coordinate alignment. A head with no variance gives 0. Computed in float64 NumPy.

    Args:
      a: (N, D_a) float, N >= 2.
      b: (N, D_b) float, same N.

    Returns:
      The CKA value as a Python float.

    References:
      Kornblith, Norouzi, Lee, Hinton, "Similarity of Neural Network Representations
      Revisited", ICML 2019 (linear CKA).
    """
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[0] != b.shape[0] or a.shape[0] < 2:
        raise ValueError(
            f"need (N, D_a) and (N, D_b) with the same N >= 2, got {a.shape}, {b.shape}"
        )
    a = a - a.mean(axis=0)
    b = b - b.mean(axis=0)
    denominator = np.linalg.norm(a.T @ a) * np.linalg.norm(b.T @ b)
    if denominator <= 0.0:
        return 0.0
    return float(np.sum(np.square(a.T @ b)) / denominator)
