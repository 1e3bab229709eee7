"""Distance-adapted noise-contrastive estimation (DaNCE) of DiVA (Milbich, Roth et al. 2020).

A pure function, not a registered ``Loss``: it contrasts the online network's queries with the
momentum (EMA) network's keys and a memory queue of past keys (``jdml.methods.ema_queue``), which
the registry's ``(embeddings, labels, tuples)`` interface does not carry.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

from jdml.losses.base import LossOutput
from jdml.miners.distance import MAX_DISTANCE

Normalize = Literal["anchor", "batch"]


def _check_config(lower_cutoff: float, upper_cutoff: float | None, normalize: str) -> None:
    if not 0.0 < lower_cutoff < MAX_DISTANCE:
        raise ValueError(f"lower_cutoff must lie in (0, 2), got {lower_cutoff}")
    if upper_cutoff is not None and upper_cutoff <= lower_cutoff:
        raise ValueError(
            f"upper_cutoff {upper_cutoff} must exceed lower_cutoff {lower_cutoff} (or be None)"
        )
    if normalize not in ("anchor", "batch"):
        raise ValueError(f"normalize must be 'anchor' or 'batch', got {normalize!r}")


def distance_weights(
    queries: jax.Array,
    queue: jax.Array,
    *,
    lower_cutoff: float = 0.5,
    upper_cutoff: float | None = 1.4,
    normalize: Normalize = "anchor",
    queue_valid: jax.Array | None = None,
) -> jax.Array:
    """Normalised inverse-density weights of every (query, queue entry) pair; no gradient.

    With D the embedding dimension, q(d) ∝ d^(D-2) (1 - d^2/4)^((D-3)/2) is the density of the
    distance between two uniform points of the unit sphere S^(D-1), and the weight is q(d)^-1:

    - d = sqrt(max(2 - 2 q·Q_j, 0)) (unit vectors), clamped to [lower_cutoff, 2 - 1e-4]: the
      lower clamp is the reference's cap on the weight of very close negatives (the paper's
      w(d) = min(lambda, q^-1(d))), the upper one keeps log(1 - d^2/4) finite at d = 2;
    - log w = (2 - D) log d - ((D - 3) / 2) log(1 - d^2 / 4);
    - entries with unclamped d > upper_cutoff get weight 0 (``upper_cutoff=None``: none do), as
      do queue entries marked invalid by ``queue_valid``;
    - normalisation: ``"anchor"`` (the reference's ``--diva_fixed``, the paper's intent) makes
      each query's weights over the queue sum to 1; ``"batch"`` (the reference's default code)
      makes each queue entry's weights over the batch (axis 0) sum to 1.

    Numerics versus the reference: the reference subtracts a maximum of log w (the global one
    over the B x N matrix by default, the row one with ``--diva_fixed``) before ``exp``, zeroes
    the entries beyond the cutoff, clamps every weight to >= 1e-45 and divides by the sum. The
    subtracted maximum cancels in the division, so here each normalisation slice is normalised
    in log space (``exp(log w - logsumexp(log w))`` over its kept entries): the same values in
    exact arithmetic, without the float32 underflow that the reference's global maximum causes
    for D = 128 (XLA flushes denormals, so the 1e-45 clamp would not be representable either).
    The clamp's only visible effect is kept explicitly: a slice with no kept entry (e.g. a query
    whose whole queue lies beyond the upper cutoff) gets uniform weights over its valid entries
    (1 / #valid queue entries per query for ``"anchor"``, 1 / B per queue entry for ``"batch"``),
    which is what the reference's clamp-then-normalise yields, instead of 0/0 = NaN. Entries
    beyond the cutoff in a slice that keeps others are exactly 0 (the reference: 1e-45 / sum).

    Args:
      queries: (B, D) float, L2-normalised (the distances assume unit vectors).
      queue: (N, D) float, L2-normalised keys.
      lower_cutoff: distances below this are treated as equal to it (0.5).
      upper_cutoff: entries farther than this get weight 0 (1.4), or None for no cutoff.
      normalize: ``"anchor"`` (rows sum to 1) or ``"batch"`` (columns sum to 1).
      queue_valid: (N,) bool, False for unfilled queue slots (weight 0), or None (all valid).

    Returns:
      (B, N) float32 weights, wrapped in ``stop_gradient``; invalid columns are 0.

    References:
      Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric
      Learning", ECCV 2020, Sec. 3.1 (w(d) and Eq. 6); reference ``criteria/fast_moco.py`` and
      its issue #3 (``--diva_fixed``). Wu et al., "Sampling Matters in Deep Embedding Learning",
      ICCV 2017 (the distance density).
    """
    _check_config(lower_cutoff, upper_cutoff, normalize)
    q = jax.lax.stop_gradient(queries).astype(jnp.float32)
    bank = jax.lax.stop_gradient(queue).astype(jnp.float32)
    dim = q.shape[-1]
    dist = jnp.sqrt(jnp.maximum(2.0 - 2.0 * (q @ bank.T), 0.0))
    d = jnp.clip(dist, lower_cutoff, MAX_DISTANCE)
    log_w = (2.0 - dim) * jnp.log(d) - ((dim - 3.0) / 2.0) * jnp.log1p(-0.25 * d * d)

    valid = jnp.ones(bank.shape[0], bool) if queue_valid is None else queue_valid.astype(bool)
    valid = jnp.broadcast_to(valid[None, :], log_w.shape)
    kept = valid if upper_cutoff is None else valid & (dist <= upper_cutoff)
    axis = 1 if normalize == "anchor" else 0

    masked = jnp.where(kept, log_w, -jnp.inf)
    has_kept = jnp.any(kept, axis=axis, keepdims=True)
    log_norm = jax.nn.logsumexp(jnp.where(has_kept, masked, 0.0), axis=axis, keepdims=True)
    weights = jnp.where(kept, jnp.exp(masked - log_norm), 0.0)
    num_valid = jnp.sum(valid, axis=axis, keepdims=True).astype(jnp.float32)
    uniform = jnp.where(valid, 1.0 / jnp.maximum(num_valid, 1.0), 0.0)
    return jax.lax.stop_gradient(jnp.where(has_kept, weights, uniform))


def dance_loss(
    queries: jax.Array,
    keys: jax.Array,
    queue: jax.Array,
    *,
    temperature: float | jax.Array,
    lower_cutoff: float = 0.5,
    upper_cutoff: float | None = 1.4,
    normalize: Normalize = "anchor",
    weighting: bool = True,
    queue_valid: jax.Array | None = None,
) -> LossOutput:
    """DaNCE: InfoNCE against a key queue with distance-adapted negative logits.

    For query q_i (online network, view a), its key k_i (EMA network, view b) and queue entries
    Q_j (past keys), with weights w_ij from ``distance_weights`` (no gradient):

        l_pos_i  = q_i·k_i,   l_neg_ij = w_ij * (q_i·Q_j)
        loss     = mean_i -log( exp(l_pos_i / tau) / (exp(l_pos_i / tau)
                                                      + sum_j exp(l_neg_ij / tau)) )

    i.e. cross-entropy with target 0 over the logits [l_pos, l_neg] / tau. ``weighting=False``
    sets w = 1: plain MoCo InfoNCE.

    Weight placement. The paper's Eq. 6 reads
        L_DaNCE = 1/Z sum_a -log[ exp(phi(I_a)^T phi(~I_a) / tau)
                                  / sum_{I_n in N} exp(w(d_an) * phi*(I_n)^T phi(I_a) / tau) ],
    so the weight multiplies the negative's logit inside the exponential, exactly as the
    reference does (``l_neg = l_neg * distance_weighting``); there is one placement, hence no
    option. Two differences from Eq. 6 as printed, where this follows the reference (and MoCo):
    the positive term is also in the denominator, and the paper's cap w = min(lambda, q^-1(d))
    is realised by the lower distance clamp plus the upper cutoff and normalisation (see
    ``distance_weights``). Note that a weight of 0 does not remove a negative: its logit becomes
    0 and still adds exp(0) to the denominator, as in the reference.

    ``queue_valid`` removes unfilled queue slots from the softmax entirely (their logits are
    -inf), so a partly filled queue behaves like a shorter queue of its valid entries.

    Args:
      queries: (B, D) float, L2-normalised; gradients flow into them.
      keys: (B, D) float, L2-normalised positives; gradients flow into them too, so the caller
        passes EMA-network keys through ``stop_gradient`` (the reference computes them under
        ``no_grad``).
      queue: (N, D) float, L2-normalised past keys; treated as a constant (``stop_gradient``).
      temperature: tau > 0 (0.01 in the paper's runs, 0.1 the reference's flag default); may be
        a traced scalar for a trainable temperature.
      lower_cutoff: see ``distance_weights`` (0.5).
      upper_cutoff: see ``distance_weights`` (1.4), or None.
      normalize: ``"anchor"`` (default; the reference's ``--diva_fixed``) or ``"batch"`` (the
        reference's default code).
      weighting: False for unweighted InfoNCE.
      queue_valid: (N,) bool mask of filled queue slots, or None (all filled).

    Returns:
      (loss, {"dance_accuracy", "dance_neg_logit", "dance_pos_logit"}): scalar float32 loss; the
      fraction of queries whose positive logit is >= every valid negative logit (after
      weighting); the mean unweighted q·Q_j over valid entries; the mean q_i·k_i.

    References:
      Milbich, Roth et al., "DiVA: Diverse Visual Feature Aggregation for Deep Metric
      Learning", ECCV 2020, Eq. 6; reference ``criteria/fast_moco.py``. He et al., "Momentum
      Contrast for Unsupervised Visual Representation Learning", CVPR 2020.
    """
    _check_config(lower_cutoff, upper_cutoff, normalize)
    q = queries.astype(jnp.float32)
    k = keys.astype(jnp.float32)
    bank = jax.lax.stop_gradient(queue).astype(jnp.float32)

    l_pos = jnp.sum(q * k, axis=-1)
    sim_neg = q @ bank.T
    l_neg = sim_neg
    if weighting:
        l_neg = sim_neg * distance_weights(
            q,
            bank,
            lower_cutoff=lower_cutoff,
            upper_cutoff=upper_cutoff,
            normalize=normalize,
            queue_valid=queue_valid,
        )
    if queue_valid is not None:
        l_neg = jnp.where(queue_valid[None, :], l_neg, -jnp.inf)

    logits = jnp.concatenate([l_pos[:, None], l_neg], axis=1) / temperature
    loss = -jnp.mean(jax.nn.log_softmax(logits, axis=1)[:, 0])

    accuracy = jnp.mean((l_pos >= jnp.max(l_neg, axis=1, initial=-jnp.inf)).astype(jnp.float32))
    if queue_valid is None:
        neg_mean = jnp.mean(sim_neg)
    else:
        mask = jnp.broadcast_to(queue_valid[None, :], sim_neg.shape)
        neg_mean = jnp.sum(jnp.where(mask, sim_neg, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
    metrics = {
        "dance_accuracy": accuracy,
        "dance_neg_logit": neg_mean.astype(jnp.float32),
        "dance_pos_logit": jnp.mean(l_pos),
    }
    return loss, metrics
