"""Sub-center ArcFace: ArcFace against the nearest of K sub-centers of each class (Deng et al.,
ECCV 2020)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize
from jdml.losses.arcface import arcface_logits, cosine_bounds
from jdml.losses.base import ClassMapLoss, LossOutput, register_loss
from jdml.losses.softmax import batch_accuracy, softmax_cross_entropy
from jdml.registry import COUNT, NON_NEGATIVE, POSITIVE, Range


@register_loss
class SubCenterArcFaceLoss(ClassMapLoss):
    """Sub-center ArcFace: each class c has K sub-centers w_ck; with x_i and the sub-centers
    L2-normalised, a sample's cosine to its class is that of its nearest sub-center,

        cos_ic = max_k x_i . w_ck,

    and the loss is ArcFace's on those cosines (``jdml.losses.arcface``: the target logit is
    s cos(theta_y + m), clamped as ArcFace's default). A noisy sample can settle on a
    sub-center of its own, so the dominant sub-center of each class stays clean (the paper's
    eq. 3 and Fig. 2).

    Attributes:
      num_classes: number of training classes.
      sub_centers: K sub-centers per class (3, the paper's).
      margin: additive angular margin m in radians (0.5, the paper's).
      scale: feature scale s (64, the paper's).
      class_lr_multiplier: learning rate of the sub-centers as a multiple of the network's
        (1.0).
      eps: distance of the cosine clamp from +-1 (1e-7).

    Params:
      class_map: float32 (num_classes * sub_centers, D), the K sub-centers of class c in rows
        c K to c K + K - 1.

    References:
      Deng, Guo, Liu, Zafeiriou, "Sub-center ArcFace: Boosting Face Recognition by Large-scale
      Noisy Web Faces", ECCV 2020.
    """

    loss_name: ClassVar[str] = "subcenter_arcface"
    param_lr: ClassVar[str | None] = "class_lr_multiplier"
    param_ranges: ClassVar[dict[str, Range]] = {
        "class_lr_multiplier": NON_NEGATIVE,
        "eps": POSITIVE,
        "margin": NON_NEGATIVE,
        "scale": POSITIVE,
        "sub_centers": COUNT,
    }

    _: dataclasses.KW_ONLY
    sub_centers: int = 3
    margin: float = 0.5
    scale: float = 64.0
    class_lr_multiplier: float = 1.0
    eps: float = 1e-7

    def map_shape(self, dim: int) -> tuple[int, int]:
        """(num_classes * sub_centers, D): the sub-centers of class c in rows c K to c K + K - 1."""
        return (self.num_classes * self.sub_centers, dim)

    def map_loss(self, x: jax.Array, class_map: jax.Array, labels: jax.Array) -> LossOutput:
        """The loss of float32 (B, D) embeddings ``x`` (L2-normalised here).

        Returns:
          (loss, {"accuracy"}): scalar float32 loss and the fraction of the batch whose highest
          class cosine is its own class's.
        """
        x = l2_normalize(x, axis=1)
        cos_all = x @ l2_normalize(class_map, axis=1).T
        cos = jnp.max(cos_all.reshape(x.shape[0], self.num_classes, self.sub_centers), axis=-1)
        low, high = cosine_bounds(self.eps, reference_clamp=False)
        logits = arcface_logits(
            jnp.clip(cos, low, high), labels, margin=self.margin, scale=self.scale
        )
        return softmax_cross_entropy(logits, labels), {"accuracy": batch_accuracy(cos, labels)}
