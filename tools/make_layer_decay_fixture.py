"""Records timm's layer-wise learning-rate scales of a few vision transformers, and MAE's, for
the tests of ``optim.layer_decay_grouping``.

For each case, a timm ``VisionTransformer`` (random weights, nothing downloaded) is given to
``timm.optim.param_groups_layer_decay``, and each parameter's ``lr_scale`` is recorded under its
timm name. MAE's rule (``util/lr_decay.py`` of facebookresearch/mae, BEiT's: ``cls_token``,
``pos_embed`` and ``patch_embed.*`` are layer 0, ``blocks.i.*`` layer i + 1, everything else
layer L + 1 of a depth-L model, at ``decay ** (L + 1 - layer)``) is applied to the same names,
for the cases without register tokens (MAE's ViT has none). Each case is recorded without a
classifier (``num_classes=0``: the backbone alone, as jdml's layer decay sees it, its embedding
heads outside) and with one (``head.*``, standing for an embedding head inside timm's model),
since timm numbers its groups from the parameters it is given. The cases go to
``tests/golden/optim/layer_decay.json``; ``tests/test_optim.py`` compares jdml's scales with
them and ``tools/layer_decay_table.py`` prints the documentation's table from them.

torch and timm are not jdml dependencies; run this in a separate environment:

  python3 -m venv /tmp/tvenv
  /tmp/tvenv/bin/pip install "torch===2.13.0" timm==1.0.31 numpy

(``===``: the build torchvision 0.28, which timm imports, was made for; beside the ``+cpu`` build
torchvision's operators fail to load.)
  /tmp/tvenv/bin/python tools/make_layer_decay_fixture.py
"""

from __future__ import annotations

import json
import os

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "golden", "optim", "layer_decay.json")
# timm VisionTransformer arguments of each case (vit_small: ViT-S/16, DINO's and timm's), and
# the decay it is recorded at.
CASES = {
    "vit_small": (dict(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6), 0.65),
    "depth2": (dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=2), 0.5),
    "depth4_reg2": (
        dict(
            img_size=32,
            patch_size=8,
            embed_dim=24,
            depth=4,
            num_heads=2,
            reg_tokens=2,
            no_embed_class=True,
        ),
        0.75,
    ),
}
HEAD_CLASSES = 8  # the classifier of the "with head" variants


def timm_scales(model, decay: float) -> dict[str, float]:
    """Each parameter name of ``model`` -> its ``lr_scale`` in timm's layer-decay groups."""
    from timm.optim import param_groups_layer_decay

    params = {id(p): name for name, p in model.named_parameters()}
    return {
        params[id(p)]: float(group["lr_scale"])
        for group in param_groups_layer_decay(model, layer_decay=decay)
        for p in group["params"]
    }


def mae_layer(name: str, depth: int) -> int:
    """MAE's (and BEiT's) layer of a ViT parameter: 0 for the embedding, i + 1 for block i,
    depth + 1 for the rest."""
    if name in ("cls_token", "pos_embed") or name.startswith("patch_embed"):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def mae_scales(names: list[str], depth: int, decay: float) -> dict[str, float]:
    """Each name -> ``decay ** (depth + 1 - layer)``, MAE's ``param_groups_lrd``."""
    return {name: decay ** (depth + 1 - mae_layer(name, depth)) for name in names}


def record(kwargs: dict, decay: float, num_classes: int) -> dict:
    """One case: timm's scales of every parameter and, without registers, MAE's."""
    from timm.models.vision_transformer import VisionTransformer

    model = VisionTransformer(**kwargs, num_classes=num_classes)
    scales = {"timm": timm_scales(model, decay)}
    if not kwargs.get("reg_tokens"):
        names = [name for name, _ in model.named_parameters()]
        scales["mae"] = mae_scales(names, kwargs["depth"], decay)
    return {"timm_kwargs": {**kwargs, "num_classes": num_classes}, "decay": decay, **scales}


def main() -> None:
    import timm
    import torch

    cases = {}
    for name, (kwargs, decay) in CASES.items():
        cases[name] = record(kwargs, decay, num_classes=0)
        cases[f"{name}_head"] = record(kwargs, decay, num_classes=HEAD_CLASSES)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"timm": timm.__version__, "torch": torch.__version__, "cases": cases}, f,
                  indent=1, sort_keys=True)  # fmt: skip
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
