"""The papers' protocol on the emoji set: ImageNet features, raw pixels, fine-tuning and ablations.

Every trained row fine-tunes the ImageNet-pretrained EfficientNet-Lite0 of the ``data=emoji``
preset (frozen BatchNorm, batch 112 with SPC-2, Adam, 64 px) for ``--epochs`` epochs on the
first half of the classes minus the 15 % held out for validation, evaluates on the validation
classes after every epoch, keeps the checkpoint with the best validation Recall@1 and evaluates
only that one on the test classes (the second half, unseen; ``eval.selected_splits``, so the
run's ``results.json`` holds it). Runs go to
``<out>/<row>/seed<seed>`` and resume. A finished run leaves a small record (its test
evaluation, the validation curve and the commit it was trained at) in
``<results>/<row>/seed<seed>.json``, which is kept in the repository: a run with a record is
skipped, and the tables are computed from the records alone, so they survive the loss of the run
directories. Tables (mean ± std over seeds) are printed and written to ``<out>/<table>.md``:

* ``protocol``: raw pixels and ImageNet features (no training) against the fine-tuned margin
  baseline (Revisiting's Tab. 1 analogue);
* ``rho``: margin against R-margin (rho-regularisation), with the train spectra plotted to
  ``<out>/rho_spectrum.png``;
* ``diva``: DiVA's Tab. 2 rows at one total dimension (512), with the concatenation;
* ``dm2``: DM2's Table 1 (cohorts of ``--cohort`` members; member 1 and the ensemble);
* ``sharing``: Sharing Matters' class / class + shared / decorrelated;
* ``losses`` and ``samplers``: the wider Revisiting comparison;
* ``tune``: every method's own hyperparameters on validation only (``TUNING``: the same number
  of candidates per method, seed 0); ``--tuned`` trains the other tables with the values it
  selects (from ``--tune-results``).

Every table compares its rows with its first (or ``BASELINE_ROW``) by the paired per-seed
difference and its 95 % interval; ``experiments/emoji_claims.py`` reads the claims off them.
A record names the data it was trained on (the emoji npz's checksum) and its settings; a run
whose record was trained on other data or with other settings is trained again.

``--frozen-stages k`` trains only the last stages (``model.frozen_stages``): those runs go to
``<row>-frozen<k>`` directories and their tables say so. ``--rows`` keeps only the named rows
of the tables (their keys, e.g. ``dm2-3-independent``), for a check that cannot afford them all.

``--jobs N`` trains N runs at once, each a process of its own on 1/N of the cores and of the
accelerator's memory (``jdml.study.executor.Local``), its output in ``<out>/<row>/seed<k>.log``;
the tables follow when every run has ended. On a lent GPU one run leaves most of the device
idle. On 2 CPU cores, two one-core runs of the Sharing class-only row (3 epochs) took 21.5 s
per epoch each against 12.5 s for one two-core run: 1.16x the throughput in the steady state,
1.29x with start-up (116 s for the two against 75 s for one).

Usage: python experiments/emoji_protocol.py [--tables protocol,rho] [--epochs 45] [--seeds 0 1 2]
           [--out runs/emoji-v2-<epochs>] [--results experiments/results/emoji-v2-<epochs>]
           [--frozen-stages -1] [--rows KEY,...] [--tuned] [--tune-epochs 20]
           [--tune-results DIR] [--jobs 1] [--report-only]
(The format-1 records: --results experiments/results/emoji-45, -20, -60.)
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import sys
import time
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

from configs.diva import ablation_config
from configs.dm2 import get_config as dm2_config
from configs.revisiting import get_config as revisiting_config
from configs.sharing import get_config as sharing_config
from jdml.allocator import reexec_with_tcmalloc
from jdml.config import metric_term, set_keys
from jdml.data.emoji import cache_paths as emoji_cache_paths
from jdml.errors import WorkdirInUseError
from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.fileio import read_jsonl
from jdml.keys import RENAMED_KEYS
from jdml.models.efficientnet import MEAN, STD, EfficientNetLite0
from jdml.models.pretrained.backbones import load_backbone
from jdml.report import load_run, plot_spectra, summarize_group
from jdml.run import Run
from jdml.samplers import SAMPLERS as SAMPLER_REGISTRY
from jdml.statistics import Paired, mean_std, paired
from jdml.study.records import commit
from jdml.trainer import atomic_write, train_and_evaluate

METRICS = ("recall@1", "map@r", "nmi")
DATA = "data=emoji"
DIVA_DIM = 512  # DiVA's total embedding dimension, split over the heads of each row

Build = Callable[[], ml_collections.ConfigDict]


# The settings a method's row is trained with beyond its preset: the values selected on
# validation by the ``tune`` table (``selected``) when tuned rows are asked for, else none.
Settings = dict[str, object]
SETTINGS: dict[str, Callable[[], Settings]] = {}


def settings_of(method: str | None) -> Settings:
    """The settings of ``method``'s rows: the shared keys the baseline's tuning selected, then
    the method's own (a tuning run's candidate, or the selected ones)."""
    if method is None:
        return {}
    shared = SETTINGS["margin"]() if method != "margin" and "margin" in SETTINGS else {}
    shared = {k: v for k, v in shared.items() if k in SHARED_KEYS}
    if method in _OVERRIDE:
        return {**shared, **_OVERRIDE[method]}
    return {**shared, **(SETTINGS[method]() if method in SETTINGS else {})}


def _apply(c: ml_collections.ConfigDict, settings: Settings) -> ml_collections.ConfigDict:
    """Sets the dotted config keys of ``settings`` (the DiVA split keys are applied by
    :func:`diva`)."""
    keys = {k: v for k, v in settings.items() if "." in k}
    with c.unlocked():
        set_keys(c, keys)
    return c


def revisiting(spec: str, method: str | None = "margin", **overrides: object) -> Build:
    """A Revisiting row: ``configs/revisiting.py:<spec>,data=emoji`` plus dotted overrides and
    ``method``'s settings."""

    def build() -> ml_collections.ConfigDict:
        c = revisiting_config(f"{spec},{DATA}")
        with c.unlocked():
            set_keys(c, overrides)
        return _apply(c, settings_of(method))

    return build


