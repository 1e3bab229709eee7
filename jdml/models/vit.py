"""Vision transformers as timm, DINO and DINOv2 define them (Dosovitskiy et al., "An Image is
Worth 16x16 Words", ICLR 2021; Caron et al., "Emerging Properties in Self-Supervised Vision
Transformers", ICCV 2021; Oquab et al., "DINOv2", TMLR 2024; Darcet et al., "Vision Transformers
Need Registers", ICLR 2024).

A patch embedding (a strided convolution), a class token, optional register tokens, learned
position embeddings, then pre-norm blocks: ``x + attn(norm1(x))`` and ``x + mlp(norm2(x))``,
each branch scaled per channel by a layer scale in DINOv2, and a final LayerNorm over all
tokens. The features are the class token or the mean of the patch tokens (``model.vit.pooling``),
after the final norm, as ``timm``'s ``forward_features`` gives them.

Module and parameter names follow timm's state dict (``blocks_3`` holds ``blocks.3.*``,
``attn_qkv`` holds ``attn.qkv``) so that the converter (``jdml.models.pretrained.vit``) is a rename
and a transpose. The position embeddings are a parameter of the grid of the input size the model
is built for; weights made at another size are resampled to it when they are read, as timm does
(bicubic, antialiased: :func:`jdml.models.pretrained.vit.resample_position_embeddings`).

Attention (:func:`attention`) is XLA's arithmetic on every backend by default; ``jax.nn.
dot_product_attention`` without an implementation computes the same (it picks no fused kernel by
itself), so ``model.vit.attention=cudnn`` asks it for cuDNN's fused kernel on NVIDIA GPUs in
bfloat16.

The backbones: ``vit_s16`` and ``vit_b16`` (timm's ``vit_{small,base}_patch16_224`` and DINO's
ViT-S/16 and ViT-B/16), ``vit_s14_dinov2`` and ``vit_b14_dinov2`` (patch 14, layer scale), their
``_reg4`` variants with 4 register tokens, and ``vit``, whose shape the ``model.vit.*`` keys set
(a small one for tests and experiments).
"""

from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from jdml.errors import ConfigError
from jdml.models.freeze import NOT_FROZEN, cut_after
from jdml.models.registry import BACKBONES
from jdml.nn.matmul import float32_product, native_dot_general
from jdml.platform import platform
from jdml.registry import COUNT, NON_NEGATIVE, Range

