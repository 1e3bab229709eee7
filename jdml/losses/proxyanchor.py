"""Proxy-Anchor: each class proxy is an anchor that pulls the batch's samples of its class and
pushes the others (Kim, Kim, Cho, Kwak, CVPR 2020)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize
from jdml.losses.base import ClassMapLoss, LossOutput, register_loss, safe_divide
from jdml.losses.npair import log1p_sum_exp
from jdml.losses.softmax import batch_accuracy
from jdml.registry import NON_NEGATIVE, POSITIVE, Range


def fan_out_normal(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype) -> jax.Array:
    """He-normal over the rows of a (C, D) proxy matrix: N(0, 2 / C), the paper code's
    ``kaiming_normal_(mode="fan_out")`` (PyTorch counts a (C, D) matrix's rows as its fan-out)."""
    return jax.random.normal(key, shape, dtype) * math.sqrt(2.0 / shape[0])


@register_loss
class ProxyAnchorLoss(ClassMapLoss):
    """Proxy-Anchor loss on cosine similarities s(x, p) of L2-normalised embeddings and proxies:

        loss = 1/|P+| sum_{p in P+} log(1 + sum_{x in X_p+} exp(-alpha (s(x, p) - delta)))
             + 1/|P|  sum_{p in P}  log(1 + sum_{x in X_p-} exp( alpha (s(x, p) + delta)))

    P is every class proxy, P+ the proxies of the classes present in the batch, X_p+ the batch's
    samples of p's class and X_p- the others (the paper's eq. 4). Each sample's gradient weighs
    it against the other samples of the batch, as a pair loss does, at the cost of a proxy loss.
    Proxies start from N(0, 2 / C), as the paper's code draws them, and learn with
    ``proxy_lr_multiplier`` times the network's learning rate (the paper's 100) and no weight
    decay.

    Attributes:
      num_classes: number of training classes (one proxy each).
      alpha: scale (32).
      margin: delta (0.1).
      proxy_lr_multiplier: learning rate of the proxies as a multiple of the network's (100).

    Params:
      proxies: float32 (num_classes, D).

    References:
      Kim, Kim, Cho, Kwak, "Proxy Anchor Loss for Deep Metric Learning", CVPR 2020.
    """

    loss_name: ClassVar[str] = "proxyanchor"
    param_lr: ClassVar[str | None] = "proxy_lr_multiplier"
    param_ranges: ClassVar[dict[str, Range]] = {
        "alpha": POSITIVE,
        "margin": NON_NEGATIVE,
        "proxy_lr_multiplier": NON_NEGATIVE,
    }
    map_param: ClassVar[str] = "proxies"

    _: dataclasses.KW_ONLY
    alpha: float = 32.0
    margin: float = 0.1
    proxy_lr_multiplier: float = 100.0

    def map_init(self) -> nn.initializers.Initializer:
        """N(0, 2 / C), as the paper's code draws the proxies (``fan_out_normal``)."""
        return fan_out_normal

    def map_loss(self, x: jax.Array, proxies: jax.Array, labels: jax.Array) -> LossOutput:
        """The loss of float32 (B, D) embeddings ``x``.

        Returns:
          (loss, {"accuracy", "pos_loss", "neg_loss"}): scalar float32 loss; the fraction of
          the batch whose most similar proxy is its own class's; the two terms of the loss.
        """
        cos = l2_normalize(x, axis=1) @ l2_normalize(proxies, axis=1).T  # (B, C)
        own = jax.nn.one_hot(labels, self.num_classes, dtype=jnp.bool_)
        # Per proxy (rows of the transposed (C, B) matrices): log(1 + sum over its samples).
        pos = log1p_sum_exp(-self.alpha * (cos.T - self.margin), own.T)
        neg = log1p_sum_exp(self.alpha * (cos.T + self.margin), ~own.T)
        present = jnp.any(own, axis=0)
        pos_loss = safe_divide(jnp.sum(pos), jnp.sum(present))  # an absent proxy's term is 0
        neg_loss = jnp.sum(neg) / self.num_classes
        metrics = {
            "accuracy": batch_accuracy(cos, labels),
            "neg_loss": neg_loss,
            "pos_loss": pos_loss,
        }
        return pos_loss + neg_loss, metrics