def diva(keep: tuple[str, ...], decorrelate: bool = True, copies: int = 0) -> Build:
    """A DiVA row: the discriminative head with the auxiliary terms in ``keep`` (or, with
    ``copies``, that many more discriminative heads: the equal-dimension control)."""

    def build() -> ml_collections.ConfigDict:
        s = settings_of("diva")
        c = ablation_config(
            "emoji",
            keep,
            decorrelate=decorrelate,
            total_dim=DIVA_DIM,
            main_dim=s.get("main_dim") if keep else None,
            aux_weight=s.get("aux_weight"),
        )
        if copies:
            extra_class_heads(c, copies, DIVA_DIM // (copies + 1))
        return _apply(c, {k: v for k, v in s.items() if k.startswith("optim.")})

    return build


def extra_class_heads(c: ml_collections.ConfigDict, copies: int, dim: int) -> None:
    """``copies`` more heads trained by the main head's loss and miner, each ``dim``-d like the
    main head, all evaluated and concatenated: more heads of the same task, the control for a
    method whose extra heads learn other tasks."""
    main = c.model.head
    with c.unlocked():
        c.model.embed_dim = dim
        for k in range(2, copies + 2):
            term = metric_term(c.loss.name, c.miner.name, head=f"{main}{k}", weight=1.0, dim=dim)
            term.loss = ml_collections.ConfigDict(c.loss.to_dict())  # the main term's options
            term.miner = ml_collections.ConfigDict(c.miner.to_dict())
            c.aux[f"{main}{k}"] = term
        heads = (main, *(f"{main}{k}" for k in range(2, copies + 2)))
        c.eval.heads = heads
        c.eval.combinations = ((1.0,) * len(heads),)


def sharing(decorrelate: bool) -> Build:
    def build() -> ml_collections.ConfigDict:
        c = sharing_config(DATA)
        if not decorrelate:
            c.decorrelation.pairs, c.decorrelation.weights = (), ()
        s = settings_of("sharing")
        if not decorrelate:
            s = {k: v for k, v in s.items() if not k.startswith("decorrelation.")}
        return _apply(c, s)  # both heads at the class head's dimension, as the paper has them

    return build


def class_heads(copies: int = 0, dim: int = 128) -> Build:
    """Sharing's class head alone (margin loss, SPC-4 as Sharing trains), ``dim``-d, with
    ``copies`` more class heads of the same dimension (the equal-dimension control)."""

    def build() -> ml_collections.ConfigDict:
        # No shared head: of Sharing's settings only those every method shares (the lr) apply.
        c = revisiting("loss=margin", None, **{"sampler.samples_per_class": 4})()
        s = settings_of("sharing")
        _apply(c, {k: v for k, v in s.items() if k in SHARED_KEYS})
        with c.unlocked():
            c.model.embed_dim = dim
        if copies:
            extra_class_heads(c, copies, dim)
        return c

    return build


def dm2(diversity: str, size: int) -> Build:
    def build() -> ml_collections.ConfigDict:
        c = dm2_config(f"size={size},diversity={diversity},{DATA}")
        c.exchange.dm2.warmup_epochs = 1.0  # lambda at full weight after one of the few epochs
        s = settings_of("dm2")
        if diversity == "independent":  # lambda 0: no exchange to weigh
            s = {k: v for k, v in s.items() if k != "exchange.dm2.mutual_weight"}
        return _apply(c, s)

    return build


# Row id -> (table label, builder). Ids name the run directories; a row shared by two tables
# (the margin baseline) is trained once.
ROWS: dict[str, tuple[str, Build]] = {
    "margin": ("margin (distance miner)", revisiting("loss=margin")),
    "R-margin": (
        "R-margin (rho-regularised)",
        revisiting("loss=margin,miner=rho_distance", "R-margin"),
    ),
    "diva-D": ("margin, one 512-d head", diva(())),
    "diva-4D": ("four 128-d margin heads, concatenated", diva((), copies=3)),
    "diva-DS": ("D+S", diva(("shared",))),
    "diva-DI": ("D+I", diva(("intra",))),
    "diva-DDa": ("D+Da", diva(("selfsimilarity",))),
    "diva": ("DiVA (D+Da+S+I)", diva(("selfsimilarity", "shared", "intra"))),
    "diva-nodecor": (
        "DiVA without decorrelation",
        diva(("selfsimilarity", "shared", "intra"), decorrelate=False),
    ),
    "sharing-class": ("class only", class_heads()),
    "sharing-class256": ("class only, one 256-d head", class_heads(dim=256)),
    "sharing-2class": ("two 128-d class heads, concatenated", class_heads(copies=1)),
    "sharing": ("class + shared", sharing(decorrelate=False)),
    "sharing-decor": ("class + shared, decorrelated", sharing(decorrelate=True)),
    "triplet": ("triplet", revisiting("loss=triplet")),
    "contrastive": ("contrastive", revisiting("loss=contrastive")),
    "multisimilarity": ("multisimilarity", revisiting("loss=multisimilarity")),
    "proxynca": ("proxynca", revisiting("loss=proxynca")),
    "R-triplet": ("R-triplet", revisiting("loss=triplet,miner=rho_distance")),
    # RandomResizedCrop + flip on the artwork, its views made by Pillow on the host and on the
    # device from the same draws (the views table: the training equivalence of the two paths).
    "views-host": (
        "base augmentation, Pillow views",
        revisiting("loss=margin", **{"data.augment": "base", "data.views": "host"}),
    ),
    "views-device": (
        "base augmentation, device views",
        revisiting("loss=margin", **{"data.augment": "base", "data.views": "device"}),
    ),
}
# Every registered batch sampler, the default (the margin row) first.
SAMPLERS = ("class_random", *(n for n in SAMPLER_REGISTRY.names() if n != "class_random"))
for _name in SAMPLERS[1:]:
    ROWS[f"sampler-{_name}"] = (_name, revisiting("loss=margin", **{"sampler.name": _name}))
DM2_ROWS = {
    "Independent": "independent",
    "MD": "md",
    "MD+TD": "md+td",
    "MD+VD": "md+vd",
    "MD+TD+VD": "md+td+vd",
}


def add_dm2_rows(size: int) -> tuple[str, ...]:
    """DM2's rows for cohorts of ``size`` (``dm2-<size>-<diversity>``)."""
    for label, diversity in DM2_ROWS.items():
        ROWS[f"dm2-{size}-{diversity}"] = (label, dm2(diversity, size))
    return tuple(f"dm2-{size}-{d}" for d in DM2_ROWS.values())


add_dm2_rows(3)  # the tables' cohort size (DM2's tuning runs use it)

TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "protocol": ("ImageNet features, raw pixels and fine-tuning", ("margin",)),
    "rho": ("Revisiting: rho-regularisation", ("margin", "R-margin")),
    "diva": (
        "DiVA, Tab. 2",
        ("diva-D", "diva-4D", "diva-DS", "diva-DI", "diva-DDa", "diva", "diva-nodecor"),
    ),
    "dm2": ("DM2, Table 1", ()),  # rows added per cohort size in main()
    "sharing": (
        "Sharing Matters",
        ("sharing-class", "sharing-class256", "sharing-2class", "sharing", "sharing-decor"),
    ),
    "losses": (
        "Revisiting: losses",
        (
            "margin",
            "triplet",
            "contrastive",
            "multisimilarity",
            "proxynca",
            "R-margin",
            "R-triplet",
        ),
    ),
    "samplers": (
        "Revisiting: batch samplers with margin",
        ("margin", *(f"sampler-{s}" for s in SAMPLERS[1:])),
    ),
    "views": ("Views made on the device against Pillow's", ("views-host", "views-device")),
}
# Rows whose train rho (spectral decay, eval.train_metrics) is measured after every epoch.
RHO_ROWS = frozenset({"margin", "R-margin", "triplet", "R-triplet"})

