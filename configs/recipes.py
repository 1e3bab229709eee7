r"""Published metric-learning recipes on vision transformers, with the numbers they report.

``recipe=hyp_vit_sphere`` is the Euclidean baseline of Hyp-ViT (Ermolov, Mirvakhabova, Khrulkov,
Sebe, Oseledets, "Hyperbolic Vision Transformers: Combining Improvements in Metric Learning",
CVPR 2022): its "Sph-DINO" rows, ViT-S/16 with DINO's self-supervised ImageNet weights and a
384-d L2-normalised head, trained with NT-Xent on the sphere. Bring DINO's ViT-S/16 weights
(``dino_deitsmall16_pretrain.pth``, Apache-2.0) and the dataset:

  python train.py --config configs/recipes.py:recipe=hyp_vit_sphere,data=cub200 \
      --config.data.path=/data/CUB_200_2011 \
      --config.model.pretrained=/weights/dino_deitsmall16_pretrain.pth --workdir runs/hypvit-cub

``data`` is one of cub200, cars196, sop and inshop. The recipe is its code's (``train.py`` and the
single-GPU commands of its README), with the 384-d head of the reported table (the README's
commands leave the code's default of 128):

* ViT-S/16, the class token; the patch embedding frozen (its ``--freeze 0``); a linear head with
  an orthogonal initial weight and a zero bias, L2-normalised.
* Batches of distinct classes, each class once per epoch (``sampler.name=class_epoch``): 9
  images of 100 classes on CUB200 (900) and of 98 on CARS196 (882), 2 of 450 on SOP and
  In-Shop (900). An epoch of CUB200 or CARS196 is then one step.
* NT-Xent with tau 0.1 over every ordered pair of the 9 (or 2) view slots, against the other
  classes in those slots, summed over the slot pairs (``loss.ntxent.slot_pairs``).
* AdamW, lr 1e-5, PyTorch's default decoupled weight decay 0.01 on every trained parameter, a
  constant lr, gradients clipped to global norm 3; 50 epochs on CUB200, 300 on CARS196, 200 on
  SOP, 400 on In-Shop.
* Training views: RandomResizedCrop(224, scale (0.2, 1), bicubic) and a flip (``data.augment=
  vit``); the evaluation view: the short side resized bicubically to 256 on CUB200 and 224
  elsewhere, the centre 224 square. ImageNet's mean and std.
* Every training class trains (``data.val_fraction=0``) and the network is evaluated once, after
  the last epoch: no checkpoint is selected, on validation or test.

What differs from the code: it trains in apex's float16 mixed precision (O2), jdml in float32
(``--config.model.dtype=bfloat16`` for bfloat16); its head-less "body" recall is not computed.

Any key can still be overridden with --config.<key>=<value>.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import ml_collections

from configs.revisiting import parse_arg
from jdml.config import base_config, set_keys
from jdml.errors import ConfigError

CUB_CARS_METRICS = ("recall@1", "recall@2", "recall@4", "recall@8", "map@r", "nmi")
SOP_METRICS = ("recall@1", "recall@10", "recall@100", "recall@1000", "map@r", "nmi")
INSHOP_METRICS = ("recall@1", "recall@10", "recall@20", "recall@30", "map@r", "nmi")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A published recipe: its settings on every dataset, per dataset, and what it reports.

    Attributes:
      common: dotted config keys of every dataset.
      datasets: data preset -> its own dotted keys.
      reported: data preset -> the Recall@k the publication reports (percent), k -> value.
      source: where the numbers are printed.
    """

    common: Mapping[str, object]
    datasets: Mapping[str, Mapping[str, object]]
    reported: Mapping[str, Mapping[int, float]]
    source: str


def _dataset(name: str, epochs: int, images: int, batch: int, resize: int, metrics: tuple):
    return {
        "data.name": name,
        "data.resize": resize,
        "sampler.samples_per_class": images,
        "train.batch_size": batch,
        "train.epochs": epochs,
        "eval.every_epochs": epochs,  # once, after the last epoch
        "eval.metrics": metrics,
    }


RECIPES: dict[str, Recipe] = {
    "hyp_vit_sphere": Recipe(
        common={
            "data.channels": 3,
            "data.image_size": 224,
            "data.augment": "vit",
            "data.eval_interpolation": "bicubic",
            "data.normalization": "backbone",
            "data.val_fraction": 0.0,
            "model.backbone": "vit_s16",
            "model.vit.pooling": "token",
            "model.pretrained": "required",
            "model.frozen_stages": 0,
            "model.embed_dim": 384,
            "model.normalize": True,
            "model.head_init": "orthogonal",
            "loss.name": "ntxent",
            "loss.ntxent.temperature": 0.1,
            "loss.ntxent.slot_pairs": True,
            "miner.name": "",
            "sampler.name": "class_epoch",
            "optim.name": "adamw",
            "optim.lr": 1e-5,
            "optim.weight_decay": 0.01,
            "optim.schedule": "constant",
            "optim.milestones": (),
            "optim.clip_norm": 3.0,
            "eval.at_start": False,
            "eval.batch_size": 100,
        },
        datasets={
            "cub200": _dataset("cub200", 50, 9, 900, 256, CUB_CARS_METRICS),
            "cars196": _dataset("cars196", 300, 9, 882, 224, CUB_CARS_METRICS),
            "sop": _dataset("sop", 200, 2, 900, 224, SOP_METRICS),
            "inshop": _dataset("inshop", 400, 2, 900, 224, INSHOP_METRICS),
        },
        reported={
            "cub200": {1: 78.7, 2: 86.7, 4: 91.4, 8: 94.9},
            "cars196": {1: 86.6, 2: 91.8, 4: 95.2, 8: 97.4},
            "sop": {1: 82.2, 10: 92.1, 100: 96.8, 1000: 98.9},
            "inshop": {1: 90.1, 10: 97.1, 20: 98.0, 30: 98.4},
        },
        source="the results table of the Hyp-ViT code (github.com/htdt/hyp_metric), Sph-DINO",
    ),
}


def recipe(name: str) -> Recipe:
    """The recipe ``recipe=<name>`` selects (ConfigError naming the known ones)."""
    if name not in RECIPES:
        raise ConfigError(f"unknown recipe {name!r}; choose one of: {', '.join(RECIPES)}")
    return RECIPES[name]


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """The config for ``recipe=<name>,data=<dataset>``."""
    args = parse_arg(arg)
    chosen = recipe(args.pop("recipe", "hyp_vit_sphere"))
    data = args.pop("data", "cub200")
    if args:
        raise ConfigError(
            f"unknown config argument(s) {sorted(args)}; use recipe=<name>, data=<dataset>"
        )
    if data not in chosen.datasets:
        raise ConfigError(
            f"the recipe has no settings for data={data}; choose one of: "
            + ", ".join(chosen.datasets)
        )
    c = base_config()
    set_keys(c, chosen.common)
    set_keys(c, chosen.datasets[data])
    c.lock()
    return c
