"""Normalised softmax loss (Zhai & Wu 2019) and helpers shared by the classifier-style losses."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize
from jdml.losses.base import ClassMapLoss, LossOutput, register_loss
from jdml.registry import NON_NEGATIVE, POSITIVE, Range


def softmax_cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean over the batch of -log softmax(logits)[label].

    Args:
      logits: (B, C) float.
      labels: (B,) int in [0, C).

    Returns:
      Scalar, in the dtype of ``logits``.
    """
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(log_probs, labels[:, None].astype(jnp.int32), axis=-1)
    return -jnp.mean(picked)


def batch_accuracy(scores: jax.Array, labels: jax.Array) -> jax.Array:
    """Fraction of rows whose highest score is at the label (ties go to the lowest index).

    Args:
      scores: (B, C) float, higher is better.
      labels: (B,) int.

    Returns:
      Scalar float32.
    """
    return jnp.mean((jnp.argmax(scores, axis=-1) == labels).astype(jnp.float32))


@register_loss
class NormSoftmaxLoss(ClassMapLoss):
    """Normalised softmax: cross-entropy over cosine-like logits to unit-norm class weights.

    With W the (num_classes, D) class map and w_c = W_c / |W_c|:

        logits_ic = x_i . w_c / temperature,   loss = mean_i -log softmax(logits_i)[y_i]

    The embeddings are used as given: the model is expected to L2-normalise them (then the
    logits are cosines over the temperature), as in the reference, which does not normalise the
    batch inside the loss. W starts from U(-1/sqrt(D), 1/sqrt(D)).

    Learning rate of W: the reference gives it an absolute rate, ``--loss_softmax_lr`` = 1e-5,
    equal to its network rate, and its SOP runs raise it to 0.002 (200x the network's 1e-5).
    Here ``class_lr_multiplier`` multiplies the network's learning rate instead, so the default
    1.0 reproduces the reference default and 200.0 the SOP setting at network lr 1e-5.

    Attributes:
      num_classes: number of training classes (rows of the class map).
      temperature: T (0.05).
      class_lr_multiplier: learning rate of the class map as a multiple of the network's (1.0).

    Params:
      class_map: float32 (num_classes, D).

    References:
      Zhai, Wu, "Classification is a Strong Baseline for Deep Metric Learning", BMVC 2019.
      Roth et al., ICML 2020, reference ``criteria/softmax.py``.
    """

    loss_name: ClassVar[str] = "softmax"
    param_lr: ClassVar[str | None] = "class_lr_multiplier"
    param_ranges: ClassVar[dict[str, Range]] = {
        "class_lr_multiplier": NON_NEGATIVE,
        "temperature": POSITIVE,
    }

    _: dataclasses.KW_ONLY
    temperature: float = 0.05
    class_lr_multiplier: float = 1.0

    def map_loss(self, x: jax.Array, class_map: jax.Array, labels: jax.Array) -> LossOutput:
        """The loss of L2-normalised float32 (B, D) embeddings ``x``.

        Returns:
          (loss, {"accuracy"}): scalar float32 loss and the fraction of the batch whose highest
          logit is its own class.
        """
        logits = x @ l2_normalize(class_map, axis=1).T / self.temperature
        loss = softmax_cross_entropy(logits, labels)
        return loss, {"accuracy": batch_accuracy(logits, labels)}
