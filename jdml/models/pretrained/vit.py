"""Vision transformer weights from timm, DINO and DINOv2 state dicts.

timm and DINO name the tensors alike: ``patch_embed.proj.*``, ``cls_token``, ``pos_embed``,
``blocks.{i}.norm1.*``, ``blocks.{i}.attn.qkv.*``, ``blocks.{i}.attn.proj.*``,
``blocks.{i}.norm2.*``, ``blocks.{i}.mlp.fc{1,2}.*``, DINOv2's ``blocks.{i}.ls{1,2}.gamma``, and
``norm.*``; timm adds an ImageNet classifier ``head.*``, which the backbone does not use. DINOv2's
own checkpoints hold ``mask_token`` (unused), and, with registers, ``register_tokens`` and a
position embedding for the class token too; they are rewritten into timm's layout first
(:func:`prepare`: the class token takes its position embedding, as timm's conversion does).

Position embeddings made for another input size are resampled to the model's grid with the
resampling timm applies when it loads them (:func:`resample_position_embeddings`).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable

import numpy as np

from jdml.models.pretrained.convert import CONVERTERS, Converter, leaf_source, same, takes_shape
from jdml.models.vit import ARCHITECTURES

_BLOCK = re.compile(r"^blocks_(\d+)$")
# Flax module name -> PyTorch module name inside a block.
_BLOCK_MODULES = {
    "norm1": "norm1",
    "norm2": "norm2",
    "attn_qkv": "attn.qkv",
    "attn_proj": "attn.proj",
    "mlp_fc1": "mlp.fc1",
    "mlp_fc2": "mlp.fc2",
    "ls1": "ls1",
    "ls2": "ls2",
}


def _cubic(x: np.ndarray, a: float = -0.5) -> np.ndarray:
    """The cubic convolution kernel of PyTorch's antialiased bicubic resampling (a = -0.5)."""
    x = np.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return np.where(x < 1, near, np.where(x < 2, far, 0.0))


@functools.lru_cache(maxsize=64)
def bicubic_matrix(in_len: int, out_len: int) -> np.ndarray:
    """(out_len, in_len) float64 weights of ``torch.nn.functional.interpolate(...,
    mode="bicubic", antialias=True, align_corners=False)`` along one axis: each output sample at
    centre ``scale (i + 0.5)`` (scale = in / out) weighs the inputs within ``2 max(scale, 1)``
    of it by the cubic kernel stretched by the scale when shrinking, normalised to sum to 1
    (PyTorch's ``_compute_indices_weights_aa``)."""
    scale = in_len / out_len
    support = 2.0 * scale if scale >= 1.0 else 2.0
    inv = 1.0 / scale if scale >= 1.0 else 1.0
    out = np.zeros((out_len, in_len))
    for i in range(out_len):
        center = scale * (i + 0.5)
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), in_len)
        j = np.arange(low, high)
        w = _cubic((j - center + 0.5) * inv)
        out[i, low:high] = w / w.sum()
    return out


def _square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def resample_position_embeddings(pos_embed: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Position embeddings (1, prefix + h w, D) made for an h x w grid, resampled to the square
    grid of ``shape`` (1, prefix + H W, D) as timm's ``resample_abs_pos_embed`` does when it
    loads weights for another input size (bicubic, antialiased; the prefix embeddings, the class
    token's in timm's original layout and none with registers, are kept). The prefix is the
    one (0 or 1) that leaves both grids square.

    Raises:
      ValueError: for grids that are not square.
    """
    pos_embed = np.asarray(pos_embed)
    if pos_embed.ndim != 3 or len(shape) != 3 or pos_embed.shape[-1] != shape[-1]:
        return pos_embed  # fill names the mismatch with both shapes
    if pos_embed.shape[1] == shape[1]:
        return pos_embed
    fits = [p for p in (0, 1) if _square(pos_embed.shape[1] - p) and _square(shape[1] - p)]
    if not fits:
        raise ValueError(
            f"position embeddings {tuple(pos_embed.shape)} cannot be resampled to {tuple(shape)}: "
            "the patch grids must be square"
        )
    prefix = fits[0]
    old, new = pos_embed.shape[1] - prefix, shape[1] - prefix
    old_side, new_side = math.isqrt(old), math.isqrt(new)
    grid = pos_embed[0, prefix:].reshape(old_side, old_side, -1).astype(np.float32)
    m = bicubic_matrix(old_side, new_side)
    resampled = np.einsum("ia,jb,abd->ijd", m, m, grid.astype(np.float64))
    resampled = resampled.astype(np.float32).reshape(1, new, -1)
    return np.concatenate([pos_embed[:, :prefix], resampled.astype(pos_embed.dtype)], axis=1)


def prepare(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A DINOv2 checkpoint in timm's layout (a timm or DINO one is returned as it is): the mask
    token dropped; with registers, ``register_tokens`` renamed ``reg_token`` and the class
    token's position embedding added to it (timm's ``_convert_dinov2``)."""
    state = {k: v for k, v in state.items() if k != "mask_token"}
    if "register_tokens" in state:
        pos_embed = state.pop("pos_embed")
        state["reg_token"] = state.pop("register_tokens")
        state["cls_token"] = state["cls_token"] + pos_embed[:, :1]
        state["pos_embed"] = pos_embed[:, 1:]
    return state


def rule(collection: str, path: tuple[str, ...]) -> tuple[str, Callable[..., np.ndarray]] | None:
    """The weight-file key and transform of one leaf of :class:`jdml.models.vit.VisionTransformer`.

    Raises:
      KeyError: for a leaf no weight file names.
    """
    if collection != "params":
        return None
    *modules, leaf = path
    if not modules:  # cls_token, reg_token, pos_embed
        if leaf == "pos_embed":
            return "pos_embed", takes_shape(resample_position_embeddings)
        return leaf, same
    if modules == ["patch_embed_proj"]:
        return leaf_source("patch_embed.proj", collection, leaf, "conv")
    if modules == ["norm"]:
        return "norm.weight" if leaf == "scale" else "norm.bias", same
    block = _BLOCK.match(modules[0])
    if block is None or len(modules) != 2 or modules[1] not in _BLOCK_MODULES:
        raise KeyError(f"no weight-file name for {'/'.join(path)}")
    torch_module = f"blocks.{block.group(1)}.{_BLOCK_MODULES[modules[1]]}"
    if modules[1].startswith("norm"):
        return f"{torch_module}.{'weight' if leaf == 'scale' else 'bias'}", same
    if modules[1].startswith("ls"):
        return f"{torch_module}.gamma", same
    return leaf_source(torch_module, collection, leaf, "dense")


def ignore(key: str) -> bool:
    """The ImageNet classifier (``head.*``) and an identity ``fc_norm``'s absence aside, every
    tensor of the file is used."""
    return key.startswith("head.")


for _name in ("vit", *ARCHITECTURES):
    CONVERTERS.register(_name)(Converter(rule=rule, ignore=ignore, prepare=prepare))
