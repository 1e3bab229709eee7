"""Prints the layer-decay table of docs/usage.md: the learning-rate factor of each part of
ViT-S/16 at ``optim.layer_decay=0.65`` under jdml's two ``optim.layer_decay_grouping`` values,
timm's ``param_groups_layer_decay`` and MAE's ``param_groups_lrd``.

timm's and MAE's factors are read from ``tests/golden/optim/layer_decay.json``
(``tools/make_layer_decay_fixture.py`` records them with torch and timm); jdml's are computed
here, each parameter named as timm names it by the ViT converter's rule. No torch is needed:

  python tools/layer_decay_table.py
"""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import ml_collections

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "golden", "optim", "layer_decay.json")
HEAD = "head."  # timm's classifier, standing for jdml's embedding heads (outside the backbone)
STEM, NORM, HEADS = (
    "stem (patch embedding, class token, positions)",
    "final norm",
    "embedding heads",
)


def load_cases() -> dict[str, dict]:
    """The fixture's cases: name -> timm's arguments, the decay, and each rule's scales."""
    with open(FIXTURE) as f:
        return json.load(f)["cases"]


def model_config(timm_kwargs: dict) -> ml_collections.ConfigDict:
    """jdml's ``model`` section of the ``vit`` backbone shaped as timm's VisionTransformer."""
    from configs.revisiting import get_config

    model = get_config().model
    model.backbone = "vit"
    model.vit.patch = timm_kwargs["patch_size"]
    model.vit.dim = timm_kwargs["embed_dim"]
    model.vit.depth = timm_kwargs["depth"]
    model.vit.heads = timm_kwargs["num_heads"]
    model.vit.registers = timm_kwargs.get("reg_tokens", 0)
    return model


def jdml_scales(case: dict, grouping: str) -> dict[str, float]:
    """jdml's learning-rate factor of each parameter of a fixture case, under its timm name;
    timm's classifier (``head.*``) stands for jdml's embedding heads, which keep the rate."""
    from jdml.models import BACKBONES
    from jdml.models.embedding import backbone_layers
    from jdml.models.pretrained.vit import rule
    from jdml.optim import layer_scales

    kwargs = case["timm_kwargs"]
    model = model_config(kwargs)
    scales = layer_scales(backbone_layers(model), case["decay"], grouping)
    image = jnp.zeros((1, kwargs["img_size"], kwargs["img_size"], 3))
    backbone = BACKBONES.get(model.backbone)(model, train=False)
    shapes = jax.eval_shape(backbone.init, jax.random.key(0), image)["params"]
    named = {}
    for path, _ in jax.tree_util.tree_leaves_with_path(shapes):
        keys = tuple(k.key for k in path)
        named[rule("params", keys)[0]] = scales[keys[0]]
    named.update({name: 1.0 for name in case["timm"] if name.startswith(HEAD)})
    return named


def part(name: str) -> str:
    """The table row of a timm parameter name: the stem, block i, the final norm or the head."""
    if name.startswith("blocks."):
        return f"block {name.split('.')[1]}"
    if name.startswith("norm."):
        return NORM
    if name.startswith(HEAD):
        return HEADS
    return STEM


def by_part(scales: dict[str, float]) -> dict[str, float]:
    """The one factor of each row's parameters.

    Raises:
      ValueError: if the parameters of a row have different factors.
    """
    rows: dict[str, set[float]] = {}
    for name, scale in scales.items():
        rows.setdefault(part(name), set()).add(scale)
    mixed = {row: sorted(found) for row, found in rows.items() if len(found) > 1}
    if mixed:
        raise ValueError(f"rows with more than one factor: {mixed}")
    return {row: found.pop() for row, found in rows.items()}


def cell(scale: float | None, decay: float) -> str:
    """``0.0037 = 0.65^13`` (``1`` and ``0.65`` as they are), or ``1 (outside)`` for a part
    that the rule's model does not hold (it learns at the rate)."""
    if scale is None:
        return "1 (outside)"
    power = round(math.log(scale) / math.log(decay))
    if scale in (1.0, decay):
        return f"{scale:g}"
    exact = math.isclose(scale, decay**power, rel_tol=1e-9)
    return f"{scale:.3g} = {decay:g}^{power}" if exact else f"{scale:.4g}"


def table(name: str = "vit_small") -> str:
    """The Markdown table of the case ``name``, its ``_head`` variant holding timm's classifier."""
    cases = load_cases()
    plain, head = cases[name], cases[f"{name}_head"]
    columns = {
        "jdml `mae`": jdml_scales(head, "mae"),
        "jdml `timm`": jdml_scales(head, "timm"),
        "timm, `num_classes=0`": plain["timm"],
        "timm, head inside": head["timm"],
        "MAE": head["mae"],
    }
    parts = {column: by_part(scales) for column, scales in columns.items()}
    depth, decay = head["timm_kwargs"]["depth"], head["decay"]
    rows = [STEM, *(f"block {i}" for i in range(depth)), NORM, HEADS]
    lines = [
        "| part | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
    ]
    for row in rows:
        cells = [cell(parts[column].get(row), decay) for column in columns]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
