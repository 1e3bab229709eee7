"""DM2 on glyphs: the paper's Table 1 (diversities) and Fig. 2 (cohort size) under one budget.

Small members (the glyph network at half width, 64-d embeddings; triplet loss with distance
weighted sampling, the paper's default) train ``--epochs`` epochs each, lambda = 20 warmed up
over the first epoch, in ``<out>/<row>/seed<seed>`` (finished or interrupted runs resume):

* Table 1, cohorts of 4: Independent (lambda = 0, each member its own init and augmentations),
  MD, MD+TD, MD+VD, MD+TD+VD (DM2): Recall@1 of every member and the ensemble (concatenation),
  MAP@R and NMI of member 1 and the ensemble, member 1's train rho;
* Fig. 2, cohort sizes 1-4: member 1 and the ensemble of DM2, and the ensemble of independent
  members, with the size-4 points from Table 1.

Writes ``<out>/table1.md``, ``<out>/cohort_size.md`` and ``<out>/cohort_size.png`` and prints
the tables.

Usage: python experiments/glyph_dm2.py [--epochs 3] [--seeds 0 1 2] [--out runs/glyph_dm2]
       [--steps N (a smoke run: N steps per epoch)] [--report-only]
       [--mutual-weight LAMBDA --table1-only (a lambda probe: Table 1's rows only)]
"""

from __future__ import annotations

import argparse
import os
import time

import ml_collections
import numpy as np

from configs.dm2 import get_config
from jdml.errors import ReportError
from jdml.report import find_runs, format_cell, load_run, summarize_group
from jdml.trainer import atomic_write, train_and_evaluate

METRICS = ("recall@1", "map@r", "nmi")
SIZE = 4
TABLE1 = {
    "Independent": "independent",
    "MD": "md",
    "MD+TD": "md+td",
    "MD+VD": "md+vd",
    "MD+TD+VD (DM2)": "md+td+vd",
}
SMALL_MEMBER = {
    "model.small_resnet.stem_features": 16,
    "model.small_resnet.stage_features": (16, 32, 64),
    "model.embed_dim": 64,
}


def _config(
    diversity: str,
    size: int,
    seed: int,
    epochs: int,
    steps: int = 0,
    mutual_weight: float | None = None,
) -> ml_collections.ConfigDict:
    c = get_config(f"diversity={diversity},size={size}")
    with c.unlocked():
        # independent rows keep 0; a single model (size 1) exchanges nothing
        if mutual_weight is not None and size > 1 and c.exchange.dm2.mutual_weight:
            c.exchange.dm2.mutual_weight = mutual_weight
        for key, value in SMALL_MEMBER.items():
            section, name = key.split(".")
            c[section][name] = value
        c.seed = seed
        c.data.val_fraction = 0.0  # as the documented tables: no class held out
        c.train.epochs = epochs
        c.train.steps_per_epoch = steps
        c.train.progress_bar = False
        c.eval.every_epochs = epochs  # the final epoch only
        c.eval.at_start = False
        c.eval.metrics = METRICS
    return c


def _workdir(out: str, diversity: str, size: int, seed: int) -> str:
    return os.path.join(out, f"{diversity}_L{size}", f"seed{seed}")


def _runs(table1_only: bool = False) -> list[tuple[str, int]]:
    """(diversity, size) of every experiment: Table 1, then the smaller cohorts of Fig. 2."""
    rows = [(d, SIZE) for d in TABLE1.values()]
    if table1_only:
        return rows
    rows += [("md+td+vd", 1)]  # one model: no cohort, the same for every diversity
    rows += [(d, size) for size in range(2, SIZE) for d in ("md+td+vd", "independent")]
    return rows


def _values(out: str, diversity: str, size: int, embedding: str | None) -> dict[str, list]:
    """Per metric, the values over seeds (empty lists for an experiment not run yet)."""
    folder = os.path.join(out, f"{diversity}_L{size}")
    if not os.path.isdir(folder):
        return {"rho": []}
    runs = []
    for workdir in find_runs([folder]):
        try:
            runs.append(load_run(workdir, embedding))
        except ReportError:  # still training: no evaluation yet
            continue
    if not runs:
        return {"rho": []}
    summary = summarize_group(diversity, runs, "test")
    return {**summary.values["best"], "rho": summary.values["rho"].get("rho_spectrum@1", [])}


def _ensemble(size: int) -> str | None:
    return "concat:" + ",".join(["1"] * size) if size > 1 else None


