"""GoogLeNet (Szegedy et al., "Going Deeper with Convolutions", CVPR 2015), torchvision variant.

torchvision's GoogLeNet differs from the paper in ways its ImageNet weights depend on, all kept
here: every convolution is followed by BatchNorm (eps 1e-3) and ReLU and has no bias; the
"5x5" branch of each Inception block uses a 3x3 convolution; the stride-2 max pools use
``ceil_mode`` (the last window may hang over the edge, so a 113-pixel map pools to 57, not 56);
there is no local response normalisation. The auxiliary classifiers (``aux1``, ``aux2``) and
the classifier ``fc`` are not part of the backbone.

Input convention. The weights were ported from TensorFlow and expect ``(x - 0.5) / 0.5`` for
pixels x in [0, 1] (MEAN = STD = 0.5 below). torchvision hides this: with its ImageNet weights
it sets ``transform_input=True`` and maps ImageNet-normalised input back to that scale inside
the model. ``transform_input=True`` here does the same, for inputs normalised with
IMAGENET_MEAN / IMAGENET_STD; the default (False) takes ``(x - MEAN) / STD`` directly, which
gives what a torchvision user gets without the extra pass over the input. Input size: 224 (the
reference uses 227 crops); keep it at 96 px or more on CPU so that the last 3x3 convolutions
see at least a 3x3 map (the XLA CPU trap, see ``jdml.models.small_resnet``).

Module and parameter names mirror the PyTorch names (``inception4a/branch2_1`` holds
``inception4a.branch2.1.*``), so the converter (``jdml.models.pretrained.googlenet``) is a
rename and a transpose.
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from jdml.models.registry import BACKBONES
from jdml.models.resnet50 import batch_norm, conv, global_pool

MEAN = (0.5, 0.5, 0.5)
STD = (0.5, 0.5, 0.5)
# What torchvision's ImageNet transforms produce; transform_input=True expects these.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BN_EPS = 1e-3
FEATURES = 1024
# Inception blocks: name -> (1x1, 3x3 reduce, 3x3, "5x5" reduce, "5x5", pool projection).
BLOCKS: dict[str, tuple[int, int, int, int, int, int]] = {
    "inception3a": (64, 96, 128, 16, 32, 32),
    "inception3b": (128, 128, 192, 32, 96, 64),
    "inception4a": (192, 96, 208, 16, 48, 64),
    "inception4b": (160, 112, 224, 24, 64, 64),
    "inception4c": (128, 128, 256, 24, 64, 64),
    "inception4d": (112, 144, 288, 32, 64, 64),
    "inception4e": (256, 160, 320, 32, 128, 128),
    "inception5a": (256, 160, 320, 32, 128, 128),
    "inception5b": (384, 192, 384, 48, 128, 128),
}


def max_pool_ceil(x: jnp.ndarray, kernel: int, stride: int, pad: int = 0) -> jnp.ndarray:
    """PyTorch's ``MaxPool2d(kernel, stride, pad, ceil_mode=True)`` on a (B, H, W, C) map.

    ceil mode rounds the output size up, i.e. adds a partial window at the end, except one
    that would start in the right padding; the extra cells are padded with -inf (Flax's max
    pool pads with its initial value), so they never win.
    """
    pads = []
    for size in x.shape[1:3]:
        out = -(-(size + 2 * pad - kernel) // stride) + 1
        if (out - 1) * stride >= size + pad:
            out -= 1
        pads.append((pad, (out - 1) * stride + kernel - size - pad))
    return nn.max_pool(x, (kernel, kernel), (stride, stride), padding=tuple(pads))


def transform_imagenet_input(x: jnp.ndarray) -> jnp.ndarray:
    """ImageNet-normalised input -> the ``(x - 0.5) / 0.5`` scale of the weights, per channel
    exactly as torchvision's ``GoogLeNet._transform_input``."""
    scale = jnp.asarray([s / 0.5 for s in IMAGENET_STD], x.dtype)
    shift = jnp.asarray([(m - 0.5) / 0.5 for m in IMAGENET_MEAN], x.dtype)
    return x * scale + shift


