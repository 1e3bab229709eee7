"""Training curves and singular-value spectra from a run's ``metrics.jsonl``, and the plots over
several runs of ``jdml report``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jdml.fileio import read_jsonl
from jdml.visualize.figure import figure, finite_number, is_fraction_metric, save_png, shorten

TRAINING_CURVES_PX = (1200, 450)
SPECTRUM_PX = (700, 450)
#: The spectrum plot's axes inside its figure, as fractions (left, bottom, width, height): fixed
#: margins for the tick labels, axis labels and title instead of a layout engine, which took two
#: thirds of the plot's time (it is drawn at every evaluation when TensorBoard is on).
SPECTRUM_AXES = (80 / 700, 55 / 450, 605 / 700, 355 / 450)


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    """Reads a JSON-lines file of records, warning about (and skipping) malformed lines.

    Args:
      path: the file.

    Returns:
      The records (JSON objects) in file order.

    Raises:
      FileNotFoundError: if the file does not exist.
      ValueError: if it holds no valid record.
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"metrics file not found: {path}")
    records = read_jsonl(path, warn=True)
    if not records:
        raise ValueError(f"metrics file {path} holds no records (empty or all lines malformed)")
    return records


def load_records(
    metrics_path_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
) -> tuple[list[dict[str, Any]], str]:
    """Metric records from a ``metrics.jsonl`` path or given directly.

    Args:
      metrics_path_or_records: the path of a run's ``metrics.jsonl`` (JSON lines), or an
        iterable of record dicts (non-dicts are skipped with a warning).

    Returns:
      ``(records, source)``: the records in order and a description of where they came from
      (the path, or "records") for titles and messages.

    Raises:
      FileNotFoundError: for a missing file.
      ValueError: for an empty file or no records.
    """
    source = metrics_path_or_records
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        return _read_jsonl(path), path
    records = []
    for i, record in enumerate(source):
        if isinstance(record, Mapping):
            records.append(dict(record))
        else:
            warnings.warn(f"record {i} is not a mapping; skipped", stacklevel=3)
    if not records:
        raise ValueError("no metric records given")
    return records, "records"


def _default_title(source: str) -> str:
    """A short title from a metrics path: its run directory's last two path components."""
    if source == "records":
        return ""
    parts = os.path.normpath(os.path.abspath(os.path.dirname(source))).split(os.sep)
    return "/".join(p for p in parts[-2:] if p)


def _series(records: list[dict[str, Any]], key: str, scale: float = 1.0) -> tuple[list, list]:
    """The (step, value) points of ``key`` in records with a numeric step and value, by step.

    Args:
      records: metric records.
      key: the value's key.
      scale: multiplier of the values.

    Returns:
      ``(steps, values)`` sorted by step.
    """
    points = []
    for r in records:
        step, value = finite_number(r.get("step")), finite_number(r.get(key))
        if step is not None and value is not None:
            points.append((step, scale * value))
    points.sort(key=lambda p: p[0])
    return [p[0] for p in points], [p[1] for p in points]


def _no_data(ax: Any, text: str) -> None:
    """Writes ``text`` in the middle of an empty panel."""
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#666666")
    ax.set_xticks([])
    ax.set_yticks([])


def _plot_losses(ax: Any, train: list[dict[str, Any]]) -> None:
    """Panel 1 of :func:`training_curves`: every loss term over steps.

    Args:
      ax: the axes.
      train: the "train" records.
    """
    keys = list(dict.fromkeys(k for r in train for k in r if "loss" in k))
    drawn = []
    for key in keys:
        steps, values = _series(train, key)
        if not steps:
            continue
        main = key == "loss"
        ax.plot(
            steps,
            values,
            label=key,
            color="black" if main else None,
            linewidth=2.0 if main else 1.2,
            zorder=3 if main else 2,
        )
        drawn.extend(values)
    if not drawn:
        _no_data(ax, "no loss values in the train records")
        return
    if min(drawn) > 0:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss" + (" (log scale)" if min(drawn) > 0 else ""))
    ax.set_title("Training losses", fontsize=11)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2 if len(keys) > 6 else 1)


