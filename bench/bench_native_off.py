"""What switching the native CPU kernels off costs (``JDML_CONV``, ``JDML_KNN``,
``JDML_KMEANS`` at ``auto``, the native kernels where the library builds, against ``xla``).

Times, in one process, alternating the two modes round after round (``alternating_rounds``)
so that changes in machine load affect them alike:

* ``eval``: the quick start's evaluation (``configs/revisiting.py``: ``eval.metrics`` on the
  glyph test split, k-means++), :func:`jdml.evaluation.embeddings.evaluate_embeddings` of the
  untrained network's test embeddings, with the backends ``JDML_KNN`` and ``JDML_KMEANS`` at
  the mode resolve to (:func:`jdml.backends.resolve_backends`);
* ``eval 10k``: the same metrics on 10,000 x 128 clustered embeddings in 100 classes (the
  evaluator benchmark's case, ``bench/bench_eval.py``);
* ``step``: the quick start's train step (batch 112), one method built with the convolutions
  ``JDML_CONV`` at each mode resolves to.

Runs under tcmalloc where it is installed, as ``train.py`` and ``eval.py`` do.

Usage: PYTHONPATH=. python bench/bench_native_off.py [--repeats 5] [--steps 10]
           [--parts eval,eval10k,step]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from configs.revisiting import get_config
from jdml.allocator import reexec_with_tcmalloc
from jdml.backends import Backends, resolve_backends
from jdml.build import build_program
from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.native import switches
from jdml.run import Run
from jdml.step import make_train_step
from jdml.throughput import alternating_rounds

MODES = ("auto", "xla")


def mode_backends(mode: str) -> Backends:
    """The backends of every switch at ``mode``, as ``JDML_CONV=JDML_KNN=JDML_KMEANS=<mode>``
    resolve."""
    envs = (switches.ENV, switches.KNN_ENV, switches.KMEANS_ENV)
    return resolve_backends(environ={env: mode for env in envs})


def test_embeddings(run: Run) -> tuple[np.ndarray, np.ndarray]:
    """The untrained network's embeddings of the test split, and its labels."""
    captured: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def keep(split: str, data, embeddings: np.ndarray) -> None:
        captured[split] = (np.asarray(embeddings), np.asarray(data.labels))

    run.evaluate(run.initial_state, {"test": run.splits["test"]}, on_embeddings=keep)
    return captured["test"]


def clustered(n: int, dim: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` x ``dim`` float32 embeddings around ``classes`` random centres."""
    rng = np.random.default_rng(0)
    labels = np.arange(n) % classes
    centres = rng.normal(size=(classes, dim))
    return (centres[labels] + rng.normal(size=(n, dim))).astype(np.float32), labels


def main() -> None:
    reexec_with_tcmalloc()  # as train.py and eval.py run (jdml.allocator)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--parts", default="eval,eval10k,step")
    args = parser.parse_args()
    parts = args.parts.split(",")
    config = get_config()
    run = Run(config)
    metrics = list(config.eval.metrics)
    backends = {mode: mode_backends(mode) for mode in MODES}
    print(f"{jax.devices()[0].device_kind}, {os.cpu_count()} CPUs, metrics {', '.join(metrics)}")
    if "eval" in parts:
        x, y = test_embeddings(run)
        contenders = {
            mode: lambda b=backends[mode]: evaluate_embeddings(x, y, metrics, backends=b)
            for mode in MODES
        }
        report(f"eval: glyph test split {x.shape[0]} x {x.shape[1]}", contenders, args.repeats)
    if "eval10k" in parts:
        x, y = clustered(10_000, 128, 100)
        contenders = {
            mode: lambda b=backends[mode]: evaluate_embeddings(x, y, metrics, backends=b)
            for mode in MODES
        }
        report("eval: 10,000 x 128, 100 classes", contenders, args.repeats)
    if "step" in parts:
        batch = {k: jnp.asarray(v) for k, v in run.batch_maker()(0).items()}
        contenders = {}
        for mode in MODES:
            classes = run.splits["train"].num_classes
            program = build_program(config, classes, run.steps_per_epoch, backends[mode])
            step = make_train_step(program.method, run.tx)
            state = [jax.tree.map(jnp.copy, run.initial_state)]
            state[0], out = step(state[0], batch)  # traced now, under this mode
            jax.block_until_ready(out)

            def one_step(step=step, state=state) -> None:
                state[0], out = step(state[0], batch)
                jax.block_until_ready(out)

            contenders[mode] = one_step
        title = f"step: glyph train step, batch {config.train.batch_size}"
        report(title, contenders, args.repeats, calls=args.steps)


def report(
    title: str, contenders: dict[str, Callable[[], object]], repeats: int, calls: int = 1
) -> None:
    """Times the contenders and prints their first call, median and ratio to ``auto``."""
    times = alternating_rounds(contenders, repeats, calls=calls, warmup=2, pause=0.5)
    print(f"\n{title} ({repeats} rounds x {calls} calls, median)")
    base = float(np.median(times["auto"].rounds))
    for mode, timing in times.items():
        median = float(np.median(timing.rounds))
        print(
            f"  {mode:5s} first {timing.first:7.3f} s  median {1e3 * median:9.1f} ms  "
            f"x{median / base:5.2f}"
        )


if __name__ == "__main__":
    main()