# -- tuning on validation -------------------------------------------------------------------------
# Every method gets the same budget for its own key hyperparameters: TUNE_RUNS candidates (a
# small grid that holds the preset's value, listed first so that it wins ties), trained at seed
# 0 for --epochs (20 by default for the tune table) and compared by their best validation
# Recall@1 only. The baseline's learning rate is shared by every other method (SHARED_KEYS), so
# the margin grid runs first. (what is tuned, the row it is tuned on, {variant: settings})
TUNE_RUNS = 4
SHARED_KEYS = frozenset({"optim.lr"})
TUNING: dict[str, tuple[str, str, dict[str, Settings]]] = {
    "margin": (
        "learning rate",
        "margin",
        {f"lr{v:g}": {"optim.lr": v} for v in (1e-4, 5e-5, 2e-4, 4e-4)},
    ),
    "R-margin": (
        "push probability",
        "R-margin",
        {f"p{v:g}": {"miner.rho_distance.push_prob": v} for v in (0.2, 0.05, 0.1, 0.35)},
    ),
    "diva": (
        "auxiliary weight x discriminative head's dimension",
        "diva",
        {
            f"a{a:g}-d{d}": {"aux_weight": a, "main_dim": d}
            for a, d in ((0.2, 128), (0.1, 128), (0.2, 224), (0.1, 224))
        },
    ),
    "sharing": (
        "shared term's weight x decorrelation weight",
        "sharing-decor",
        {
            f"w{w:g}-g{g:g}": {"aux.shared.weight": w, "decorrelation.weights": (g,)}
            for w, g in ((1.0, 500.0), (0.5, 500.0), (1.0, 100.0), (0.5, 100.0))
        },
    ),
    "dm2": (
        "lambda x temporal update rate",
        "dm2-3-md+td+vd",
        {
            f"l{lam:g}-r{r:g}": {"exchange.dm2.mutual_weight": lam, "exchange.dm2.temporal_rate": r}
            for lam, r in ((20.0, 0.5), (5.0, 0.5), (20.0, 0.8), (5.0, 0.8))
        },
    ),
}
#: Stages every run of a row keeps frozen whatever --frozen-stages says (DM2's tuning runs, as
#: its table trains only the stages after stage 3).
ROW_FROZEN: dict[str, int] = {}
_OVERRIDE: dict[str, Settings] = {}  # a tuning run's candidate, while its config is built


