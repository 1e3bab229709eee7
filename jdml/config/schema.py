"""The configuration schema: every key the library reads, with its default, and setting keys.

Configs are ``ml_collections.ConfigDict`` objects built by :func:`base_config` and specialised by
the files in ``configs/`` (one per method, the dataset chosen by an argument). The dict is locked,
so a misspelt override (``--config.optim.lrr=...``) is an error instead of a silently ignored key.

Component hyperparameters are not repeated here: the defaults of every registered loss, miner and
sampler are read from the component itself (its dataclass fields or keyword-only arguments), and
a backbone's or a dataset loader's own ``model.*`` / ``data.*`` keys from its registration
(``jdml.models.registry``, ``jdml.data.sources``), so a
component's defaults are declared in exactly one place and every one of them can be overridden as
``--config.loss.margin.beta=0.6``. The generic key helpers are :mod:`jdml.keys`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable
from typing import Any

import ml_collections

from jdml.cohort.exchanges import EXCHANGES
from jdml.data.sources import DATASETS
from jdml.keys import (
    component_defaults,
    component_section,
    declared_keys,
    parse_assignments,
    set_keys,
)
from jdml.losses import LOSSES
from jdml.methods.terms import TERMS
from jdml.miners import MINERS
from jdml.models import backbone_keys
from jdml.samplers import SAMPLERS

__all__ = [
    "SECTION",
    "apply_overrides",
    "base_config",
    "component_defaults",
    "component_section",
    "config_leaves",
    "dance_term",
    "decorrelation_section",
    "metric_term",
    "parse_assignments",
    "schema_leaves",
    "set_keys",
    "term_schema",
    "type_problem",
]


def exchange_sections() -> ml_collections.ConfigDict:
    """The ``exchange`` section: per registered exchange with settings, its own section."""
    section = ml_collections.ConfigDict()
    for name in EXCHANGES.names():
        keys = EXCHANGES.get(name).section()
        if keys:
            section[name] = ml_collections.ConfigDict(keys)
    return section


def base_config() -> ml_collections.ConfigDict:
    """Returns the full default configuration (the Revisiting baseline on glyphs)."""
    c = ml_collections.ConfigDict()
    c.seed = 0
    # "a:b" records a JAX profiler trace of steps a to b - 1 in <workdir>/profile (open it in
    # TensorBoard's profile tab or Perfetto); "" records none.
    c.profile_steps = ""

    c.data = ml_collections.ConfigDict()
    c.data.name = "glyphs"  # one of DATASETS.names()
    c.data.path = ""  # root folder / npz file for the generic sources; tfds data folder for tfds
    # How the benchmarks are read: "files" (the official archives' layouts) or "tfds" (cub200,
    # cars196 and sop as tfds builders prepared in data.path; pip install 'jdml[tfds]').
    c.data.source = "files"
    # Every dataset loader's own keys, its options as data.<name>_<option> (data.name=tfds, any
    # prepared tfds image dataset: data.tfds_name, ...), declared by the loader with its
    # registration.
    c.data.update(declared_keys(DATASETS, "data"))
    # Where built data are cached: the glyph renders (default $JDML_CACHE/glyphs or
    # ~/.cache/jdml/glyphs) and the decode cache of photos (default $JDML_CACHE/decoded).
    c.data.cache_dir = ""
    c.data.image_size = 32  # photo datasets: the crop size (224)
    c.data.resize = 256  # photo datasets: short side before the evaluation's centre crop
    # The evaluation view's resize filter: "bilinear" (the papers' protocol) or "bicubic" (the
    # ViT recipes'); the training view's is the augmentation's own (``vit``: bicubic).
    c.data.eval_interpolation = "bilinear"
    c.data.verify_counts = True  # benchmarks: check the image and class counts of the copy
    c.data.skip_unreadable = False  # folder source: skip undecodable images with a warning
    c.data.channels = 1
    # The fraction of the training classes held out as the validation split that selects the
    # checkpoint (at least 2 classes, leaving at least 2 to train). 0 selects on the test split,
    # as the reference code of the papers does (its published numbers were selected that way).
    c.data.val_fraction = 0.15
    c.data.split_seed = 0
    # Cross-validation over the training classes (k >= 2): they are cut into k class-disjoint
    # folds by data.split_seed and fold data.val_fold is the validation split (val_fraction is
    # then not read); 0: one hold-out of val_fraction. `jdml study` scores a candidate by its
    # mean over the folds (A Metric Learning Reality Check's protocol).
    c.data.val_folds = 0
    c.data.val_fold = 0
    c.data.augment = "affine"  # one of jdml.data.augment.AUGMENTATIONS
    c.data.mean = 0.5
    c.data.std = 0.5
    # "mean_std": (x - data.mean) / data.std on [0, 1] pixels; "backbone": the per-channel
    # constants the backbone's pretrained weights expect (ImageNet's for resnet50, ...).
    c.data.normalization = "mean_std"
    # The input pipeline: grain reader threads (of each worker process, with num_workers) and
    # worker processes building batches (0: threads in this process). -1 sizes them from the
    # host: on the CPU backend 2 threads and no worker process (the cores run the step too);
    # with an accelerator every core but 2, as threads for in-memory images and as worker
    # processes of 2 threads for photos decoded per batch (jdml.data.pipeline.
    # resolve_pipeline_sizes). A value set here always wins.
    c.data.num_threads = -1
    c.data.prefetch = 4  # batches prepared ahead
    c.data.num_workers = -1
    # Benchmarks read from files: decode every photo once into a cache with its short side at
    # data.resize (in data.cache_dir), instead of decoding the JPEG at every draw (the reference
    # code's way, the default). The evaluation view and "red" crops are unchanged; the
    # RandomResizedCrop augmentations read their crops from the smaller photo (see
    # jdml.data.benchmarks.decode_cache).
    c.data.decode_cache = False
    # The short side the decode cache keeps: 0 is data.resize (the evaluation's resize); a larger
    # value keeps more of each photo for the RandomResizedCrop augmentations (a photo whose short
    # side is at most this is kept at its original size, so with 512 CUB's photos, at most 500 px,
    # are all cropped as the reference crops them), at (value / resize)^2 the memory.
    c.data.cache_size = 0
    # Where the training views of photo augmentations are made: "device" in the jitted step
    # from uint8 pixels (equal to the Pillow views; jdml.data.device_views), "host" with Pillow
    # in the input pipeline, "auto" the device on accelerators and the host on the CPU backend.
    c.data.views = "auto"
    # Device views: the most device memory (GiB) the training photos may hold for the whole
    # run; a larger set streams each batch's photos from the host. -1: a quarter of the
    # device's memory (jdml.data.device_pixels).
    c.data.device_photos_gib = -1.0

    c.model = ml_collections.ConfigDict()
    c.model.backbone = "small_resnet"
    # Every backbone's own keys (small_resnet's stem_features, stage_strides, ...), declared by
    # the backbone with its registration.
    c.model.update(backbone_keys())
    c.model.frozen_bn = False  # running statistics fixed, affine parameters trained
    # Partial fine-tuning (pretrained backbones): -1 trains every stage (the papers); k freezes
    # the stem and the first k stages (no gradient, no update), see jdml.models.freeze.
    c.model.frozen_stages = -1
    c.model.embed_dim = 128
    c.model.normalize = True  # L2-normalise the embedding (the reference's *_normalize archs)
    # The embedding heads' weights at the start: "lecun_normal" or "orthogonal" (the ViT
    # recipes'); their biases start at zero.
    c.model.head_init = "lecun_normal"
    c.model.head = "discriminative"
    c.model.dtype = "float32"
    c.model.pooling = "avg"  # global pooling of pretrained backbones: avg or avg+max
    # Backbone weights: a weight file (PyTorch zip or legacy format, or safetensors; read without
    # executing code), "packaged" for weights a pip package ships, or "" for a random init.
    c.model.pretrained = ""

    c.loss = component_section(LOSSES)
    c.loss.name = "margin"
    c.miner = component_section(MINERS)
    c.miner.name = "distance"  # "" for losses that mine their own pairs
    c.sampler = component_section(SAMPLERS)
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
    # The transformer recipe's parts (jdml.optim), off by default: the global norm all gradients
    # are clipped to (0: none), the parameters without weight decay ("1d": norms and biases;
    # or names such as "cls_token", "pos_embed"), and the backbone's learning rate as a multiple
    # of optim.lr.
    c.optim.clip_norm = 0.0
    c.optim.no_decay = ()
    c.optim.backbone_lr_multiplier = 1.0
    # Layer-wise learning-rate decay of backbones that declare their layers (the ViTs): group g
    # of G + 1 learns at layer_decay^(G - g) times the rate (BEiT's; 0.65-0.75 in ViT
    # fine-tuning recipes); 1 is off. The groups: "mae" (BEiT's and MAE's: the stem, each
    # block, the final norm at the full rate) or "timm" (timm's param_groups_layer_decay of a
    # backbone without classifier: the final norm with the last block, at the full rate).
    c.optim.layer_decay = 1.0
    c.optim.layer_decay_grouping = "mae"

    c.train = ml_collections.ConfigDict()
    c.train.batch_size = 112
    c.train.epochs = 15
    c.train.steps_per_epoch = 0  # 0: floor(N_train / batch_size), as the reference
    c.train.log_every_steps = 50
    c.train.checkpoint_every_steps = 200
    c.train.progress_bar = True
    # TensorBoard event files in <workdir>/tensorboard: the training scalars (losses, terms,
    # learning rate, images/s) and every evaluation's metrics per split, head and member.
    c.train.tensorboard = True

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
    # Evaluated once, at the end, on the checkpoint selected on validation (the papers' protocol:
    # the test classes see only that checkpoint, with eval.splits=()); results.json's
    # ``selected`` and eval_best_step<step>.json hold it.
    c.eval.selected_splits = ()
    # Retrieval metrics of eval.metrics whose per-query values (one per test query, with the
    # queries' classes) the selected checkpoint's evaluation keeps, compressed, in
    # eval_best_step<step>.json's ``per_query``: e.g. ("recall@1",), so that the test classes
    # can be resampled as well as the seeds (jdml.statistics.two_way_bootstrap).
    c.eval.per_query = ()
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

    # A cohort: ``size`` members of this method trained together (size 1 trains one model),
    # exchanging what ``exchange`` names (jdml.cohort.exchanges; "dm2": DM2's relation matrices
    # and its diversities), with that exchange's settings in its own section exchange.<name>.
    # ``devices``: devices of the mesh's member axis (0: automatic).
    c.cohort = ml_collections.ConfigDict()
    c.cohort.size = 1
    c.cohort.devices = 0
    # Members of one device: "unroll" traced one after the other, "vmap" vectorised (grouped
    # convolutions, which XLA runs slowly on CPU; try it on GPU/TPU).
    c.cohort.member_loop = "unroll"
    # Heterogeneous cohorts (DM2's Table 5): one entry per member, each "" or ";"-separated
    # model.* overrides of that member's network, e.g. ("", "model.embed_dim=64",
    # "model.backbone=efficientnet_lite0;model.pretrained=packaged"). () = identical members.
    c.cohort.members = ()
    c.cohort.exchange = "dm2"
    c.exchange = exchange_sections()

    # Data parallelism for every method (jdml.program): the global batch of each member split
    # over ``data_devices`` devices of the mesh's data axis (0: every device the member axis
    # leaves). The miner, the losses, DaNCE's queue and DM2's relations still see the whole
    # global batch, and trained BatchNorm its statistics (the compiler gathers what they need),
    # so the run computes what it computes on one device.
    c.parallel = ml_collections.ConfigDict()
    c.parallel.data_devices = 1
    # Trained BatchNorm (model.frozen_bn=False) on the data axis: "global" statistics of the whole
    # batch (synchronised: the one-device result), or "per_device" statistics of each device's
    # rows, as unsynchronised data-parallel training computes them (running statistics: the
    # mean over the devices). Frozen BatchNorm, the papers' default, is the same either way.
    c.parallel.batch_norm = "global"
    # Evaluation on ``eval_devices`` devices (jdml.evaluation.sharded; 0: every device, of every
    # host under jax.distributed): the kNN search with the queries split over the devices and
    # the references passed around a ring, k-means and the SVD with the points split; the same
    # metrics as on one device (1: the default device only), with about 1/D of the memory each.
    c.parallel.eval_devices = 1

    # Which implementation computes (jdml.backends, recorded in results.json): the same numbers
    # up to float32 rounding, only the speed differs, and backends other than CPU always take
    # XLA's ops. "auto": the variable ($JDML_CONV, $JDML_KNN, $JDML_KMEANS) where it is set,
    # else the native kernels (jdml.native) where the library builds; a value here wins over it.
    c.backends = ml_collections.ConfigDict()
    c.backends.conv = "auto"  # the CPU convolutions: auto, onednn (oneDNN's) or xla (XLA's)
    # The kNN selection: auto, native (the kernel), host (numpy) or xla (XLA's top-k).
    c.backends.knn = "auto"
    c.backends.kmeans = "auto"  # the k-means assignment: auto, onednn (native) or xla

    return c


def metric_term(
    loss: str, miner: str, *, head: str, weight: float, dim: int = 0
) -> ml_collections.ConfigDict:
    """An auxiliary metric term's section (``jdml.methods.terms.metric.MetricTerm.section``)."""
    return TERMS.get("metric").section(loss, miner, head=head, weight=weight, dim=dim)


