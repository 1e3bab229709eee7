"""Embedding models: a backbone followed by named linear, L2-normalised embedding heads."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import flax.linen as nn
import jax.numpy as jnp
import ml_collections

from jdml.geometry import l2_normalize
from jdml.models.freeze import NOT_FROZEN, frozen_modules
from jdml.models.registry import BACKBONES


def frozen_backbone_modules(cfg: ml_collections.ConfigDict) -> frozenset[str]:
    """Names of the backbone submodules whose parameters ``model.frozen_stages`` freezes.

    Raises:
      ValueError: for a backbone without stages to freeze, or a value out of its range.
    """
    frozen_stages = cfg.get("frozen_stages", NOT_FROZEN)
    if frozen_stages == NOT_FROZEN:
        return frozenset()
    stages = _declared(cfg, cfg.backbone, "STAGE_MODULES")
    if stages is None:
        able = [n for n in BACKBONES.names() if _declared(cfg, n, "STAGE_MODULES") is not None]
        raise ValueError(
            f"model.frozen_stages={frozen_stages}, but backbone {cfg.backbone!r} has no "
            f"stages to freeze; backbones with them: {', '.join(able)} (or set it to -1)"
        )
    return frozen_modules(stages, frozen_stages)


def _declared(cfg: ml_collections.ConfigDict, backbone: str, name: str) -> tuple | None:
    """What a backbone's module declares as ``name`` (None: nothing): ``STAGE_MODULES``, the
    stages ``model.frozen_stages`` freezes, or ``LAYERS``, its parameters by depth; a module
    whose stages depend on its shape (a ViT's depth) declares them as a property."""
    return getattr(BACKBONES.get(backbone)(cfg, train=False), name, None)


def backbone_layers(cfg: ml_collections.ConfigDict) -> tuple[tuple[str, ...], ...] | None:
    """The backbone's parameters by depth, as it declares them (its ``LAYERS``: the stem, each
    block, then the final norm), for ``optim.layer_decay`` (``jdml.optim.layer_lr_scale``);
    None for a backbone that declares none.

    Args:
      cfg: the ``model`` section.
    """
    return _declared(cfg, cfg.backbone, "LAYERS")


def backbones_with_layers(cfg: ml_collections.ConfigDict) -> list[str]:
    """The backbones that declare their layers (``model`` section ``cfg`` for their shapes)."""
    return [n for n in BACKBONES.names() if _declared(cfg, n, "LAYERS") is not None]


#: The embedding heads' weight initialisers (``model.head_init``); biases start at zero.
HEAD_INITS: dict[str, Callable[[], nn.initializers.Initializer]] = {
    "lecun_normal": nn.initializers.lecun_normal,
    # A random orthogonal matrix, as the ViT recipes' ``nn.init.orthogonal_`` (Hyp-ViT's head).
    "orthogonal": nn.initializers.orthogonal,
}


class EmbeddingModel(nn.Module):
    """Backbone + one linear, L2-normalised embedding per named head.

    Attributes:
      backbone: module mapping images (B, H, W, C) to pooled features (B, F).
      heads: head name -> embedding dimension.
      normalize: L2-normalise each head's output (the reference's ``*_normalize`` archs).
      head_init: the heads' weight initialiser, a name of :data:`HEAD_INITS`.

    Returns from ``__call__``: dict head name -> (B, dim) float32 embeddings.
    """

    backbone: nn.Module
    heads: Mapping[str, int]
    normalize: bool = True
    head_init: str = "lecun_normal"

    @nn.compact
    def __call__(self, images: jnp.ndarray) -> dict[str, jnp.ndarray]:
        feats = self.backbone(images)
        init = HEAD_INITS[self.head_init]()
        out = {}
        for name, dim in self.heads.items():
            e = nn.Dense(dim, dtype=jnp.float32, kernel_init=init, name=f"head_{name}")(feats)
            out[name] = l2_normalize(e) if self.normalize else e
        return out


def build_model(
    cfg: ml_collections.ConfigDict,
    *,
    train: bool,
    heads: Mapping[str, int] | None = None,
    native_conv: bool = False,
) -> EmbeddingModel:
    """Builds the embedding model described by the ``model`` config section.

    Args:
      cfg: the ``model`` section.
      train: batch statistics in train mode (unless ``model.frozen_bn``).
      heads: head name -> dimension (default: the one head ``model.head``, ``model.embed_dim``).
      native_conv: the convolutions of a backbone with a ``native_conv`` field (oneDNN's on
        CPU or XLA's; a run's :class:`jdml.backends.Backends` ``conv``); False: XLA's.
    """
    backbone = BACKBONES.get(cfg.backbone)(cfg, train=train)
    if "native_conv" in getattr(backbone, "__dataclass_fields__", {}):
        backbone = backbone.clone(native_conv=native_conv)
    heads = dict(heads) if heads is not None else {cfg.head: cfg.embed_dim}
    return EmbeddingModel(
        backbone=backbone,
        heads=heads,
        normalize=cfg.normalize,
        head_init=cfg.get("head_init", "lecun_normal"),
        name=None,
    )