def method_of(row: str) -> str:
    """The method whose settings a row is trained with."""
    if row.startswith("tune-"):
        return next(m for m in TUNING if row.startswith(f"tune-{m}-"))
    for prefix, method in (("R-", "R-margin"), ("diva", "diva"), ("sharing", "sharing")):
        if row.startswith(prefix):
            return method
    return "dm2" if row.startswith("dm2-") else "margin"


def tune_row(method: str, variant: str) -> str:
    return f"tune-{method}-{variant}"


def row_settings(row: str) -> Settings:
    """The settings a row's runs are trained with (a tuning run: its candidate)."""
    method = method_of(row)
    if row.startswith("tune-"):
        variant = row.removeprefix(f"tune-{method}-")
        _OVERRIDE[method] = TUNING[method][2][variant]
        try:
            return settings_of(method)
        finally:
            _OVERRIDE.pop(method, None)
    return settings_of(method)


def tuning_build(method: str, settings: Settings) -> Build:
    def build() -> ml_collections.ConfigDict:
        _OVERRIDE[method] = settings
        try:
            return ROWS[TUNING[method][1]][1]()
        finally:
            _OVERRIDE.pop(method, None)

    return build


def best_validation(record: dict) -> tuple[float, int]:
    """A run's best validation Recall@1 over its trained epochs, and that epoch."""
    curve = [(p["recall@1"], p["epoch"]) for p in record["val_curve"] if p.get("epoch")]
    value, epoch = max(curve, key=lambda x: (x[0], -x[1]))
    return value, epoch


def selected(method: str, tune_results: str, tune_epochs: int) -> Settings:
    """The candidate of ``method`` with the best validation Recall@1 among its tuning runs
    (ties: the first listed, the preset's); every candidate must have its record."""
    best: tuple[float, Settings] | None = None
    for variant, settings in TUNING[method][2].items():
        path = os.path.join(tune_results, tune_row(method, variant), "seed0.json")
        record = None
        if os.path.exists(path):
            with open(path) as f:
                record = json.load(f)
        if record is None or record.get("epochs") != tune_epochs:
            raise SystemExit(
                f"error: {method}'s tuning run {variant} has no {tune_epochs}-epoch record at "
                f"{path}; run `python experiments/emoji_protocol.py --tables tune --epochs "
                f"{tune_epochs} --seeds 0 --results {tune_results}` first"
            )
        value = best_validation(record)[0]
        if best is None or value > best[0]:
            best = (value, settings)
    assert best is not None
    return best[1]


def use_selected(tune_results: str, tune_epochs: int) -> None:
    """Makes every tuned method's rows use its selected settings."""
    for method in TUNING:
        SETTINGS[method] = lambda m=method: selected(m, tune_results, tune_epochs)


for _method, (_, _row, _grid) in TUNING.items():
    for _variant, _settings in _grid.items():
        ROWS[tune_row(_method, _variant)] = (
            f"{_method} {_variant}",
            tuning_build(_method, _settings),
        )
        if _method == "dm2":
            ROW_FROZEN[tune_row(_method, _variant)] = 3
TABLES["tune"] = (
    "Tuning on validation",
    tuple(tune_row(m, v) for m, (_, _, grid) in TUNING.items() for v in grid),
)


def row_name(row: str, frozen: int) -> str:
    return row if frozen < 0 else f"{row}-frozen{frozen}"


def run_dir(out: str, row: str, seed: int, frozen: int) -> str:
    return os.path.join(out, row_name(row, frozen), f"seed{seed}")


def record_path(args: argparse.Namespace, row: str, seed: int) -> str:
    return os.path.join(args.results, row_name(row, args.frozen_stages), f"seed{seed}.json")


def finished(workdir: str, row: str = "") -> str | None:
    """The test evaluation of the best checkpoint (a tuning run's summary), if the run has one."""
    if row.startswith("tune-"):
        path = os.path.join(workdir, "results.json")
        return path if os.path.exists(path) else None
    found = sorted(glob.glob(os.path.join(workdir, "eval_best_step*.json")))
    return found[-1] if found else None


def load_record(args: argparse.Namespace, row: str, seed: int) -> dict | None:
    """The finished run's record, if it was trained with this budget (and, when training, on
    the same data and with the settings the row has now)."""
    path = record_path(args, row, seed)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        record = json.load(f)
    if record.get("epochs") != args.epochs:
        return None
    data = getattr(args, "data_sha256", None)
    if data and record.get("data_sha256") != data:
        return None  # another build of the dataset
    if getattr(args, "check_settings", False) and _current_keys(record.get("settings")) != (
        _jsonable(row_settings(row))
    ):
        return None  # trained before the method's settings were selected
    return record


def _current_keys(settings: dict | None) -> dict | None:
    """A record's settings under the keys' current names (``jdml.keys.RENAMED_KEYS``: records
    written before DM2's settings moved to ``exchange.dm2`` hold ``cohort.*`` keys)."""
    if settings is None:
        return None
    return {RENAMED_KEYS.get(k, k): v for k, v in settings.items()}


def _jsonable(settings: Settings) -> dict:
    return json.loads(json.dumps(settings))


def data_sha256() -> str | None:
    """The built emoji set's npz checksum (from its manifest), if the set is built."""
    try:
        with open(emoji_cache_paths()[1]) as f:
            return json.load(f).get("npz_sha256")
    except (OSError, ValueError):
        return None


