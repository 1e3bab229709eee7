"""Small residual networks for small images (glyphs, thumbnails) on CPU or accelerator.

The models are Flax Linen modules. Linen rather than NNX because the train state here is a plain
pytree (params, batch statistics, EMA params, queues) carried through one jitted, donated step and
stacked on a member axis for cohorts: Linen's pure ``init``/``apply`` on explicit variable trees
fits that directly, and orbax checkpoints the same trees without conversion.

Design note (XLA CPU): a stride-1 3x3 convolution on a feature map smaller than the kernel (2x2 or
1x1) is rewritten by XLA's algebraic simplifier into a path that is ~90x slower on CPU. The stage
layout below is chosen so that every 3x3 convolution sees a map of at least 3x3 for the supported
input sizes; ``SmallResNet`` checks this at trace time and refuses layouts that would hit the trap.
The convolutions are :class:`jdml.nn.conv.Conv` (``nn.Conv``'s parameters; on CPU, the kernel
gradient of wide maps is summed over batch pieces, which XLA computes about 2-3x faster), and the
BatchNorms :class:`jdml.nn.batch_norm.BatchNorm` (``nn.BatchNorm``'s variables and values, with
a backward pass of one reduction and one elementwise pass).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from jdml.errors import ConfigError
from jdml.models.registry import BACKBONES, POOLINGS
from jdml.nn.batch_norm import BatchNorm
from jdml.nn.conv import Conv
from jdml.registry import COUNT

_MIN_CONV_MAP = 3

#: The backbone's own keys, in its section ``model.small_resnet``, and their defaults
#: (``--config.model.small_resnet.stem_features=16``).
KEYS = {
    "small_resnet.stem_features": 32,
    "small_resnet.stem_strides": 2,
    "small_resnet.stage_features": (32, 64, 128),
    "small_resnet.stage_blocks": (1, 1, 1),
    "small_resnet.stage_strides": (1, 2, 2),
}


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with a residual connection (He et al., 2016).

    Attributes:
      features: output channels.
      strides: stride of the first convolution (and of the projection shortcut).
      train_bn: whether BatchNorm uses and updates batch statistics (training mode).
      dtype: computation dtype.
      native_conv: oneDNN's convolutions on CPU (False: XLA's).
    """

    features: int
    strides: int = 1
    train_bn: bool = True
    dtype: jnp.dtype = jnp.float32
    native_conv: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        norm = lambda name: BatchNorm(  # noqa: E731
            use_running_average=not self.train_bn, momentum=0.9, dtype=self.dtype, name=name
        )
        conv = lambda f, k, s, name: Conv(  # noqa: E731
            f, k, s, dtype=self.dtype, native=self.native_conv, name=name
        )
        y = nn.relu(norm("bn1")(conv(self.features, 3, self.strides, "conv1")(x)))
        y = norm("bn2")(conv(self.features, 3, 1, "conv2")(y))
        if x.shape[-1] != self.features or self.strides != 1:
            x = norm("proj_bn")(conv(self.features, 1, self.strides, "proj")(x))
        return nn.relu(x + y)


