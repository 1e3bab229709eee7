"""ResNet-50 (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).

The torchvision layout ("v1.5"): the stride of a downsampling bottleneck sits on its 3x3
convolution, not on the first 1x1 as in the paper, and the projection shortcut is a strided 1x1
convolution followed by BatchNorm. timm's ``resnet50`` and Cadene's ``pretrainedmodels``
``resnet50`` (torchvision's model with ``fc`` renamed ``last_linear``) share this layout, so one
module serves all three weight files.

Module and parameter names mirror the PyTorch names (``layer3_1`` holds ``layer3.1.*``,
``downsample_0`` holds ``downsample.0``) so that the converter
(``jdml.models.pretrained.resnet50``) is a rename and a transpose. Every padding is PyTorch's
explicit symmetric padding: Flax's ``SAME`` would put the extra pixel of a stride-2 layer on the
other side and shift every feature.

Input: 224 x 224 RGB images normalised as ``(x - MEAN) / STD`` for pixels x in [0, 1]. On CPU keep
inputs at 96 px or more: below that the last stage's 3x3 convolutions see a 2x2 map, which XLA's
CPU backend runs about 90x slower (see ``jdml.models.small_resnet``).
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from jdml.models.freeze import NOT_FROZEN, cut_after
from jdml.models.registry import BACKBONES, POOLINGS
from jdml.nn.batch_norm import BatchNorm
from jdml.nn.frozen_bn import FrozenBatchNorm

# ImageNet statistics in RGB order on [0, 1] pixels (torchvision's, timm's and Cadene's).
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
BN_EPS = 1e-5
BN_MOMENTUM = 0.9  # PyTorch momentum 0.1: running = 0.9 * running + 0.1 * batch
# (blocks, bottleneck width, stride of the first block) per stage; output = 4 x width.
STAGES: tuple[tuple[int, int, int], ...] = ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2))
EXPANSION = 4
FEATURES = 2048


def global_pool(x: jnp.ndarray, pooling: str) -> jnp.ndarray:
    """Global pooling of a (B, H, W, C) map to float32 (B, C).

    Args:
      x: the last feature map.
      pooling: a name of ``POOLINGS``: ``"avg"``, or ``"avg+max"`` for the sum of average and
        max pooling (the reference's ``double`` pooling).

    Raises:
      UnknownNameError: (a ``ValueError``) for another pooling name.
    """
    pool = POOLINGS.get(pooling)
    # Average in float32: a bfloat16 sum over 7x7 positions loses digits the embedding needs.
    return pool(x.astype(jnp.float32))


def batch_norm(
    train_bn: bool, eps: float, dtype: jnp.dtype, name: str, momentum: float = BN_MOMENTUM
) -> nn.Module:
    """A BatchNorm with PyTorch's momentum 0.1 (Flax ``momentum`` 0.9) unless told; frozen
    (running statistics, never updated; computed as one multiply-add, see
    :mod:`jdml.nn.frozen_bn`) unless ``train_bn``. Scale and bias are params either way, so they
    stay trainable."""
    if not train_bn:
        return FrozenBatchNorm(epsilon=eps, dtype=dtype, name=name)
    return BatchNorm(
        use_running_average=False,
        momentum=momentum,
        epsilon=eps,
        dtype=dtype,
        name=name,
    )


def conv(
    features: int, kernel: int, stride: int, pad: int, dtype: jnp.dtype, name: str, bias: bool
) -> nn.Conv:
    """A square convolution with PyTorch's explicit symmetric padding ``pad``."""
    return nn.Conv(
        features,
        (kernel, kernel),
        (stride, stride),
        padding=((pad, pad), (pad, pad)),
        use_bias=bias,
        dtype=dtype,
        name=name,
    )


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (strided), 1x1 expand, each followed by BatchNorm; residual sum, ReLU.

    Attributes:
      width: channels of the 1x1 reduction and the 3x3 convolution (output: 4 x width).
      stride: stride of the 3x3 convolution and of the projection shortcut.
      train_bn: BatchNorm in training mode.
      dtype: computation dtype.
    """

    width: int
    stride: int = 1
    train_bn: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        out = self.width * EXPANSION
        bn = lambda name: batch_norm(self.train_bn, BN_EPS, self.dtype, name)  # noqa: E731
        y = nn.relu(bn("bn1")(conv(self.width, 1, 1, 0, self.dtype, "conv1", False)(x)))
        y = conv(self.width, 3, self.stride, 1, self.dtype, "conv2", False)(y)
        y = nn.relu(bn("bn2")(y))
        y = bn("bn3")(conv(out, 1, 1, 0, self.dtype, "conv3", False)(y))
        if self.stride != 1 or x.shape[-1] != out:
            x = conv(out, 1, self.stride, 0, self.dtype, "downsample_0", False)(x)
            x = bn("downsample_1")(x)
        return nn.relu(x + y)


class ResNet50(nn.Module):
    """ResNet-50 returning globally pooled features (B, 2048) float32.

    Attributes:
      train_bn: BatchNorm in training mode (batch statistics, running statistics updated); False
        freezes it: running statistics used and never updated, scale and bias still trained.
      pooling: ``"avg"`` or ``"avg+max"`` (see :func:`global_pool`).
      dtype: computation dtype (params stay float32).
      frozen_stages: the gradient stops after the stem (0) or after that many of the 4 stages
        (see :mod:`jdml.models.freeze`); -1 lets it through everywhere.

    Input: normalised images (B, H, W, 3), see the module docstring for MEAN / STD.
    """

    train_bn: bool = False
    pooling: str = "avg"
    dtype: jnp.dtype = jnp.float32
    frozen_stages: int = NOT_FROZEN

    #: Submodule names per stage, the stem first (for ``model.frozen_stages``).
    STAGE_MODULES: ClassVar[tuple[tuple[str, ...], ...]] = (
        ("conv1", "bn1"),
        *(tuple(f"layer{s}_{i}" for i in range(n)) for s, (n, _, _) in enumerate(STAGES, 1)),
    )

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = x.astype(self.dtype)
        x = conv(64, 7, 2, 3, self.dtype, "conv1", False)(x)
        x = nn.relu(batch_norm(self.train_bn, BN_EPS, self.dtype, "bn1")(x))
        x = nn.max_pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
        x = cut_after(x, 0, self.frozen_stages)
        for stage, (blocks, width, stride) in enumerate(STAGES, start=1):
            for i in range(blocks):
                x = Bottleneck(
                    width,
                    stride if i == 0 else 1,
                    self.train_bn,
                    self.dtype,
                    name=f"layer{stage}_{i}",
                )(x)
            x = cut_after(x, stage, self.frozen_stages)
        return global_pool(x, self.pooling)


@BACKBONES.register("resnet50", input_normalization=(MEAN, STD))
def resnet50(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """ResNet-50, torchvision layout (2048-d pooled features; weights from torchvision, timm or
    Cadene files, see ``jdml.models.resnet50``)."""
    return ResNet50(
        train_bn=train and not cfg.frozen_bn,
        pooling=cfg.pooling,
        dtype=jnp.dtype(cfg.dtype),
        frozen_stages=cfg.get("frozen_stages", NOT_FROZEN),
    )