def write_record(args: argparse.Namespace, row: str, seed: int, workdir: str) -> dict:
    """Keeps what the tables need from a finished run: the test evaluation of the selected
    checkpoint (with its per-query Recall@1 hits where the run kept them), the validation curve
    it was selected on and the commit."""
    tuning = row.startswith("tune-")
    with open(finished(workdir, row)) as f:
        evaluation = json.load(f)
    if tuning:  # validation only: the test classes are never evaluated
        evaluation = {"meta": {"epoch": evaluation["best"]["epoch"]}, "results": {}}
    curve = [
        {"step": r["step"], "epoch": r.get("epoch"), **{m: r[m] for m in METRICS if m in r}}
        for r in read_jsonl(os.path.join(workdir, "metrics.jsonl"))
        if r.get("kind") == "eval" and r.get("split") == "val" and "embedding" not in r
    ]
    record = {
        "row": row,
        "seed": seed,
        "epochs": args.epochs,
        "frozen_stages": args.frozen_stages,
        "commit": commit(),
        "data_sha256": data_sha256(),
        "device": jax.devices()[0].device_kind,
        # The method's settings the row was built from, which name the selection it was trained
        # under; the row's builder applies those that fit it (the class-only controls only the
        # lr, Sharing without decorrelation no decorrelation weight): config.json has the rest.
        "settings": _jsonable(row_settings(row)),
        "meta": evaluation["meta"],
        "results": evaluation["results"],
        "embeddings": evaluation.get("embeddings", {}),
        "val_curve": curve,
    }
    if evaluation.get("per_query"):  # compressed per-query hits (jdml.evaluation.per_query)
        record["per_query"] = evaluation["per_query"]
    path = record_path(args, row, seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1) + "\n")
    return record


def configure(
    c: ml_collections.ConfigDict, seed: int, epochs: int, frozen: int, rho: bool, test: bool
):
    """The shared budget: epochs, seed, validation-only evaluation during training, and the
    selected checkpoint evaluated on the test classes at the end (not for a tuning run)."""
    with c.unlocked():
        c.seed = seed
        c.train.epochs = epochs
        c.train.progress_bar = False
        c.model.frozen_stages = frozen
        c.eval.splits = ()  # validation only; the test split sees the selected checkpoint
        c.eval.selected_splits = (("test", "train") if rho else ("test",)) if test else ()
        c.eval.metrics = METRICS
        c.eval.train_metrics = ("rho_spectrum@1",) if rho else ()
        c.eval.per_query = ("recall@1",)  # the hits per test query, for a bootstrap over classes
    return c


def train_row(row: str, seed: int, args: argparse.Namespace) -> None:
    """Trains one run unless its record exists, and writes its record. A run another process
    is training (its workdir's lock is held: a second queue lane on the same rows) is skipped
    with one line, so two lanes can share one list of runs; that process writes its record."""
    if load_record(args, row, seed):
        return
    workdir = run_dir(args.out, row, seed, args.frozen_stages)
    rho, tuning = row in RHO_ROWS, row.startswith("tune-")
    if not finished(workdir, row):
        print(f"== {row} seed {seed}", flush=True)
        start = time.perf_counter()
        frozen = ROW_FROZEN.get(row, args.frozen_stages)
        c = configure(ROWS[row][1](), seed, args.epochs, frozen, rho, test=not tuning)
        try:
            train_and_evaluate(c, workdir)
        except WorkdirInUseError as err:
            print(f"   skipped: {err}", flush=True)
            return
        print(f"   {time.perf_counter() - start:.0f} s", flush=True)
    record = write_record(args, row, seed, workdir)
    if tuning:
        value, epoch = best_validation(record)
        print(f"   {row}: best validation R@1 {100 * value:.2f} at epoch {epoch}")
        return
    r1 = 100 * record["results"]["test"]["recall@1"]
    print(f"   {row} seed {seed}: best epoch {record['meta'].get('epoch')}, test R@1 {r1:.2f}")


# -- rows without training ----------------------------------------------------------------------


PIXELS = "raw pixels (64 x 64 x 3, L2-normalised)"
FEATURES = "ImageNet features (pooled 1280-d, L2-normalised)"
BASELINE_HEAD = "ImageNet features, random 128-d head"


def baselines(results: str, seeds: list[int], compute: bool = True) -> dict[str, dict]:
    """Test metrics of raw pixels and pooled ImageNet features (both L2-normalised, as the
    trained embeddings are) and of the untrained network's 128-d head (one value per seed: the
    head's random init), as ``{label: {"seeds": n or None, metric: [values]}}``.

    Kept in ``<results>/baselines.json`` next to the run records, so that the protocol table is
    computed from committed files; ``compute=False`` reads that file only (the missing seeds stay
    missing) and never loads the data."""
    path = os.path.join(results, "baselines.json")
    cached: dict = {"fixed": {}, "random_head": {}}
    if os.path.exists(path):
        try:
            with open(path) as f:
                cached = json.load(f)
            if not isinstance(cached, dict) or not all(
                isinstance(cached.get(k), dict) for k in ("fixed", "random_head")
            ):
                raise ValueError("no 'fixed' and 'random_head' tables")
        except ValueError as err:
            raise SystemExit(
                f"error: {path} is not a baselines file ({err!r}); delete it and run the report "
                "again to recompute it"
            ) from err
    missing = [s for s in seeds if str(s) not in cached["random_head"]]
    if compute and (missing or not cached["fixed"]):
        cached = _compute_baselines(cached, missing)
        cached["commit"] = commit()
        os.makedirs(results, exist_ok=True)
        atomic_write(path, json.dumps(cached, indent=1, sort_keys=True) + "\n")
    rows: dict[str, dict] = {
        label: {"seeds": None, **{m: [cached["fixed"][label][m]] for m in METRICS}}
        for label in (PIXELS, FEATURES)
        if label in cached["fixed"]
    }
    heads = [cached["random_head"][str(s)] for s in seeds if str(s) in cached["random_head"]]
    if heads:
        rows[BASELINE_HEAD] = {"seeds": len(heads), **{m: [h[m] for h in heads] for m in METRICS}}
    return rows


