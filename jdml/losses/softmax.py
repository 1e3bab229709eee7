"""Normalised softmax loss (Zhai & Wu 2019) and helpers shared by the classifier-style losses."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize
from jdml.losses.base import Loss, LossOutput, register_loss
from jdml.miners.base import Tuples
from jdml.registry import NON_NEGATIVE, POSITIVE, Range


def symmetric_uniform(bound: float) -> nn.initializers.Initializer:
    """Initializer drawing every entry from U(-bound, bound).

    Args:
      bound: half-width of the interval.

    Returns:
      An ``init(key, shape, dtype=float32)`` function for ``Module.param``.
    """

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def unit_class_map(module: nn.Module, rows: int, dim: int) -> jax.Array:
    """The parameter ``class_map`` of a classification loss, L2-normalised per row.

    Declared on ``module`` (from its compact ``__call__``) as (rows, dim) float32 drawn from
    U(-1/sqrt(dim), 1/sqrt(dim)), the reference's initialisation of its class maps.

    Returns:
      (rows, dim) float32, unit rows.
    """
    init = symmetric_uniform(1.0 / math.sqrt(dim))
    class_map = module.param("class_map", init, (rows, dim), jnp.float32)
    return l2_normalize(class_map, axis=1)


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
class NormSoftmaxLoss(Loss):
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
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = False
    param_lr: ClassVar[str | None] = "class_lr_multiplier"
    param_ranges: ClassVar[dict[str, Range]] = {
        "class_lr_multiplier": NON_NEGATIVE,
        "temperature": POSITIVE,
    }
    param_lr_is_multiplier: ClassVar[bool] = True

    _: dataclasses.KW_ONLY
    num_classes: int
    temperature: float = 0.05
    class_lr_multiplier: float = 1.0

    @nn.compact
    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Computes the loss.

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32), L2-normalised.
          labels: (B,) int in [0, num_classes); out-of-range labels are not checked under jit.
          tuples: ignored (the loss takes no miner).

        Returns:
          (loss, {"accuracy"}): scalar float32 loss and the fraction of the batch whose highest
          logit is its own class.
        """
        x = embeddings.astype(jnp.float32)
        class_map = unit_class_map(self, self.num_classes, x.shape[-1])
        logits = x @ class_map.T / self.temperature
        loss = softmax_cross_entropy(logits, labels)
        return loss, {"accuracy": batch_accuracy(logits, labels)}
