"""SoftTriple loss: softmax over classes with several learnable centres each (Qian et al. 2019)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from jdml.geometry import l2_normalize
from jdml.losses.base import ClassMapLoss, LossOutput, register_loss
from jdml.losses.softmax import batch_accuracy, softmax_cross_entropy
from jdml.registry import COUNT, NON_NEGATIVE, POSITIVE, Range

# Added under the square root of the regulariser: sqrt(2 + 1e-5 - 2 w.w') (paper and reference).
REG_SQRT_EPS = 1e-5
# Floor of that square root's argument; only reached by non-unit centres (``reference_quirks``).
REG_SQRT_FLOOR = 1e-12


def class_similarities(
    sims: jax.Array, gamma: float, *, reference_quirks: bool
) -> tuple[jax.Array, jax.Array]:
    """Relaxed per-class similarity S_c = sum_k w_ck S_ck.

    Args:
      sims: (B, C, K) float32 similarities to every centre.
      gamma: softmax temperature of the centre weights (intended: divides; reference:
        multiplies).
      reference_quirks: weights softmax(gamma * S) over the classes (axis 1) instead of
        softmax(S / gamma) over the centres of each class (axis 2).

    Returns:
      ((B, C) class similarities, (B, C, K) weights).
    """
    if reference_quirks:
        weights = jax.nn.softmax(gamma * sims, axis=1)
    else:
        weights = jax.nn.softmax(sims / gamma, axis=2)
    return jnp.sum(weights * sims, axis=2), weights


def centroid_regulariser(centroids: jax.Array, num_classes: int, k: int) -> jax.Array:
    """sum_c sum_{k < k'} sqrt(2 + 1e-5 - 2 w_ck . w_ck') / (C K (K - 1)); 0 when K = 1.

    Args:
      centroids: (D, C * K) float32 centres, column c * K + k for centre k of class c.
      num_classes: C.
      k: K, centres per class.

    Returns:
      Scalar float32. The divisor counts ordered pairs, so this is half the mean over pairs.
    """
    if k < 2:
        return jnp.zeros((), jnp.float32)
    per_class = centroids.reshape(centroids.shape[0], num_classes, k)
    gram = jnp.einsum("dck,dcl->ckl", per_class, per_class)
    rows, cols = np.triu_indices(k, 1)
    pair_sims = gram[:, rows, cols]
    dist = jnp.sqrt(jnp.maximum(2.0 + REG_SQRT_EPS - 2.0 * pair_sims, REG_SQRT_FLOOR))
    return jnp.sum(dist) / (num_classes * k * (k - 1))


@register_loss
class SoftTripleLoss(ClassMapLoss):
    """SoftTriple: cross-entropy over relaxed class similarities to K centres per class.

    With centres W (D, C K), S = x W reshaped to (B, C, K):

        w_ick   = softmax_k(S_ick / gamma),        S_ic = sum_k w_ick S_ick
        logits  = lambda (S_ic - delta [c = y_i])
        loss    = mean_i -log softmax(logits_i)[y_i] + tau Reg
        Reg     = sum_c sum_{k < k'} sqrt(2 + 1e-5 - 2 w_ck . w_ck') / (C K (K - 1))

    where every centre (column of W) is L2-normalised. Defaults are the paper's: K = 10,
    lambda = 20, gamma = 0.1, delta = 0.01, tau = 0.2.

    ``reference_quirks`` reproduces the reference implementation's two axis bugs and its use of
    gamma: W is normalised along the centre axis (each embedding dimension across all C K
    centres) instead of per centre, and the weights are softmax(gamma * S) over the *classes*
    instead of softmax(S / gamma) over each class's centres. It changes nothing else: the
    reference's runs also used K = 2 and lambda = 8, set through ``n_centroids`` and ``lam``.
    With those non-unit centres 2 + 1e-5 - 2 w.w' can go negative (NaN in the reference); the
    argument of the square root is floored at 1e-12. With K = 1 there is no pair and Reg = 0
    (the reference divides 0 by 0).

    The embeddings are used as given: the model is expected to L2-normalise them, as in the
    paper. W starts from U(-1/sqrt(C K), 1/sqrt(C K)). Its learning rate is
    ``centroid_lr_multiplier`` times the network's: the reference means
    ``--loss_softtriplet_lrmulti`` (default 1) but reads a flag that does not exist
    (``loss_softtriplet_lr``) and crashes, so 1.0 is its intended value.

    Attributes:
      num_classes: number of training classes C.
      n_centroids: centres per class K (10; reference runs 2).
      lam: lambda, the scale of the logits (20.0; reference runs 8).
      gamma: temperature of the centre weights (0.1).
      margin_delta: delta, the margin subtracted from the target similarity (0.01).
      reg_weight: tau, the weight of the centre regulariser (0.2).
      centroid_lr_multiplier: learning rate of the centres as a multiple of the network's (1.0).
      reference_quirks: reproduce the reference's normalisation and softmax axes and its
        gamma-as-multiplier (False).

    Params:
      centroids: float32 (D, num_classes * n_centroids).

    References:
      Qian, Shang, Sun, Hu, Li, Jin, "SoftTriple Loss: Deep Metric Learning Without Triplet
      Sampling", ICCV 2019. Roth et al., ICML 2020, reference ``criteria/softtriplet.py``.
    """

    loss_name: ClassVar[str] = "softtriplet"
    param_lr: ClassVar[str | None] = "centroid_lr_multiplier"
    param_ranges: ClassVar[dict[str, Range]] = {
        "centroid_lr_multiplier": NON_NEGATIVE,
        "gamma": POSITIVE,
        "lam": POSITIVE,
        "margin_delta": NON_NEGATIVE,
        "n_centroids": COUNT,
        "reg_weight": NON_NEGATIVE,
    }
    map_param: ClassVar[str] = "centroids"

    _: dataclasses.KW_ONLY
    n_centroids: int = 10
    lam: float = 20.0
    gamma: float = 0.1
    margin_delta: float = 0.01
    reg_weight: float = 0.2
    centroid_lr_multiplier: float = 1.0
    reference_quirks: bool = False

    def map_shape(self, dim: int) -> tuple[int, int]:
        """(D, num_classes * n_centroids): column c K + k is centre k of class c."""
        return (dim, self.num_classes * self.n_centroids)

    def map_loss(self, x: jax.Array, centroids: jax.Array, labels: jax.Array) -> LossOutput:
        """The loss of L2-normalised float32 (B, D) embeddings ``x``.

        Returns:
          (loss, {"accuracy", "regulariser"}): scalar float32 loss; the fraction of the batch
          whose highest class similarity is its own class; the unweighted Reg.
        """
        c, k = self.num_classes, self.n_centroids
        centres = l2_normalize(centroids, axis=1 if self.reference_quirks else 0)
        sims = (x @ centres).reshape(x.shape[0], c, k)
        class_sims, _ = class_similarities(sims, self.gamma, reference_quirks=self.reference_quirks)
        onehot = jax.nn.one_hot(labels, c, dtype=jnp.float32)
        logits = self.lam * (class_sims - self.margin_delta * onehot)
        regulariser = centroid_regulariser(centres, c, k)
        loss = softmax_cross_entropy(logits, labels) + self.reg_weight * regulariser
        metrics = {"accuracy": batch_accuracy(class_sims, labels), "regulariser": regulariser}
        return loss, metrics