def dance_term(
    *, head: str = "selfsimilarity", weight: float, dim: int = 0
) -> ml_collections.ConfigDict:
    """An auxiliary DaNCE term's section (``jdml.methods.terms.dance.DanceTerm.section``)."""
    return TERMS.get("dance").section(head=head, weight=weight, dim=dim)


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


def apply_overrides(
    c: ml_collections.ConfigDict, items: Iterable[str]
) -> ml_collections.ConfigDict:
    """Sets each ``section.key=value`` of ``items`` on ``c`` (:func:`parse_assignments`, then
    :func:`set_keys`), as ``--config.section.key=value`` does on ``train.py``."""
    return set_keys(c, parse_assignments(items))


#: The leaf of an empty section in :func:`config_leaves`.
SECTION = "<section>"
#: Placeholders of a term section's arguments without default, by their annotation.
_PLACEHOLDERS = {"str": "", "float": 0.0, "int": 0, "bool": False}


def config_leaves(section: Any, prefix: str = "") -> dict[str, Any]:
    """Every key of a config (nested ``ConfigDict``s or dicts) as ``dotted.key -> value``,
    ``FieldReference``s kept (their declared type says what they hold) and an empty section
    as :data:`SECTION`."""
    items = (
        section.items(preserve_field_references=True)
        if isinstance(section, ml_collections.ConfigDict)
        else section.items()
    )
    out: dict[str, Any] = {}
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, ml_collections.ConfigDict | dict):
            out.update(config_leaves(value, f"{name}.") if len(value) else {name: SECTION})
        else:
            out[name] = value
    return out


