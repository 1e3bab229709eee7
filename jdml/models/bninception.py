"""BN-Inception (Ioffe & Szegedy, "Batch Normalization: Accelerating Deep Network Training by
Reducing Internal Covariate Shift", ICML 2015), as defined by Cadene's ``pretrainedmodels``.

The Inception network of the BatchNorm paper: the 5x5 convolutions of GoogLeNet replaced by two
stacked 3x3, BatchNorm (eps 1e-5) after every convolution (the convolutions keep their biases),
average-pool branches in most blocks, and two reduction blocks (``inception_3c``,
``inception_4e``) whose stride-2 branches are concatenated with a stride-2 max pool of the input.
All pools use PyTorch's ``ceil_mode``; the 3x3 stride-1 average pools count the zero padding
(always divide by 9).

Input convention. The weights (a Caffe port) expect BGR images on the 0-255 scale minus the
per-channel means (104, 117, 128) in BGR order, std 1. This module takes RGB input like every
other backbone here and flips the channels itself, so the pipeline's per-channel
normalisation ``(x - MEAN) / STD`` on [0, 1] pixels with the RGB-order constants below gives
exactly Cadene's input. (The reference DML code used std 0.0039 ~ 1/256 instead of 1/255, a
0.4% input scale difference.) Input size: 224; the maps entering ``inception_3c`` and
``inception_4e`` must have even sizes (e.g. inputs that are multiples of 32), as in the PyTorch
model, where the ceil-mode pool and the strided convolutions otherwise disagree by one pixel.

Pooled features: the global average of the last map. Cadene's ``logits`` applies a 7x7 average
pool, which equals it for 224-pixel inputs; the DML reference uses adaptive average pooling.

Module and parameter names are Cadene's: ``conv1_7x7_s2`` and ``conv1_7x7_s2_bn`` at the top,
and a block ``inception_4a`` holds ``double_3x3_1`` for ``inception_4a_double_3x3_1``, so the
converter (``jdml.models.pretrained.bninception``) joins names with ``_`` and transposes.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from jdml.models.googlenet import max_pool_ceil
from jdml.models.registry import BACKBONES
from jdml.models.resnet50 import batch_norm, conv, global_pool

# Cadene's mean (104, 117, 128) and std 1 on BGR 0-255 pixels, as RGB-order constants on [0, 1].
MEAN = (128.0 / 255.0, 117.0 / 255.0, 104.0 / 255.0)
STD = (1.0 / 255.0, 1.0 / 255.0, 1.0 / 255.0)
BN_EPS = 1e-5
FEATURES = 1024
# Regular blocks: (1x1, 3x3 reduce, 3x3, double reduce, double 1, double 2, pool, pool proj).
# Reduction blocks: (3x3 reduce, 3x3, double reduce, double 1, double 2).
BLOCKS: dict[str, tuple] = {
    "inception_3a": (64, 64, 64, 64, 96, 96, "avg", 32),
    "inception_3b": (64, 64, 96, 64, 96, 96, "avg", 64),
    "inception_3c": (128, 160, 64, 96, 96),
    "inception_4a": (224, 64, 96, 96, 128, 128, "avg", 128),
    "inception_4b": (192, 96, 128, 96, 128, 128, "avg", 128),
    "inception_4c": (160, 128, 160, 128, 160, 160, "avg", 128),
    "inception_4d": (96, 128, 192, 160, 192, 192, "avg", 128),
    "inception_4e": (128, 192, 192, 256, 256),
    "inception_5a": (352, 192, 320, 160, 224, 224, "avg", 128),
    "inception_5b": (352, 192, 320, 192, 224, 224, "max", 128),
}


def conv_bn(
    x: jnp.ndarray,
    features: int,
    kernel: int,
    name: str,
    *,
    stride: int = 1,
    train_bn: bool,
    dtype: jnp.dtype,
) -> jnp.ndarray:
    """Convolution with bias ``name``, BatchNorm ``name_bn``, ReLU; call inside a compact
    module, so both land in that module under the PyTorch names."""
    x = conv(features, kernel, stride, kernel // 2, dtype, name, True)(x)
    return nn.relu(batch_norm(train_bn, BN_EPS, dtype, f"{name}_bn")(x))


class Block(nn.Module):
    """One Inception block of BN-Inception.

    A regular block concatenates a 1x1 branch, 1x1 -> 3x3, 1x1 -> 3x3 -> 3x3 ("double") and a
    3x3 stride-1 pool -> 1x1 projection. A reduction block concatenates 1x1 -> 3x3 stride 2,
    the double branch ending in stride 2, and a 3x3 stride-2 ceil-mode max pool of the input.

    Attributes:
      widths: see ``BLOCKS`` (8 entries: regular, 5: reduction).
      train_bn: BatchNorm in training mode.
      dtype: computation dtype.
    """

    widths: tuple
    train_bn: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        def unit(y: jnp.ndarray, features: int, kernel: int, name: str, stride: int = 1):
            return conv_bn(
                y, features, kernel, name, stride=stride, train_bn=self.train_bn, dtype=self.dtype
            )

        reduction = len(self.widths) == 5
        if reduction:
            w3r, w3, wdr, wd1, wd2 = self.widths
            stride = 2
            if x.shape[1] % 2 or x.shape[2] % 2:
                raise ValueError(
                    f"{self.name} needs a map of even size, got {x.shape[1]}x{x.shape[2]}: "
                    "use inputs whose size is a multiple of 32 (224)"
                )
        else:
            w1, w3r, w3, wdr, wd1, wd2, pool, wp = self.widths
            stride = 1
        b3 = unit(unit(x, w3r, 1, "3x3_reduce"), w3, 3, "3x3", stride)
        bd = unit(unit(x, wdr, 1, "double_3x3_reduce"), wd1, 3, "double_3x3_1")
        bd = unit(bd, wd2, 3, "double_3x3_2", stride)
        if reduction:
            return jnp.concatenate([b3, bd, max_pool_ceil(x, 3, 2)], axis=-1)
        if pool == "avg":
            # count_include_pad: border windows divide by 9 too, as the PyTorch pool does.
            pooled = nn.avg_pool(x, (3, 3), (1, 1), ((1, 1), (1, 1)), count_include_pad=True)
        else:
            pooled = max_pool_ceil(x, 3, 1, 1)
        b1 = unit(x, w1, 1, "1x1")
        bp = unit(pooled, wp, 1, "pool_proj")
        return jnp.concatenate([b1, b3, bd, bp], axis=-1)


class BNInception(nn.Module):
    """BN-Inception (Cadene) returning globally pooled features (B, 1024) float32.

    Attributes:
      train_bn: BatchNorm in training mode (batch statistics, running statistics updated); False
        freezes it: running statistics used and never updated, scale and bias still trained.
      pooling: ``"avg"`` or ``"avg+max"`` (see :func:`jdml.models.resnet50.global_pool`).
      dtype: computation dtype (params stay float32).

    Input: RGB images (B, H, W, 3) normalised as ``(x - MEAN) / STD`` for pixels x in [0, 1];
    the module reverses the channels to the weights' BGR order.
    """

    train_bn: bool = False
    pooling: str = "avg"
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = x.astype(self.dtype)[..., ::-1]  # RGB -> BGR
        kw = {"train_bn": self.train_bn, "dtype": self.dtype}
        x = conv_bn(x, 64, 7, "conv1_7x7_s2", stride=2, **kw)
        x = max_pool_ceil(x, 3, 2)
        x = conv_bn(x, 64, 1, "conv2_3x3_reduce", **kw)
        x = max_pool_ceil(conv_bn(x, 192, 3, "conv2_3x3", **kw), 3, 2)
        for name, widths in BLOCKS.items():
            x = Block(widths, self.train_bn, self.dtype, name=name)(x)
        return global_pool(x, self.pooling)


@BACKBONES.register("bninception", input_normalization=(MEAN, STD))
def bninception(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """BN-Inception, Cadene's definition (1024-d pooled features; RGB input normalised with the
    per-channel constants of ``jdml.models.bninception``, flipped to BGR inside)."""
    return BNInception(
        train_bn=train and not cfg.frozen_bn, pooling=cfg.pooling, dtype=jnp.dtype(cfg.dtype)
    )
