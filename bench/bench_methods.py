"""Train-step cost of the multi-head methods against the single-head margin baseline (glyphs).

Times, in the same process and on the same data, the full jitted step of:

* ``margin``: ``configs/revisiting.py`` (one head, distance miner, margin loss);
* ``DiVA``: ``configs/diva.py`` (four heads, two extra margin terms, DaNCE with the EMA key
  network's forward pass on a second view and a queue of 10 batches, three decorrelation MLPs,
  the EMA and queue updates);
* ``Sharing (joint)`` and ``Sharing (alternating)``: ``configs/sharing.py`` with one update per
  step, or two updates on two batches (Algorithm 1).

Every figure is the median of ``--repeats`` rounds of ``--steps`` steps after a warm-up; the
methods run in turn so that machine load affects them alike. Prints ms/step and the ratio to
the margin baseline, then each step's model FLOPs, TFLOP/s and MFU (``jdml.throughput``).

Usage: python bench/bench_methods.py [--steps 10] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

from configs.diva import get_config as diva_config
from configs.revisiting import get_config as revisiting_config
from configs.sharing import get_config as sharing_config
from jdml.run import Run
from jdml.step import make_train_step
from jdml.throughput import model_flops, throughput_line

METHODS = {
    "margin": lambda: revisiting_config(),
    "DiVA": lambda: diva_config(),
    "Sharing (joint)": lambda: sharing_config(),
    "Sharing (alternating)": lambda: sharing_config("alternating=1"),
}


def _stepper(build, steps: int):
    """The method's timed rounds of ``steps`` steps, its step's model FLOPs and its dtype."""
    run = Run(build())
    make_batch = run.batch_maker()
    batches = [jax.device_put(make_batch(i)) for i in range(steps)]
    step = make_train_step(run.method, run.tx)
    state = {"s": run.prepare(run.initial_state)}
    flops = model_flops(step, state["s"], batches[0])
    state["s"], _ = step(state["s"], batches[0])  # compile
    jax.block_until_ready(state["s"])

    def rounds() -> float:
        start = time.perf_counter()
        for batch in batches:
            state["s"], _ = step(state["s"], batch)
        jax.block_until_ready(state["s"])
        return (time.perf_counter() - start) / len(batches)

    return rounds, flops, str(run.config.model.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    steppers = {name: _stepper(build, args.steps) for name, build in METHODS.items()}
    times: dict[str, list[float]] = {name: [] for name in METHODS}
    for _ in range(args.repeats):
        for name, (rounds, _, _) in steppers.items():
            times[name].append(rounds())
    base = statistics.median(times["margin"])
    print("| method | ms/step | ratio to margin |\n|---|---|---|")
    for name, values in times.items():
        t = statistics.median(values)
        print(f"| {name} | {1000 * t:.1f} | {t / base:.2f} |")
    print()
    for name, (_, flops, dtype) in steppers.items():
        print(throughput_line(name, flops, statistics.median(times[name]), dtype))


if __name__ == "__main__":
    main()