def smallest_map(image_size: int, stem_strides: int, stage_strides: Sequence[int]) -> int:
    """The side of the smallest feature map a ``SmallResNet`` computes on ``image_size`` inputs
    (SAME padding: every stride divides the side, rounding up)."""
    side = -(-image_size // stem_strides)
    for stride in stage_strides:
        side = -(-side // stride)
    return side


def check_map_sizes(image_size: int, stem_strides: int, stage_strides: Sequence[int]) -> None:
    """Raises ``ValueError`` if a stage would convolve a map smaller than 3x3 (see
    ``_MIN_CONV_MAP``); the message names the keys to change."""
    side = smallest_map(image_size, stem_strides, stage_strides)
    least = _MIN_CONV_MAP * stem_strides * math.prod(stage_strides)
    if side < _MIN_CONV_MAP:
        raise ValueError(
            f"with data.image_size={image_size}, model.small_resnet.stem_strides={stem_strides} "
            f"and model.small_resnet.stage_strides={tuple(stage_strides)} the last stage would "
            f"run 3x3 convolutions on a {side}x{side} map (very slow on XLA CPU and wasteful "
            f"elsewhere): set --config.data.image_size={least} or more, a smaller "
            "--config.model.small_resnet.stem_strides or fewer/smaller "
            "--config.model.small_resnet.stage_strides"
        )


class SmallResNet(nn.Module):
    """A compact ResNet backbone returning globally pooled features.

    Attributes:
      stage_features: channels of each stage.
      stage_blocks: residual blocks per stage.
      stage_strides: stride of each stage's first block.
      stem_features: channels of the 3x3 stem convolution.
      stem_strides: stride of the stem.
      train_bn: BatchNorm in training mode (batch statistics) rather than frozen running stats.
      pooling: ``"avg"`` or ``"avg+max"`` (the sum of global average and max pooling).
      dtype: computation dtype (params stay float32).
      native_conv: oneDNN's convolutions on CPU (a run's :class:`jdml.backends.Backends`
        ``conv``); False: XLA's.

    Returns from ``__call__``: pooled features (B, stage_features[-1]).
    """

    stage_features: Sequence[int] = (32, 64, 128)
    stage_blocks: Sequence[int] = (1, 1, 1)
    stage_strides: Sequence[int] = (1, 2, 2)
    stem_features: int = 32
    stem_strides: int = 1
    train_bn: bool = True
    pooling: str = "avg"
    dtype: jnp.dtype = jnp.float32
    native_conv: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        x = x.astype(self.dtype)
        x = Conv(
            self.stem_features,
            3,
            self.stem_strides,
            dtype=self.dtype,
            native=self.native_conv,
            name="stem",
        )(x)
        x = nn.relu(
            BatchNorm(
                use_running_average=not self.train_bn,
                momentum=0.9,
                dtype=self.dtype,
                name="stem_bn",
            )(x)
        )
        for i, (feat, nblocks, stride) in enumerate(
            zip(self.stage_features, self.stage_blocks, self.stage_strides, strict=True)
        ):
            for j in range(nblocks):
                s = stride if j == 0 else 1
                out_hw = -(-x.shape[1] // s)
                if min(out_hw, -(-x.shape[2] // s)) < _MIN_CONV_MAP:
                    raise ValueError(
                        f"stage {i} would run 3x3 convolutions on a {out_hw}x{out_hw} map, which "
                        "is very slow on XLA CPU and wasteful elsewhere: use larger images or "
                        "fewer/smaller stage strides (model.small_resnet.stage_strides)"
                    )
                x = BasicBlock(
                    feat, s, self.train_bn, self.dtype, self.native_conv, name=f"stage{i}_block{j}"
                )(x)
        return POOLINGS.get(self.pooling)(x).astype(jnp.float32)


def check_config(config: ml_collections.ConfigDict) -> None:
    """The stage keys give one entry per stage, and no stage convolves a map smaller than 3x3
    (:func:`check_map_sizes`) on ``data.image_size`` inputs.

    Raises:
      ConfigError: naming the keys to change.
    """
    m = config.model.small_resnet
    if not len(m.stage_features) == len(m.stage_blocks) == len(m.stage_strides):
        raise ConfigError(
            "model.small_resnet.stage_features, .stage_blocks and .stage_strides need one entry "
            f"per stage; got {len(m.stage_features)}, {len(m.stage_blocks)} and "
            f"{len(m.stage_strides)}"
        )
    try:
        check_map_sizes(config.data.image_size, m.stem_strides, m.stage_strides)
    except ValueError as e:
        raise ConfigError(str(e)) from None


@BACKBONES.register(
    "small_resnet", keys=KEYS, ranges=dict.fromkeys(KEYS, COUNT), check=check_config
)
def small_resnet(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """The compact CPU-friendly ResNet (see ``jdml.models.small_resnet``)."""
    m = cfg.small_resnet
    return SmallResNet(
        stage_features=tuple(m.stage_features),
        stage_blocks=tuple(m.stage_blocks),
        stage_strides=tuple(m.stage_strides),
        stem_features=m.stem_features,
        stem_strides=m.stem_strides,
        train_bn=train and not cfg.frozen_bn,
        pooling=cfg.pooling,
        dtype=jnp.dtype(cfg.dtype),
    )
