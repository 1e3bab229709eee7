"""The papers' protocol on the emoji set: ImageNet features, raw pixels, fine-tuning and ablations.

Every trained row fine-tunes the ImageNet-pretrained EfficientNet-Lite0 of the ``data=emoji``
preset (frozen BatchNorm, batch 112 with SPC-2, Adam, 64 px) for ``--epochs`` epochs on the
first half of the classes minus the 15 % held out for validation, evaluates on the validation
classes after every epoch, keeps the checkpoint with the best validation Recall@1 and evaluates
only that one on the test classes (the second half, unseen). Runs go to
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
* ``losses`` and ``samplers``: the wider Revisiting comparison.

``--frozen-stages k`` trains only the last stages (``model.frozen_stages``): those runs go to
``<row>-frozen<k>`` directories and their tables say so. ``--rows`` keeps only the named rows
of the tables (their keys, e.g. ``dm2-3-independent``), for a check that cannot afford them all.

Usage: python experiments/emoji_protocol.py [--tables protocol,rho] [--epochs 45] [--seeds 0 1 2]
           [--out runs/emoji-<epochs>] [--results experiments/results/emoji-<epochs>]
           [--frozen-stages -1] [--rows KEY,...] [--report-only]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shlex
import subprocess
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
from jdml.evaluate_checkpoint import evaluate_checkpoint
from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.fileio import read_jsonl
from jdml.models.efficientnet import MEAN, STD, EfficientNetLite0
from jdml.models.pretrained.backbones import load_backbone
from jdml.report import load_run, plot_spectra, summarize_group
from jdml.run import Run
from jdml.samplers import SAMPLERS as SAMPLER_REGISTRY
from jdml.trainer import atomic_write, train_and_evaluate

METRICS = ("recall@1", "map@r", "nmi")
DATA = "data=emoji"
DIVA_DIM = 512  # DiVA's total embedding dimension, split over the heads of each row

Build = Callable[[], ml_collections.ConfigDict]


def revisiting(spec: str, **overrides: object) -> Build:
    """A Revisiting row: ``configs/revisiting.py:<spec>,data=emoji`` plus dotted overrides."""

    def build() -> ml_collections.ConfigDict:
        c = revisiting_config(f"{spec},{DATA}")
        with c.unlocked():
            for key, value in overrides.items():
                section, name = key.rsplit(".", 1)
                c[section][name] = value
        return c

    return build


def diva(keep: tuple[str, ...], decorrelate: bool = True) -> Build:
    """A DiVA row: the discriminative head with the auxiliary terms in ``keep``."""

    return lambda: ablation_config("emoji", keep, decorrelate=decorrelate, total_dim=DIVA_DIM)


def sharing(decorrelate: bool) -> Build:
    def build() -> ml_collections.ConfigDict:
        c = sharing_config(DATA)
        if not decorrelate:
            c.decorrelation.pairs, c.decorrelation.weights = (), ()
        return c  # both heads at the class head's dimension, as the paper compares them

    return build


def dm2(diversity: str, size: int) -> Build:
    def build() -> ml_collections.ConfigDict:
        c = dm2_config(f"size={size},diversity={diversity},{DATA}")
        c.cohort.warmup_epochs = 1.0  # lambda at full weight after one of the few epochs
        return c

    return build


# Row id -> (table label, builder). Ids name the run directories; a row shared by two tables
# (the margin baseline) is trained once.
ROWS: dict[str, tuple[str, Build]] = {
    "margin": ("margin (distance miner)", revisiting("loss=margin")),
    "R-margin": ("R-margin (rho-regularised)", revisiting("loss=margin,miner=rho_distance")),
    "diva-D": ("margin, one 512-d head", diva(())),
    "diva-DS": ("D+S", diva(("shared",))),
    "diva-DI": ("D+I", diva(("intra",))),
    "diva-DDa": ("D+Da", diva(("selfsimilarity",))),
    "diva": ("DiVA (D+Da+S+I)", diva(("selfsimilarity", "shared", "intra"))),
    "diva-nodecor": (
        "DiVA without decorrelation",
        diva(("selfsimilarity", "shared", "intra"), decorrelate=False),
    ),
    "sharing-class": ("class only", revisiting("loss=margin", **{"sampler.samples_per_class": 4})),
    "sharing": ("class + shared", sharing(decorrelate=False)),
    "sharing-decor": ("class + shared, decorrelated", sharing(decorrelate=True)),
    "triplet": ("triplet", revisiting("loss=triplet")),
    "contrastive": ("contrastive", revisiting("loss=contrastive")),
    "multisimilarity": ("multisimilarity", revisiting("loss=multisimilarity")),
    "proxynca": ("proxynca", revisiting("loss=proxynca")),
    "R-triplet": ("R-triplet", revisiting("loss=triplet,miner=rho_distance")),
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

TABLES: dict[str, tuple[str, tuple[str, ...]]] = {
    "protocol": ("ImageNet features, raw pixels and fine-tuning", ("margin",)),
    "rho": ("Revisiting: rho-regularisation", ("margin", "R-margin")),
    "diva": (
        "DiVA, Tab. 2",
        ("diva-D", "diva-DS", "diva-DI", "diva-DDa", "diva", "diva-nodecor"),
    ),
    "dm2": ("DM2, Table 1", ()),  # rows added per cohort size in main()
    "sharing": ("Sharing Matters", ("sharing-class", "sharing", "sharing-decor")),
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
}
# Rows whose train rho (spectral decay, eval.train_metrics) is measured after every epoch.
RHO_ROWS = frozenset({"margin", "R-margin", "triplet", "R-triplet"})


def row_name(row: str, frozen: int) -> str:
    return row if frozen < 0 else f"{row}-frozen{frozen}"


def run_dir(out: str, row: str, seed: int, frozen: int) -> str:
    return os.path.join(out, row_name(row, frozen), f"seed{seed}")


def record_path(args: argparse.Namespace, row: str, seed: int) -> str:
    return os.path.join(args.results, row_name(row, args.frozen_stages), f"seed{seed}.json")


def finished(workdir: str) -> str | None:
    """The test evaluation of the best checkpoint, if the run has one."""
    found = sorted(glob.glob(os.path.join(workdir, "eval_best_step*.json")))
    return found[-1] if found else None


def load_record(args: argparse.Namespace, row: str, seed: int) -> dict | None:
    """The finished run's record, if it was trained with this budget."""
    path = record_path(args, row, seed)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        record = json.load(f)
    return record if record.get("epochs") == args.epochs else None


