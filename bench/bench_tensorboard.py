"""What TensorBoard logging costs a training step (``train.tensorboard``).

Trains the default glyph run for one epoch twice in this process, alternating, with
``train.tensorboard`` on and off (everything else equal: the same records go to metrics.jsonl),
and prints the wall time per step of each and the difference (compilation and evaluation
included, so run-to-run noise dominates it). Then times the writer alone on that run's own
records, to give the cost per step without that noise, and the pictures each evaluation adds
(the spectrum, and the retrieval grid of the test split), against the time of one epoch.

Usage: python bench/bench_tensorboard.py [--rounds 2] [--log-every 50]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from configs.revisiting import get_config
from jdml.data.loading import load_splits
from jdml.fileio import read_jsonl
from jdml.metric_writer import MetricWriter
from jdml.trainer import _retrieval_image, _spectrum_image, train_and_evaluate


def _train(tensorboard: bool, log_every: int, folder: str) -> tuple[float, int, str]:
    c = get_config()
    with c.unlocked():
        c.train.epochs = 1
        c.train.progress_bar = False
        c.train.tensorboard = tensorboard
        c.train.log_every_steps = log_every
        c.eval.at_start = False
    workdir = tempfile.mkdtemp(dir=folder)
    start = time.perf_counter()
    train_and_evaluate(c, workdir)
    seconds = time.perf_counter() - start
    steps = max(r["step"] for r in read_jsonl(os.path.join(workdir, "metrics.jsonl")))
    return seconds, steps, workdir


def _writer_cost(records: list[dict], tensorboard: bool, folder: str, repeats: int) -> float:
    """Seconds to write ``records`` ``repeats`` times."""
    writer = MetricWriter(os.path.join(tempfile.mkdtemp(dir=folder), "metrics.jsonl"), None,
                          tensorboard=tensorboard)  # fmt: skip
    start = time.perf_counter()
    for i in range(repeats):
        for record in records:
            writer.write({**record, "step": record["step"] + i * 10_000})
    writer.close()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--log-every", type=int, default=50, help="train.log_every_steps")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        times = {True: [], False: []}
        workdir = ""
        for _ in range(args.rounds):
            for tensorboard in (False, True):
                seconds, steps, workdir = _train(tensorboard, args.log_every, folder)
                times[tensorboard].append(seconds / steps * 1e3)
        records = read_jsonl(os.path.join(workdir, "metrics.jsonl"))
        repeats = 50
        writer = MetricWriter(os.path.join(workdir, "metrics.jsonl"), enabled=False)
        _spectrum_image(writer, "train")  # matplotlib's first figure
        start = time.perf_counter()
        for _ in range(5):
            _spectrum_image(writer, "train")
        picture_ms = (time.perf_counter() - start) / 5 * 1e3
        test = load_splits(get_config().data)["test"]
        embeddings = np.random.default_rng(0).standard_normal((len(test), 128), np.float32)
        start = time.perf_counter()
        for _ in range(5):
            _retrieval_image(test, embeddings, "euclidean")
        grid_ms = (time.perf_counter() - start) / 5 * 1e3
        with_tb = _writer_cost(records, True, folder, repeats)
        without = _writer_cost(records, False, folder, repeats)
    on, off = float(np.median(times[True])), float(np.median(times[False]))
    extra_ms = (with_tb - without) / repeats * 1e3  # TensorBoard's cost for one run's records
    print(f"default glyph run, 1 epoch of {steps} steps, log every {args.log_every} steps, "
          f"median of {args.rounds} runs each")  # fmt: skip
    print(f"  whole run, ms per step: tensorboard off {off:.2f}, on {on:.2f} "
          f"({100 * (on / off - 1):+.2f}%, includes run-to-run noise)")  # fmt: skip
    print(f"  writer alone: the run's {len(records)} records cost {extra_ms:.2f} ms more with "
          f"TensorBoard, {extra_ms / steps:.4f} ms per step = "
          f"{100 * extra_ms / steps / off:.3f}% of a step")  # fmt: skip
    print(f"  spectrum picture: {picture_ms:.0f} ms per evaluation of a split that records it, "
          f"{100 * picture_ms / (steps * off):.2f}% of an epoch")  # fmt: skip
    print(f"  retrieval grid: {grid_ms:.0f} ms per evaluated split ({len(test)} test images), "
          f"{100 * grid_ms / (steps * off):.2f}% of an epoch")  # fmt: skip


if __name__ == "__main__":
    main()
