"""Reports a set of training runs by the protocol of Roth et al., "Revisiting Training Strategies
and Generalization Performance in Deep Metric Learning" (ICML 2020), section 4.1 / appendix A.3.

Run directories (each with the ``config.json`` and ``metrics.jsonl`` that training writes) are
grouped into experiments that differ only in their seed (or, with ``group_by="dir"``, by their
parent directory). For each experiment and metric the report gives, as mean and sample standard
deviation over seeds:

* **best**: the value at the checkpoint selected by the selection metric on the selection split
  (validation when the runs hold one out, else the test split, as the reference does). On a
  validation split this is the honest number.
* **max**: the maximum over all evaluated epochs (step > 0), the reference's reported number,
  which selects on the test data itself.
* **rho**: the spectral decay of the training-set embeddings at the best epoch (the paper's
  rho, ``rho_spectrum@1``, measured at every evaluation when ``eval.train_metrics`` has it);
* **Δ**: every experiment against the first, paired by seed at the selected checkpoints, with
  the 95 % interval of the mean difference (:mod:`jdml.statistics`).

Outputs: ``report.md`` (tables), ``report.csv`` (one row per experiment, protocol and metric,
with the per-seed values), ``recall_at_1_over_epochs.png`` (a metric over epochs, mean and std band)
and ``spectrum.png`` (the normalised singular-value spectrum of the training embeddings at the
best epoch, the paper's Fig. 5 / 7 style).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from jdml.config import RESUMABLE_CHANGES, flatten_config, selected_only
from jdml.errors import ReportError
from jdml.evaluation.table import is_percent
from jdml.fileio import read_jsonl
from jdml.statistics import mean_std, paired
from jdml.visualize.curves import curves_with_bands, spectra_comparison

log = logging.getLogger("jdml")

RHO = "rho_spectrum@1"
# Keys that do not make two runs different experiments.
_NOT_EXPERIMENT = (*RESUMABLE_CHANGES, "seed", "data.path", "data.source", "data.num_threads")


@dataclasses.dataclass
class RunResult:
    """The evaluation records of one training run directory."""

    workdir: str
    config: dict[str, Any]  # flattened: {"loss.name": "margin", ...}
    selection_split: str
    selection_metric: str
    evals: dict[str, list[dict[str, Any]]]  # split -> eval records ordered by step
    spectra: dict[int, np.ndarray]  # step -> normalised train singular values
    selection: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # main head

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    def best_step(self) -> int | None:
        """The step of the selected checkpoint (ties: the earliest), or None before training."""
        records = [r for r in self.selection if r["step"] > 0]
        records = [r for r in records if _finite(r.get(self.selection_metric))]
        if not records:
            return None
        return max(records, key=lambda r: (r[self.selection_metric], -r["step"]))["step"]

    def at_step(self, split: str, step: int) -> dict[str, Any] | None:
        return next((r for r in self.evals.get(split, []) if r["step"] == step), None)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def find_runs(paths: Iterable[str]) -> list[str]:
    """Run directories (holding config.json and metrics.jsonl) at or below ``paths``.

    In the order of ``paths``, sorted below each; a directory reached twice is listed once.
    """
    found: dict[str, None] = {}
    for path in paths:
        if not os.path.isdir(path):
            raise ReportError(f"{path} is not a directory; pass run directories or their parents")
        for root, dirs, files in os.walk(path):
            if "config.json" in files and "metrics.jsonl" in files:
                found[os.path.abspath(root)] = None
                dirs[:] = []  # checkpoints live below a run; runs do not nest
            dirs.sort()
    return list(found)


def load_run(workdir: str, embedding: str | None = None) -> RunResult:
    """Reads one run directory's config and evaluation records.

    Args:
      workdir: the run directory.
      embedding: report this head or weighted concatenation (e.g. ``concat:0.5,1,1,1``) of a
        multi-head run instead of the main head; the checkpoint is still selected on the main
        head, as training selected it.
    """
    try:
        with open(os.path.join(workdir, "config.json")) as f:
            config = flatten_config(json.load(f))
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{workdir}/config.json is unreadable ({e})") from None
    evals: dict[str, list[dict[str, Any]]] = {}
    others: dict[str, list[dict[str, Any]]] = {}
    spectra: dict[int, np.ndarray] = {}
    for record in read_jsonl(os.path.join(workdir, "metrics.jsonl")):
        if record.get("kind") == "eval" and "embedding" not in record:  # the main head
            evals.setdefault(record["split"], []).append(record)
        elif record.get("kind") == "eval" and record["embedding"] == embedding:
            others.setdefault(record["split"], []).append(record)
        elif record.get("kind") == "spectrum" and record.get("split") == "train":
            spectra[record["step"]] = np.asarray(record["spectrum"], np.float64)
    for records in (*evals.values(), *others.values()):
        records.sort(key=lambda r: r["step"])
    selection_split = "val" if "val" in evals else "test"
    if embedding is not None and not others:
        raise ReportError(
            f"{workdir} has no evaluation of the embedding {embedding!r} (see eval.heads and "
            "eval.combinations of its config.json)"
        )
    return RunResult(
        workdir=workdir,
        config=config,
        selection_split=selection_split,
        selection_metric=config.get("eval.selection_metric", "recall@1"),
        evals={**evals, **others},
        spectra=spectra,
        selection=evals.get(selection_split, []),
    )


def _experiment_key(run: RunResult) -> str:
    flat = selected_only(run.config)
    kept = {k: v for k, v in flat.items() if not k.startswith(_NOT_EXPERIMENT)}
    return json.dumps(kept, sort_keys=True, default=str)


def group_runs(runs: Sequence[RunResult], group_by: str = "config") -> dict[str, list[RunResult]]:
    """Groups runs into experiments, each named by what sets it apart.

    Args:
      runs: the loaded runs.
      group_by: "config": runs whose configs differ only in the seed (and in keys that do not
        change training) form one experiment, named by the config keys whose values differ
        between experiments; "dir": runs in the same parent directory form one experiment,
        named by that directory.

    Returns:
      {experiment name: runs ordered by seed}, in order of first appearance.
    """
    if group_by == "dir":
        groups: dict[str, list[RunResult]] = {}
        for run in runs:
            groups.setdefault(os.path.basename(os.path.dirname(run.workdir)), []).append(run)
        return {k: sorted(v, key=lambda r: r.seed) for k, v in groups.items()}
    if group_by != "config":
        raise ReportError(f"group_by={group_by!r}; choose config or dir")
    by_key: dict[str, list[RunResult]] = {}
    for run in runs:
        by_key.setdefault(_experiment_key(run), []).append(run)
    configs = [json.loads(k) for k in by_key]
    shared = set.intersection(*(set(c) for c in configs)) if configs else set()
    differing = sorted(k for k in shared if len({json.dumps(c[k]) for c in configs}) > 1)
    out = {}
    for key, members in by_key.items():
        config = json.loads(key)
        name = ", ".join(f"{k}={config[k] if config[k] != '' else 'none'}" for k in differing)
        if not name:  # one experiment (or differences only in component parameters)
            name = os.path.basename(os.path.dirname(members[0].workdir)) or "runs"
        while name in out:
            name += "'"
        out[name] = sorted(members, key=lambda r: r.seed)
    return out


@dataclasses.dataclass
class Summary:
    """Per-seed values of one experiment: {protocol: {metric: [value per seed]}}."""

    name: str
    runs: list[RunResult]
    values: dict[str, dict[str, list[float]]]


def summarize_group(name: str, runs: Sequence[RunResult], split: str) -> Summary:
    """Collects the 'best', 'max' and training-rho values of each run of an experiment."""
    values: dict[str, dict[str, list[float]]] = {"best": {}, "max": {}, "rho": {}}
    for run in runs:
        trained = [r for r in run.evals.get(split, []) if r["step"] > 0]
        if not trained:
            log.warning("%s has no evaluation on %s after training; skipped", run.workdir, split)
            continue
        metrics = [
            k for k in trained[0] if k not in ("kind", "split", "step", "epoch", "embedding")
        ]
        for metric in metrics:
            xs = [r[metric] for r in trained if _finite(r.get(metric))]
            values["max"].setdefault(metric, []).append(max(xs) if xs else math.nan)
        best = run.best_step()
        record = run.at_step(split, best) if best is not None else None
        for metric in metrics:
            value = record.get(metric, math.nan) if record else math.nan
            values["best"].setdefault(metric, []).append(value)
        train = run.at_step("train", best) if best is not None else None
        for metric, value in (train or {}).items():
            if metric.startswith("rho_spectrum"):
                values["rho"].setdefault(metric, []).append(value)
    return Summary(name=name, runs=list(runs), values=values)


def _best_by_seed(s: Summary, split: str, metric: str) -> dict[Any, float]:
    """An experiment's value of ``metric`` at each run's selected checkpoint, by seed."""
    out = {}
    for run in s.runs:
        best = run.best_step()
        record = run.at_step(split, best) if best is not None else None
        if record and _finite(record.get(metric)):
            out[run.config.get("seed")] = float(record[metric])
    return out


def paired_markdown(summaries: Sequence[Summary], split: str, metrics: Sequence[str]) -> str:
    """Every experiment against the first, seed by seed at the selected checkpoints: the mean
    difference and its 95 % Student-t interval over the seeds both have (jdml.statistics)."""
    if len(summaries) < 2:
        return ""
    base = summaries[0]
    header = ["experiment", "common seeds", *(f"Δ {m} [95 % CI]" for m in metrics)]
    lines = [f"### Paired differences against {base.name} (selected checkpoints, {split} split)"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in summaries[1:]:
        cells, common = [s.name], set()
        for metric in metrics:
            a, b = _best_by_seed(s, split, metric), _best_by_seed(base, split, metric)
            seeds = sorted(set(a) & set(b), key=str)
            common |= set(seeds)
            scale = 100.0 if is_percent(metric) else 1.0
            d = paired([a[k] for k in seeds], [b[k] for k in seeds]) if seeds else None
            cells.append(d.cell(scale) if d else "-")
        lines.append("| " + " | ".join([cells[0], str(len(common)), *cells[1:]]) + " |")
    return "\n".join(lines)


def format_cell(xs: Sequence[float], metric: str) -> str:
    """Per-seed values as "mean ± std" (percent for fractions; the mean alone for one seed)."""
    if not xs:
        return "-"
    mean, std = mean_std(xs)
    scale, digits = (100.0, 2) if is_percent(metric) else (1.0, 4)
    if len(xs) == 1:
        return f"{scale * mean:.{digits}f}"
    return f"{scale * mean:.{digits}f} ± {scale * std:.{digits}f}"


def markdown(summaries: Sequence[Summary], split: str, metrics: Sequence[str]) -> str:
    """The report's Markdown: the 'best' and the 'max' tables (percent for fractions)."""
    rho_metrics = list(dict.fromkeys(m for s in summaries for m in s.values["rho"]))
    parts = []
    for protocol, title in (
        ("best", f"At the selected checkpoint ({split} split; rho on train at that epoch)"),
        ("max", f"Maximum over evaluated epochs ({split} split; the reference's protocol)"),
    ):
        extra = rho_metrics if protocol == "best" else []
        header = ["experiment", "seeds", "selected on", *metrics, *(f"{m} (train)" for m in extra)]
        lines = [f"### {title}", "", "| " + " | ".join(header) + " |"]
        lines.append("|" + "---|" * len(header))
        for s in summaries:
            selected = ", ".join(sorted({r.selection_split for r in s.runs}))
            cells = [s.name, str(len(s.values[protocol].get(metrics[0], []))), selected]
            cells += [format_cell(s.values[protocol].get(m, []), m) for m in metrics]
            cells += [format_cell(s.values["rho"].get(m, []), m) for m in extra]
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    paired_part = paired_markdown(summaries, split, metrics)
    if paired_part:
        parts.append(paired_part)
    note = (
        "Mean ± sample standard deviation over seeds; retrieval and clustering metrics in "
        "percent; Δ: the per-seed difference to the first experiment over the seeds both have, "
        "mean and 95 % Student-t interval (an interval holding 0 does not resolve the "
        "difference). 'selected on' is the split whose "
        f"{summaries[0].runs[0].selection_metric if summaries else 'selection metric'} picked "
        "the checkpoint: 'test' means no validation split was held out, so 'best' is not an "
        "honest estimate there."
    )
    return "\n\n".join([*parts, note]) + "\n"


