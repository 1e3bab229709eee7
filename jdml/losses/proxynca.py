"""ProxyNCA: NCA against one learnable proxy per class (Movshovitz-Attias et al. 2017)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.geometry import l2_normalize
from jdml.losses.base import ClassMapLoss, LossOutput, register_loss
from jdml.losses.softmax import batch_accuracy
from jdml.registry import NON_NEGATIVE, POSITIVE, Range


def proxy_squared_distances(x: jax.Array, proxies: jax.Array, scale: float) -> jax.Array:
    """d_ic = |scale * x_i/|x_i| - scale * p_c/|p_c||^2.

    Args:
      x: (B, D) float32 embeddings.
      proxies: (C, D) float32 proxies.
      scale: factor applied to both after L2 normalisation.

    Returns:
      (B, C) float32 squared distances, smooth everywhere (also at d = 0).
    """
    xs = scale * l2_normalize(x, axis=1)
    ps = scale * l2_normalize(proxies, axis=1)
    return jnp.sum(jnp.square(xs[:, None, :] - ps[None, :, :]), axis=-1)


@register_loss
class ProxyNCALoss(ClassMapLoss):
    """ProxyNCA in the reference's form: the positive proxy is left out of the denominator.

    With d_ic the squared distance between the L2-normalised embedding and proxy, both scaled by
    ``scale`` (so d_ic = 2 scale^2 (1 - cos(x_i, p_c))):

        loss = mean_i [ d_{i,y_i} + log sum_{c != y_i} exp(-d_ic) ]
             = mean_i -log( exp(-d_{i,y_i}) / sum_{c != y_i} exp(-d_ic) )

    This is the paper's NCA ratio, which can go negative (the positive is not in the
    denominator). The scale 3 is the reference's temperature; the paper has none. Proxies start
    from N(0, 1/8^2) and are learned with ``proxy_lr_multiplier`` times the network's learning
    rate (the reference's ``--loss_proxynca_lrmulti`` 50, i.e. 5e-4 at its network lr 1e-5) and
    no weight decay.

    Attributes:
      num_classes: number of training classes (one proxy each; at least 2).
      scale: factor on the normalised embeddings and proxies (3.0).
      proxy_lr_multiplier: learning rate of the proxies as a multiple of the network's (50.0).

    Params:
      proxies: float32 (num_classes, D).

    References:
      Movshovitz-Attias, Toshev, Leung, Ioffe, Singh, "No Fuss Distance Metric Learning Using
      Proxies", ICCV 2017. Roth et al., ICML 2020, reference ``criteria/proxynca.py``.
    """

    loss_name: ClassVar[str] = "proxynca"
    param_lr: ClassVar[str | None] = "proxy_lr_multiplier"
    param_ranges: ClassVar[dict[str, Range]] = {
        "proxy_lr_multiplier": NON_NEGATIVE,
        "scale": POSITIVE,
    }
    map_param: ClassVar[str] = "proxies"

    _: dataclasses.KW_ONLY
    scale: float = 3.0
    proxy_lr_multiplier: float = 50.0

    def map_init(self) -> nn.initializers.Initializer:
        """N(0, 1/8^2), the reference's initialisation of the proxies."""
        return nn.initializers.normal(stddev=1.0 / 8.0)

    def map_loss(self, x: jax.Array, proxies: jax.Array, labels: jax.Array) -> LossOutput:
        """The loss of float32 (B, D) embeddings ``x``.

        Returns:
          (loss, {"accuracy"}): scalar float32 loss and the fraction of the batch whose nearest
          proxy is its own class's.

        Raises:
          ValueError: with fewer than 2 classes (no negative proxy).
        """
        if self.num_classes < 2:
            raise ValueError(f"proxynca needs at least 2 classes, got {self.num_classes}")
        dist = proxy_squared_distances(x, proxies, self.scale)
        is_pos = jax.nn.one_hot(labels, self.num_classes, dtype=jnp.bool_)
        pos = jnp.sum(jnp.where(is_pos, dist, 0.0), axis=1)
        neg = jax.nn.logsumexp(jnp.where(is_pos, -jnp.inf, -dist), axis=1)
        loss = jnp.mean(pos + neg)
        return loss, {"accuracy": batch_accuracy(-dist, labels)}
