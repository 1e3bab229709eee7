"""Embedding models: a backbone followed by named linear, L2-normalised embedding heads."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from jdml.models import bninception as bninception_module
from jdml.models import efficientnet
from jdml.models import googlenet as googlenet_module
from jdml.models import resnet50 as resnet50_module
from jdml.models.bninception import BNInception
from jdml.models.efficientnet import EfficientNetLite0
from jdml.models.freeze import NOT_FROZEN, frozen_modules
from jdml.models.googlenet import GoogLeNet
from jdml.models.resnet50 import ResNet50
from jdml.models.small_resnet import SmallResNet
from jdml.registry import Registry

BACKBONES: Registry[Callable[..., nn.Module]] = Registry("backbone")

# A backbone with pretrained weights registers the per-channel (RGB) mean and standard deviation
# on [0, 1] pixels that its weights expect, as ``input_normalization=(mean, std)``
# (``data.normalization=backbone``; :func:`input_normalization`).


def input_normalization(backbone: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The (mean, std) per RGB channel the ``backbone``'s weights expect, or None if it
    registered none."""
    return BACKBONES.meta(backbone).get("input_normalization")


@BACKBONES.register("small_resnet")
def small_resnet(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """The compact CPU-friendly ResNet (see ``jdml.models.small_resnet``)."""
    return SmallResNet(
        stage_features=tuple(cfg.stage_features),
        stage_blocks=tuple(cfg.stage_blocks),
        stage_strides=tuple(cfg.stage_strides),
        stem_features=cfg.stem_features,
        stem_strides=cfg.stem_strides,
        train_bn=train and not cfg.frozen_bn,
        pooling=cfg.pooling,
        dtype=jnp.dtype(cfg.dtype),
    )


@BACKBONES.register(
    "efficientnet_lite0",
    input_normalization=((efficientnet.MEAN,) * 3, (efficientnet.STD,) * 3),
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


@BACKBONES.register("resnet50", input_normalization=(resnet50_module.MEAN, resnet50_module.STD))
def resnet50(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """ResNet-50, torchvision layout (2048-d pooled features; weights from torchvision, timm or
    Cadene files, see ``jdml.models.resnet50``)."""
    return ResNet50(
        train_bn=train and not cfg.frozen_bn,
        pooling=cfg.pooling,
        dtype=jnp.dtype(cfg.dtype),
        frozen_stages=cfg.get("frozen_stages", NOT_FROZEN),
    )


@BACKBONES.register("googlenet", input_normalization=(googlenet_module.MEAN, googlenet_module.STD))
def googlenet(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """GoogLeNet, torchvision variant (1024-d pooled features; inputs normalised with
    data.mean = data.std = 0.5, see ``jdml.models.googlenet``)."""
    return GoogLeNet(
        train_bn=train and not cfg.frozen_bn, pooling=cfg.pooling, dtype=jnp.dtype(cfg.dtype)
    )


@BACKBONES.register(
    "bninception", input_normalization=(bninception_module.MEAN, bninception_module.STD)
)
def bninception(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
    """BN-Inception, Cadene's definition (1024-d pooled features; RGB input normalised with the
    per-channel constants of ``jdml.models.bninception``, flipped to BGR inside)."""
    return BNInception(
        train_bn=train and not cfg.frozen_bn, pooling=cfg.pooling, dtype=jnp.dtype(cfg.dtype)
    )


def frozen_backbone_modules(cfg: ml_collections.ConfigDict) -> frozenset[str]:
    """Names of the backbone submodules whose parameters ``model.frozen_stages`` freezes.

    Raises:
      ValueError: for a backbone without stages to freeze, or a value out of its range.
    """
    frozen_stages = cfg.get("frozen_stages", NOT_FROZEN)
    if frozen_stages == NOT_FROZEN:
        return frozenset()
    stages = _stage_modules(cfg, cfg.backbone)
    if stages is None:
        able = [n for n in BACKBONES.names() if _stage_modules(cfg, n) is not None]
        raise ValueError(
            f"model.frozen_stages={frozen_stages}, but backbone {cfg.backbone!r} has no "
            f"stages to freeze; backbones with them: {', '.join(able)} (or set it to -1)"
        )
    return frozen_modules(stages, frozen_stages)


def _stage_modules(cfg: ml_collections.ConfigDict, backbone: str) -> tuple | None:
    """The ``STAGE_MODULES`` a backbone's module declares (None: it declares none)."""
    module = BACKBONES.get(backbone)(cfg, train=False)
    return getattr(type(module), "STAGE_MODULES", None)


def l2_normalize(x: jnp.ndarray, eps: float = 1e-12) -> jnp.ndarray:
    """Row-wise L2 normalisation that is finite (and has finite gradients) at x = 0."""
    sq = jnp.sum(jnp.square(x), axis=-1, keepdims=True)
    return x / jnp.sqrt(jnp.maximum(sq, eps))


class EmbeddingModel(nn.Module):
    """Backbone + one linear, L2-normalised embedding per named head.

    Attributes:
      backbone: module mapping images (B, H, W, C) to pooled features (B, F).
      heads: head name -> embedding dimension.
      normalize: L2-normalise each head's output (the reference's ``*_normalize`` archs).

    Returns from ``__call__``: dict head name -> (B, dim) float32 embeddings.
    """

    backbone: nn.Module
    heads: Mapping[str, int]
    normalize: bool = True

    @nn.compact
    def __call__(self, images: jnp.ndarray) -> dict[str, jnp.ndarray]:
        feats = self.backbone(images)
        out = {}
        for name, dim in self.heads.items():
            e = nn.Dense(dim, dtype=jnp.float32, name=f"head_{name}")(feats)
            out[name] = l2_normalize(e) if self.normalize else e
        return out


def build_model(
    cfg: ml_collections.ConfigDict, *, train: bool, heads: Mapping[str, int] | None = None
) -> EmbeddingModel:
    """Builds the embedding model described by the ``model`` config section.

    Args:
      cfg: the ``model`` section.
      train: batch statistics in train mode (unless ``model.frozen_bn``).
      heads: head name -> dimension (default: the one head ``model.head``, ``model.embed_dim``).
    """
    backbone = BACKBONES.get(cfg.backbone)(cfg, train=train)
    heads = dict(heads) if heads is not None else {cfg.head: cfg.embed_dim}
    return EmbeddingModel(backbone=backbone, heads=heads, normalize=cfg.normalize, name=None)
