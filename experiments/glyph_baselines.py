"""The glyph results of docs/glyph_results.md: the trained baseline against raw pixels and the
untrained network.

For each seed, trains the default config (``configs/revisiting.py``: margin loss, distance
miner, SPC-2) in ``<out>/seed<seed>`` (resuming if interrupted), and reports on the unseen test
classes:

* ``raw pixels``: kNN on the flattened pixel vectors (no learning at all);
* ``untrained``: the randomly initialised network of that seed (evaluated at step 0);
* ``trained (final)``: the network after the last epoch;
* ``trained (best)``: the best epoch by test Recall@1 (the reference's test-set selection, shown
  for comparison with published numbers; optimistic by construction).

Prints a Markdown table of mean +- std over the seeds and writes it, with every per-seed value,
to ``<out>/glyph_baselines.md`` and ``.json``.

``--set KEY=VALUE`` (repeatable) changes the config of every run, e.g. ``--set
model.dtype=bfloat16 --out runs/glyph_bf16`` for a bfloat16 row.

Usage: python experiments/glyph_baselines.py [--seeds 0 1 2] [--out runs/glyph_baselines]
       [--set K=V]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from configs.revisiting import get_config
from jdml.config import apply_overrides
from jdml.data.loading import load_splits
from jdml.errors import ConfigError
from jdml.evaluation.splits import evaluate_raw_pixels
from jdml.trainer import train_and_evaluate

METRICS = ("recall@1", "recall@2", "recall@4", "recall@8", "map@r", "map@c", "nmi")


def _row(name: str, values: list[dict[str, float]]) -> str:
    cells = []
    for m in METRICS:
        xs = 100 * np.array([v[m] for v in values])
        cells.append(f"{xs.mean():.2f} ± {xs.std(ddof=1):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}")
    return f"| {name} | " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/glyph_baselines")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()

    def config_of_run():
        try:
            return apply_overrides(get_config(), args.set)
        except ConfigError as e:
            raise SystemExit(f"error: {e}") from None

    config = config_of_run()
    os.makedirs(args.out, exist_ok=True)
    rows: dict[str, list[dict[str, float]]] = {
        "raw pixels": [],
        "untrained network": [],
        "trained, final epoch": [],
        "trained, best epoch (test-selected)": [],
    }
    splits = load_splits(config.data)
    for seed in args.seeds:
        rows["raw pixels"].append(
            evaluate_raw_pixels({"test": splits["test"]}, config.eval, seed=seed)["test"]
        )
    for seed in args.seeds:
        c = config_of_run()
        c.seed = seed
        c.data.val_fraction = 0.0  # as the documented tables: no class held out
        summary = train_and_evaluate(c, os.path.join(args.out, f"seed{seed}"))
        rows["untrained network"].append(summary["untrained"]["test"])
        rows["trained, final epoch"].append(summary["final"]["test"])
        rows["trained, best epoch (test-selected)"].append(summary["best"]["test"])

    header = "| glyphs test (unseen classes), % | " + " | ".join(METRICS) + " |"
    lines = [header, "|" + "---|" * (len(METRICS) + 1)]
    lines += [_row(name, values) for name, values in rows.items()]
    seeds = ", ".join(map(str, args.seeds))
    table = "\n".join(lines) + f"\n\nmean ± std over seeds {seeds}; {config.train.epochs} epochs.\n"
    print(table)
    with open(os.path.join(args.out, "glyph_baselines.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "glyph_baselines.json"), "w") as f:
        json.dump({"seeds": args.seeds, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
