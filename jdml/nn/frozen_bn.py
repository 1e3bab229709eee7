"""BatchNorm with fixed running statistics, as one multiply-add per element.

The papers fine-tune with frozen BatchNorm: the running mean and variance stay those of the
pretrained weights and only the affine scale and bias train. Then the layer is
``x * a + b`` with ``a = scale / sqrt(var + eps)`` and ``b = bias - mean * a``, per channel.
``nn.BatchNorm(use_running_average=True)`` computes ``(x - mean) * a + bias`` instead, and its
backward pass keeps the normalised map ``x - mean`` for the scale's gradient: an extra
full-size pass over every activation. Written as a multiply-add, the forward fuses into the
next op and the scale's gradient is a reduction of ``x * dy``; EfficientNet-Lite0's train step
on CPU spends markedly less time in these layers (``bench/bench_finetune_speed.py``).

``FrozenBatchNorm`` has ``nn.BatchNorm``'s variables (params ``scale``, ``bias``; batch_stats
``mean``, ``var``), so weights and checkpoints load unchanged. The values differ from
``nn.BatchNorm``'s only by float rounding.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax


class FrozenBatchNorm(nn.Module):
    """``nn.BatchNorm(use_running_average=True)`` as ``x * a + b``.

    Attributes:
      epsilon: added to the running variance.
      dtype: computation dtype (the variables stay float32).
    """

    epsilon: float = 1e-5
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        shape = (x.shape[-1],)
        mean = self.variable("batch_stats", "mean", lambda s: jnp.zeros(s, jnp.float32), shape)
        var = self.variable("batch_stats", "var", lambda s: jnp.ones(s, jnp.float32), shape)
        scale = self.param("scale", nn.initializers.ones, shape, jnp.float32)
        bias = self.param("bias", nn.initializers.zeros, shape, jnp.float32)
        a = scale * lax.rsqrt(var.value + self.epsilon)
        b = bias - mean.value * a
        return x.astype(self.dtype) * a.astype(self.dtype) + b.astype(self.dtype)
