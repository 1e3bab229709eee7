"""Checking a config before anything runs: names, numbers and the combinations of choices.

:func:`validate` raises :class:`jdml.errors.ConfigError` with a message that names the key and a
value that works.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import jax
import ml_collections

from jdml.backends import check_backends
from jdml.cohort.exchanges import EXCHANGE_STATE, EXCHANGES
from jdml.cohort.members import MEMBER_LOOPS, member_configs
from jdml.config.saved import flatten_config
from jdml.config.schema import SECTION, config_leaves, schema_leaves, type_problem
from jdml.data.augment import AUGMENTATIONS
from jdml.data.benchmarks import BENCHMARKS, SOURCES
from jdml.data.device_pixels import VIEW_PLACES
from jdml.data.sources import DATASETS
from jdml.data.splits import SPLITS
from jdml.data.transforms import PIL_FILTERS
from jdml.embedder import check_head_dims
from jdml.errors import ConfigError
from jdml.evaluation.embeddings import check_metric_names, resolve_metrics
from jdml.evaluation.kmeans import KMEANS_MODES
from jdml.evaluation.knn import DISTANCES
from jdml.keys import RENAMED_KEYS, get_dotted
from jdml.losses import LOSSES
from jdml.mesh import mesh_shape
from jdml.methods.checks import check_phases, check_stateless_members
from jdml.methods.terms import TERMS
from jdml.methods.terms.metric import check_sections
from jdml.miners import MINERS
from jdml.models import BACKBONES, INPUT_NORMALIZATIONS, MODEL_DTYPES, POOLINGS
from jdml.models.embedding import (
    HEAD_INITS,
    backbone_layers,
    backbones_with_layers,
    frozen_backbone_modules,
)
from jdml.models.pretrained.backbones import CONVERTERS, weight_path
from jdml.nn.batch_norm import BATCH_NORM_MODES
from jdml.optim import LAYER_GROUPINGS, OPTIMIZERS, SCHEDULES
from jdml.registry import COUNT, NON_NEGATIVE, POSITIVE, Range, Registry
from jdml.samplers import SAMPLERS

_COUNT = COUNT
_NON_NEGATIVE_INT = Range(0, integer=True)
_NON_NEGATIVE = NON_NEGATIVE
_POSITIVE = POSITIVE
#: A size of the input pipeline: -1 (from the host's cores) or a count (threads: at least 1).
AUTO_SIZE = Range(-1, integer=True)

#: The numeric keys of the base config and the values each accepts (sequences: every element).
NUMERIC_KEYS: dict[str, Range] = {
    "seed": _NON_NEGATIVE_INT,
    "data.image_size": Range(8, 4096, integer=True),
    "data.resize": Range(8, 8192, integer=True),
    "data.channels": Range(1, 3, integer=True),
    "data.val_fraction": Range(0, 0.95),
    "data.split_seed": _NON_NEGATIVE_INT,
    "data.val_folds": _NON_NEGATIVE_INT,
    "data.val_fold": _NON_NEGATIVE_INT,
    "data.mean": Range(),
    "data.std": _POSITIVE,
    "data.num_threads": AUTO_SIZE,
    "data.device_photos_gib": Range(-1),
    "data.cache_size": Range(0, integer=True),
    "data.prefetch": _COUNT,
    "data.num_workers": AUTO_SIZE,
    "model.embed_dim": _COUNT,
    "model.frozen_stages": Range(-1, integer=True),
    "sampler.samples_per_class": _COUNT,
    "optim.lr": _POSITIVE,
    "optim.weight_decay": _NON_NEGATIVE,
    "optim.milestones": _NON_NEGATIVE,
    "optim.gamma": _POSITIVE,
    "optim.warmup_epochs": _NON_NEGATIVE,
    "optim.clip_norm": _NON_NEGATIVE,
    "optim.backbone_lr_multiplier": _NON_NEGATIVE,
    "optim.layer_decay": Range(0, 1, open_low=True),
    "train.batch_size": Range(2, integer=True),
    "train.epochs": _COUNT,
    "train.steps_per_epoch": _NON_NEGATIVE_INT,
    "train.log_every_steps": _COUNT,
    "train.checkpoint_every_steps": _COUNT,
    "eval.every_epochs": _COUNT,
    "eval.batch_size": _COUNT,
    "cohort.size": _COUNT,
    "cohort.devices": _NON_NEGATIVE_INT,
    "parallel.data_devices": _NON_NEGATIVE_INT,
    "parallel.eval_devices": _NON_NEGATIVE_INT,
    "decorrelation.weights": _NON_NEGATIVE,
    "decorrelation.hidden": _COUNT,
    "decorrelation.lr": _NON_NEGATIVE,
    "decorrelation.weight_decay": _NON_NEGATIVE,
}


def profile_range(text: str) -> tuple[int, int] | None:
    """``profile_steps`` ("a:b", steps a to b - 1; "" for none) as ``(a, b)``.

    Raises:
      ConfigError: for anything but two integers 0 <= a < b.
    """
    if not text:
        return None
    parts = str(text).split(":")
    try:
        first, stop = (int(p) for p in parts)
    except ValueError:
        first, stop = -1, -1
    if len(parts) != 2 or not 0 <= first < stop:
        raise ConfigError(
            f"profile_steps={text!r} must be 'a:b' with integers 0 <= a < b (steps a to b - 1), "
            "e.g. --config.profile_steps=10:15, or '' for no trace"
        )
    return first, stop


def _check_number(key: str, value: Any, allowed: Range) -> None:
    values = value if isinstance(value, tuple | list) else (value,)
    for v in values:
        problem = allowed.problem(v)
        if problem:
            which = f" (each entry {problem})" if len(values) > 1 else f" {problem}"
            shown = tuple(value) if isinstance(value, tuple | list) else value
            raise ConfigError(f"{key}={shown!r}{which.rstrip()}; change --config.{key}")


def _component_sections(c: ml_collections.ConfigDict):
    """(key prefix, section, registry, component) of every loss, miner and sampler section, the
    auxiliary terms' included (the selected ones and the others, whose values are checked too:
    selecting one later must not meet a value that was never checked)."""
    out = [("loss", c.loss, LOSSES), ("miner", c.miner, MINERS), ("sampler", c.sampler, SAMPLERS)]
    for name, term in c.aux.items():
        out += TERMS.get(term.kind).components(f"aux.{name}", term)
    return [
        (p, section, r, name)
        for p, section, r in out
        for name in r.names()
        if name in section and hasattr(section[name], "items")
    ]


def _validate_numbers(c: ml_collections.ConfigDict) -> None:
    """Range checks of every numeric key: the base config's (``NUMERIC_KEYS``), the auxiliary
    terms' (the ranges their kinds registered with) and the selected components' (their
    registries' ranges; any other numeric hyperparameter must at least be finite), then the
    selected backbone's own keys (its ranges and its registered check)."""
    flat = flatten_config(c.to_dict())
    for key, allowed in NUMERIC_KEYS.items():
        _check_number(key, flat[key], allowed)

    for name, term in c.aux.items():
        for key, allowed in TERMS.ranges(term.kind).items():
            if term.get(key) is not None:
                _check_number(f"aux.{name}.{key}", term[key], allowed)
    for prefix, section, registry, name in _component_sections(c):
        ranges = registry.ranges(name)
        for key, value in section[name].items():
            where = f"{prefix}.{name}.{key}"
            if key in ranges and value is not None:
                _check_number(where, value, ranges[key])
            elif isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{where}={value!r} must be finite; change --config.{where}")
    for name in BACKBONES.names():  # every backbone's own keys hold valid values, used or not
        _check_values(BACKBONES, name, "model", c)
    _check_declared(BACKBONES, c.model.backbone, "model", c)
    if c.data.name in DATASETS:
        _check_declared(DATASETS, c.data.name, "data", c)


def _check_declared(
    registry: Registry, name: str, section: str, c: ml_collections.ConfigDict
) -> None:
    """The ranges and choices of the keys the component ``name`` of ``registry`` declared in
    ``section``, then its own ``check`` fact (``check(config)``, raising ``ConfigError``) if it
    has one."""
    _check_values(registry, name, section, c)
    check = registry.meta(name).get("check")
    if check is not None:
        check(c)


def _check_values(
    registry: Registry, name: str, section: str, c: ml_collections.ConfigDict
) -> None:
    """The ranges (``ranges``) and the allowed names (the ``choices`` fact: key -> names) of
    the keys the component ``name`` of ``registry`` declared in ``section``."""
    for key, allowed in registry.ranges(name).items():
        _check_number(f"{section}.{key}", get_dotted(c[section], key), allowed)
    for key, names in registry.meta(name).get("choices", {}).items():
        value = get_dotted(c[section], key)
        if value not in names:
            raise ConfigError(f"{section}.{key}={value!r}; choose one of: {', '.join(names)}")


def _validate_per_query(c: ml_collections.ConfigDict) -> None:
    """``eval.per_query``: retrieval metrics of ``eval.metrics`` (those with per-query values)."""
    retrieval = [m.name for m in resolve_metrics(list(c.metrics)) if m.per_query is not None]
    for name in c.per_query:
        if name not in retrieval:
            raise ConfigError(
                f"eval.per_query has {name!r}, which is not a retrieval metric of eval.metrics; "
                f"choose from {retrieval}"
            )


def _validate_model(model: ml_collections.ConfigDict, channels: int) -> None:
    """Pooling and pretrained weights of the ``model`` section (``channels``: data.channels)."""
    if model.pooling not in POOLINGS:
        raise ConfigError(
            f"model.pooling={model.pooling!r}; choose {' or '.join(POOLINGS.names())}"
        )
    try:
        frozen_backbone_modules(model)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not model.pretrained:
        return
    if channels != 3:
        raise ConfigError(
            f"model.pretrained loads ImageNet weights of {model.backbone}, which take RGB images, "
            f"but data.channels={channels}: set --config.data.channels=3 (grayscale images are "
            "then repeated over the three channels)"
        )
    if model.pretrained == "required":
        raise ConfigError(
            f"this preset fine-tunes ImageNet weights of {model.backbone}: give their file with "
            "--config.model.pretrained=<path> (a torchvision/timm/Cadene/DINO/DINOv2 .pth or "
            ".safetensors; nothing is downloaded), or --config.model.pretrained='' to train from "
            "scratch"
        )
    if model.backbone not in CONVERTERS:
        raise ConfigError(
            f"model.pretrained is set but backbone {model.backbone!r} has no weight converter; "
            f"backbones with one: {', '.join(CONVERTERS.names())}"
        )
    try:
        weight_path(model.backbone, model.pretrained)
    except (FileNotFoundError, ValueError) as e:
        raise ConfigError(str(e)) from None


def _validate_layer_decay(c: ml_collections.ConfigDict) -> None:
    """``optim.layer_decay_grouping`` is a known grouping, and ``optim.layer_decay`` below 1
    needs a backbone that declares its layers."""
    if c.optim.layer_decay_grouping not in LAYER_GROUPINGS:
        raise ConfigError(
            f"optim.layer_decay_grouping={c.optim.layer_decay_grouping!r}; choose one of: "
            + ", ".join(LAYER_GROUPINGS)
        )
    if c.optim.layer_decay != 1.0 and backbone_layers(c.model) is None:
        raise ConfigError(
            f"optim.layer_decay={c.optim.layer_decay:g}, but backbone {c.model.backbone!r} has no "
            f"layers to decay; backbones with them: {', '.join(backbones_with_layers(c.model))} "
            "(or set it to 1)"
        )


def _validate_head_init(model: ml_collections.ConfigDict) -> None:
    """``model.head_init`` names an initialiser of the embedding heads."""
    if model.head_init not in HEAD_INITS:
        raise ConfigError(
            f"model.head_init={model.head_init!r}; choose one of: {', '.join(HEAD_INITS)}"
        )


def _validate_normalization(c: ml_collections.ConfigDict) -> None:
    """``data.normalization`` and, for ``backbone``, that the backbone has constants."""
    if c.data.normalization not in INPUT_NORMALIZATIONS:
        raise ConfigError(
            f"data.normalization={c.data.normalization!r}; choose "
            + " or ".join(INPUT_NORMALIZATIONS.names())
        )
    if INPUT_NORMALIZATIONS.get(c.data.normalization)(c) is None:
        raise ConfigError(
            f"data.normalization=backbone, but backbone {c.model.backbone!r} has no input "
            "constants of its own; use data.normalization=mean_std with data.mean and data.std"
        )


def _validate_photos(data: ml_collections.ConfigDict) -> None:
    """Photo datasets need a photo augmentation; photo augmentations need RGB data."""
    photos = AUGMENTATIONS.names_where("photo")
    photo = data.augment in photos
    if data.name in BENCHMARKS and not photo:
        raise ConfigError(
            f"data.name={data.name} holds photos of many sizes: choose a photo augmentation "
            f"(data.augment={' or '.join(photos)}), not {data.augment!r}"
        )
    if photo and data.channels != 3:
        raise ConfigError(f"data.augment={data.augment} works on RGB images: set data.channels=3")
    if photo and data.resize < data.image_size:
        raise ConfigError(
            f"data.resize={data.resize} is below the crop data.image_size={data.image_size}; the "
            "evaluation resizes the short side to data.resize, then crops the centre"
        )


def _validate_source(data: ml_collections.ConfigDict) -> None:
    """``data.source`` is a known source that holds ``data.name``: a benchmark it has a reader
    of, or a dataset registered with that source (``data.name=tfds``); ``files`` (the default)
    also suits every in-memory dataset."""
    if data.source not in SOURCES:
        raise ConfigError(
            f"data.source={data.source!r} is not a known data source; choose one of: "
            + ", ".join(SOURCES.names())
        )
    readers = SOURCES.get(data.source)
    if data.name in BENCHMARKS:
        held = data.name in readers
    else:
        held = data.source == "files" or DATASETS.meta(data.name).get("source") == data.source
    if not held:
        readable = sorted([*readers.names(), *DATASETS.names_where("source", data.source)])
        raise ConfigError(
            f"data.source={data.source} has no reader of data.name={data.name} (it reads "
            f"data.name={', '.join(readable)}); use --config.data.source=files"
        )


def _validate_pipeline(data: ml_collections.ConfigDict) -> None:
    """The input pipeline's keys: a thread count of 0 (the range allows -1 for "auto"), where
    views are made, and the decode cache, which caches photos read from files."""
    if data.num_threads == 0:
        raise ConfigError(
            "data.num_threads=0: set at least 1 reader thread, or -1 to size the pipeline from "
            "the host's cores (--config.data.num_threads=-1)"
        )
    if data.views not in VIEW_PLACES:
        raise ConfigError(f"data.views={data.views!r}; choose one of: {', '.join(VIEW_PLACES)}")
    if data.eval_interpolation not in PIL_FILTERS:
        raise ConfigError(
            f"data.eval_interpolation={data.eval_interpolation!r}; choose one of: "
            + ", ".join(PIL_FILTERS)
        )
    if data.views == "device" and "views" not in AUGMENTATIONS.meta(data.augment):
        raise ConfigError(
            f"data.views=device makes the views of photo augmentations, not of "
            f"data.augment={data.augment!r}; use data.views=host or auto, or one of "
            + ", ".join(n for n in AUGMENTATIONS.names() if "views" in AUGMENTATIONS.meta(n))
        )
    if data.cache_size and data.cache_size < data.resize:
        raise ConfigError(
            f"data.cache_size={data.cache_size} is below data.resize={data.resize}: the "
            "evaluation view would upsample the cached photos; set it to 0 (data.resize) or "
            f"at least {data.resize}"
        )
    if data.decode_cache and data.source != "files":
        raise ConfigError(
            f"data.decode_cache=True caches photos read from files, not data.source="
            f"{data.source}; set --config.data.decode_cache=False or --config.data.source=files"
        )


def check_devices(c: ml_collections.ConfigDict) -> None:
    """Checks the device counts of a training run against the devices present (every process's,
    under ``jax.distributed``), before anything is read or written; raises ``ConfigError``.

    ``validate`` does not: a stored config is also evaluated on machines with other devices.
    """
    available = len(jax.devices())
    for key in ("data_devices", "eval_devices"):
        value = int(c.parallel[key])
        if value > available:
            raise ConfigError(
                f"parallel.{key}={value}, but this run has {available} device(s); set "
                f"--config.parallel.{key}=0 (all of them) or a number up to {available}"
            )
    data_devices = int(c.parallel.data_devices)
    if data_devices and c.train.batch_size % data_devices:
        raise ConfigError(
            f"parallel.data_devices={data_devices} must divide train.batch_size="
            f"{c.train.batch_size}; choose a batch size that is a multiple of it, or another "
            "--config.parallel.data_devices"
        )
    members, data = mesh_shape(c.cohort.size, c.cohort.devices, data_devices)
    if jax.process_count() > 1 and members * data != available:
        raise ConfigError(
            f"this run has {jax.process_count()} processes, whose {available} devices must all "
            f"train, but cohort.devices x parallel.data_devices = {members} x {data} uses "
            f"{members * data}; set --config.parallel.data_devices=0 (every device the cohort's "
            "member axis leaves)"
        )


def check_profile_steps(profile_steps: str, total_steps: int, start_step: int = 0) -> None:
    """Refuses a ``profile_steps`` range with no step to trace: one that starts at or after the
    run's last step, or ends at or before the step a resumed run starts from (a range begun
    before it is traced from there); raises ``ConfigError`` naming a range that fits.
    """
    span = profile_range(profile_steps)
    if span is None or (span[0] < total_steps and span[1] > start_step):
        return
    if start_step >= total_steps:
        raise ConfigError(
            f"profile_steps={profile_steps!r}: this run has trained all its {total_steps} "
            "steps, so no step is left to trace; raise --config.train.epochs and trace steps "
            f"from {total_steps} on (e.g. --config.profile_steps={total_steps}:"
            f"{total_steps + 5}), or use another --workdir"
        )
    left = total_steps - start_step
    length = min(span[1] - span[0], 5, max(1, left - 1))
    first = start_step + max(0, min(left - length, 0 if start_step else 1))
    where = (
        f"ends before step {start_step}, where this run resumes"
        if span[1] <= start_step
        else f"starts after the run's last step ({total_steps} steps: train.epochs x steps "
        "per epoch)"
    )
    raise ConfigError(
        f"profile_steps={profile_steps!r} {where}, so no trace would be written; use e.g. "
        f"--config.profile_steps={first}:{first + length}"
    )


def plain_value(value: Any) -> Any:
    """A config value without its ``FieldReference`` (tuples as tuples)."""
    value = value.get() if isinstance(value, ml_collections.FieldReference) else value
    return tuple(value) if isinstance(value, list) else value


def check_schema(c: ml_collections.ConfigDict) -> None:
    """Every key of ``c`` is one jdml reads (:func:`jdml.config.schema.schema_leaves`), holding
    a value of its default's type: the same check for the command line, a Python config file
    and a JSON config. Raises ``ConfigError`` naming the key, and the nearest known key."""
    schema = schema_leaves(c)
    for key, value in config_leaves(c).items():
        if key in schema:
            problem = type_problem(schema[key], value)
            if problem == "must be finite":
                shown = plain_value(value)
                raise ConfigError(
                    f"{key}={shown!r} must be finite; change --config.{key} or its entry in "
                    "the config file"
                )
            if problem:
                shown = "a section" if value is SECTION else repr(value)
                raise ConfigError(
                    f"{key} {problem} (it is {shown}, its default {schema[key]!r}); change "
                    f"--config.{key} or its entry in the config file"
                )
            continue
        if value is SECTION and any(k.startswith(f"{key}.") for k in schema):
            continue  # an emptied section
        below = [k for k in schema if k.startswith(f"{key}.")]
        if below:
            raise ConfigError(
                f"{key} must be a section of keys (such as {below[0]}), not {value!r}; restore "
                "it in the config file"
            )
        parts = key.split(".")
        if parts[0] == "aux" and len(parts) > 2 and f"aux.{parts[1]}.kind" not in schema:
            continue  # a term of no known kind: _validate_aux names its kind
        close = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else "."
        if key in RENAMED_KEYS:
            hint = f"; it is now {RENAMED_KEYS[key]}."
        raise ConfigError(
            f"{key} is not a jdml config key{hint} Remove or rename it in the config file "
            "(--config.<key> on the command line refuses it the same way)"
        )


def _validate_folds(data: ml_collections.ConfigDict) -> None:
    """``data.val_folds`` is 0 (one hold-out) or at least 2, and ``data.val_fold`` one of its
    folds."""
    folds, fold = data.val_folds, data.val_fold
    if folds == 1:
        raise ConfigError(
            "data.val_folds=1 holds every training class out; set it to 0 (one hold-out of "
            "data.val_fraction) or to 2 or more class-disjoint folds"
        )
    if folds and not 0 <= fold < folds:
        raise ConfigError(
            f"data.val_fold={fold} is not one of the {folds} folds; set --config.data.val_fold "
            f"to 0..{folds - 1}"
        )
    if not folds and fold:
        raise ConfigError(
            f"data.val_fold={fold} is set, but data.val_folds=0 (one hold-out, no folds); set "
            "--config.data.val_folds=k (k >= 2) or leave data.val_fold at 0"
        )


def validate(c: ml_collections.ConfigDict) -> None:
    """Checks the combination of choices before anything runs; raises ``ConfigError``."""
    check_schema(c)
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
    profile_range(c.profile_steps)
    for rule in c.optim.no_decay:
        if rule != "1d" and not (isinstance(rule, str) and rule.isidentifier()):
            raise ConfigError(
                f"optim.no_decay has {rule!r}; give '1d' (every parameter of fewer than 2 "
                "dimensions: norms and biases) or parameter names such as 'cls_token'"
            )
    for name, term in c.aux.items():
        if term.get("kind") not in TERMS:
            raise ConfigError(
                f"aux.{name}.kind={term.get('kind')!r}; choose one of: " + ", ".join(TERMS.names())
            )
    if c.data.name not in DATASETS and c.data.name not in BENCHMARKS:
        raise ConfigError(
            f"data.name={c.data.name!r} is not a known dataset; choose one of: "
            + ", ".join(sorted([*DATASETS.names(), *BENCHMARKS.names()]))
        )
    _validate_source(c.data)
    check_sections("", c.loss, c.miner)  # the main term's loss and miner
    _validate_numbers(c)
    _validate_folds(c.data)  # after the numbers: each is a count, then the pair agrees
    _validate_pipeline(c.data)
    bs, spc = c.train.batch_size, c.sampler.samples_per_class
    if spc > bs // 2:
        fits = [d for d in range(1, bs // 2 + 1) if bs % d == 0]
        raise ConfigError(
            f"sampler.samples_per_class={spc} leaves room for fewer than two classes in a batch "
            f"of train.batch_size={bs} (a metric loss needs negatives from another class); "
            f"choose one of {', '.join(map(str, fits[-6:]))} (divisors of the batch size up "
            "to half of it), or raise the batch size"
        )
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
    _validate_per_query(c.eval)
    if c.eval.distance not in DISTANCES:
        raise ConfigError(
            f"eval.distance={c.eval.distance!r}; choose one of: {', '.join(DISTANCES)}"
        )
    if c.model.dtype not in MODEL_DTYPES:
        raise ConfigError(
            f"model.dtype={c.model.dtype!r}; choose one of: {', '.join(MODEL_DTYPES)} (the "
            "network's activations and products; parameters stay float32)"
        )
    if c.eval.kmeans not in KMEANS_MODES:
        raise ConfigError(
            f"eval.kmeans={c.eval.kmeans!r}; choose one of: {', '.join(KMEANS_MODES)}"
        )
    for key in ("splits", "selected_splits"):
        for split in c.eval[key]:
            if split not in SPLITS:
                raise ConfigError(
                    f"eval.{key} has {split!r}; choose from {', '.join(SPLITS.names())}"
                )
    _validate_model(c.model, c.data.channels)
    _validate_normalization(c)
    _validate_head_init(c.model)
    _validate_layer_decay(c)
    _validate_photos(c.data)
    _validate_aux(c)
    _validate_cohort(c)
    check_backends(c.get("backends"))  # the values; whether oneDNN builds is asked when run
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


def _validate_cohort(c: ml_collections.ConfigDict) -> None:
    cohort = c.cohort
    if cohort.exchange not in EXCHANGES:
        raise ConfigError(
            f"cohort.exchange={cohort.exchange!r}; choose one of {', '.join(EXCHANGES.names())}"
        )
    for key, allowed in EXCHANGES.ranges(cohort.exchange).items():
        where = f"exchange.{cohort.exchange}.{key}"
        _check_number(where, c.exchange[cohort.exchange][key], allowed)
    if cohort.exchange in c.exchange:
        EXCHANGES.get(cohort.exchange).check(c.exchange[cohort.exchange])
    if cohort.member_loop not in MEMBER_LOOPS:
        raise ConfigError(
            f"cohort.member_loop={cohort.member_loop!r}; choose "
            + " or ".join(MEMBER_LOOPS.names())
        )
    if c.parallel.batch_norm not in BATCH_NORM_MODES:
        raise ConfigError(
            f"parallel.batch_norm={c.parallel.batch_norm!r}; choose one of "
            f"{', '.join(BATCH_NORM_MODES.names())}"
        )
    if cohort.members:
        members = member_configs(c)
        check_stateless_members(c)
        if cohort.devices > 1:
            raise ConfigError(
                f"cohort.devices={cohort.devices} with cohort.members: a heterogeneous cohort "
                "keeps every member on every device (split the batch with "
                "parallel.data_devices); use cohort.devices=0"
            )
        for i, member in enumerate(members):
            try:
                validate(member)
            except ConfigError as e:
                raise ConfigError(f"cohort.members[{i}] {cohort.members[i]!r}: {e}") from None
    if cohort.size > 1 and c.phases:
        raise ConfigError(
            f"phases={tuple(c.phases)} with cohort.size={cohort.size}: a cohort trains one joint "
            "update per step; use phases=() (the joint variant) for cohort members"
        )


def _validate_aux(c: ml_collections.ConfigDict) -> None:
    heads = {c.model.head}
    for name, t in c.aux.items():
        where = f"aux.{name}"  # its kind is known (checked first, in validate)
        if name == EXCHANGE_STATE:  # a term's state would share the exchange's key
            raise ConfigError(
                f"aux.{name}: the term name {name!r} is reserved for a cohort's exchange "
                "state; rename the term (e.g. aux.exchange_term)"
            )
        TERMS.get(t.kind).validate(where, t)
        heads.add(t.head)
    check_head_dims(c)
    check_phases(c)
    decorrelation = c.decorrelation
    if len(decorrelation.pairs) != len(decorrelation.weights):
        raise ConfigError(
            f"decorrelation.pairs has {len(decorrelation.pairs)} pair(s) but "
            f"decorrelation.weights has {len(decorrelation.weights)}; give one weight per "
            "(source, target) pair"
        )
    for pair in decorrelation.pairs:
        unknown = [h for h in pair if h not in heads]
        if len(pair) != 2 or unknown or pair[0] == pair[1]:
            raise ConfigError(
                f"decorrelation pair {tuple(pair)} must name two different heads among "
                f"{sorted(heads)}"
            )
