"""Every per-dataset setting of every method config, in one place.

``PRESETS[name]`` is what ``data=<name>`` selects in ``configs/revisiting.py``, ``diva.py``,
``sharing.py`` and ``dm2.py``: the data protocol (dotted config keys) and, per method, the
settings of the reference runs on that dataset, or the ones chosen here for the glyphs and the
emoji. A new dataset preset is one entry here; a method config reads only its own fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from jdml.errors import ConfigError

# The reference's ImageNet protocol (Roth et al., ICML 2020, sec. 4; its parameters.py): the
# frozen-BN ResNet-50 fine-tuned from ImageNet weights (a file the user gives: the presets refuse
# to start without --config.model.pretrained) with L2-normalised 128-d embeddings, 224 crops of
# the base augmentation, 256/224 evaluation view, batch 112 with SPC-2, Adam lr 1e-5 and coupled
# weight decay 4e-4, no lr decay (its tau 1000 never arrives), evaluation every epoch.
IMAGENET_PROTOCOL: dict[str, object] = {
    "data.channels": 3,
    "data.image_size": 224,
    "data.resize": 256,
    "data.augment": "base",
    "data.normalization": "backbone",
    "model.backbone": "resnet50",
    "model.frozen_bn": True,
    "model.pretrained": "required",
    "model.embed_dim": 128,
    "train.batch_size": 112,
    "sampler.samples_per_class": 2,
    "optim.lr": 1e-5,
    "optim.weight_decay": 4e-4,
    "optim.milestones": (),
    "eval.every_epochs": 1,
    "eval.batch_size": 100,
    # NMI and F1 with the k-means every published number was measured with (faiss's: seeded
    # random initialisation, 20 iterations, its empty-cluster split); k-means++ gives other
    # values on the same embeddings.
    "eval.kmeans": "reference",
}

# The papers' protocol scaled to 2 CPU cores, on the emoji set (1,644 emoji concepts drawn by
# five designs; the first half of the classes trains, the second half tests): EfficientNet-Lite0
# fine-tuned from its ImageNet weights (shipped by a pip package) with frozen BatchNorm, a
# linear L2-normalised 128-d embedding, batch 112 with SPC-2, Adam with coupled weight decay
# 4e-4 and no lr decay, 64 px images, 45 epochs, evaluation every epoch, and 15 % of the
# training classes held out to select the checkpoint. No flips: some emoji are mirror images
# of others.
EMOJI_PROTOCOL: dict[str, object] = {
    "data.name": "emoji",
    "data.channels": 3,
    "data.image_size": 64,
    "data.augment": "affine",
    "data.normalization": "backbone",
    "data.val_fraction": 0.15,
    "model.backbone": "efficientnet_lite0",
    "model.pretrained": "packaged",
    "model.frozen_bn": True,
    "model.embed_dim": 128,
    "train.batch_size": 112,
    "train.epochs": 45,  # the validation plateau (docs/history.md, "Why 45 epochs")
    "sampler.samples_per_class": 2,
    "optim.lr": 1e-4,
    "optim.weight_decay": 4e-4,
    "optim.milestones": (),
    "eval.every_epochs": 1,
}

# Loss options (relative to a loss section) with which the benchmark presets reproduce the
# published numbers, all made with the reference code: its margin loss divides by the number of
# triplets with an active term, which is what its bool-tensor count gives under the PyTorch
# >= 1.2 its README requires (the Revisiting and DiVA repositories; Sharing Matters' code has
# the same count and is assumed to have run under PyTorch >= 1.2 as well). The glyph and
# your-own-data presets keep Wu et al.'s count of active terms.
REFERENCE_LOSS_OPTIONS: dict[str, object] = {"margin.reference_pair_count": True}

# DiVA's evaluation weights of (discriminative, selfsimilarity, shared, intra) in the
# concatenations: the reference's, SOP's list on SOP and In-Shop.
_DIVA_WEIGHTS = ((0.75, 1.25, 1.25, 1.25), (0.5, 1.0, 1.0, 1.0), (0.5, 1.5, 1.5, 1.5))
_DIVA_WEIGHTS_SOP = (
    (1.0, 1.0, 1.0, 1.0),
    (0.5, 1.0, 1.0, 1.0),
    (1.0, 0.5, 0.5, 0.5),
    (1.5, 1.0, 1.0, 1.0),
)
# DM2's section 4.2 optimiser: Adam lr 3e-5 and weight decay 5e-4, no decay.
_DM2_OPTIM = {"optim.lr": 3e-5, "optim.weight_decay": 5e-4, "optim.milestones": ()}

# DiVA on the glyphs, chosen here for the small network trained from scratch (Adam 1e-3; the
# reference's 1e-5 is for a pretrained ResNet50): alpha and rho picked on a held-out validation
# split (data.val_fraction=0.2, 4 epochs, seed 0; validation Recall@1 of the main head / the
# concatenation, the latter deciding: alpha 0.3 rho 15 -> 92.2 / 89.6, 0.1 and 15 -> 96.4 /
# 93.3, 0.1 and 150 -> 96.7 / 94.1; the CUB weights 0.3 and 1500 had cut the main head's test
# Recall@1 to 55.6 from 68.8 without decorrelation in 2-epoch runs), the default schedule, a
# 10-batch queue.
_DIVA_GLYPHS = {"alpha": 0.1, "rho": 150.0, "milestone": 10, "gamma": 0.3, "epochs": 15, "keys": 10}
# Sharing Matters on the glyphs, chosen on a held-out validation split (data.val_fraction=0.2,
# 4 epochs, seed 0; validation Recall@1 of the class head / the concatenation, the latter
# deciding): shared weight 0.3 and gamma 50 -> 97.3 / 96.2, 0.1 and 50 -> 97.8 / 96.7, 0.1 and
# 500 (the flag default) -> 97.6 / 97.0.
_SHARING_GLYPHS = {"gamma": 500.0, "epochs": 15, "shared_weight": 0.1}


@dataclasses.dataclass(frozen=True)
class Preset:
    """What ``data=<name>`` selects.

    Attributes:
      protocol: the data protocol, dotted config keys set on the base config by every method.
      benchmark: an ImageNet benchmark: the reference's loss options (``REFERENCE_LOSS_OPTIONS``)
        and the methods' reference optimisers apply.
      rho_push_prob: Revisiting's rho-regularisation push probability per loss, ``"default"``
        for the others (Roth et al., ICML 2020, sec. 5 and its sample runs; without runs on a
        dataset, the reference's flag default 0.2).
      loss: Revisiting's per-dataset loss settings (dotted keys).
      diva: DiVA's auxiliary weight ``alpha``, decorrelation weight ``rho``, lr step
        ``milestone`` and factor ``gamma``, ``epochs`` and the queue's key batches ``keys``.
      diva_eval_weights: DiVA's weights of the heads in the evaluated concatenations.
      sharing: Sharing Matters' decorrelation weight ``gamma``, ``epochs`` and
        ``shared_weight``.
      dm2: DM2's keys for cohorts of Revisiting members (the paper's section 4.2).
      dm2_any_method: DM2's keys for cohorts of any method.
    """

    protocol: Mapping[str, object]
    benchmark: bool = False
    rho_push_prob: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: {"default": 0.2}  # the reference's flag default
    )
    loss: Mapping[str, object] = dataclasses.field(default_factory=dict)
    diva: Mapping[str, float] = dataclasses.field(default_factory=lambda: _DIVA_GLYPHS)
    diva_eval_weights: tuple[tuple[float, ...], ...] = _DIVA_WEIGHTS
    sharing: Mapping[str, float] = dataclasses.field(default_factory=lambda: _SHARING_GLYPHS)
    dm2: Mapping[str, object] = dataclasses.field(default_factory=dict)
    dm2_any_method: Mapping[str, object] = dataclasses.field(default_factory=dict)


# The SOP rows (In-Shop, without reference runs, takes them: the closest benchmark).
_SOP = {
    "rho_push_prob": {"default": 0.15},
    "loss": {"loss.histogram.num_bins": 11},
    "diva": {"alpha": 0.2, "rho": 150.0, "milestone": 70, "gamma": 0.3, "epochs": 150, "keys": 70},
    "diva_eval_weights": _DIVA_WEIGHTS_SOP,
    # No reference run on SOP: the flag default gamma and the Revisiting SOP length.
    "sharing": {"gamma": 500.0, "epochs": 100, "shared_weight": 1.0},
    "dm2": {
        **_DM2_OPTIM,
        "train.batch_size": 120,
        "sampler.samples_per_class": 2,
        "model.frozen_bn": False,
        "model.embed_dim": 512,
    },
}
_DM2_CUB_CARS = {
    **_DM2_OPTIM,
    "train.batch_size": 120,
    "sampler.samples_per_class": 5,
    "model.frozen_bn": True,
    "model.embed_dim": 512,
}

PRESETS: dict[str, Preset] = {
    # The glyph network trains from scratch in a few epochs: DM2's lambda reaches its value
    # after one.
    "glyphs": Preset(protocol={}, dm2_any_method={"exchange.dm2.warmup_epochs": 1.0}),
    "folder": Preset(protocol={"data.name": "folder", "data.image_size": 64}),
    "npz": Preset(protocol={"data.name": "npz"}),
    # Any prepared tfds image dataset: --config.data.tfds_name=<builder> --config.data.path=<dir>.
    "tfds": Preset(protocol={"data.name": "tfds", "data.image_size": 64}),
    # Cross-design emoji retrieval under the papers' protocol (EMOJI_PROTOCOL); build the data
    # first with `python -m jdml data fetch emoji`. DiVA and Sharing: SOP's weights (the emoji
    # are shaped like SOP and fine-tuned like the benchmarks), no lr decay within the 20 epochs,
    # a 10-batch queue (1,120 keys, a third of the training set; SOP's 70 batches would exceed
    # it).
    "emoji": Preset(
        protocol=EMOJI_PROTOCOL,
        diva={"alpha": 0.2, "rho": 150.0, "milestone": 20, "gamma": 0.3, "epochs": 20, "keys": 10},
        sharing={"gamma": 500.0, "epochs": 20, "shared_weight": 1.0},
    ),
    # CUB: rho push 0.4 for contrastive / triplet / margin with beta 0.6, 0.35 for margin with
    # beta 1.2, 0.3 for SNR; DiVA's and Sharing's sample runs (runs/shared_features.sh).
    "cub200": Preset(
        protocol={**IMAGENET_PROTOCOL, "data.name": "cub200", "train.epochs": 150},
        benchmark=True,
        rho_push_prob={
            "contrastive": 0.4,
            "triplet": 0.4,
            "margin": 0.35,
            "snr": 0.3,
            "default": 0.2,
        },
        diva={
            "alpha": 0.3,
            "rho": 1500.0,
            "milestone": 55,
            "gamma": 0.2,
            "epochs": 350,
            "keys": 30,
        },
        sharing={"gamma": 2400.0, "epochs": 150, "shared_weight": 1.0},
        dm2=_DM2_CUB_CARS,
    ),
    "cars196": Preset(
        protocol={**IMAGENET_PROTOCOL, "data.name": "cars196", "train.epochs": 150},
        benchmark=True,
        rho_push_prob={"default": 0.35},
        diva={
            "alpha": 0.15,
            "rho": 100.0,
            "milestone": 70,
            "gamma": 0.2,
            "epochs": 350,
            "keys": 30,
        },
        sharing={"gamma": 900.0, "epochs": 150, "shared_weight": 1.0},
        dm2=_DM2_CUB_CARS,
    ),
    "sop": Preset(
        protocol={
            **IMAGENET_PROTOCOL,
            "data.name": "sop",
            "train.epochs": 100,
            "eval.metrics": ("recall@1", "recall@10", "recall@100", "recall@1000", "map@r", "nmi"),
        },
        benchmark=True,
        **_SOP,
    ),
    # No reference runs on In-Shop: SOP's protocol (product images, few per class), its test
    # split the queries ranked against the gallery, with the recall cut-offs its papers report.
    "inshop": Preset(
        protocol={
            **IMAGENET_PROTOCOL,
            "data.name": "inshop",
            "train.epochs": 100,
            "eval.metrics": ("recall@1", "recall@10", "recall@20", "recall@30", "map@r", "nmi"),
        },
        benchmark=True,
        **_SOP,
    ),
}


def preset(data: str) -> Preset:
    """The preset ``data=<name>`` selects.

    Raises:
      ConfigError: for an unknown name, listing the known ones.
    """
    if data not in PRESETS:
        raise ConfigError(f"unknown data preset {data!r}; choose one of: {', '.join(PRESETS)}")
    return PRESETS[data]


def reference_loss_overrides(section: str, data: str) -> dict[str, object]:
    """``REFERENCE_LOSS_OPTIONS`` under a loss section ("loss", "aux.shared.loss") on benchmarks.

    Args:
      section: dotted path of a loss section of the config.
      data: the data preset.

    Returns:
      Dotted overrides; empty for presets that are not ImageNet benchmarks.
    """
    if not PRESETS[data].benchmark:
        return {}
    return {f"{section}.{key}": value for key, value in REFERENCE_LOSS_OPTIONS.items()}
