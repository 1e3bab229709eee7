"""The ``jdml`` command: ``jdml report RUN_DIR... [--out DIR]`` (also ``python -m jdml``).

Training and checkpoint evaluation are ``train.py`` and ``eval.py``; this command works on the
run directories they write.
"""

from __future__ import annotations

import argparse
import logging
import sys


def _report(args: argparse.Namespace) -> None:
    from jdml.report import report

    result = report(
        args.paths,
        args.out,
        split=args.split,
        metrics=args.metrics,
        group_by=args.group_by,
        curve_metric=args.curve_metric,
        embedding=args.embedding,
    )
    print(result["markdown"])
    for name, workdirs in result["experiments"].items():
        print(f"{name}: {len(workdirs)} run(s)")
    print("wrote " + ", ".join(result["files"]))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="jdml", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "report",
        help="tables (Markdown, CSV) and plots over training runs, mean and std over seeds",
        description="Collects run directories into the Revisiting paper's protocol: per metric "
        "the value at the selected checkpoint and the maximum over epochs, rho on the training "
        "set at the best epoch, mean and std over seeds; plots the selection metric over epochs "
        "and the training embeddings' singular-value spectrum.",
    )
    r.add_argument("paths", nargs="+", help="run directories, or directories holding them")
    r.add_argument("--out", help="output directory (default: <common parent>/report)")
    r.add_argument("--split", default="test", help="split to report (default: test)")
    r.add_argument("--metrics", nargs="+", help="metric columns (default: all evaluated)")
    r.add_argument(
        "--group-by",
        choices=("config", "dir"),
        default="config",
        help="experiments = configs equal up to the seed (default), or parent directories",
    )
    r.add_argument("--curve-metric", default="recall@1", help="metric plotted over epochs")
    r.add_argument(
        "--embedding",
        help="multi-head runs: report this head or concatenation (e.g. concat:0.5,1,1,1) "
        "instead of the main head; the checkpoint is still selected on the main head",
    )
    r.set_defaults(func=_report)
    return p


def main(argv: list[str] | None = None) -> None:
    from jdml.cli import known_errors
    from jdml.report import ReportError

    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        args.func(args)
    except (ReportError, *known_errors()) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