def _table1(out: str, epochs: int) -> str:
    members = [f"member {i} R@1" for i in range(1, SIZE + 1)]
    header = ["row", *members, "ensemble R@1", "member 1 MAP@R", "ensemble MAP@R"]
    header += ["member 1 NMI", "ensemble NMI", "member 1 rho (train)"]
    lines = [f"## DM2 diversities, cohorts of {SIZE} ({epochs} epochs, glyphs test)", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, diversity in TABLE1.items():
        first = _values(out, diversity, SIZE, None)
        cells = [format_cell(first.get("recall@1", []), "recall@1")]
        for i in range(2, SIZE + 1):
            other = _values(out, diversity, SIZE, f"member{i}")
            cells.append(format_cell(other.get("recall@1", []), "recall@1"))
        ens = _values(out, diversity, SIZE, _ensemble(SIZE))
        cells.append(format_cell(ens.get("recall@1", []), "recall@1"))
        for metric in ("map@r", "nmi"):
            cells += [format_cell(first.get(metric, []), metric)]
            cells += [format_cell(ens.get(metric, []), metric)]
        cells.append(format_cell(first["rho"], "rho_spectrum@1"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nMean ± std over seeds; the ensemble concatenates the members.\n"


def _cohort_size(out: str, epochs: int) -> tuple[str, dict[str, list[tuple[int, list]]]]:
    curves: dict[str, list[tuple[int, list]]] = {
        "DM2 member 1": [],
        "DM2 ensemble": [],
        "independent ensemble": [],
    }
    for size in range(1, SIZE + 1):
        dm2 = "md+td+vd"
        curves["DM2 member 1"].append((size, _values(out, dm2, size, None).get("recall@1", [])))
        if size == 1:
            single = curves["DM2 member 1"][-1][1]
            curves["DM2 ensemble"].append((1, single))
            curves["independent ensemble"].append((1, single))
            continue
        ens = _ensemble(size)
        curves["DM2 ensemble"].append((size, _values(out, dm2, size, ens).get("recall@1", [])))
        ind = _values(out, "independent", size, ens).get("recall@1", [])
        curves["independent ensemble"].append((size, ind))
    header = ["cohort size", *curves]
    lines = [f"## DM2 Recall@1 against cohort size ({epochs} epochs, glyphs test)", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i in range(SIZE):
        cells = [format_cell(curve[i][1], "recall@1") for curve in curves.values()]
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nSize 1 is one model (no cohort).\n", curves


def _plot(curves: dict[str, list[tuple[int, list]]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    for name, points in curves.items():
        points = [(size, 100 * np.asarray(v)) for size, v in points if len(v)]
        if not points:
            continue
        sizes = [p[0] for p in points]
        mean = np.array([v.mean() for _, v in points])
        std = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for _, v in points])
        (line,) = ax.plot(sizes, mean, marker="o", label=name)
        ax.fill_between(sizes, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    ax.set_xlabel("cohort size")
    ax.set_ylabel("Recall@1 (test, %)")
    ax.set_xticks(range(1, SIZE + 1))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/glyph_dm2")
    parser.add_argument("--steps", type=int, default=0, help="steps per epoch (0: full epochs)")
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument(
        "--mutual-weight", type=float, default=None, help="lambda (default: the config's 20)"
    )
    parser.add_argument("--table1-only", action="store_true", help="skip Fig. 2's cohorts")
    args = parser.parse_args()
    if not args.report_only:
        for seed in args.seeds:  # seed-major: every experiment has a first seed early
            for diversity, size in _runs(args.table1_only):
                print(f"== {diversity} L={size} seed {seed}", flush=True)
                start = time.perf_counter()
                config = _config(diversity, size, seed, args.epochs, args.steps, args.mutual_weight)
                train_and_evaluate(config, _workdir(args.out, diversity, size, seed))
                print(f"   {time.perf_counter() - start:.0f} s", flush=True)
    table = _table1(args.out, args.epochs)
    sizes, curves = _cohort_size(args.out, args.epochs)
    print(table)
    print(sizes)
    os.makedirs(args.out, exist_ok=True)
    atomic_write(os.path.join(args.out, "table1.md"), table)
    atomic_write(os.path.join(args.out, "cohort_size.md"), sizes)
    _plot(curves, os.path.join(args.out, "cohort_size.png"))


if __name__ == "__main__":
    main()