def csv_text(summaries: Sequence[Summary], split: str) -> str:
    """One CSV row per experiment, protocol and metric, with mean, std, n and per-seed values."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["experiment", "protocol", "split", "metric", "mean", "std", "n", "seeds"])
    for s in summaries:
        for protocol, by_metric in s.values.items():
            for metric, xs in by_metric.items():
                mean, std = mean_std(xs)
                where = "train" if protocol == "rho" else split
                seeds = ";".join(f"{x:.6g}" for x in xs)
                row = [s.name, protocol, where, metric, f"{mean:.6g}", f"{std:.6g}", len(xs), seeds]
                writer.writerow(row)
    return out.getvalue()


def _curve(runs: Sequence[RunResult], split: str, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Epochs every run evaluated, and the (runs, epochs) values of ``metric`` there."""
    per_run = [
        {r["epoch"]: r[metric] for r in run.evals.get(split, []) if _finite(r.get(metric))}
        for run in runs
    ]
    per_run = [p for p in per_run if p]
    if not per_run:
        return np.zeros(0), np.zeros((0, 0))
    epochs = sorted(set.intersection(*(set(p) for p in per_run)))
    return np.asarray(epochs), np.asarray([[p[e] for e in epochs] for p in per_run])


def plot_curves(summaries: Sequence[Summary], split: str, metric: str, path: str) -> bool:
    """Plots ``metric`` over epochs, one line (mean) and band (std over seeds) per experiment."""
    scale = 100.0 if is_percent(metric) else 1.0
    series = []
    for s in summaries:
        epochs, values = _curve(s.runs, split, metric)
        series.append((s.name, epochs, scale * values))
    ylabel = f"{metric} ({split}{', %' if scale == 100.0 else ''})"
    return curves_with_bands(series, path, xlabel="epoch", ylabel=ylabel)