def term_schema(kind: str) -> ml_collections.ConfigDict:
    """The section of an auxiliary term of ``kind`` (its keys and their types), with
    placeholders for the arguments its ``section`` has no default for."""
    build = TERMS.get(kind).section
    needed = {
        p.name: _PLACEHOLDERS.get(str(p.annotation), "")
        for p in inspect.signature(build).parameters.values()
        if p.default is inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD
    }
    return build(**needed)


def schema_leaves(c: ml_collections.ConfigDict | dict) -> dict[str, Any]:
    """Every key config ``c`` may hold, with its default (:func:`config_leaves`): the base
    schema's, and each auxiliary term's of the kind ``c`` gives it."""
    out = config_leaves(base_config())
    aux = c.get("aux") if hasattr(c, "get") else None
    for name, term in (aux or {}).items() if hasattr(aux, "items") else ():
        kind = term.get("kind") if hasattr(term, "get") else None
        if isinstance(kind, str) and kind in TERMS:
            out.update(config_leaves(term_schema(kind), f"aux.{name}."))
    return out


def type_problem(default: Any, value: Any) -> str | None:
    """What is wrong with the type of ``value`` for a key whose schema default is ``default``
    (None: nothing): a bool, an integer, a number, a string or a tuple, as the default is; a
    ``FieldReference`` of type ``object`` and a default of None take anything."""
    if isinstance(value, ml_collections.FieldReference):
        value = value.get()
    numbers = value if isinstance(value, tuple | list) else (value,)
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        return "must be finite"
    if isinstance(default, ml_collections.FieldReference):
        if default.get_type() is object:
            return None
        default = default.get()
    if default is None:
        return None
    if default is SECTION:
        return None if value is SECTION else "is a section, not a value"
    if value is SECTION or isinstance(value, dict | ml_collections.ConfigDict):
        return "must be a value, not a section"
    checks: tuple[tuple[type, Any, str], ...] = (
        (bool, lambda v: isinstance(v, bool), "True or False"),
        (int, lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
        (float, lambda v: isinstance(v, int | float) and not isinstance(v, bool), "a number"),
        (str, lambda v: isinstance(v, str), "a string"),
        (tuple, lambda v: isinstance(v, tuple | list), "a tuple (a list in JSON)"),
    )
    for kind, ok, wanted in checks:
        if isinstance(default, kind):
            return None if ok(value) else f"must be {wanted}"
    return None
