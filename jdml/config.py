"""The configuration schema: every key the library reads, with its default.

Configs are ``ml_collections.ConfigDict`` objects built by ``base_config()`` and specialised by the
files in ``configs/`` (one per method, the dataset chosen by an argument). The dict is locked, so a
misspelt override (``--config.optim.lrr=...``) is an error instead of a silently ignored key.

Component hyperparameters are not repeated here: the defaults of every registered loss, miner and
sampler are read from the component itself (its dataclass fields or keyword-only arguments), so a
component's defaults are declared in exactly one place and every one of them can be overridden as
``--config.loss.margin.beta=0.6``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import ml_collections

from jdml.errors import ConfigError
from jdml.registry import COUNT, NON_NEGATIVE, POSITIVE, Range

# Keys of a component's signature that the library fills in itself.
_RUNTIME_ARGS = frozenset(
    {
        "parent",
        "name",
        "num_classes",
        "miner_name",
        "key",
        "embeddings",
        "labels",
        "batch_size",
        "samples_per_class",
        "seed",
    }
)


def component_defaults(obj: Any) -> dict[str, Any]:
    """Returns the overridable hyperparameters of a registered component with their defaults.

    Args:
      obj: a Flax module class (dataclass fields) or a function / class (keyword arguments).
    """
    out: dict[str, Any] = {}
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            if f.name in _RUNTIME_ARGS or not f.init:
                continue
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    target = obj.__init__ if inspect.isclass(obj) else obj
    for p in inspect.signature(target).parameters.values():
        if p.name in _RUNTIME_ARGS or p.name == "self" or p.default is inspect.Parameter.empty:
            continue
        out[p.name] = p.default
    return out


def _to_config_value(value: Any) -> Any:
    # Sequences are tuples: ml_collections can override tuples from the command line, not lists.
    return tuple(value) if isinstance(value, list) else value


def _optional_names(obj: Any) -> set[str]:
    """Hyperparameters annotated as accepting None (e.g. ``upper_cutoff: float | None``)."""
    if dataclasses.is_dataclass(obj):
        annotations = {f.name: f.type for f in dataclasses.fields(obj)}
    else:
        target = obj.__init__ if inspect.isclass(obj) else obj
        annotations = {p.name: p.annotation for p in inspect.signature(target).parameters.values()}
    return {k for k, a in annotations.items() if "None" in str(a)}


def _component_section(registry: Any) -> ml_collections.ConfigDict:
    section = ml_collections.ConfigDict()
    for name in registry.names():
        obj = registry.get(name)
        optional = _optional_names(obj)
        entries = {}
        for k, v in component_defaults(obj).items():
            v = _to_config_value(v)
            # An optional value must accept None from the command line (--config.x=None).
            entries[k] = ml_collections.FieldReference(v, field_type=object) if k in optional else v
        section[name] = ml_collections.ConfigDict(entries)
    return section


def base_config() -> ml_collections.ConfigDict:
    """Returns the full default configuration (the Revisiting baseline on glyphs)."""
    from jdml.data.sources import DATASETS
    from jdml.losses import LOSSES
    from jdml.miners import MINERS
    from jdml.samplers import SAMPLERS

    c = ml_collections.ConfigDict()
    c.seed = 0

    c.data = ml_collections.ConfigDict()
    c.data.name = "glyphs"  # one of DATASETS.names()
    c.data.path = ""  # root folder / npz file for the generic sources
    c.data.cache_dir = ""  # glyph cache (default: $JDML_CACHE/glyphs or ~/.cache/jdml/glyphs)
    c.data.image_size = 32  # photo datasets: the crop size (224)
    c.data.resize = 256  # photo datasets: short side before the evaluation's centre crop
    c.data.verify_counts = True  # benchmarks: check the image and class counts of the copy
    c.data.skip_unreadable = False  # folder source: skip undecodable images with a warning
    c.data.channels = 1
    c.data.val_fraction = 0.0  # fraction of training classes held out for model selection
    c.data.split_seed = 0
    c.data.augment = "affine"  # one of jdml.data.augment.AUGMENTATIONS
    c.data.mean = 0.5
    c.data.std = 0.5
    # "mean_std": (x - data.mean) / data.std on [0, 1] pixels; "backbone": the per-channel
    # constants the backbone's pretrained weights expect (ImageNet's for resnet50, ...).
    c.data.normalization = "mean_std"
    c.data.num_threads = 2  # grain reader threads
    c.data.prefetch = 4  # batches prepared ahead
    c.data.num_workers = 0  # worker processes building batches (0: threads in this process)

    c.model = ml_collections.ConfigDict()
    c.model.backbone = "small_resnet"
    c.model.stem_features = 32
    c.model.stem_strides = 2
    c.model.stage_features = (32, 64, 128)
    c.model.stage_blocks = (1, 1, 1)
    c.model.stage_strides = (1, 2, 2)
    c.model.frozen_bn = False  # running statistics fixed, affine parameters trained
    # Partial fine-tuning (pretrained backbones): -1 trains every stage (the papers); k freezes
    # the stem and the first k stages (no gradient, no update), see jdml.models.freeze.
    c.model.frozen_stages = -1
    c.model.embed_dim = 128
    c.model.normalize = True  # L2-normalise the embedding (the reference's *_normalize archs)
    c.model.head = "discriminative"
    c.model.dtype = "float32"
    c.model.pooling = "avg"  # global pooling of pretrained backbones: avg or avg+max
    # Backbone weights: a weight file (PyTorch zip or legacy format, or safetensors; read without
    # executing code), "packaged" for weights a pip package ships, or "" for a random init.
    c.model.pretrained = ""

    c.loss = _component_section(LOSSES)
    c.loss.name = "margin"
    c.miner = _component_section(MINERS)
    c.miner.name = "distance"  # "" for losses that mine their own pairs
    c.sampler = _component_section(SAMPLERS)
    c.sampler.name = "class_random"
    c.sampler.samples_per_class = 2

    c.optim = ml_collections.ConfigDict()
    c.optim.name = "adam"
    c.optim.lr = 1e-3
    c.optim.weight_decay = 4e-4  # coupled L2 (PyTorch Adam semantics), not AdamW
    c.optim.schedule = "multistep"  # constant | multistep | cosine
    c.optim.milestones = (10,)  # epochs at which the lr is multiplied by gamma
    c.optim.gamma = 0.3
    c.optim.warmup_epochs = 0

    c.train = ml_collections.ConfigDict()
    c.train.batch_size = 112
    c.train.epochs = 15
    c.train.steps_per_epoch = 0  # 0: floor(N_train / batch_size), as the reference
    c.train.log_every_steps = 50
    c.train.checkpoint_every_steps = 200
    c.train.progress_bar = True

    c.eval = ml_collections.ConfigDict()
    c.eval.every_epochs = 5
    c.eval.at_start = True  # evaluate the untrained network too
    c.eval.metrics = ("recall@1", "recall@2", "recall@4", "recall@8", "map@r", "map@c", "nmi")
    c.eval.selection_metric = "recall@1"
    c.eval.distance = "euclidean"
    # The k-means of nmi / f1: "k-means++" (k-means++ seeding, then 20 Lloyd steps), "random"
    # (uniform seeding) or "reference" (faiss's k-means as the Revisiting-DML evaluation runs
    # it, fixed seed 1234; the ImageNet benchmark presets use it to compare with the papers).
    c.eval.kmeans = "k-means++"
    c.eval.batch_size = 500
    c.eval.splits = ("test",)  # 'val' is added automatically when data.val_fraction > 0
    # Measured on the training split at every evaluation (with its singular-value spectrum, for
    # the report's plots), as the Revisiting paper measures rho; () skips embedding the train set.
    c.eval.train_metrics = ("rho_spectrum@1",)
    # Multi-head models: further heads evaluated alone, and weighted concatenations of
    # ``eval.heads`` (one weight per head, in that order; DiVA's evaluation). The main head
    # (``model.head``) is always evaluated and selects the best checkpoint.
    c.eval.heads = ()
    c.eval.combinations = ()

    # Auxiliary terms on further embedding heads (DiVA, Sharing Matters): name -> section built by
    # ``metric_term`` or ``dance_term``. Empty for the Revisiting methods (one head, one loss).
    c.aux = ml_collections.ConfigDict()
    c.decorrelation = decorrelation_section()
    # Optimiser updates per step, each over a set of terms ("main", "decorrelation", aux term
    # names); () = one joint update of every term. Phases after the first train on their own
    # uniformly drawn batch (Sharing Matters' alternating Algorithm 1).
    c.phases = ()

    # DM2 (jdml.methods.cohort): ``size`` members of this method trained together, exchanging
    # relation matrices with weight ``mutual_weight`` (warmed up linearly over ``warmup_epochs``);
    # size 1 trains one model. ``devices``: devices of the mesh's member axis (0: automatic).
    c.cohort = ml_collections.ConfigDict()
    c.cohort.size = 1
    c.cohort.mutual_weight = 20.0
    c.cohort.warmup_epochs = 3.0
    c.cohort.relation = "distance"  # the paper's plain distances, or "rkd" (normalised, Huber)
    c.cohort.model_diversity = True  # own random init of each member's embedding layer
    c.cohort.temporal_diversity = True  # member l updates with probability 2^-(l-1)
    c.cohort.view_diversity = True  # own augmentation of the batch per member
    c.cohort.devices = 0
    c.cohort.data_devices = 1  # devices splitting each member's batch (data parallelism)
    # Members of one device: "unroll" traced one after the other, "vmap" vectorised (grouped
    # convolutions, which XLA runs slowly on CPU; try it on GPU/TPU).
    c.cohort.member_loop = "unroll"

    _ = DATASETS  # the dataset name is validated in validate()
    return c


def metric_term(
    loss: str, miner: str, *, head: str, weight: float, dim: int = 0
) -> ml_collections.ConfigDict:
    """An auxiliary term: a registered loss on ``head``'s embeddings with its own miner.

    The section has every registered loss and miner with its defaults (as the top-level
    ``loss``/``miner`` sections), so ``--config.aux.<term>.loss.margin.beta=...`` works; the loss's
    learnable parameters (e.g. its own per-class betas) are separate from the main loss's.

    Args:
      loss: registered loss name.
      miner: registered miner name ("" for a loss that mines its own pairs).
      head: embedding head the term trains (created if no other term uses it).
      weight: the term's weight in the total loss.
      dim: the head's dimension (0: ``model.embed_dim``).
    """
    from jdml.losses import LOSSES
    from jdml.miners import MINERS

    t = ml_collections.ConfigDict()
    t.kind = "metric"
    t.head = head
    t.dim = dim
    t.weight = weight
    t.loss = _component_section(LOSSES)
    t.loss.name = loss
    t.miner = _component_section(MINERS)
    t.miner.name = miner
    return t


def dance_term(
    *, head: str = "selfsimilarity", weight: float, dim: int = 0
) -> ml_collections.ConfigDict:
    """An auxiliary DaNCE term (DiVA's self-supervision) with its EMA key network and queue.

    Keys: ``temperature`` (the paper's runs 0.01), ``momentum`` of the EMA key parameters (0.9),
    ``queue_batches`` (the queue holds that many batches of keys, filled by the initial key
    network before training: the reference's n_key_batches), the distance-weight cut-offs, the
    weight normalisation (``anchor``: each anchor's weights sum to 1, the paper's intent;
    ``batch``: the reference's default code) and ``weighting`` (False: plain MoCo InfoNCE).
    """
    t = ml_collections.ConfigDict()
    t.kind = "dance"
    t.head = head
    t.dim = dim
    t.weight = weight
    t.temperature = 0.01
    t.momentum = 0.9
    t.queue_batches = 30
    t.lower_cutoff = 0.5
    t.upper_cutoff = ml_collections.FieldReference(1.4, field_type=object)
    t.normalize = "anchor"
    t.weighting = True
    return t


def decorrelation_section() -> ml_collections.ConfigDict:
    """Decorrelation of head pairs through psi MLPs and gradient reversal (DiVA, Sharing Matters).

    ``pairs``: ((source, target), ...), empty = off; ``weights``: one per pair; psi is
    Linear(dim, ``hidden``) -> ReLU -> Linear(hidden, dim) with its own ``lr`` and
    ``weight_decay``; ``renormalize``: L2-normalise the reversed embeddings (DiVA) or not
    (Sharing Matters); ``detach_target``: no gradient into the target head.
    """
    d = ml_collections.ConfigDict()
    d.pairs = ()
    d.weights = ()
    d.hidden = 512
    d.lr = 1e-5
    d.weight_decay = 0.0
    d.renormalize = True
    d.detach_target = False
    return d


_COUNT = COUNT
_NON_NEGATIVE_INT = Range(0, integer=True)
_NON_NEGATIVE = NON_NEGATIVE
_POSITIVE = POSITIVE

#: The numeric keys of the base config and the values each accepts (sequences: every element).
NUMERIC_KEYS: dict[str, Range] = {
    "seed": _NON_NEGATIVE_INT,
    "data.image_size": Range(8, 4096, integer=True),
    "data.resize": Range(8, 8192, integer=True),
    "data.channels": Range(1, 3, integer=True),
    "data.val_fraction": Range(0, 0.95),
    "data.split_seed": _NON_NEGATIVE_INT,
    "data.mean": Range(),
    "data.std": _POSITIVE,
    "data.num_threads": _COUNT,
    "data.prefetch": _COUNT,
    "data.num_workers": _NON_NEGATIVE_INT,
    "model.stem_features": _COUNT,
    "model.stem_strides": _COUNT,
    "model.stage_features": _COUNT,
    "model.stage_blocks": _COUNT,
    "model.stage_strides": _COUNT,
    "model.embed_dim": _COUNT,
    "model.frozen_stages": Range(-1, integer=True),
    "sampler.samples_per_class": _COUNT,
    "optim.lr": _POSITIVE,
    "optim.weight_decay": _NON_NEGATIVE,
    "optim.milestones": _NON_NEGATIVE,
    "optim.gamma": _POSITIVE,
    "optim.warmup_epochs": _NON_NEGATIVE,
    "train.batch_size": Range(2, integer=True),
    "train.epochs": _COUNT,
    "train.steps_per_epoch": _NON_NEGATIVE_INT,
    "train.log_every_steps": _COUNT,
    "train.checkpoint_every_steps": _COUNT,
    "eval.every_epochs": _COUNT,
    "eval.batch_size": _COUNT,
    "cohort.size": _COUNT,
    "cohort.mutual_weight": _NON_NEGATIVE,
    "cohort.warmup_epochs": _NON_NEGATIVE,
    "cohort.devices": _NON_NEGATIVE_INT,
    "cohort.data_devices": _COUNT,
    "decorrelation.weights": _NON_NEGATIVE,
    "decorrelation.hidden": _COUNT,
    "decorrelation.lr": _NON_NEGATIVE,
    "decorrelation.weight_decay": _NON_NEGATIVE,
}

#: The numeric keys of every auxiliary term (``aux.<term>.<key>``; DaNCE's only where present).
AUX_NUMERIC_KEYS: dict[str, Range] = {
    "dim": _NON_NEGATIVE_INT,
    "weight": _NON_NEGATIVE,
    "temperature": _POSITIVE,
    "momentum": Range(0, 1),
    "queue_batches": _COUNT,
    "lower_cutoff": _NON_NEGATIVE,
    "upper_cutoff": _POSITIVE,
}


def _check_number(key: str, value: Any, allowed: Range) -> None:
    values = value if isinstance(value, tuple | list) else (value,)
    for v in values:
        problem = allowed.problem(v)
        if problem:
            which = f" (each entry {problem})" if len(values) > 1 else f" {problem}"
            shown = tuple(value) if isinstance(value, tuple | list) else value
            raise ConfigError(f"{key}={shown!r}{which.rstrip()}; change --config.{key}")


def _component_sections(c: ml_collections.ConfigDict):
    """(key prefix, section, registry) of every selected loss, miner and sampler, the auxiliary
    terms' included."""
    from jdml.losses import LOSSES
    from jdml.miners import MINERS
    from jdml.samplers import SAMPLERS

    out = [("loss", c.loss, LOSSES), ("miner", c.miner, MINERS), ("sampler", c.sampler, SAMPLERS)]
    for name, term in c.aux.items():
        if term.get("kind") == "metric":
            out += [
                (f"aux.{name}.loss", term.loss, LOSSES),
                (f"aux.{name}.miner", term.miner, MINERS),
            ]
    return [(p, section, r) for p, section, r in out if section.name and section.name in r]


def _validate_numbers(c: ml_collections.ConfigDict) -> None:
    """Range checks of every numeric key: the base config's (``NUMERIC_KEYS``), the auxiliary
    terms' (``AUX_NUMERIC_KEYS``) and the selected components' (their registries' ranges; any
    other numeric hyperparameter must at least be finite)."""
    flat = flatten_config(c.to_dict())
    for key, allowed in NUMERIC_KEYS.items():
        _check_number(key, flat[key], allowed)
    for name, term in c.aux.items():
        for key, allowed in AUX_NUMERIC_KEYS.items():
            if term.get(key) is not None:
                _check_number(f"aux.{name}.{key}", term[key], allowed)
    for prefix, section, registry in _component_sections(c):
        ranges = registry.ranges(section.name)
        for key, value in section[section.name].items():
            where = f"{prefix}.{section.name}.{key}"
            if key in ranges and value is not None:
                _check_number(where, value, ranges[key])
            elif isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{where}={value!r} must be finite; change --config.{where}")
    m = c.model
    if not len(m.stage_features) == len(m.stage_blocks) == len(m.stage_strides):
        raise ConfigError(
            "model.stage_features, model.stage_blocks and model.stage_strides need one entry per "
            f"stage; got {len(m.stage_features)}, {len(m.stage_blocks)} and "
            f"{len(m.stage_strides)}"
        )
    if m.backbone == "small_resnet":
        from jdml.models.resnet import check_map_sizes

        try:
            check_map_sizes(c.data.image_size, m.stem_strides, m.stage_strides)
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _validate_model(m: ml_collections.ConfigDict, channels: int) -> None:
    """Pooling and pretrained weights of the ``model`` section (``channels``: data.channels)."""
    from jdml.models.embedding import frozen_backbone_modules
    from jdml.models.pretrained.backbones import CONVERTERS, weight_path

    if m.pooling not in ("avg", "avg+max"):
        raise ConfigError(f"model.pooling={m.pooling!r}; choose avg or avg+max")
    try:
        frozen_backbone_modules(m)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not m.pretrained:
        return
    if channels != 3:
        raise ConfigError(
            f"model.pretrained loads ImageNet weights of {m.backbone}, which take RGB images, but "
            f"data.channels={channels}: set --config.data.channels=3 (grayscale images are then "
            "repeated over the three channels)"
        )
    if m.pretrained == "required":
        raise ConfigError(
            f"this preset fine-tunes ImageNet weights of {m.backbone}: give their file with "
            "--config.model.pretrained=<path> (a torchvision/timm/Cadene .pth or .safetensors; "
            "nothing is downloaded), or --config.model.pretrained='' to train from scratch"
        )
    if m.backbone not in CONVERTERS:
        raise ConfigError(
            f"model.pretrained is set but backbone {m.backbone!r} has no weight converter; "
            f"backbones with one: {', '.join(CONVERTERS.names())}"
        )
    try:
        weight_path(m.backbone, m.pretrained)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None


def _validate_normalization(c: ml_collections.ConfigDict) -> None:
    """``data.normalization`` and, for ``backbone``, that the backbone has constants."""
    from jdml.models import input_normalization

    if c.data.normalization not in ("mean_std", "backbone"):
        raise ConfigError(
            f"data.normalization={c.data.normalization!r}; choose mean_std or backbone"
        )
    if c.data.normalization == "backbone" and input_normalization(c.model.backbone) is None:
        raise ConfigError(
            f"data.normalization=backbone, but backbone {c.model.backbone!r} has no input "
            "constants of its own; use data.normalization=mean_std with data.mean and data.std"
        )


def _validate_photos(d: ml_collections.ConfigDict) -> None:
    """Photo datasets need a photo augmentation; photo augmentations need RGB data."""
    from jdml.data.augment import AUGMENTATIONS
    from jdml.data.benchmarks import BENCHMARKS

    photos = AUGMENTATIONS.names_where("photo")
    photo = d.augment in photos
    if d.name in BENCHMARKS and not photo:
        raise ConfigError(
            f"data.name={d.name} holds photos of many sizes: choose a photo augmentation "
            f"(data.augment={' or '.join(photos)}), not {d.augment!r}"
        )
    if photo and d.channels != 3:
        raise ConfigError(f"data.augment={d.augment} works on RGB images: set data.channels=3")
    if photo and d.resize < d.image_size:
        raise ConfigError(
            f"data.resize={d.resize} is below the crop data.image_size={d.image_size}; the "
            "evaluation resizes the short side to data.resize, then crops the centre"
        )


def validate(c: ml_collections.ConfigDict) -> None:
    """Checks the combination of choices before anything runs; raises ``ConfigError``."""
    from jdml.data.augment import AUGMENTATIONS
    from jdml.data.benchmarks import BENCHMARKS
    from jdml.data.sources import DATASETS
    from jdml.evaluation.evaluator import check_metric_names
    from jdml.evaluation.kmeans import KMEANS_MODES
    from jdml.losses import LOSSES
    from jdml.miners import MINERS
    from jdml.models import BACKBONES
    from jdml.optim import OPTIMIZERS, SCHEDULES
    from jdml.samplers import SAMPLERS

    for registry, value, key in (
        (AUGMENTATIONS, c.data.augment, "data.augment"),
        (BACKBONES, c.model.backbone, "model.backbone"),
        (LOSSES, c.loss.name, "loss.name"),
        (SAMPLERS, c.sampler.name, "sampler.name"),
        (OPTIMIZERS, c.optim.name, "optim.name"),
        (SCHEDULES, c.optim.schedule, "optim.schedule"),
    ):
        if value not in registry:
            raise ConfigError(
                f"{key}={value!r} is not a known {registry.kind}; choose one of: "
                + ", ".join(registry.names())
            )
    if c.data.name not in DATASETS and c.data.name not in BENCHMARKS:
        raise ConfigError(
            f"data.name={c.data.name!r} is not a known dataset; choose one of: "
            + ", ".join(sorted([*DATASETS.names(), *BENCHMARKS.names()]))
        )
    miner = c.miner.name or None
    if miner is not None and miner not in MINERS:
        raise ConfigError(
            f"miner.name={miner!r} is not a known miner; choose one of: "
            + ", ".join(MINERS.names())
        )
    _check_miner("", c.loss.name, miner)
    _validate_numbers(c)
    bs, spc = c.train.batch_size, c.sampler.samples_per_class
    if bs % spc:
        raise ConfigError(
            f"train.batch_size={bs} is not divisible by sampler.samples_per_class={spc}; "
            f"choose a batch size that is a multiple of {spc} (e.g. {max(spc, bs - bs % spc)})"
        )
    if c.eval.selection_metric not in c.eval.metrics:
        raise ConfigError(
            f"eval.selection_metric={c.eval.selection_metric!r} is not among eval.metrics "
            f"{list(c.eval.metrics)}; add it or pick one of them"
        )
    for key in ("metrics", "train_metrics"):
        try:
            check_metric_names(list(c.eval[key]))
        except ValueError as e:
            raise ConfigError(f"eval.{key}: {e}") from None
    if c.eval.kmeans not in KMEANS_MODES:
        raise ConfigError(
            f"eval.kmeans={c.eval.kmeans!r}; choose one of: {', '.join(KMEANS_MODES)}"
        )
    for split in c.eval.splits:
        if split not in ("train", "val", "test"):
            raise ConfigError(f"eval.splits has {split!r}; choose from train, val, test")
    _validate_model(c.model, c.data.channels)
    _validate_normalization(c)
    _validate_photos(c.data)
    _validate_aux(c)
    _validate_cohort(c)
    heads = {c.model.head, *(t.head for t in c.aux.values())}
    for head in c.eval.heads:
        if head not in heads:
            raise ConfigError(f"eval.heads has {head!r}; the model's heads are {sorted(heads)}")
    for weights in c.eval.combinations:
        if len(weights) != len(c.eval.heads):
            raise ConfigError(
                f"eval.combinations entry {tuple(weights)} needs one weight per head of "
                f"eval.heads {tuple(c.eval.heads)}"
            )


def _check_miner(prefix: str, loss: str, miner: str | None) -> None:
    """A loss that mines its own pairs takes no miner; every other one a compatible miner.

    Args:
      prefix: where the section sits (``""`` or ``aux.<term>.``), for the message.
      loss: the loss name.
      miner: the miner name, or None for none.
    """
    from jdml.losses import LOSSES, compatible_miners

    if not LOSSES.get(loss).needs_miner:
        if miner is not None:
            raise ConfigError(
                f"{prefix}loss.name={loss} mines its own pairs and takes no miner, but "
                f"{prefix}miner.name={miner}; set --config.{prefix}miner.name=''"
            )
        return
    allowed = compatible_miners(loss)
    if miner not in allowed:
        got = f"{prefix}miner.name={miner}" if miner else f"no miner ({prefix}miner.name='')"
        raise ConfigError(
            f"{prefix}loss.name={loss} cannot be trained with {got}; compatible miners: "
            f"{', '.join(allowed)} (set --config.{prefix}miner.name to one of them)"
        )


def _validate_cohort(c: ml_collections.ConfigDict) -> None:
    from jdml.losses.mutual import RELATIONS

    k = c.cohort
    if k.relation not in RELATIONS:
        raise ConfigError(f"cohort.relation={k.relation!r}; choose one of {', '.join(RELATIONS)}")
    if k.member_loop not in ("unroll", "vmap"):
        raise ConfigError(f"cohort.member_loop={k.member_loop!r}; choose unroll or vmap")
    if c.train.batch_size % k.data_devices:
        raise ConfigError(
            f"cohort.data_devices={k.data_devices} must divide train.batch_size="
            f"{c.train.batch_size}"
        )
    if k.size > 1 and c.phases:
        raise ConfigError(
            f"phases={tuple(c.phases)} with cohort.size={k.size}: a cohort trains one joint "
            "update per step; use phases=() (the joint variant) for cohort members"
        )


def _validate_aux(c: ml_collections.ConfigDict) -> None:
    from jdml.losses import LOSSES
    from jdml.miners import MINERS

    heads = {c.model.head}
    for name, t in c.aux.items():
        where = f"aux.{name}"
        if t.get("kind") not in ("metric", "dance"):
            raise ConfigError(f"{where}.kind={t.get('kind')!r}; choose metric or dance")
        if t.kind == "metric":
            if t.loss.name not in LOSSES:
                raise ConfigError(
                    f"{where}.loss.name={t.loss.name!r} is not a known loss; choose one of: "
                    + ", ".join(LOSSES.names())
                )
            miner = t.miner.name or None
            if miner is not None and miner not in MINERS:
                raise ConfigError(
                    f"{where}.miner.name={miner!r} is not a known miner; choose one of: "
                    + ", ".join(MINERS.names())
                )
            _check_miner(f"{where}.", t.loss.name, miner)
        elif t.normalize not in ("anchor", "batch"):
            raise ConfigError(f"{where}.normalize={t.normalize!r}; choose anchor or batch")
        heads.add(t.head)
    d = c.decorrelation
    if len(d.pairs) != len(d.weights):
        raise ConfigError(
            f"decorrelation.pairs has {len(d.pairs)} pair(s) but decorrelation.weights has "
            f"{len(d.weights)}; give one weight per (source, target) pair"
        )
    for pair in d.pairs:
        unknown = [h for h in pair if h not in heads]
        if len(pair) != 2 or unknown or pair[0] == pair[1]:
            raise ConfigError(
                f"decorrelation pair {tuple(pair)} must name two different heads among "
                f"{sorted(heads)}"
            )


def set_keys(c: ml_collections.ConfigDict, values: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """Sets every dotted key of ``values`` (``{"data.name": "sop"}``) on ``c``.

    Only keys the config has can be set (the config is the schema); the config's own type checks
    apply to the values.

    Args:
      c: the config, changed in place.
      values: dotted key -> value.

    Returns:
      ``c``.

    Raises:
      ConfigError: naming the key, for an unknown key or a value of the wrong type.
    """
    for dotted, value in values.items():
        *path, name = dotted.split(".")
        section = c
        try:
            for part in path:
                section = section[part]
            if not isinstance(section, ml_collections.ConfigDict) or name not in section:
                raise KeyError(dotted)
            section[name] = value
        except (KeyError, TypeError, AttributeError) as e:
            raise ConfigError(
                f"cannot set {dotted}={value!r} ({type(e).__name__}: {e}): use a key of the "
                "config (see the config file's keys) with a value of its type"
            ) from None
    return c


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """``"section.key=value"`` strings (scripts' ``--set``) as dotted key -> value.

    A value is read as a Python literal where it is one (numbers, tuples, booleans), else kept
    as a string.

    Raises:
      ConfigError: for an item without ``=``.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"cannot set {item!r}: expected section.key=value")
        try:
            out[key] = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            out[key] = text
    return out


def apply_overrides(
    c: ml_collections.ConfigDict, items: Iterable[str]
) -> ml_collections.ConfigDict:
    """Sets each ``section.key=value`` of ``items`` on ``c`` (:func:`parse_assignments`, then
    :func:`set_keys`), as ``--config.section.key=value`` does on ``train.py``."""
    return set_keys(c, parse_assignments(items))


def to_json(c: ml_collections.ConfigDict) -> str:
    return json.dumps(c.to_dict(), indent=2, sort_keys=True)


def _tuples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value


def from_json(text: str) -> ml_collections.ConfigDict:
    """Rebuilds a config written by ``to_json`` (JSON lists become tuples again)."""
    return ml_collections.ConfigDict(_tuples(json.loads(text)))


def _under(defaults: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """``saved`` with the keys it lacks taken from ``defaults``, section by section."""
    out = dict(saved)
    for key, value in defaults.items():
        if key not in out:
            out[key] = value
        elif isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _under(value, out[key])
    return out


def saved_config(text: str) -> ml_collections.ConfigDict:
    """A run's ``config.json`` for evaluation and inference: keys added to jdml after the run was
    trained get their defaults, which keep the behaviour the run was trained with."""
    return ml_collections.ConfigDict(_tuples(_under(base_config().to_dict(), json.loads(text))))


# Keys that may change between runs in the same workdir (they do not change the trained model).
RESUMABLE_CHANGES = (
    "train.epochs",
    "train.log_every_steps",
    "train.checkpoint_every_steps",
    "train.progress_bar",
    "data.num_threads",
    "data.prefetch",
    "data.num_workers",
    "data.cache_dir",
    "eval.",
)


def flatten_config(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def selected_only(flat: dict[str, Any]) -> dict[str, Any]:
    """Drops the hyperparameters of components that are not selected (loss, miner, sampler).

    Their presence depends on which components the installed version registers, and their
    values do not affect the run. Component sections may be nested (``aux.<term>.loss``).
    """
    out = {}
    for key, value in flat.items():
        parts = key.split(".")
        unselected = False
        for i, part in enumerate(parts[:-2]):
            if part in _COMPONENT_SECTIONS:
                prefix = ".".join(parts[: i + 1])
                unselected = flat.get(f"{prefix}.name") != parts[i + 1]
                break
        if not unselected:
            out[key] = value
    return out


_COMPONENT_SECTIONS = ("loss", "miner", "sampler")


def incompatible_keys(
    old: dict[str, Any],
    new: dict[str, Any],
    allowed: Iterable[str] = RESUMABLE_CHANGES,
    defaults: dict[str, Any] | None = None,
) -> list[str]:
    """Returns the keys whose values differ between two configs and forbid resuming.

    Keys of loss/miner/sampler components that are not selected are ignored, and so are keys
    the old config lacks (written by an earlier version) whose new value is their default in
    ``defaults`` (a flattened config).
    """
    fo, fn = selected_only(flatten_config(old)), selected_only(flatten_config(new))
    allowed = tuple(allowed)
    defaults = defaults or {}
    diffs = []
    for k in sorted(set(fo) | set(fn)):
        if k not in fo and k in defaults and fn.get(k) == defaults[k]:
            continue
        if fo.get(k, "<missing>") != fn.get(k, "<missing>") and not k.startswith(allowed):
            diffs.append(f"{k}: {fo.get(k, '<missing>')!r} -> {fn.get(k, '<missing>')!r}")
    return diffs


ConfigFactory = Callable[..., ml_collections.ConfigDict]