def _compute_baselines(cached: dict, seeds: list[int]) -> dict:
    """Adds the fixed rows (if absent) and the random head's metrics for ``seeds``."""
    c = revisiting_config(DATA)
    run = Run(c)
    test = run.splits["test"]

    def metrics(x: np.ndarray) -> dict[str, float]:
        x = np.asarray(x, np.float32)
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # as the embeddings
        result = evaluate_embeddings(x, test.labels, METRICS, seed=0)
        return {m: float(result[m]) for m in METRICS}

    if not cached["fixed"]:
        images = test.eval_images(np.arange(len(test)))  # float32 in [0, 1]
        pixels = images.reshape(len(test), -1)
        images = (images - MEAN) / STD  # the Lite0 weights' input range
        model = EfficientNetLite0()
        variables = model.init(jax.random.PRNGKey(0), images[:1])
        wrapped = {k: {"backbone": v} for k, v in variables.items()}
        variables = {k: v["backbone"] for k, v in load_backbone("efficientnet_lite0", "packaged")(
            wrapped).items()}  # fmt: skip
        apply = jax.jit(model.apply)
        feats = np.concatenate(
            [np.asarray(apply(variables, images[i : i + 500])) for i in range(0, len(images), 500)]
        )
        cached["fixed"] = {PIXELS: metrics(pixels), FEATURES: metrics(feats)}
    for seed in seeds:
        c = revisiting_config(DATA)
        with c.unlocked():
            c.seed = seed
        run = Run(c)
        results, _, _ = run.evaluate(run.initial_state, {"test": test})
        cached["random_head"][str(seed)] = {m: float(results["test"][m]) for m in METRICS}
    return cached


# -- tables -------------------------------------------------------------------------------------


def _cell(xs: list[float], scale: float = 100.0, digits: int = 2) -> str:
    """mean ± sample std of ``scale * xs`` (percent by default)."""
    if not xs:
        return "-"
    mean, std = mean_std([scale * x for x in xs])
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if len(xs) > 1 else f"{mean:.{digits}f}"


def _row_results(row: str, args: argparse.Namespace) -> list[dict]:
    records = (load_record(args, row, seed) for seed in args.seeds)
    return [r for r in records if r]


def _concat_name(c: ml_collections.ConfigDict) -> str | None:
    if c.cohort.size > 1:
        return "concat:" + ",".join(["1"] * c.cohort.size)
    if c.eval.combinations:
        return "concat:" + ",".join(f"{float(w):g}" for w in c.eval.combinations[0])
    return None


#: The row every other row of a table is compared with (paired by seed).
BASELINE_ROW = {
    "rho": "margin",
    "diva": "diva-D",
    "sharing": "sharing-class",
    "losses": "margin",
    "samplers": "margin",
    "views": "views-host",
}


def _by_seed(row: str, args: argparse.Namespace, concat: str | None) -> dict[int, float]:
    """Test Recall@1 per seed of a row (of its concatenation ``concat`` if given)."""
    out = {}
    for r in _row_results(row, args):
        values = r["results"]["test"]
        if concat:
            values = r.get("embeddings", {}).get("test", {}).get(concat, {})
        if "recall@1" in values:
            out[r["seed"]] = values["recall@1"]
    return out


def per_query_blocks(row: str, args: argparse.Namespace) -> dict[int, dict]:
    """The kept per-query test values per seed of a row (``jdml.evaluation.per_query``
    blocks), of the seeds whose records have them."""
    return {r["seed"]: r["per_query"]["test"] for r in _row_results(row, args)
            if "test" in r.get("per_query", {})}  # fmt: skip


def embedding_name(row: str, concat: bool) -> str | None:
    """The embedding a claim reads of ``row``: its concatenation, or None for its main head
    (a row with one head reads that head under ``concat`` too, as :func:`difference` does)."""
    return _concat_name(ROWS[row][1]()) if concat else None


def difference(
    row: str, base: str, args: argparse.Namespace, concat: bool = False, level: float = 0.95
) -> Paired | None:
    """``row`` - ``base`` in test Recall@1 over their common seeds, with its ``level`` interval
    (``concat``: the row's concatenation against the base's, or the base's main head if it has
    one head)."""
    row_concat = _concat_name(ROWS[row][1]()) if concat else None
    if concat and row_concat is None:
        return None
    base_concat = _concat_name(ROWS[base][1]()) if concat else None
    a, b = _by_seed(row, args, row_concat), _by_seed(base, args, base_concat)
    seeds = sorted(set(a) & set(b))
    if not seeds or row == base:
        return None
    return paired([a[k] for k in seeds], [b[k] for k in seeds], level)


