"""The test classes as a second source of variance: one glyph comparison, read over seeds alone
and over seeds and classes.

Two rows, ``configs/revisiting.py:loss=contrastive`` and ``loss=triplet`` (each with its
reference miner, the distance miner), train ``--epochs`` epochs for every seed of ``--seeds``
(default 0-9), with 15 % of the training classes held out to select the checkpoint. Only the
selected checkpoint sees the test classes, and its evaluation keeps every test query's
Recall@1 hit and class (``eval.per_query``). Each finished run leaves a record
``<results>/<row>/seed<seed>.json`` (its test metrics and compressed hits, kept in the
repository); a run with a record is skipped, so the reading needs only the records.

It prints the difference contrastive - triplet in test Recall@1 three ways, at ``--level``:
the paired Student-t interval over seeds (the claim tables' reading), the percentile bootstrap
over seeds alone, and the two-way bootstrap over seeds and test classes
(:func:`jdml.statistics.two_way_bootstrap`), with each one's verdict and the widening the
classes bring.

Usage: python experiments/glyph_classes.py [--seeds 0 1 ... 9] [--epochs 2]
           [--out runs/glyph_classes] [--results experiments/results/glyph-classes]
           [--report-only]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

from configs.revisiting import get_config
from jdml.evaluation.per_query import paired_differences
from jdml.fileio import atomic_write
from jdml.statistics import Paired, paired, two_way_bootstrap
from jdml.trainer import train_and_evaluate

ROWS = {"contrastive": "loss=contrastive", "triplet": "loss=triplet"}
METRICS = ("recall@1", "map@r")


def train(row: str, seed: int, args: argparse.Namespace) -> None:
    """Trains one run unless its record exists, then writes the record."""
    record = os.path.join(args.results, row, f"seed{seed}.json")
    if os.path.exists(record):
        return
    c = get_config(ROWS[row])
    with c.unlocked():
        c.seed = seed
        c.data.val_fraction = 0.15
        c.train.epochs = args.epochs
        c.train.progress_bar = False
        c.eval.at_start = False
        c.eval.every_epochs = 1
        c.eval.splits = ()  # validation only; the test split sees the selected checkpoint
        c.eval.selected_splits = ("test",)
        c.eval.metrics = METRICS
        c.eval.train_metrics = ()
        c.eval.per_query = ("recall@1",)
    workdir = os.path.join(args.out, row, f"seed{seed}")
    print(f"== {row} seed {seed}", flush=True)
    start = time.perf_counter()
    train_and_evaluate(c, workdir)
    [path] = sorted(glob.glob(os.path.join(workdir, "eval_best_step*.json")))[-1:]
    with open(path) as f:
        evaluation = json.load(f)
    kept = {
        "row": row,
        "seed": seed,
        "epochs": args.epochs,
        "meta": evaluation["meta"],
        "results": evaluation["results"],
        "per_query": evaluation["per_query"],
    }
    os.makedirs(os.path.dirname(record), exist_ok=True)
    atomic_write(record, json.dumps(kept, indent=1) + "\n")
    r1 = 100 * kept["results"]["test"]["recall@1"]
    print(f"   {time.perf_counter() - start:.0f} s, test R@1 {r1:.2f}", flush=True)


def records(results: str, row: str, seeds: list[int]) -> dict[int, dict]:
    """The row's records of ``seeds`` that exist."""
    out = {}
    for seed in seeds:
        path = os.path.join(results, row, f"seed{seed}.json")
        if os.path.exists(path):
            with open(path) as f:
                out[seed] = json.load(f)
    return out


def readings(results: str, seeds: list[int], level: float) -> list[tuple[str, Paired]]:
    """contrastive - triplet in test Recall@1 over the seeds both rows have: the paired
    Student-t interval, the bootstrap over seeds, and the bootstrap over seeds and classes."""
    a, b = records(results, "contrastive", seeds), records(results, "triplet", seeds)
    common = sorted(set(a) & set(b))
    if len(common) < 2:
        raise SystemExit(f"error: {results} has {len(common)} seed(s) of both rows; train more")
    t = paired(
        [a[s]["results"]["test"]["recall@1"] for s in common],
        [b[s]["results"]["test"]["recall@1"] for s in common],
        level,
    )
    d, classes, _ = paired_differences(
        {s: a[s]["per_query"]["test"] for s in common},
        {s: b[s]["per_query"]["test"] for s in common},
        (None, None),  # each row's main head
    )
    return [
        ("Student-t over seeds (classes fixed)", t),
        (
            "bootstrap over seeds (classes fixed)",
            two_way_bootstrap(d, classes, level, over_classes=False),
        ),
        ("bootstrap over seeds and test classes", two_way_bootstrap(d, classes, level)),
    ]


def report(results: str, seeds: list[int], level: float) -> str:
    """The reading as a Markdown table, and a sentence on what the classes change."""
    found = readings(results, seeds, level)
    n = found[0][1].n
    lines = [
        f"| contrastive - triplet, glyphs test Recall@1, {n} seeds | Δ [{100 * level:g} % interval]"
        " | width | verdict |",
        "|---|---|---|---|",
    ]
    for name, d in found:
        width = 100 * (d.high - d.low)
        lines.append(f"| {name} | {d.cell()} | {width:.2f} | {d.verdict()} |")
    t, seeds_only, both = (d for _, d in found)
    ratio = (both.high - both.low) / (seeds_only.high - seeds_only.low)
    to_t = (both.high - both.low) / (t.high - t.low)
    same = "keeps" if both.verdict() == seeds_only.verdict() else "changes"
    return (
        "\n".join(lines)
        + f"\n\nCounting the test classes widens the bootstrap interval {ratio:.2f} times and "
        f"{same} its verdict ({seeds_only.verdict()} over seeds alone, {both.verdict()} over "
        f"seeds and classes). The two-way interval is {to_t:.2f} "
        f"times as wide as the Student-t interval of the claim tables' reading "
        f"({t.verdict()}).\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--level", type=float, default=0.95)
    parser.add_argument("--out", default="runs/glyph_classes")
    parser.add_argument("--results", default="experiments/results/glyph-classes")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    if not args.report_only:
        for seed in args.seeds:  # both rows of a seed before the next seed: a paired table fills
            for row in ROWS:
                train(row, seed, args)
    print(report(args.results, args.seeds, args.level), end="")


if __name__ == "__main__":
    main()
