"""ArcFace: softmax with an additive angular margin on the target class (Deng et al. 2019)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize
from jdml.losses.base import ClassMapLoss, LossOutput, register_loss
from jdml.losses.softmax import batch_accuracy, softmax_cross_entropy
from jdml.registry import NON_NEGATIVE, POSITIVE, Range

# The reference's lower clamp of the cosines (it zeroes every negative cosine).
REFERENCE_COS_MIN = 1e-10


def cosine_bounds(eps: float, reference_clamp: bool) -> tuple[float, float]:
    """Interval the cosines are clamped to before the arccos.

    Args:
      eps: distance of the upper bound (and of the intended lower bound) from +-1.
      reference_clamp: use the reference's lower bound 1e-10 instead of -1 + eps.

    Returns:
      (low, high). The upper bound is 1 - eps in both modes: the reference's 1 - 1e-10 rounds
      to 1.0 in float32, where the arccos has an infinite derivative.
    """
    low = REFERENCE_COS_MIN if reference_clamp else -1.0 + eps
    return low, 1.0 - eps


def arcface_logits(cos: jax.Array, labels: jax.Array, *, margin: float, scale: float) -> jax.Array:
    """scale * (cos + onehot_y * (cos(arccos(cos_y) + margin) - cos_y)).

    Args:
      cos: (B, C) float32 cosines, already clamped inside (-1, 1).
      labels: (B,) int in [0, C).
      margin: additive angular margin m in radians.
      scale: feature scale s.

    Returns:
      (B, C) float32 logits.
    """
    onehot = jax.nn.one_hot(labels, cos.shape[-1], dtype=cos.dtype)
    cos_y = jnp.sum(cos * onehot, axis=1)
    shifted = jnp.cos(jnp.arccos(cos_y) + margin)
    return scale * (cos + onehot * (shifted - cos_y)[:, None])


@register_loss
class ArcFaceLoss(ClassMapLoss):
    """ArcFace: cross-entropy where the target logit is s cos(theta_y + m).

    With the (num_classes, D) class map W, w_c = W_c / |W_c| and cos_ic = x_i . w_c clamped to
    [low, 1 - eps]:

        theta_i = arccos(cos_{i,y_i})
        logits_ic = s (cos_ic + [c = y_i] (cos(theta_i + m) - cos_{i,y_i}))
        loss = mean_i -log softmax(logits_i)[y_i]

    Clamping: the intended interval (default) is [-1 + eps, 1 - eps], which keeps the arccos
    derivative finite at cos = +-1. ``reference_clamp`` reproduces the reference's lower bound
    1e-10, which also zeroes (and stops the gradient of) every negative cosine, target or not.
    The reference's upper bound 1 - 1e-10 equals 1.0 in float32 (infinite arccos derivative
    when an embedding coincides with its class weight), so the upper bound stays 1 - eps.

    No theta + m > pi handling: this is the plain margin of the paper's equation, as in the
    reference; the paper's implementation variants ("easy margin", or falling back to
    cos - m sin m beyond theta = pi - m) are not implemented, so for theta_y > pi - m the
    target logit grows again with the angle.

    The embeddings are used as given: the model is expected to L2-normalise them, as in the
    reference. W starts from U(-1/sqrt(D), 1/sqrt(D)). Its learning rate in the reference is an
    absolute 5e-4 (``--loss_arcface_lr``), 50x its network rate 1e-5; here
    ``class_lr_multiplier`` (50.0) multiplies the network's rate, which keeps that ratio.

    Attributes:
      num_classes: number of training classes (rows of the class map).
      margin: additive angular margin m in radians (0.5).
      scale: feature scale s (16.0).
      class_lr_multiplier: learning rate of the class map as a multiple of the network's (50.0).
      eps: distance of the clamp bounds from +-1 (1e-7).
      reference_clamp: clamp the cosines from below at 1e-10 as the reference does (False).

    Params:
      class_map: float32 (num_classes, D).

    References:
      Deng, Guo, Xue, Zafeiriou, "ArcFace: Additive Angular Margin Loss for Deep Face
      Recognition", CVPR 2019. Roth et al., ICML 2020, reference ``criteria/arcface.py``.
    """

    loss_name: ClassVar[str] = "arcface"
    param_lr: ClassVar[str | None] = "class_lr_multiplier"
    param_ranges: ClassVar[dict[str, Range]] = {
        "class_lr_multiplier": NON_NEGATIVE,
        "eps": POSITIVE,
        "margin": NON_NEGATIVE,
        "scale": POSITIVE,
    }

    _: dataclasses.KW_ONLY
    margin: float = 0.5
    scale: float = 16.0
    class_lr_multiplier: float = 50.0
    eps: float = 1e-7
    reference_clamp: bool = False

    def map_loss(self, x: jax.Array, class_map: jax.Array, labels: jax.Array) -> LossOutput:
        """The loss of L2-normalised float32 (B, D) embeddings ``x``.

        Returns:
          (loss, {"accuracy"}): scalar float32 loss and the fraction of the batch whose highest
          cosine (no margin, no clamp) is to its own class.
        """
        cos = x @ l2_normalize(class_map, axis=1).T
        low, high = cosine_bounds(self.eps, self.reference_clamp)
        logits = arcface_logits(
            jnp.clip(cos, low, high), labels, margin=self.margin, scale=self.scale
        )
        loss = softmax_cross_entropy(logits, labels)
        return loss, {"accuracy": batch_accuracy(cos, labels)}