def _best_spectrum(run: RunResult) -> np.ndarray | None:
    best = run.best_step()
    return run.spectra.get(best) if best is not None else None


def plot_spectra(summaries: Sequence[Summary], split: str, path: str) -> bool:
    """Plots the normalised singular values of the training embeddings at the best epoch.

    One line per experiment (mean over seeds), log scale, labelled with the experiment's
    mean selection-split Recall@1 at the best checkpoint and its training rho.
    """
    series = []
    for s in summaries:
        spectra = [x for x in map(_best_spectrum, s.runs) if x is not None]
        if not spectra or len({len(x) for x in spectra}) != 1:
            continue
        label = s.name
        recall = s.values["best"].get("recall@1")
        rho = s.values["rho"].get(RHO)
        if recall:
            label += f": R@1 {100 * mean_std(recall)[0]:.2f}"
        if rho:
            label += f", rho {mean_std(rho)[0]:.3f}"
        series.append((label, np.mean(spectra, axis=0)))
    title = f"Spectrum at the best epoch (R@1 on {split})"
    return spectra_comparison(series, path, title=title)


def report(
    paths: Sequence[str],
    out: str | None = None,
    *,
    split: str = "test",
    metrics: Sequence[str] | None = None,
    group_by: str = "config",
    curve_metric: str = "recall@1",
    embedding: str | None = None,
) -> dict[str, Any]:
    """Writes report.md, report.csv and the plots for the runs at or below ``paths``.

    Args:
      paths: run directories or directories holding them.
      out: output directory (default: ``<common parent of paths>/report``).
      split: the split whose metrics are reported.
      metrics: the metric columns (default: every metric the runs evaluated on ``split``).
      group_by: "config" or "dir" (see :func:`group_runs`).
      curve_metric: the metric plotted over epochs.
      embedding: report this head or weighted concatenation of multi-head runs instead of the
        main head (see :func:`load_run`).

    Returns:
      ``{"markdown": ..., "files": [written paths], "experiments": {name: [workdirs]}}``.

    Raises:
      ReportError: when no run directory with evaluations on ``split`` is found.
    """
    from jdml.fileio import atomic_write

    workdirs = find_runs(paths)
    if not workdirs:
        raise ReportError(
            f"no run directories (with config.json and metrics.jsonl) under {list(paths)}"
        )
    runs = [load_run(w, embedding) for w in workdirs]
    runs = [r for r in runs if any(e["step"] > 0 for e in r.evals.get(split, []))]
    if not runs:
        raise ReportError(
            f"none of the {len(workdirs)} run directories has a {split!r} evaluation after "
            "training (let the runs reach their first evaluation, or pick another --split)"
        )
    groups = group_runs(runs, group_by)
    summaries = [summarize_group(name, members, split) for name, members in groups.items()]
    if metrics is None:
        metrics = list(dict.fromkeys(m for s in summaries for m in s.values["max"]))
    evaluated = list(dict.fromkeys(m for s in summaries for m in s.values["max"]))
    missing = [m for m in metrics if m not in evaluated]
    if missing:
        raise ReportError(
            f"metric(s) {missing} were not evaluated on {split!r} in these runs; they "
            f"evaluated {', '.join(evaluated)}"
        )
    if curve_metric not in evaluated:
        raise ReportError(
            f"--curve-metric {curve_metric!r} was not evaluated on {split!r} in these runs; "
            f"choose one of: {', '.join(evaluated)}"
        )
    out = out or os.path.join(os.path.commonpath([os.path.abspath(p) for p in paths]), "report")
    os.makedirs(out, exist_ok=True)
    text = markdown(summaries, split, metrics)
    files = [os.path.join(out, "report.md"), os.path.join(out, "report.csv")]
    atomic_write(files[0], text)
    atomic_write(files[1], csv_text(summaries, split))
    curves = os.path.join(out, f"{curve_metric.replace('@', '_at_')}_over_epochs.png")
    if plot_curves(summaries, split, curve_metric, curves):
        files.append(curves)
    spectra = os.path.join(out, "spectrum.png")
    if plot_spectra(summaries, split, spectra):
        files.append(spectra)
    else:
        log.warning("no training spectra recorded (eval.train_metrics empty?): no spectrum plot")
    return {
        "markdown": text,
        "files": files,
        "experiments": {s.name: [r.workdir for r in s.runs] for s in summaries},
    }
