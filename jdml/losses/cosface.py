"""CosFace (the large margin cosine loss): softmax with an additive cosine margin on the target
class (Wang et al., CVPR 2018)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax

from jdml.geometry import l2_normalize
from jdml.losses.base import ClassMapLoss, LossOutput, register_loss
from jdml.losses.softmax import batch_accuracy, softmax_cross_entropy
from jdml.registry import NON_NEGATIVE, POSITIVE, Range


@register_loss
class CosFaceLoss(ClassMapLoss):
    """CosFace: with x_i and the class weights w_c L2-normalised and cos_ic = x_i . w_c,

        loss = mean_i -log( exp(s (cos_{i,y_i} - m))
                            / (exp(s (cos_{i,y_i} - m)) + sum_{c != y_i} exp(s cos_ic)) )

    (the paper's eq. 4). The class map starts from U(-1/sqrt(D), 1/sqrt(D)) and learns with
    ``class_lr_multiplier`` times the network's learning rate and no weight decay.

    Attributes:
      num_classes: number of training classes (rows of the class map).
      margin: cosine margin m (0.35, the paper's).
      scale: feature scale s (64, the paper's).
      class_lr_multiplier: learning rate of the class map as a multiple of the network's (1.0).

    Params:
      class_map: float32 (num_classes, D).

    References:
      Wang, Wang, Zhou, Ji, Gong, Zhou, Li, Liu, "CosFace: Large Margin Cosine Loss for Deep
      Face Recognition", CVPR 2018.
    """

    loss_name: ClassVar[str] = "cosface"
    param_lr: ClassVar[str | None] = "class_lr_multiplier"
    param_ranges: ClassVar[dict[str, Range]] = {
        "class_lr_multiplier": NON_NEGATIVE,
        "margin": NON_NEGATIVE,
        "scale": POSITIVE,
    }

    _: dataclasses.KW_ONLY
    margin: float = 0.35
    scale: float = 64.0
    class_lr_multiplier: float = 1.0

    def map_loss(self, x: jax.Array, class_map: jax.Array, labels: jax.Array) -> LossOutput:
        """The loss of float32 (B, D) embeddings ``x`` (L2-normalised here).

        Returns:
          (loss, {"accuracy"}): scalar float32 loss and the fraction of the batch whose highest
          cosine is to its own class.
        """
        x = l2_normalize(x, axis=1)
        cos = x @ l2_normalize(class_map, axis=1).T
        onehot = jax.nn.one_hot(labels, self.num_classes, dtype=cos.dtype)
        loss = softmax_cross_entropy(self.scale * (cos - self.margin * onehot), labels)
        return loss, {"accuracy": batch_accuracy(cos, labels)}
