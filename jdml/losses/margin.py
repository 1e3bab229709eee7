"""Margin loss with learnable class-specific boundaries beta (Wu et al. 2017).

Two normalisations of the summed hinge terms exist. Wu et al.'s code (float masks) and
pytorch-metric-learning divide by the number of active *terms*, #{pos_t > 0} + #{neg_t > 0}: the
default here. The Revisiting reference writes the same count as ``sum((pos > 0) + (neg > 0))`` on
bool tensors, which PyTorch >= 1.2 evaluates as a logical OR: it divides by the number of
*triplets* with an active term, #{pos_t > 0 or neg_t > 0} (``reference_pair_count``). The two
divisors differ by a batch-dependent factor between 1 and 2 (exactly 2 when every valid triplet
has both terms active).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.geometry import euclidean_distance
from jdml.losses.base import (
    Loss,
    LossOutput,
    fraction_of,
    gather_triplets,
    masked,
    register_loss,
    require_tuples,
    safe_divide,
    valid_fraction,
)
from jdml.miners.base import Tuples
from jdml.registry import NON_NEGATIVE, Range


def active_term_count(pos: jax.Array, neg: jax.Array) -> jax.Array:
    """The number of active hinge terms, #{pos_t > 0} + #{neg_t > 0} (Wu et al.'s divisor).

    Args:
      pos: (B_t,) float, positive hinge terms (0 on invalid triplets).
      neg: (B_t,) float, negative hinge terms (0 on invalid triplets).

    Returns:
      int32 scalar in [0, 2 * B_t].

    References:
      Wu et al., ICCV 2017 (their code's float-mask pair count); pytorch-metric-learning's
      MarginLoss.
    """
    return jnp.sum(pos > 0) + jnp.sum(neg > 0)


def active_triplet_count(pos: jax.Array, neg: jax.Array) -> jax.Array:
    """The number of triplets with an active term, #{pos_t > 0 or neg_t > 0}.

    This is what the Revisiting reference's ``torch.sum((pos_loss > 0.) + (neg_loss > 0.))``
    computes: in PyTorch >= 1.2 comparisons give bool tensors and ``+`` on two bool tensors is a
    logical OR.

    Args:
      pos: (B_t,) float, positive hinge terms (0 on invalid triplets).
      neg: (B_t,) float, negative hinge terms (0 on invalid triplets).

    Returns:
      int32 scalar in [0, B_t].

    References:
      Roth et al., ICML 2020, reference ``criteria/margin.py``.
    """
    return jnp.sum((pos > 0) | (neg > 0))


@register_loss
class MarginLoss(Loss):
    """Margin loss over mined triplets with a learnable boundary beta per anchor class.

    With d = sqrt(|x - y|^2 + 1e-8) and beta_t = beta[y_anchor] for triplet t:

        pos_t = [d(a, p) - beta_t + margin]_+,   neg_t = [beta_t - d(a, n) + margin]_+
        loss  = (sum_t (pos_t + neg_t) + nu * sum_t beta_t) / max(count, 1)

    with ``count`` = #{pos_t > 0} + #{neg_t > 0}, the number of active terms (Wu et al.'s
    normalisation, see ``active_term_count``), or with ``reference_pair_count`` the Revisiting
    reference's #{pos_t > 0 or neg_t > 0}, the number of triplets with at least one active term
    (see ``active_triplet_count``). Sums and counts run over valid triplets only. With no active
    term the count is 0 and the reference returns the plain hinge sum, which is 0; ``max(count,
    1)`` gives the same 0 (plus the nu term).

    The nu term follows Wu et al.: their objective adds nu * beta inside the sum over the
    training tuples, and the MXNet code of Wu et al. divides hinge sum and beta sum together by
    the active-term count, with one beta_{y_a} per triplet. With ``reference_pair_count`` the
    same numerator, nu term included, is divided by the reference's count instead. The
    Revisiting reference meant to add nu * sum(beta) *after* its normalisation but never runs
    it (a misspelt variable makes nu > 0 crash), so no reference run uses nu > 0 and the
    option reproduces the reference exactly only at nu = 0. With ``beta_constant`` the single
    beta is likewise counted once per valid triplet.

    Attributes:
      num_classes: number of training classes (labels index ``beta``).
      margin: alpha, the separation around the boundary (0.2).
      beta: initial value beta_0 of every boundary (1.2; the paper also uses 0.6).
      beta_lr: learning rate of the ``beta`` parameters (5e-4), read by the optimizer setup.
      beta_constant: one scalar beta shared by all classes instead of one per class.
      nu: weight of the beta regulariser (0).
      reference_pair_count: divide by the number of triplets with an active term, as the
        Revisiting reference does under PyTorch >= 1.2, instead of the number of active terms.

    Params:
      beta: float32 (num_classes,), or () with ``beta_constant``.

    References:
      Wu, Manmatha, Smola, Krähenbühl, "Sampling Matters in Deep Embedding Learning", ICCV 2017.
      Roth et al., ICML 2020, reference ``criteria/margin.py``.
    """

    loss_name: ClassVar[str] = "margin"
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = True
    reference_miner: ClassVar[str] = "distance"
    param_lr: ClassVar[str | None] = "beta_lr"
    param_ranges: ClassVar[dict[str, Range]] = {
        "margin": NON_NEGATIVE,
        "beta": NON_NEGATIVE,
        "beta_lr": NON_NEGATIVE,
        "nu": NON_NEGATIVE,
    }

    _: dataclasses.KW_ONLY
    num_classes: int
    margin: float = 0.2
    beta: float = 1.2
    beta_lr: float = 5e-4
    beta_constant: bool = False
    nu: float = 0.0
    reference_pair_count: bool = False

    @nn.compact
    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int in [0, num_classes); out-of-range labels are not checked under jit.
          tuples: mined triplets, (B_t,) each.

        Returns:
          (loss, {"active_fraction", "beta_mean", "valid_fraction"}): scalar float32 loss; the
          fraction of the 2 * #valid pair terms with a non-zero hinge; the mean of all betas; the
          fraction of valid triplets.
        """
        tuples = require_tuples(self.loss_name, tuples)
        shape = () if self.beta_constant else (self.num_classes,)
        beta = self.param("beta", nn.initializers.constant(self.beta), shape, jnp.float32)
        beta_t = beta if self.beta_constant else beta[labels[tuples.anchors]]
        beta_t = jnp.broadcast_to(beta_t, tuples.valid.shape)

        a, p, n = gather_triplets(embeddings, tuples)
        valid = tuples.valid
        pos = masked(jax.nn.relu(euclidean_distance(a, p) - beta_t + self.margin), valid)
        neg = masked(jax.nn.relu(beta_t - euclidean_distance(a, n) + self.margin), valid)
        num_active = active_term_count(pos, neg)
        count = active_triplet_count(pos, neg) if self.reference_pair_count else num_active
        regulariser = self.nu * jnp.sum(masked(beta_t, valid))
        loss = safe_divide(jnp.sum(pos + neg) + regulariser, count)

        num_valid = jnp.sum(valid)
        metrics = {
            "active_fraction": fraction_of(num_active, 2 * num_valid),
            "beta_mean": jnp.mean(beta),
            "valid_fraction": valid_fraction(valid),
        }
        return loss, metrics