class BasicConv(nn.Module):
    """Convolution without bias, BatchNorm (eps 1e-3), ReLU: torchvision's ``BasicConv2d``.

    Attributes:
      features: output channels.
      kernel: square kernel size.
      stride: stride.
      pad: symmetric padding.
      train_bn: BatchNorm in training mode.
      dtype: computation dtype.
    """

    features: int
    kernel: int
    stride: int = 1
    pad: int = 0
    train_bn: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = conv(self.features, self.kernel, self.stride, self.pad, self.dtype, "conv", False)(x)
        return nn.relu(batch_norm(self.train_bn, BN_EPS, self.dtype, "bn")(x))


class Inception(nn.Module):
    """Four parallel branches concatenated on channels: 1x1; 1x1 -> 3x3; 1x1 -> 3x3 (the
    paper's 5x5, as torchvision builds it); 3x3 stride-1 max pool -> 1x1 projection.

    Attributes:
      widths: (1x1, 3x3 reduce, 3x3, "5x5" reduce, "5x5", pool projection) channels.
      train_bn: BatchNorm in training mode.
      dtype: computation dtype.
    """

    widths: tuple[int, int, int, int, int, int]
    train_bn: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        w1, w3r, w3, w5r, w5, wp = self.widths

        def basic(features: int, kernel: int, name: str) -> BasicConv:
            pad = kernel // 2
            return BasicConv(features, kernel, 1, pad, self.train_bn, self.dtype, name=name)

        b1 = basic(w1, 1, "branch1")(x)
        b2 = basic(w3, 3, "branch2_1")(basic(w3r, 1, "branch2_0")(x))
        b3 = basic(w5, 3, "branch3_1")(basic(w5r, 1, "branch3_0")(x))
        # branch4.0 is the pool, so the projection is PyTorch's branch4.1.
        b4 = basic(wp, 1, "branch4_1")(max_pool_ceil(x, 3, 1, 1))
        return jnp.concatenate([b1, b2, b3, b4], axis=-1)


class GoogLeNet(nn.Module):
    """GoogLeNet (torchvision) returning globally pooled features (B, 1024) float32.

    Attributes:
      train_bn: BatchNorm in training mode (batch statistics, running statistics updated); False
        freezes it: running statistics used and never updated, scale and bias still trained.
      pooling: ``"avg"`` or ``"avg+max"`` (see :func:`jdml.models.resnet50.global_pool`).
      transform_input: the input is ImageNet-normalised and is mapped to the weights' scale as
        torchvision does with its ImageNet weights (see the module docstring).
      dtype: computation dtype (params stay float32).
    """

    train_bn: bool = False
    pooling: str = "avg"
    transform_input: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = x.astype(self.dtype)
        if self.transform_input:
            x = transform_imagenet_input(x)
        basic = lambda f, k, s, p, name: BasicConv(  # noqa: E731
            f, k, s, p, self.train_bn, self.dtype, name=name
        )
        x = max_pool_ceil(basic(64, 7, 2, 3, "conv1")(x), 3, 2)
        x = basic(192, 3, 1, 1, "conv3")(basic(64, 1, 1, 0, "conv2")(x))
        x = max_pool_ceil(x, 3, 2)
        for name, widths in BLOCKS.items():
            x = Inception(widths, self.train_bn, self.dtype, name=name)(x)
            if name == "inception3b":
                x = max_pool_ceil(x, 3, 2)
            elif name == "inception4e":
                x = max_pool_ceil(x, 2, 2)
        return global_pool(x, self.pooling)


@BACKBONES.register("googlenet", input_normalization=(MEAN, STD))
def googlenet(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """GoogLeNet, torchvision variant (1024-d pooled features; inputs normalised with
    data.mean = data.std = 0.5, see ``jdml.models.googlenet``)."""
    return GoogLeNet(
        train_bn=train and not cfg.frozen_bn, pooling=cfg.pooling, dtype=jnp.dtype(cfg.dtype)
    )