def table(name: str, rows: tuple[str, ...], args: argparse.Namespace) -> str:
    title, _ = TABLES[name]
    rho = any(r in RHO_ROWS for r in rows)
    header = ["row", "seeds", "best epoch", *METRICS]
    multi = any(_concat_name(ROWS[r][1]()) for r in rows)
    if multi:
        header += [f"concat {m}" for m in METRICS]
    if rho:
        header.append("rho (train)")
    base = BASELINE_ROW.get(name, rows[0] if name == "dm2" and rows else None)
    if base is not None and base in rows:
        header.append(f"Δ recall@1 vs {ROWS[base][0]} [95 % CI]")
        if multi:
            header.append("Δ concat recall@1 [95 % CI]")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    if name == "protocol":
        compute = getattr(args, "compute_baselines", True)
        for label, values in baselines(args.results, args.seeds, compute).items():
            n = values["seeds"]
            cells = [label, "-" if n is None else str(n), "-", *(_cell(values[m]) for m in METRICS)]
            cells += ["-"] * (len(header) - len(cells))
            lines.append("| " + " | ".join(cells) + " |")
    for row in rows:
        label, build = ROWS[row]
        results = _row_results(row, args)
        test = [r["results"]["test"] for r in results]
        epochs = [str(r["meta"].get("epoch", "?")) for r in results]
        cells = [label, str(len(results)), ",".join(epochs) or "-"]
        cells += [_cell([t[m] for t in test]) for m in METRICS]
        if multi:
            concat = _concat_name(build())
            extra = [r.get("embeddings", {}).get("test", {}).get(concat or "", {}) for r in results]
            cells += [_cell([e[m] for e in extra if m in e]) for m in METRICS]
        if rho:
            values = [r["results"]["train"]["rho_spectrum@1"] for r in results if row in RHO_ROWS]
            cells.append(_cell(values, scale=1.0, digits=4))
        if base is not None and base in rows:
            for concat in (False, True) if multi else (False,):
                d = difference(row, base, args, concat)
                cells.append(d.cell() if d else "-")
        lines.append("| " + " | ".join(cells) + " |")
    frozen = (
        ""
        if args.frozen_stages < 0
        else f", only the stages after {args.frozen_stages} trained (model.frozen_stages)"
    )
    argv = [a for a in sys.argv[1:] if a != "--report-only"]  # the command that trains them
    command = shlex.join(["python", "experiments/emoji_protocol.py", *argv])
    return (
        f"## {title}\n\n"
        + "\n".join(lines)
        + f"\n\nemoji test classes (unseen), %; {args.epochs} epochs{frozen}, checkpoint selected "
        f"on validation Recall@1, mean ± sample std over seeds {', '.join(map(str, args.seeds))}; "
        "Δ: the paired per-seed difference, mean and 95 % Student-t interval. "
        f"Command: `{command}`\n"
    )


def tune_table(args: argparse.Namespace) -> str:
    """Every tuning run's best validation Recall@1 (and epoch), the selected candidate of each
    method in bold."""
    lines = [
        "| method | tuned | candidate | best val recall@1 | at epoch |",
        "|---|---|---|---|---|",
    ]
    for method, (what, _, grid) in TUNING.items():
        found = {}
        for variant in grid:
            record = load_record(args, tune_row(method, variant), 0)
            if record:
                found[variant] = best_validation(record)
        top = max(found, key=lambda v: found[v][0]) if len(found) == len(grid) else None
        for variant in grid:
            value = f"{100 * found[variant][0]:.2f}" if variant in found else "-"
            epoch = str(found[variant][1]) if variant in found else "-"
            mark = "**" if variant == top else ""
            lines.append(f"| {method} | {what} | {mark}{variant}{mark} | {value} | {epoch} |")
    return (
        "## Tuning on validation\n\n"
        + "\n".join(lines)
        + f"\n\nemoji validation classes, %; seed 0, {args.epochs} epochs, {TUNE_RUNS} runs per "
        "method; bold: the selected candidate (first listed on a tie: the preset's).\n"
    )


def select_rows(tables: dict[str, tuple[str, ...]], spec: str) -> dict[str, tuple[str, ...]]:
    """The tables with only the rows named in ``spec`` (comma-separated row keys), in the tables'
    order; an unknown key is one ``error:`` line listing the known ones."""
    wanted = [r.strip() for r in spec.split(",") if r.strip()]
    known = {r for rows in tables.values() for r in rows}
    unknown = [r for r in wanted if r not in known]
    if unknown or not wanted:
        raise SystemExit(
            f"error: unknown row(s) {unknown or [spec]} in tables {list(tables)}; choose from "
            + ", ".join(sorted(known))
        )
    return {n: tuple(r for r in rows if r in wanted) for n, rows in tables.items()}


