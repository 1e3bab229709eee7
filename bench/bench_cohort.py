"""Cost of a DM2 cohort step on glyphs (the default glyph network, batch 112).

Times, in one process with L fake CPU devices and interleaved rounds:
  * ``sequential``: L independent runs one after the other (L x the plain single-model step),
  * ``1 device``: the cohort of L on one device (members vmapped),
  * ``L devices``: the cohort sharded over L devices (one member each, relation matrices
    all-gathered),
  * ``no mutual term``: the cohort on one device with lambda = 0 (relation matrices not computed),
and prints ms per step and ratios: cohort against sequential runs, and the mutual term's
overhead. On this 2-core machine the L fake devices share the same two cores, so the sharded
cohort can only show its overhead here, not the speed-up of L real accelerators.

Usage: python bench/bench_cohort.py [--members 4] [--steps 20] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

if __name__ == "__main__":
    _members = sys.argv[sys.argv.index("--members") + 1] if "--members" in sys.argv else "4"
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_members}")

import jax
import numpy as np

from configs.dm2 import get_config
from jdml.run import Run


def _build(size: int, **overrides) -> tuple[Run, object, object, list]:
    c = get_config(f"size={size}")
    with c.unlocked():
        c.train.progress_bar = False
        for key, value in overrides.items():
            section, name = key.split(".")
            c[section][name] = value
    run = Run(c)
    make = run.batch_maker()
    batches = [make(s) for s in range(4)]
    step = run.make_train_step()
    state = run.initial_state
    state, _ = step(state, batches[0])  # compile
    jax.block_until_ready(state)
    return run, step, state, batches


def _time(entry: list, steps: int) -> float:
    _, step, state, batches = entry
    start = time.perf_counter()
    for i in range(steps):
        state, metrics = step(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    entry[2] = state
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    size = args.members
    if len(jax.devices()) < size:
        sys.exit(f"needs {size} devices; run with XLA_FLAGS=--xla_force_host_platform_device_count")
    cases = {
        "single model (plain step)": list(_build(1)),
        "cohort, 1 device": list(_build(size, **{"cohort.devices": 1})),
        f"cohort, {size} devices": list(_build(size, **{"cohort.devices": size})),
        "cohort, 1 device, no mutual term": list(
            _build(size, **{"cohort.devices": 1, "cohort.mutual_weight": 0.0})
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, entry in cases.items():
            times[name].append(_time(entry, args.steps))
    ms = {name: float(np.median(t)) for name, t in times.items()}
    sequential = size * ms["single model (plain step)"]
    print(f"cohort of {size}, glyphs, batch 112, median of {args.rounds} rounds x {args.steps}")
    print(f"{'':36s} {'ms/step':>9s} {'vs sequential':>14s}")
    print(f"{f'{size} sequential independent runs':36s} {sequential:9.1f} {1.0:14.2f}")
    for name, value in ms.items():
        if name.startswith("cohort"):
            print(f"{name:36s} {value:9.1f} {value / sequential:14.2f}")
    overhead = ms["cohort, 1 device"] / ms["cohort, 1 device, no mutual term"]
    print(f"mutual term overhead (1 device): x{overhead:.3f}")


if __name__ == "__main__":
    main()
