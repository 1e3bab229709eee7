"""DiVA and Sharing Matters ablations on glyphs under one budget, at a matched embedding size.

DiVA (the paper's Tables 2 and 4): the margin baseline with one head of the total dimension,
then discriminative (D) with class-shared (S), intra-class (I) and DaNCE (Da) heads, each
variant splitting the same total dimension over its heads, and DiVA without decorrelation.
Sharing Matters (its Table 7a): class head only, shared head only, both, both decorrelated.

Each row trains ``--seeds`` runs of ``--epochs`` epochs in ``<out>/<row>/seed<seed>`` (finished or
interrupted runs resume). Multi-head rows are reported on their main head and on the equally
weighted concatenation of their heads; the checkpoint is selected on the main head.
Writes ``<out>/diva.md`` and ``<out>/sharing.md`` (the main head and the concatenation at the
checkpoint selected on the main head, mean ± std over seeds, and the main head's train rho) and
prints them.

Usage: python experiments/glyph_diva.py [--epochs 4] [--seeds 0 1 2] [--out runs/glyph_diva]
       [--only diva|sharing] [--report-only]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import ml_collections

from configs.diva import ablation_config, split_embedding
from configs.revisiting import get_config as revisiting_config
from configs.sharing import get_config as sharing_config
from jdml.evaluation.splits import combination_name
from jdml.report import find_runs, format_cell, load_run, summarize_group
from jdml.trainer import atomic_write, train_and_evaluate

TOTAL_DIM = 512
METRICS = ("recall@1", "map@r", "nmi")


def _diva(
    keep: tuple[str, ...], decorrelate: bool = True
) -> Callable[[], ml_collections.ConfigDict]:
    return lambda: ablation_config("glyphs", keep, decorrelate=decorrelate, total_dim=TOTAL_DIM)


def _margin(miner: str = "distance", spc: int = 2) -> Callable[[], ml_collections.ConfigDict]:
    def build() -> ml_collections.ConfigDict:
        c = revisiting_config(f"loss=margin,miner={miner}")
        c.sampler.samples_per_class = spc
        c.model.embed_dim = TOTAL_DIM
        return c

    return build


def _sharing(decorrelate: bool) -> Callable[[], ml_collections.ConfigDict]:
    def build() -> ml_collections.ConfigDict:
        c = sharing_config()
        if not decorrelate:
            c.decorrelation.pairs, c.decorrelation.weights = (), ()
        split_embedding(c, TOTAL_DIM)
        return c

    return build


DIVA_ROWS = {
    "margin (one head)": _margin(),
    "D+S": _diva(("shared",)),
    "D+I": _diva(("intra",)),
    "D+Da": _diva(("selfsimilarity",)),
    "DiVA (D+Da+S+I)": _diva(("selfsimilarity", "shared", "intra")),
    "DiVA without decorrelation": _diva(("selfsimilarity", "shared", "intra"), decorrelate=False),
}
SHARING_ROWS = {
    "class only": _margin(spc=4),
    "shared only": _margin("shared_neg_distance", spc=4),
    "class + shared": _sharing(decorrelate=False),
    "class + shared, decorrelated": _sharing(decorrelate=True),
}


def _dirname(row: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "+-" else "_" for ch in row)


def _train(build: Callable[[], ml_collections.ConfigDict], seed: int, epochs: int, workdir: str):
    c = build()
    c.seed = seed
    c.data.val_fraction = 0.0  # as the documented tables: no class held out
    c.train.epochs = epochs
    c.train.progress_bar = False
    c.eval.every_epochs = epochs  # the final epoch only: evaluating every head is the cost here
    c.eval.at_start = False
    c.eval.metrics = METRICS
    start = time.perf_counter()
    train_and_evaluate(c, workdir)
    print(f"   {time.perf_counter() - start:.0f} s", flush=True)


def _table(rows: dict, out: str, title: str) -> str:
    """Per row: the main head and the equal-weight concatenation (multi-head rows) at the
    checkpoint selected on the main head, mean ± std over seeds, and the main head's train rho."""
    header = ["row", "seeds"]
    header += [f"main head {m}" for m in METRICS] + [f"concat {m}" for m in METRICS]
    lines = [f"## {title}", "", "| " + " | ".join(header) + " | rho (main head, train) |"]
    lines.append("|" + "---|" * (len(header) + 1))
    for row, build in rows.items():
        c = build()
        workdirs = find_runs([os.path.join(out, _dirname(row))])
        main = summarize_group(row, [load_run(w) for w in workdirs], "test")
        cells = [format_cell(main.values["best"].get(m, []), m) for m in METRICS]
        if c.eval.combinations:
            embedding = combination_name(c.eval.combinations[0])
            concat = summarize_group(row, [load_run(w, embedding) for w in workdirs], "test")
            cells += [format_cell(concat.values["best"].get(m, []), m) for m in METRICS]
        else:
            cells += ["-"] * len(METRICS)
        cells.append(format_cell(main.values["rho"].get("rho_spectrum@1", []), "rho_spectrum@1"))
        lines.append(f"| {row} | {len(workdirs)} | " + " | ".join(cells) + " |")
    note = (
        "Test split, checkpoint selected on the main head's test Recall@1; rho is the main "
        "head's spectral decay on the training set, which depends on the head's dimension "
        "(here at most 129 of its singular values are non-zero: every head is linear in the "
        "128-d backbone feature), so it compares rows of equal head size only."
    )
    return "\n".join(lines) + "\n\n" + note + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/glyph_diva")
    parser.add_argument("--only", choices=("diva", "sharing"))
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    groups = {"diva": (DIVA_ROWS, "DiVA ablations"), "sharing": (SHARING_ROWS, "Sharing Matters")}
    if args.only:
        groups = {args.only: groups[args.only]}
    for name, (rows, title) in groups.items():
        if not args.report_only:
            for row, build in rows.items():
                for seed in args.seeds:
                    print(f"== {row} seed {seed}", flush=True)
                    workdir = os.path.join(args.out, _dirname(row), f"seed{seed}")
                    _train(build, seed, args.epochs, workdir)
        text = _table(rows, args.out, f"{title} ({args.epochs} epochs, glyphs test)")
        print(text)
        os.makedirs(args.out, exist_ok=True)
        atomic_write(os.path.join(args.out, f"{name}.md"), text)


if __name__ == "__main__":
    main()
