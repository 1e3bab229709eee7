"""CosFace (the large margin cosine loss): softmax with an additive cosine margin on the target
class (Wang et al., CVPR 2018)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize
from jdml.losses.base import Loss, LossOutput, register_loss
from jdml.losses.softmax import batch_accuracy, softmax_cross_entropy, unit_class_map
from jdml.miners.base import Tuples
from jdml.registry import NON_NEGATIVE, POSITIVE, Range


@register_loss
class CosFaceLoss(Loss):
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
    needs_miner: ClassVar[bool] = False
    param_lr: ClassVar[str | None] = "class_lr_multiplier"
    param_lr_is_multiplier: ClassVar[bool] = True
    param_ranges: ClassVar[dict[str, Range]] = {
        "class_lr_multiplier": NON_NEGATIVE,
        "margin": NON_NEGATIVE,
        "scale": POSITIVE,
    }

    _: dataclasses.KW_ONLY
    num_classes: int
    margin: float = 0.35
    scale: float = 64.0
    class_lr_multiplier: float = 1.0

    @nn.compact
    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32; L2-normalised here).
          labels: (B,) int in [0, num_classes).
          tuples: ignored (the loss takes no miner).

        Returns:
          (loss, {"accuracy"}): scalar float32 loss and the fraction of the batch whose highest
          cosine is to its own class.
        """
        x = l2_normalize(embeddings.astype(jnp.float32), axis=1)
        cos = x @ unit_class_map(self, self.num_classes, x.shape[-1]).T
        onehot = jax.nn.one_hot(labels, self.num_classes, dtype=cos.dtype)
        loss = softmax_cross_entropy(self.scale * (cos - self.margin * onehot), labels)
        return loss, {"accuracy": batch_accuracy(cos, labels)}