def main() -> None:
    reexec_with_tcmalloc()  # XLA's per-step buffers without page faults (jdml.allocator)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tables", default="protocol,rho", help=", ".join(TABLES))
    parser.add_argument("--epochs", type=int, default=45, help="the budget of every row")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", help="the run directories (default runs/emoji-v2-<epochs>)")
    parser.add_argument(
        "--results",
        help="the finished runs' records, kept (default experiments/results/emoji-v2-<epochs>)",
    )
    parser.add_argument("--frozen-stages", type=int, default=-1)
    parser.add_argument("--cohort", type=int, default=3, help="DM2 cohort size")
    parser.add_argument(
        "--rows",
        help="train (in the order named) and report only these rows of the tables, by their "
        "keys (e.g. dm2-3-independent,dm2-3-md+td+vd); default every row, table by table",
    )
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="train every method with its hyperparameters selected on validation by the tune "
        "table (from --tune-results); without it, the presets' values",
    )
    parser.add_argument("--tune-epochs", type=int, default=20)
    parser.add_argument(
        "--tune-results", help="default experiments/results/emoji-v2-tune-<tune-epochs>"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs trained at once, each a process on its share of the cores and of the "
        "accelerator's memory (default 1: one after another, in this process)",
    )
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--no-report", action="store_true", help="train only, print no table (a --jobs run)"
    )
    args = parser.parse_args()
    if args.jobs < 1:
        raise SystemExit(f"error: --jobs must be at least 1, got {args.jobs}")
    args.out = args.out or f"runs/emoji-v2-{args.epochs}"
    args.results = args.results or f"experiments/results/emoji-v2-{args.epochs}"
    args.tune_results = args.tune_results or f"experiments/results/emoji-v2-tune-{args.tune_epochs}"
    names = [t.strip() for t in args.tables.split(",") if t.strip()]
    unknown = [t for t in names if t not in TABLES]
    if unknown:
        raise SystemExit(f"error: unknown table(s) {unknown}; choose from {', '.join(TABLES)}")
    if "tune" in names and (len(names) > 1 or args.tuned or args.seeds != [0]):
        raise SystemExit(
            "error: the tune table runs alone, at seed 0, without --tuned: --tables tune "
            "--seeds 0 --epochs 20 --results experiments/results/emoji-v2-tune-20"
        )
    if args.tuned:
        use_selected(args.tune_results, args.tune_epochs)
    elif "tune" in names:
        use_selected(args.results, args.epochs)  # the baseline's selected lr for the others
    args.check_settings = args.tuned or "tune" in names
    if not args.report_only:
        args.data_sha256 = data_sha256()
    tables = {n: TABLES[n][1] for n in names}
    tables["dm2"] = add_dm2_rows(args.cohort)
    if args.rows:
        tables = select_rows(tables, args.rows)
    os.makedirs(args.out, exist_ok=True)
    failed = []
    if not args.report_only:
        order = training_order(names, tables, args.rows)
        if args.jobs > 1:
            failed = train_in_parallel(order, args)
        else:
            for _, row in order:
                for seed in args.seeds:
                    train_row(row, seed, args)
    for name in names:
        rows = tables[name]
        if args.no_report:
            continue
        text = tune_table(args) if name == "tune" else table(name, rows, args)
        print(text, flush=True)
        suffix = row_name("", args.frozen_stages)
        atomic_write(os.path.join(args.out, f"{name}{suffix}.md"), text)
        if name == "rho":
            plot_rho(rows, args, os.path.join(args.out, f"rho_spectrum{suffix}.png"))
    if failed:
        raise SystemExit(f"error: {len(failed)} run(s) failed: see the error lines above")


def training_order(
    names: list[str], tables: dict[str, tuple[str, ...]], spec: str | None = None
) -> list[tuple[str, str]]:
    """The (table, row) pairs to train, each row once (a row of two tables, as margin, with
    the first): the tables' order, or with ``spec`` (``--rows``) the order it names the rows
    in, so that rows named together finish together. Look 2 names them in the claims' order
    (``emoji_claims.py --look2-rows``), so each claim is read as soon as its two rows have
    their seeds, not once whole tables have."""
    pairs, seen = [], set()
    for name in names:
        for row in tables[name]:
            if row not in seen:
                pairs.append((name, row))
                seen.add(row)
    if spec:
        wanted = [r.strip() for r in spec.split(",") if r.strip()]
        pairs.sort(key=lambda pair: wanted.index(pair[1]))  # stable: ties keep table order
    return pairs


def train_in_parallel(
    order: list[tuple[str, str]], args: argparse.Namespace
) -> list[tuple[str, int]]:
    """Trains the runs of ``order`` (``training_order``) that have no record, ``args.jobs`` at
    a time, each in a process of its own (this script, for one row and seed); returns the
    (row, seed) pairs that failed, which are then left out of the tables."""
    from jdml.study.executor import Task, run_all

    common = [
        f"--epochs={args.epochs}",
        f"--out={args.out}",
        f"--results={args.results}",
        f"--frozen-stages={args.frozen_stages}",
        f"--cohort={args.cohort}",
        f"--tune-epochs={args.tune_epochs}",
        f"--tune-results={args.tune_results}",
        *(["--tuned"] if args.tuned else []),
        "--no-report",
    ]
    jobs, pairs = [], {}
    for name, row in order:
        for seed in args.seeds:
            if load_record(args, row, seed):
                continue
            job = Task(
                name=f"{row} seed {seed}",
                task_file="",
                command=(
                    sys.executable,
                    os.path.abspath(__file__),
                    f"--tables={name}",
                    f"--rows={row}",
                    "--seeds",
                    str(seed),
                    *common,
                ),
                log=run_dir(args.out, row, seed, args.frozen_stages) + ".log",
            )
            jobs.append(job)
            pairs[job.name] = (row, seed)
    if jobs:
        print(f"{len(jobs)} run(s) to train, {args.jobs} at a time", flush=True)
    failed = run_all(jobs, args.jobs, echo=lambda line: print(line, flush=True))
    return [pairs[name] for name in failed]


def plot_rho(rows: tuple[str, ...], args: argparse.Namespace, path: str) -> None:
    """The train embeddings' spectra at the selected checkpoints, mean over seeds, per row."""
    summaries = []
    for row in rows:
        workdirs = [run_dir(args.out, row, s, args.frozen_stages) for s in args.seeds]
        runs = [load_run(w) for w in workdirs if finished(w, row)]
        if runs:
            summaries.append(summarize_group(ROWS[row][0], runs, "val"))
    if plot_spectra(summaries, "val", path):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
