"""Objectives compared on glyphs under one budget: losses with their default miners, and R-Margin.

Trains each ``configs/revisiting.py:loss=<name>[,miner=<name>]`` row for the same number of
epochs and seeds in ``<out>/<row>/seed<seed>`` (resuming finished or interrupted runs), then builds
the results table from the run directories' ``results.json`` files: final-epoch test metrics on
the unseen classes, mean +- std over seeds. The table is printed and written to
``<out>/glyph_losses.md``; ``--table-only`` rebuilds it without training.

``--rows margin,R-margin`` runs and tabulates only those rows (named as in the table).
``--margin-divisor reference`` normalises the margin loss by the Revisiting reference's count of
triplets with an active term (``loss.margin.reference_pair_count``) instead of the number of
active terms; those runs go to ``<row>-refdiv`` directories and their table to
``glyph_losses-refdiv[-<rows>].md``, so the default rows' results stay untouched.

Usage: python experiments/glyph_losses.py [--epochs 2] [--seeds 0 1 2] [--out runs/glyph_losses]
           [--rows margin,R-margin] [--margin-divisor terms|reference] [--table-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

import numpy as np

from configs.revisiting import get_config
from jdml.trainer import train_and_evaluate

ROWS = (
    "loss=margin",
    "loss=triplet",
    "loss=contrastive",
    "loss=multisimilarity",
    "loss=softmax",
    "loss=proxynca",
    "loss=margin,miner=rho_distance",
)
METRICS = ("recall@1", "recall@2", "map@r", "nmi")
# The margin loss's divisors: the number of active terms (default) or the reference's count of
# triplets with an active term; the suffix keeps the latter's runs in their own directories.
DIVISORS = {"terms": "", "reference": "-refdiv"}
DIVISOR_LABELS = {"terms": "", "reference": ", reference divisor"}


def _row_name(row: str) -> str:
    """The table name of a row: the loss, prefixed with R- for the rho_distance miner."""
    c = get_config(row)
    return "R-" + c.loss.name if c.miner.name == "rho_distance" else c.loss.name


def _select_rows(names: str | None) -> tuple[str, ...]:
    """The rows named in a comma-separated list (all rows for None), in table order."""
    if names is None:
        return ROWS
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    by_name = {_row_name(row): row for row in ROWS}
    unknown = [n for n in wanted if n not in by_name]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; choose from: {', '.join(by_name)}")
    return tuple(row for row in ROWS if _row_name(row) in wanted)


def _run_dir(out: str, row: str, seed: int, divisor: str = "terms") -> str:
    name = row.replace("loss=", "").replace(",miner=", "+") + DIVISORS[divisor]
    return os.path.join(out, name, f"seed{seed}")


def _train(row: str, seed: int, epochs: int, workdir: str, divisor: str = "terms") -> None:
    c = get_config(row)
    c.seed = seed
    c.data.val_fraction = 0.0  # as the documented tables: no class held out
    c.loss.margin.reference_pair_count = divisor == "reference"
    c.train.epochs = epochs
    c.train.progress_bar = False
    c.eval.at_start = False
    c.eval.every_epochs = epochs
    c.eval.metrics = METRICS
    train_and_evaluate(c, workdir)


def _table(
    out: str,
    seeds: list[int],
    epochs: int,
    rows: tuple[str, ...] = ROWS,
    divisor: str = "terms",
) -> str:
    lines = [
        "| glyphs test, % (final epoch) | miner | " + " | ".join(METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for row in rows:
        c = get_config(row)
        values = []
        for seed in seeds:
            path = os.path.join(_run_dir(out, row, seed, divisor), "results.json")
            with open(path) as f:
                values.append(json.load(f)["final"]["test"])
        cells = []
        for m in METRICS:
            xs = 100 * np.array([v[m] for v in values])
            cells.append(f"{xs.mean():.2f} ± {xs.std(ddof=1):.2f}")
        name = _row_name(row)
        if c.loss.name == "margin":
            name += DIVISOR_LABELS[divisor]
        lines.append(f"| {name} | {c.miner.name or '-'} | " + " | ".join(cells) + " |")
    seed_list = ", ".join(map(str, seeds))
    command = shlex.join(["python", "experiments/glyph_losses.py", *sys.argv[1:]])
    return (
        "\n".join(lines)
        + f"\n\n{epochs} epochs each, seeds {seed_list} (mean ± std). Command: `{command}`\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/glyph_losses")
    parser.add_argument("--table-only", action="store_true")
    parser.add_argument("--rows", default=None, help="comma-separated table names, e.g. margin")
    parser.add_argument("--margin-divisor", choices=tuple(DIVISORS), default="terms")
    args = parser.parse_args()
    rows = _select_rows(args.rows)
    if not args.table_only:
        for row in rows:
            for seed in args.seeds:
                print(f"== {row} seed {seed} margin divisor {args.margin_divisor}", flush=True)
                workdir = _run_dir(args.out, row, seed, args.margin_divisor)
                _train(row, seed, args.epochs, workdir, args.margin_divisor)
    table = _table(args.out, args.seeds, args.epochs, rows, args.margin_divisor)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    subset = "" if args.rows is None else "-" + "_".join(map(_row_name, rows))
    name = f"glyph_losses{DIVISORS[args.margin_divisor]}{subset}.md"
    with open(os.path.join(args.out, name), "w") as f:
        f.write(table)


if __name__ == "__main__":
    main()