def commit() -> str:
    """The commit the runs are trained at, with ``+dirty`` if the tree has local changes."""
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def write_record(args: argparse.Namespace, row: str, seed: int, workdir: str) -> dict:
    """Keeps what the tables need from a finished run: the test evaluation of the selected
    checkpoint, the validation curve it was selected on and the commit."""
    with open(finished(workdir)) as f:
        evaluation = json.load(f)
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
        "meta": evaluation["meta"],
        "results": evaluation["results"],
        "embeddings": evaluation.get("embeddings", {}),
        "val_curve": curve,
    }
    path = record_path(args, row, seed)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, json.dumps(record, indent=1) + "\n")
    return record


def configure(c: ml_collections.ConfigDict, seed: int, epochs: int, frozen: int, rho: bool):
    """The shared budget: epochs, seed, validation-only evaluation during training."""
    with c.unlocked():
        c.seed = seed
        c.train.epochs = epochs
        c.train.progress_bar = False
        c.model.frozen_stages = frozen
        c.eval.splits = ()  # validation only; the test split sees the selected checkpoint
        c.eval.metrics = METRICS
        c.eval.train_metrics = ("rho_spectrum@1",) if rho else ()
    return c


def train_row(row: str, seed: int, args: argparse.Namespace) -> None:
    if load_record(args, row, seed):
        return
    workdir = run_dir(args.out, row, seed, args.frozen_stages)
    rho = row in RHO_ROWS
    if not finished(workdir):
        print(f"== {row} seed {seed}", flush=True)
        start = time.perf_counter()
        c = configure(ROWS[row][1](), seed, args.epochs, args.frozen_stages, rho)
        train_and_evaluate(c, workdir)
        evaluate_checkpoint(workdir, "best", ("test", "train") if rho else ("test",))
        print(f"   {time.perf_counter() - start:.0f} s", flush=True)
    record = write_record(args, row, seed, workdir)
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
    """mean ± std of ``scale * xs`` (percent by default)."""
    if not xs:
        return "-"
    a = scale * np.asarray(xs)
    return f"{a.mean():.{digits}f} ± {a.std():.{digits}f}" if len(a) > 1 else f"{a[0]:.{digits}f}"


