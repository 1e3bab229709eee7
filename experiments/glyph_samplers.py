"""Mini-batch samplers and rho-regularisation compared on glyphs under one budget.

Trains margin loss (distance miner) with each sampler, and R-Margin (the rho_distance miner)
with the default SPC-2 sampler, for the same epochs and seeds, in ``<out>/<row>/seed<seed>``
(finished or interrupted runs resume). Every epoch is evaluated on the test classes, and the
training embeddings' spectral decay rho and singular-value spectrum are recorded. Then builds
two reports with ``jdml.report`` (tables at the selected checkpoint and at the maximum over
epochs, mean and std over seeds, Recall@1 over epochs, spectrum plot):

* ``<out>/samplers/``: margin loss with each sampler;
* ``<out>/rho/``: margin against R-Margin, with the Recall@1 and rho of each in the spectrum
  plot's legend.

Usage: python experiments/glyph_samplers.py [--epochs 4] [--seeds 0 1 2] [--out runs/glyph_samplers]
       [--report-only]
"""

from __future__ import annotations

import argparse
import os
import time

from configs.revisiting import get_config
from jdml.report import report
from jdml.trainer import train_and_evaluate

SAMPLERS = (
    "class_random",
    "full_random",
    "greedy_coreset",
    "d2_coreset",
    "disthist_batchmatch",
    "fid_batchmatch",
)
RHO_ROW = "R-margin"
METRICS = ("recall@1", "recall@2", "map@r", "nmi")


def _rows() -> dict[str, str]:
    rows = {name: f"loss=margin,sampler={name}" for name in SAMPLERS}
    rows[RHO_ROW] = "loss=margin,miner=rho_distance"
    return rows


def _train(arg: str, seed: int, epochs: int, workdir: str) -> None:
    c = get_config(arg)
    c.seed = seed
    c.data.val_fraction = 0.0  # as the documented tables: no class held out
    c.train.epochs = epochs
    c.train.progress_bar = False
    c.eval.every_epochs = 1
    c.eval.metrics = METRICS
    start = time.perf_counter()
    train_and_evaluate(c, workdir)
    print(f"   {time.perf_counter() - start:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/glyph_samplers")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    rows = _rows()
    if not args.report_only:
        for name, arg in rows.items():
            for seed in args.seeds:
                print(f"== {name} ({arg}) seed {seed}", flush=True)
                _train(arg, seed, args.epochs, os.path.join(args.out, name, f"seed{seed}"))
    dirs = {name: os.path.join(args.out, name) for name in rows}
    samplers = report(
        [dirs[name] for name in SAMPLERS],
        os.path.join(args.out, "samplers"),
        metrics=METRICS,
        group_by="dir",
    )
    rho = report(
        [dirs["class_random"], dirs[RHO_ROW]],
        os.path.join(args.out, "rho"),
        metrics=METRICS,
        group_by="dir",
    )
    for result in (samplers, rho):
        print(result["markdown"])
        print("wrote " + ", ".join(result["files"]) + "\n")


if __name__ == "__main__":
    main()
