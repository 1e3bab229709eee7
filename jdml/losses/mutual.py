"""Relational knowledge exchanged in a DM2 cohort: relation matrices and the transfer loss.

Park, Kim, You, Cho, "Diversified Mutual Learning for Deep Metric Learning" (DM2), section 3.2:
member ``l`` describes a mini-batch by its relation matrix ``Psi^l_ij = ||e^l_i - e^l_j||_2`` and
learns from each peer ``k`` by ``L^{l<-k} = (1/N^2) sum_ij (Psi^l_ij - Psi^k_ij)^2``, averaged
over its ``L - 1`` peers; the peers' matrices are constants for member ``l``.

``relation="rkd"`` is the distance term of relational knowledge distillation (Park et al., CVPR
2019) instead: each matrix divided by the mean of its off-diagonal entries, compared with the
Huber loss (delta 1). The DM2 paper states the plain form, which is the default.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from jdml.geometry import differentiable_distances
from jdml.registry import Registry

#: The transfer losses between two (N, N) relation matrices, by ``exchange.dm2.relation`` name.
RELATIONS: Registry[Callable[[jax.Array, jax.Array], jax.Array]] = Registry("relation")


def relation_matrix(embeddings: jax.Array, *, eps: float = 1e-12) -> jax.Array:
    """Pairwise Euclidean distances ``(N, D) -> (N, N)``, differentiable everywhere.

    The diagonal (and any pair of identical embeddings) is exactly 0 with a zero gradient, rather
    than the NaN gradient of ``sqrt`` at 0.
    """
    return differentiable_distances(embeddings, eps=eps)


def _rkd_normalize(psi: jax.Array) -> jax.Array:
    """Divides by the mean off-diagonal distance (RKD's scale-free relation)."""
    n = psi.shape[-1]
    off = 1.0 - jnp.eye(n, dtype=psi.dtype)
    mean = jnp.sum(psi * off, axis=(-2, -1)) / max(n * (n - 1), 1)
    return psi / jnp.maximum(mean, 1e-12)[..., None, None]


def _huber(x: jax.Array) -> jax.Array:
    a = jnp.abs(x)
    return jnp.where(a < 1.0, 0.5 * x * x, a - 0.5)


@RELATIONS.register("distance")
def distance_transfer(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """The paper's mean squared difference of the plain distances."""
    return jnp.mean(jnp.square(student - teacher))


@RELATIONS.register("rkd")
def rkd_transfer(student: jax.Array, teacher: jax.Array) -> jax.Array:
    """RKD's distance term: the Huber loss between the mean-normalised matrices."""
    return jnp.mean(_huber(_rkd_normalize(student) - _rkd_normalize(teacher)))


def transfer_loss(student: jax.Array, teacher: jax.Array, relation: str = "distance") -> jax.Array:
    """``L^{l<-k}`` for one pair of ``(N, N)`` relation matrices (the teacher is not detached
    here; ``mutual_losses`` does that).

    Raises:
      UnknownNameError: (a ``ValueError``) for a relation not in ``RELATIONS``.
    """
    return RELATIONS.get(relation)(student, teacher)


def mutual_losses(
    local: jax.Array, everyone: jax.Array, offset: jax.Array | int = 0, relation: str = "distance"
) -> jax.Array:
    """Each local member's DM2 loss against all its peers.

    Args:
      local: (L_local, N, N) relation matrices of the members whose loss is computed (they carry
        gradients).
      everyone: (L, N, N) relation matrices of the whole cohort, in member order (all-gathered
        across devices in a sharded cohort); treated as constants.
      offset: cohort index of ``local[0]`` (``local`` is ``everyone[offset:offset + L_local]``).
      relation: ``"distance"`` (the paper) or ``"rkd"``.

    Returns:
      (L_local,) ``(1/(L-1)) sum_{k != l} L^{l<-k}``; zeros for a cohort of one.
    """
    size = everyone.shape[0]
    teachers = jax.lax.stop_gradient(everyone)
    pair = jax.vmap(jax.vmap(transfer_loss, (None, 0, None)), (0, None, None))
    losses = pair(local, teachers, relation)  # (L_local, L)
    own = offset + jnp.arange(local.shape[0])
    peers = jnp.arange(size)[None, :] != own[:, None]
    return jnp.sum(jnp.where(peers, losses, 0.0), axis=1) / max(size - 1, 1)


def mutual_weight(step: jax.Array, weight: float, warmup_steps: int) -> jax.Array:
    """lambda_DM2 at ``step``: linear from 0 to ``weight`` over ``warmup_steps`` (paper 4.2)."""
    if warmup_steps <= 0:
        return jnp.asarray(weight, jnp.float32)
    return weight * jnp.minimum(step.astype(jnp.float32) / warmup_steps, 1.0)
