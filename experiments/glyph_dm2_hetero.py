"""DM2 with heterogeneous members on glyphs (the DM2 paper's Table 5 setting, other networks
per member): a cohort of three different networks, mutual learning against the same three
trained independently.

The members (``cohort.members``) are the small glyph member of ``experiments/glyph_dm2.py`` (half
width, 64-d), the full-width glyph network (128-d), and a deeper half-width network (two blocks
per stage, 32-d). Rows: Independent (lambda = 0: the three train side by side, each equal to
its own run), MD+VD (mutual learning with own initialisations and augmentations) and MD+TD+VD
(DM2). Triplet loss with distance-weighted sampling, lambda = 20 warmed up over the first
epoch, ``--epochs`` epochs, seeds 0, 1, 2, test split, in ``<out>/<row>/seed<seed>``
(finished or interrupted runs resume).

Writes ``<out>/table.md`` and prints it.

Usage: python experiments/glyph_dm2_hetero.py [--epochs 3] [--seeds 0 1 2]
       [--out runs/glyph_dm2_hetero] [--steps N (a smoke run: N steps per epoch)] [--report-only]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from glyph_dm2 import METRICS
from glyph_dm2 import _config as dm2_config

from jdml.errors import ReportError
from jdml.report import find_runs, format_cell, load_run, summarize_group
from jdml.trainer import atomic_write, train_and_evaluate

MEMBERS = {
    "small (half width, 64-d)": "",
    "full width, 128-d": "model.small_resnet.stem_features=32;"
    "model.small_resnet.stage_features=(32,64,128);model.embed_dim=128",
    "deeper (2 blocks per stage, 32-d)": "model.small_resnet.stage_blocks=(2,2,2);"
    "model.embed_dim=32",
}
ROWS = {"Independent": "independent", "MD+VD": "md+vd", "MD+TD+VD (DM2)": "md+td+vd"}


def _config(diversity: str, seed: int, epochs: int, steps: int = 0) -> ml_collections.ConfigDict:
    """``experiments/glyph_dm2.py``'s cohort config with the three networks as its members."""
    c = dm2_config(diversity, len(MEMBERS), seed, epochs, steps)
    with c.unlocked():
        c.cohort.members = tuple(MEMBERS.values())
    return c


def _values(out: str, diversity: str, embedding: str | None) -> dict[str, list]:
    """Per metric, the values over seeds (empty for an experiment not run yet)."""
    folder = os.path.join(out, diversity)
    if not os.path.isdir(folder):
        return {}
    runs = []
    for workdir in find_runs([folder]):
        try:
            runs.append(load_run(workdir, embedding))
        except ReportError:  # still training: no evaluation yet
            continue
    return summarize_group(diversity, runs, "test").values["best"] if runs else {}


def _table(out: str, epochs: int) -> str:
    ensemble = "concat:" + ",".join(["1"] * len(MEMBERS))
    header = ["row", *(f"{m} R@1" for m in MEMBERS), "ensemble R@1", "ensemble MAP@R"]
    header.append("ensemble NMI")
    lines = [f"## DM2 with three different networks ({epochs} epochs, glyphs test)", ""]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, diversity in ROWS.items():
        cells = []
        for i in range(len(MEMBERS)):
            member = _values(out, diversity, None if i == 0 else f"member{i + 1}")
            cells.append(format_cell(member.get("recall@1", []), "recall@1"))
        ens = _values(out, diversity, ensemble)
        cells += [format_cell(ens.get(m, []), m) for m in METRICS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\nMean ± std over seeds; the ensemble concatenates the members.\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/glyph_dm2_hetero")
    parser.add_argument("--steps", type=int, default=0, help="steps per epoch (0: full epochs)")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if not args.report_only:
        for seed in args.seeds:  # seed-major: every row has a first seed early
            for diversity in ROWS.values():
                print(f"== {diversity} seed {seed}", flush=True)
                start = time.perf_counter()
                config = _config(diversity, seed, args.epochs, args.steps)
                train_and_evaluate(config, os.path.join(args.out, diversity, f"seed{seed}"))
                print(f"   {time.perf_counter() - start:.0f} s", flush=True)
    table = _table(args.out, args.epochs)
    print(table)
    os.makedirs(args.out, exist_ok=True)
    atomic_write(os.path.join(args.out, "table.md"), table)


if __name__ == "__main__":
    main()