def _plot_evals(ax: Any, evals: list[dict[str, Any]], split: str, metrics: Sequence[str]) -> None:
    """Panel 2 of :func:`training_curves`: eval metrics over steps, other embeddings dashed.

    Args:
      ax: the axes.
      evals: the "eval" records of ``split``.
      split: the split's name (for labels).
      metrics: the metrics to plot.
    """
    if not evals:
        _no_data(ax, f"no evaluations on the {split!r} split")
        return
    main = [r for r in evals if "embedding" not in r]
    others: dict[str, list[dict[str, Any]]] = {}
    for r in evals:
        if "embedding" in r:
            others.setdefault(str(r["embedding"]), []).append(r)
    colours = [f"C{i}" for i in range(10)]
    drawn = False
    for i, metric in enumerate(metrics):
        scale = 100.0 if is_fraction_metric(metric) else 1.0
        colour = colours[i % len(colours)]
        steps, values = _series(main, metric, scale)
        if steps:
            ax.plot(steps, values, color=colour, marker="o", markersize=4, label=metric, zorder=3)
            drawn = True
        for name, records in others.items():
            steps, values = _series(records, metric, scale)
            if steps:
                ax.plot(
                    steps,
                    values,
                    color=colour,
                    linestyle="--",
                    linewidth=1.0,
                    marker=".",
                    alpha=0.6,
                    label=f"{metric} [{shorten(name, 24)}]",
                )
                drawn = True
    if not drawn:
        _no_data(ax, f"none of {list(metrics)} recorded on the {split!r} split")
        return
    percent = all(is_fraction_metric(m) for m in metrics)
    ax.set_xlabel("step")
    ax.set_ylabel("%" if percent else "value (fractions in %)")
    ax.set_title(f"Evaluation on {split!r} (solid: main head, dashed: others)", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(ax.get_lines()) > 8 else 1)


def _epoch_axis(ax: Any, train: list[dict[str, Any]]) -> None:
    """Adds an epoch axis on top, from the step/epoch ratio of the latest train record.

    Args:
      ax: the axes (x in steps).
      train: the "train" records.
    """
    ratio = next(
        (
            epoch / step
            for r in reversed(train)
            if (step := finite_number(r.get("step"))) and (epoch := finite_number(r.get("epoch")))
        ),
        None,
    )
    if ratio is None:
        return
    top = ax.secondary_xaxis("top", functions=(lambda s: s * ratio, lambda e: e / ratio))
    top.set_xlabel("epoch", fontsize=8)
    top.tick_params(labelsize=8)


def training_curves(
    metrics_path_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    split: str = "test",
    metrics: Sequence[str] = ("recall@1", "map@r"),
    title: str | None = None,
) -> str:
    """Plots a run's losses and evaluation metrics over training steps.

    Left: every train-record key containing "loss" (``loss``, ``member1/loss``,
    ``mutual/loss``, ...; bookkeeping such as ``img_s`` or ``valid_fraction`` is left out), on
    a log scale when all values are positive. Right: ``metrics`` of the main head on ``split``
    (fractions in percent), with dashed lines for the other embeddings (records naming an
    ``embedding``: other heads, cohort members, combinations). A panel without data says so.
    The PNG is 1200 x 450 pixels (:data:`TRAINING_CURVES_PX`).

    Args:
      metrics_path_or_records: a run's ``metrics.jsonl`` or its records (see
        :func:`load_records`); malformed lines are skipped with a warning.
      path: the PNG to write.
      split: the evaluation split to plot.
      metrics: the evaluation metrics to plot.
      title: optional title (default: the run directory).

    Returns:
      ``path``.

    Raises:
      FileNotFoundError: if the metrics file does not exist.
      ValueError: if it holds no records.
    """
    records, source = load_records(metrics_path_or_records)
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval" and r.get("split") == split]
    with figure(*TRAINING_CURVES_PX, layout="constrained") as fig:
        loss_ax, eval_ax = fig.subplots(1, 2)
        if train:
            _plot_losses(loss_ax, train)
        else:
            _no_data(loss_ax, "no train records")
        _plot_evals(eval_ax, evals, split, metrics)
        drawn = [ax for ax in (loss_ax, eval_ax) if ax.get_lines()]
        if len(drawn) == 2:  # one step range for both panels
            lows, highs = zip(*(ax.get_xlim() for ax in drawn), strict=True)
            for ax in drawn:
                ax.set_xlim(min(lows), max(highs))
        for ax in drawn:
            _epoch_axis(ax, train)
        heading = title if title is not None else _default_title(source)
        if heading:
            fig.suptitle(heading, fontsize=12)
        return save_png(fig, path)


def _rho(records: list[dict[str, Any]], split: str, step: float) -> float | None:
    """The ``rho_spectrum@1`` evaluated on ``split`` at ``step``, if recorded."""
    for r in records:
        if (
            r.get("kind") == "eval"
            and r.get("split") == split
            and "embedding" not in r
            and finite_number(r.get("step")) == step
            and finite_number(r.get("rho_spectrum@1")) is not None
        ):
            return finite_number(r["rho_spectrum@1"])
    return None


def _spectrum_values(record: dict[str, Any]) -> np.ndarray | None:
    """A spectrum record's values normalised to sum 1 (non-positive ones as NaN), or None."""
    raw = record.get("spectrum")
    if not isinstance(raw, list) or not raw:
        return None
    values = np.array([finite_number(v) if finite_number(v) is not None else np.nan for v in raw])
    total = np.nansum(np.where(values > 0, values, 0.0))
    if not total > 0:
        return None
    return np.where(values > 0, values / total, np.nan)