def _row_results(row: str, args: argparse.Namespace) -> list[dict]:
    records = (load_record(args, row, seed) for seed in args.seeds)
    return [r for r in records if r]


def _concat_name(c: ml_collections.ConfigDict) -> str | None:
    if c.cohort.size > 1:
        return "concat:" + ",".join(["1"] * c.cohort.size)
    if c.eval.combinations:
        return "concat:" + ",".join(f"{float(w):g}" for w in c.eval.combinations[0])
    return None


def table(name: str, rows: tuple[str, ...], args: argparse.Namespace) -> str:
    title, _ = TABLES[name]
    rho = any(r in RHO_ROWS for r in rows)
    header = ["row", "seeds", "best epoch", *METRICS]
    multi = any(_concat_name(ROWS[r][1]()) for r in rows)
    if multi:
        header += [f"concat {m}" for m in METRICS]
    if rho:
        header.append("rho (train)")
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
        f"on validation Recall@1, mean ± std over seeds {', '.join(map(str, args.seeds))}. "
        f"Command: `{command}`\n"
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
    parser.add_argument("--out", help="the run directories (default runs/emoji-<epochs>)")
    parser.add_argument(
        "--results",
        help="the finished runs' records, kept (default experiments/results/emoji-<epochs>)",
    )
    parser.add_argument("--frozen-stages", type=int, default=-1)
    parser.add_argument("--cohort", type=int, default=3, help="DM2 cohort size")
    parser.add_argument(
        "--rows",
        help="train and report only these rows of the tables, by their keys (e.g. "
        "dm2-3-independent,dm2-3-md+td+vd); default every row",
    )
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    args.out = args.out or f"runs/emoji-{args.epochs}"
    args.results = args.results or f"experiments/results/emoji-{args.epochs}"
    names = [t.strip() for t in args.tables.split(",") if t.strip()]
    unknown = [t for t in names if t not in TABLES]
    if unknown:
        raise SystemExit(f"error: unknown table(s) {unknown}; choose from {', '.join(TABLES)}")
    for label, diversity in DM2_ROWS.items():
        ROWS[f"dm2-{args.cohort}-{diversity}"] = (label, dm2(diversity, args.cohort))
    tables = {n: TABLES[n][1] for n in names}
    tables["dm2"] = tuple(f"dm2-{args.cohort}-{d}" for d in DM2_ROWS.values())
    if args.rows:
        tables = select_rows(tables, args.rows)
    os.makedirs(args.out, exist_ok=True)
    for name in names:
        rows = tables[name]
        if not args.report_only:
            for row in rows:
                for seed in args.seeds:
                    train_row(row, seed, args)
        text = table(name, rows, args)
        print(text, flush=True)
        suffix = row_name("", args.frozen_stages)
        atomic_write(os.path.join(args.out, f"{name}{suffix}.md"), text)
        if name == "rho":
            plot_rho(rows, args, os.path.join(args.out, f"rho_spectrum{suffix}.png"))


def plot_rho(rows: tuple[str, ...], args: argparse.Namespace, path: str) -> None:
    """The train embeddings' spectra at the selected checkpoints, mean over seeds, per row."""
    summaries = []
    for row in rows:
        workdirs = [run_dir(args.out, row, s, args.frozen_stages) for s in args.seeds]
        runs = [load_run(w) for w in workdirs if finished(w)]
        if runs:
            summaries.append(summarize_group(ROWS[row][0], runs, "val"))
    if plot_spectra(summaries, "val", path):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