# ImageNet statistics in RGB order on [0, 1] pixels: DINO's and DINOv2's. timm's supervised
# ViT weights (augreg) expect 0.5 and 0.5: data.normalization=mean_std, data.mean=data.std=0.5.
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
LN_EPS = 1e-6
POOLINGS = ("token", "avg")
ATTENTIONS = ("xla", "cudnn")


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The shape of a vision transformer.

    Attributes:
      patch: patch side in pixels.
      dim: token width.
      depth: number of blocks.
      heads: attention heads.
      layer_scale: the layer scales' initial value (DINOv2's 1e-5), or 0 for none.
      registers: register tokens (their checkpoints keep no position embedding for the class
        and register tokens).
    """

    patch: int
    dim: int
    depth: int
    heads: int
    layer_scale: float = 0.0
    registers: int = 0

    @property
    def prefix_positions(self) -> int:
        """Position embeddings before the patches': the class token's, except with registers
        (timm's ``no_embed_class``)."""
        return 0 if self.registers else 1


ARCHITECTURES = {
    "vit_s16": Architecture(16, 384, 12, 6),
    "vit_b16": Architecture(16, 768, 12, 12),
    "vit_s14_dinov2": Architecture(14, 384, 12, 6, layer_scale=1e-5),
    "vit_b14_dinov2": Architecture(14, 768, 12, 12, layer_scale=1e-5),
    "vit_s14_reg4_dinov2": Architecture(14, 384, 12, 6, layer_scale=1e-5, registers=4),
    "vit_b14_reg4_dinov2": Architecture(14, 768, 12, 12, layer_scale=1e-5, registers=4),
}

#: The ``model.*`` keys of the ViT family: the pooling for every variant, the shape for ``vit``.
KEYS = {
    "vit.pooling": "token",
    # Attention: "xla" (every backend) or "cudnn" (cuDNN's fused kernel: NVIDIA GPUs, with
    # model.dtype=bfloat16).
    "vit.attention": "xla",
    "vit.patch": 16,
    "vit.dim": 384,
    "vit.depth": 12,
    "vit.heads": 6,
    "vit.layer_scale": 0.0,
    "vit.registers": 0,
}


def architecture(cfg: ml_collections.ConfigDict) -> Architecture:
    """The architecture of ``model.backbone``: a named variant's, or ``vit``'s from its keys."""
    if cfg.backbone in ARCHITECTURES:
        return ARCHITECTURES[cfg.backbone]
    v = cfg.vit
    return Architecture(
        patch=int(v.patch),
        dim=int(v.dim),
        depth=int(v.depth),
        heads=int(v.heads),
        layer_scale=float(v.layer_scale),
        registers=int(v.registers),
    )


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (DINOv2's ``ls1`` / ``ls2``, parameter ``gamma``)."""

    init_value: float

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        gamma = self.param("gamma", nn.initializers.constant(self.init_value), (x.shape[-1],))
        return x * gamma.astype(x.dtype)


def attention(
    q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, implementation: str, native: bool = False
) -> jnp.ndarray:
    """Scaled dot-product attention of (B, heads, T, D) queries, keys and values: (B, T, heads,
    D).

    ``"xla"``: softmax(q k^T / sqrt(D)) v as two batched products, the scores and the softmax in
    float32 (``jax.nn.dot_product_attention``'s XLA arithmetic, with the heads kept ahead of the
    tokens: one transpose in and one out instead of one per product; forward and backward 1.34x
    faster on a 2-core CPU, ``bench/vit_parts.py``). ``"cudnn"``: the cuDNN fused kernel of
    ``jax.nn.dot_product_attention`` (NVIDIA GPUs, bfloat16 or float16). ``native``: the two
    products of ``"xla"`` by oneDNN on CPU (:mod:`jdml.nn.matmul`, a run's ``backends.conv``),
    batched over (B, heads), the same arithmetic up to float32 summation order.
    """
    if implementation == "cudnn":
        return _cudnn_attention(q, k, v)
    scale = 1.0 / math.sqrt(q.shape[-1])
    # bfloat16 operands with float32 products, as jax.nn.dot_product_attention asks for them.
    precision = jax.lax.DotAlgorithmPreset.BF16_BF16_F32 if q.dtype == jnp.bfloat16 else None
    if native:
        stack = lambda a: a.reshape(-1, *a.shape[2:])  # noqa: E731  (B * heads, T, D)
        logits = float32_product(stack(q), stack(k), trans_b=True, dtype=jnp.float32)
        probs = jax.nn.softmax(logits * scale, axis=-1).astype(v.dtype)
        out = float32_product(probs, stack(v)).reshape(q.shape)
        return jnp.swapaxes(out, 1, 2)
    logits = jnp.einsum(
        "bhtd,bhsd->bhts", q, k, precision=precision, preferred_element_type=jnp.float32
    )
    probs = jax.nn.softmax(logits * scale, axis=-1).astype(v.dtype)
    return jnp.swapaxes(jnp.einsum("bhts,bhsd->bhtd", probs, v), 1, 2)


def _cudnn_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray) -> jnp.ndarray:
    """:func:`attention` by cuDNN's fused kernel. Its training form takes an even number of
    tokens only (JAX 0.10-0.12 refuse an odd one when they trace the gradient: ViT-S/16 at 224 px
    has 197), so an odd sequence gets one zero token, which the padding mask hides from every
    query, and the padded query's row is dropped: the same attention."""
    tokens = q.shape[2]
    lengths = None
    if tokens % 2:
        q, k, v = (jnp.pad(a, ((0, 0), (0, 0), (0, 1), (0, 0))) for a in (q, k, v))
        lengths = jnp.full((q.shape[0],), tokens, jnp.int32)
    swap = lambda a: jnp.swapaxes(a, 1, 2)  # noqa: E731
    out = jax.nn.dot_product_attention(
        swap(q),
        swap(k),
        swap(v),
        query_seq_lengths=lengths,
        key_value_seq_lengths=lengths,
        implementation="cudnn",
    )
    return out[:, :tokens]


class Block(nn.Module):
    """One pre-norm transformer block (timm's ``Block``)."""

    heads: int
    layer_scale: float
    dtype: jnp.dtype
    attention: str = "xla"
    native_conv: bool = False

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        batch, tokens, dim = x.shape
        norm = lambda name: nn.LayerNorm(LN_EPS, dtype=self.dtype, name=name)  # noqa: E731
        products = {"dot_general": native_dot_general} if self.native_conv else {}
        dense = lambda n, name: nn.Dense(n, dtype=self.dtype, name=name, **products)  # noqa: E731
        y = norm("norm1")(x)
        qkv = dense(3 * dim, "attn_qkv")(y).reshape(batch, tokens, 3, self.heads, -1)
        q, k, v = qkv.transpose(2, 0, 3, 1, 4)  # each (B, heads, T, D)
        y = attention(q, k, v, self.attention, self.native_conv)
        y = dense(dim, "attn_proj")(y.reshape(batch, tokens, dim))
        if self.layer_scale:
            y = LayerScale(self.layer_scale, name="ls1")(y)
        x = x + y
        y = norm("norm2")(x)
        y = dense(dim, "mlp_fc2")(nn.gelu(dense(4 * dim, "mlp_fc1")(y), approximate=False))
        if self.layer_scale:
            y = LayerScale(self.layer_scale, name="ls2")(y)
        return x + y


class VisionTransformer(nn.Module):
    """A ViT returning (B, dim) float32 features: the class token, or the mean of the patch
    tokens, after the final LayerNorm.

    Attributes:
      arch: the shape (:class:`Architecture`).
      pooling: ``"token"`` or ``"avg"``.
      dtype: computation dtype (params stay float32).
      frozen_stages: ``model.frozen_stages``: the patch embedding (0) and that many of the
        first blocks keep their weights, the class and register tokens and the position
        embeddings train (as Hyp-ViT's ``freeze``); -1 freezes nothing.
      attention: ``"xla"`` or ``"cudnn"`` (:func:`attention`).
      native_conv: the blocks' dense layers and attention products by oneDNN on CPU
        (:mod:`jdml.nn.matmul`; a run's :class:`jdml.backends.Backends` ``conv``, the choice of
        the convolutional backbones' kernels); False: XLA's dots.

    Input: normalised images (B, H, W, 3) whose sides are multiples of the patch; the position
    embeddings are made for the grid of the input the module is initialised with.
    """

    arch: Architecture
    pooling: str = "token"
    dtype: jnp.dtype = jnp.float32
    frozen_stages: int = NOT_FROZEN
    attention: str = "xla"
    native_conv: bool = False

    @property
    def STAGE_MODULES(self) -> tuple[tuple[str, ...], ...]:  # the freeze protocol's name
        """The patch embedding, then each block: what ``model.frozen_stages`` freezes. The
        optimiser leaves them fixed; the gradient still reaches the tokens and positions."""
        return (("patch_embed_proj",), *((f"blocks_{i}",) for i in range(self.arch.depth)))

    @property
    def LAYERS(self) -> tuple[tuple[str, ...], ...]:  # the layer-decay protocol's name
        """The parameters by depth, for ``optim.layer_decay``: the patch embedding with the
        tokens and positions, each block, then the final norm (BEiT's and MAE's layers of a
        ViT; ``optim.layer_decay_grouping=timm`` puts the final norm with the last block)."""
        stem = ("patch_embed_proj", "cls_token", "pos_embed", "reg_token")
        return (stem, *((f"blocks_{i}",) for i in range(self.arch.depth)), ("norm",))

    @nn.compact
    def __call__(self, x: jnp.ndarray) -> jnp.ndarray:
        a = self.arch
        _, height, width, _ = x.shape
        if height % a.patch or width % a.patch:
            raise ValueError(
                f"a {height}x{width} input is not a whole number of {a.patch}-pixel patches; "
                f"use a data.image_size that is a multiple of {a.patch}"
            )
        x = nn.Conv(
            a.dim,
            (a.patch, a.patch),
            strides=(a.patch, a.patch),
            padding="VALID",
            dtype=self.dtype,
            name="patch_embed_proj",
        )(x.astype(self.dtype))
        x = cut_after(x, 0, self.frozen_stages)  # nothing below a frozen patch embedding learns
        batch = x.shape[0]
        x = x.reshape(batch, -1, a.dim)
        init = nn.initializers.normal(stddev=0.02)
        positions = a.prefix_positions + x.shape[1]
        pos_embed = self.param("pos_embed", init, (1, positions, a.dim), jnp.float32)
        cls_token = self.param("cls_token", init, (1, 1, a.dim), jnp.float32)
        prefix = [jnp.broadcast_to(cls_token, (batch, 1, a.dim))]
        if a.registers:
            reg_token = self.param("reg_token", init, (1, a.registers, a.dim), jnp.float32)
            prefix.append(jnp.broadcast_to(reg_token, (batch, a.registers, a.dim)))
        prefix = [p.astype(self.dtype) for p in prefix]
        pos_embed = pos_embed.astype(self.dtype)
        if a.prefix_positions:  # timm's original layout: the class token has a position
            x = jnp.concatenate([*prefix, x], axis=1) + pos_embed
        else:  # registers: only the patches have positions
            x = jnp.concatenate([*prefix, x + pos_embed], axis=1)
        for i in range(a.depth):
            x = Block(
                a.heads,
                a.layer_scale,
                self.dtype,
                self.attention,
                self.native_conv,
                name=f"blocks_{i}",
            )(x)
        x = nn.LayerNorm(LN_EPS, dtype=self.dtype, name="norm")(x).astype(jnp.float32)
        if self.pooling == "token":
            return x[:, 0]
        return jnp.mean(x[:, 1 + a.registers :], axis=1)


def check_config(config: ml_collections.ConfigDict) -> None:
    """``vit``'s width splits over its heads, and the images are a whole number of patches (the
    pooling's names are the ``choices`` fact of the registration).

    Raises:
      ConfigError: naming the keys to change.
    """
    model = config.model
    a = architecture(model)
    if a.dim % a.heads:
        raise ConfigError(
            f"model.vit.dim={a.dim} does not split over model.vit.heads={a.heads}; choose a "
            "width that is a multiple of the heads"
        )
    if model.vit.attention == "cudnn":
        if model.dtype not in ("bfloat16", "float16"):
            raise ConfigError(
                f"model.vit.attention=cudnn runs in half precision, but model.dtype="
                f"{model.dtype}; set --config.model.dtype=bfloat16 or model.vit.attention=xla"
            )
        if platform() != "gpu":
            raise ConfigError(
                f"model.vit.attention=cudnn needs an NVIDIA GPU, and this process runs on "
                f"{platform()}; use model.vit.attention=xla"
            )
    size = config.data.image_size
    if size % a.patch:
        fit = a.patch * max(1, round(size / a.patch))
        raise ConfigError(
            f"data.image_size={size} is not a multiple of the {a.patch}-pixel patches of "
            f"{model.backbone}; use e.g. data.image_size={fit}"
        )


def _factory(name: str):
    def build(cfg: ml_collections.ConfigDict, *, train: bool) -> nn.Module:
        return VisionTransformer(
            arch=architecture(cfg),
            pooling=cfg.vit.pooling,
            dtype=jnp.dtype(cfg.dtype),
            frozen_stages=cfg.get("frozen_stages", NOT_FROZEN),
            attention=cfg.vit.attention,
        )

    build.__name__ = name
    build.__doc__ = f"The vision transformer {name} (see ``jdml.models.vit``)."
    return build


_RANGES = {
    "vit.patch": COUNT,
    "vit.dim": COUNT,
    "vit.depth": COUNT,
    "vit.heads": COUNT,
    "vit.layer_scale": NON_NEGATIVE,
    "vit.registers": Range(0, integer=True),
}

for _name in ("vit", *ARCHITECTURES):
    BACKBONES.register(
        _name,
        keys=KEYS,
        ranges=_RANGES,
        choices={"vit.pooling": POOLINGS, "vit.attention": ATTENTIONS},
        check=check_config,
        input_normalization=(MEAN, STD),
    )(_factory(_name))