def spectrum_plot(
    metrics_path_or_records: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    path: str | os.PathLike[str],
    *,
    split: str = "train",
    title: str | None = None,
) -> str:
    """Plots the normalised singular-value spectrum of the embeddings (semilog-y).

    The latest "spectrum" record of ``split`` (solid) and, for comparison, the first one
    (dashed) when it is from an earlier step; values are divided by their sum, as the
    spectral decay rho of Roth et al. (ICML 2020) uses them, and rho is shown when recorded.
    The PNG is 700 x 450 pixels (:data:`SPECTRUM_PX`).

    Args:
      metrics_path_or_records: a run's ``metrics.jsonl`` or its records.
      path: the PNG to write.
      split: the split whose spectra to plot.
      title: optional title (default: the run directory and split).

    Returns:
      ``path``.

    Raises:
      FileNotFoundError: if the metrics file does not exist.
      ValueError: if it holds no records, or no spectrum record of ``split``.
    """
    records, source = load_records(metrics_path_or_records)
    spectra = [
        (step, r, values)
        for r in records
        if r.get("kind") == "spectrum"
        and r.get("split") == split
        and (step := finite_number(r.get("step"))) is not None
        and (values := _spectrum_values(r)) is not None
    ]
    if not spectra:
        available = sorted({str(r.get("split")) for r in records if r.get("kind") == "spectrum"})
        raise ValueError(
            f"{source}: no 'spectrum' records for split {split!r} "
            f"(splits with spectra: {available or 'none'}; set eval.train_metrics to a "
            "rho_spectrum metric to record them)"
        )
    first = min(spectra, key=lambda s: s[0])
    latest = max(reversed(spectra), key=lambda s: s[0])  # the last record of the latest step
    shown = [(latest, "-", None)] + ([(first, "--", "#888888")] if first[0] < latest[0] else [])
    with figure(*SPECTRUM_PX) as fig:
        ax = fig.add_axes(SPECTRUM_AXES)
        for (step, record, values), style, colour in shown:
            label = f"step {step:g}"
            epoch = finite_number(record.get("epoch"))
            if epoch is not None:
                label += f", epoch {epoch:g}"
            rho = _rho(records, split, step)
            if rho is not None:
                label += f" (rho = {rho:.3f})"
            ax.semilogy(np.arange(1, len(values) + 1), values, style, color=colour, label=label)
        ax.set_xlabel("singular value index (descending)")
        ax.set_ylabel("normalised singular value")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        default = _default_title(source)
        heading = title if title is not None else f"{default} spectrum ({split} split)".strip()
        ax.set_title(heading, fontsize=11)
        return save_png(fig, path)


#: Pixel size of the plots over several runs (``jdml report``).
REPORT_PX = (770, 500)


def curves_with_bands(
    series: Sequence[tuple[str, np.ndarray, np.ndarray]],
    path: str | os.PathLike[str],
    *,
    xlabel: str,
    ylabel: str,
) -> bool:
    """One line (the mean over runs) and band (their standard deviation) per named series.

    Args:
      series: ``(label, x (T,), values (runs, T))`` each; empty ones are skipped.
      path: the PNG to write (only if something was drawn).
      xlabel, ylabel: the axis labels.

    Returns:
      Whether a curve was drawn (and the PNG written).
    """
    series = [(label, x, v) for label, x, v in series if len(x)]
    if not series:
        return False
    with figure(*REPORT_PX, layout="constrained") as fig:
        ax = fig.add_subplot()
        for label, x, values in series:
            mean, std = values.mean(0), values.std(0)
            (line,) = ax.plot(x, mean, marker="o", ms=3, label=f"{label} (n={len(values)})")
            ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        save_png(fig, path)
    return True


def spectra_comparison(
    series: Sequence[tuple[str, np.ndarray]], path: str | os.PathLike[str], *, title: str
) -> bool:
    """Normalised singular-value spectra of several experiments on one semilog-y plot.

    Args:
      series: ``(label, spectrum (D,))`` each.
      path: the PNG to write (only if something was drawn).
      title: the plot's title.

    Returns:
      Whether a spectrum was drawn (and the PNG written).
    """
    if not series:
        return False
    with figure(*REPORT_PX, layout="constrained") as fig:
        ax = fig.add_subplot()
        for label, spectrum in series:
            ax.semilogy(np.arange(1, len(spectrum) + 1), spectrum, label=label)
        ax.set_xlabel("singular value index")
        ax.set_ylabel("normalised singular value (train embeddings)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        save_png(fig, path)
    return True
