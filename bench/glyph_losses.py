"""Objectives compared on glyphs under one budget: losses with their default miners, and R-Margin.

Trains each ``configs/revisiting.py:loss=<name>[,miner=<name>]`` row for the same number of
epochs and seeds in ``<out>/<row>/seed<seed>`` (resuming finished or interrupted runs), then builds
the results table from the run directories' ``results.json`` files: final-epoch test metrics on
the unseen classes, mean +- std over seeds. The table is printed and written to
``<out>/glyph_losses.md``; ``--table-only`` rebuilds it without training.

Usage: python bench/glyph_losses.py [--epochs 2] [--seeds 0 1 2] [--out runs/glyph_losses]
"""

from __future__ import annotations

import argparse
import json
import os

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


def _run_dir(out: str, row: str, seed: int) -> str:
    return os.path.join(out, row.replace("loss=", "").replace(",miner=", "+"), f"seed{seed}")


def _train(row: str, seed: int, epochs: int, workdir: str) -> None:
    c = get_config(row)
    c.seed = seed
    c.train.epochs = epochs
    c.train.progress_bar = False
    c.eval.at_start = False
    c.eval.every_epochs = epochs
    c.eval.metrics = METRICS
    train_and_evaluate(c, workdir)


def _table(out: str, seeds: list[int], epochs: int) -> str:
    lines = [
        "| glyphs test, % (final epoch) | miner | " + " | ".join(METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for row in ROWS:
        c = get_config(row)
        values = []
        for seed in seeds:
            path = os.path.join(_run_dir(out, row, seed), "results.json")
            with open(path) as f:
                values.append(json.load(f)["final"]["test"])
        cells = []
        for m in METRICS:
            xs = 100 * np.array([v[m] for v in values])
            cells.append(f"{xs.mean():.2f} ± {xs.std():.2f}")
        name = "R-" + c.loss.name if c.miner.name == "rho_distance" else c.loss.name
        lines.append(f"| {name} | {c.miner.name or '-'} | " + " | ".join(cells) + " |")
    seed_list = ", ".join(map(str, seeds))
    return "\n".join(lines) + f"\n\n{epochs} epochs each, seeds {seed_list} (mean ± std).\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/glyph_losses")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    if not args.table_only:
        for row in ROWS:
            for seed in args.seeds:
                print(f"== {row} seed {seed}", flush=True)
                _train(row, seed, args.epochs, _run_dir(args.out, row, seed))
    table = _table(args.out, args.seeds, args.epochs)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "glyph_losses.md"), "w") as f:
        f.write(table)


if __name__ == "__main__":
    main()
