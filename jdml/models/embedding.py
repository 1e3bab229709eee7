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


#: ``optim.layer_decay_grouping``: how a backbone's declared layers (the stem, each block, the
#: final norm) become learning-rate groups. ``mae``: each is a group, the final norm the last,
#: at the full rate (BEiT's and MAE's ``param_groups_lrd``); ``timm``: the final norm joins the
#: last block's group, which learns at the full rate (``timm.optim.param_groups_layer_decay`` of
#: the backbone alone, without a classifier), so every other group learns at 1 / decay times
#: the ``mae`` rate.
LAYER_GROUPINGS = ("mae", "timm")


def layer_groups(layers: tuple[tuple[str, ...], ...], grouping: str) -> tuple[tuple[str, ...], ...]:
    """A backbone's declared ``LAYERS`` (the stem, each block, then the final norm) as the
    learning-rate groups of ``grouping``, a name of :data:`LAYER_GROUPINGS`, shallowest first."""
    if grouping not in LAYER_GROUPINGS:
        raise ValueError(
            f"optim.layer_decay_grouping={grouping!r}; choose one of: {', '.join(LAYER_GROUPINGS)}"
        )
    if grouping == "timm":  # timm's MATCH_PREV_GROUP: the final norm with the last block
        return (*layers[:-2], layers[-2] + layers[-1])
    return layers


def layer_scales(
    cfg: ml_collections.ConfigDict, decay: float, grouping: str = "mae"
) -> dict[str, float]:
    """Layer-wise learning-rate decay: each backbone parameter name -> the factor of its
    learning rate, ``decay ** (G - g)`` for the parameters of group g of G + 1 (the last group,
    and everything outside the backbone, keep the rate).

    Args:
      cfg: the ``model`` section.
      decay: ``optim.layer_decay``, in (0, 1].
      grouping: ``optim.layer_decay_grouping``, a name of :data:`LAYER_GROUPINGS`.

    Raises:
      ValueError: for a backbone that declares no layers, or an unknown grouping.

    References:
      Bao, Dong, Piao, Wei, "BEiT: BERT Pre-Training of Image Transformers", ICLR 2022 (layer-wise
      learning-rate decay; MAE's ``util/lr_decay.py`` groups a ViT the same way, timm's
      ``param_groups_layer_decay`` with the final norm in the last block's group).
    """
    layers = _declared(cfg, cfg.backbone, "LAYERS")
    if layers is None:
        able = [n for n in BACKBONES.names() if _declared(cfg, n, "LAYERS") is not None]
        raise ValueError(
            f"optim.layer_decay={decay:g}, but backbone {cfg.backbone!r} has no layers to decay; "
            f"backbones with them: {', '.join(able)} (or set it to 1)"
        )
    groups = layer_groups(layers, grouping)
    last = len(groups) - 1
    return {name: decay ** (last - depth) for depth, names in enumerate(groups) for name in names}


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
    native_conv: bool | None = None,
) -> EmbeddingModel:
    """Builds the embedding model described by the ``model`` config section.

    Args:
      cfg: the ``model`` section.
      train: batch statistics in train mode (unless ``model.frozen_bn``).
      heads: head name -> dimension (default: the one head ``model.head``, ``model.embed_dim``).
      native_conv: the convolutions of a backbone with a ``native_conv`` field (oneDNN's on
        CPU or XLA's; a run's :class:`jdml.backends.Backends` ``conv``); None: the backbone
        reads ``$JDML_CONV`` when traced.
    """
    backbone = BACKBONES.get(cfg.backbone)(cfg, train=train)
    if native_conv is not None and "native_conv" in getattr(backbone, "__dataclass_fields__", {}):
        backbone = backbone.clone(native_conv=native_conv)
    heads = dict(heads) if heads is not None else {cfg.head: cfg.embed_dim}
    return EmbeddingModel(
        backbone=backbone,
        heads=heads,
        normalize=cfg.normalize,
        head_init=cfg.get("head_init", "lecun_normal"),
        name=None,
    )
